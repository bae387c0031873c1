//! The records handed to a `RecordProcessor`.

use std::time::SystemTime;

use bytes::Bytes;

use crate::lease::Checkpoint;

/// One user record: a plain Kinesis record, or one sub-record of a KPL
/// aggregate.
///
/// Records of one aggregate share `sequence_number` and differ by
/// `sub_sequence_number` (0..n-1); a plain record has sub-sequence 0.
/// `data` of sub-records are slices of the aggregate's buffer, not copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The payload.
    pub data: Bytes,
    /// The partition key the producer chose.
    pub partition_key: String,
    /// The explicit hash key, when the producer set one.
    pub explicit_hash_key: Option<String>,
    /// The Kinesis sequence number of the (possibly aggregated) record.
    pub sequence_number: String,
    /// The index inside a KPL aggregate; 0 for a plain record.
    pub sub_sequence_number: u64,
    /// When Kinesis accepted the record (approximate).
    pub approximate_arrival: Option<SystemTime>,
    /// True if this record came out of a KPL aggregate.
    pub aggregated: bool,
}

impl Record {
    /// The checkpoint that marks this record (and all before it) processed.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint::at(self.sequence_number.clone(), self.sub_sequence_number)
    }
}
