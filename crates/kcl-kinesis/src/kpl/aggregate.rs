//! Writing KPL aggregates.

use std::collections::HashMap;

use bytes::Bytes;
use prost::Message as _;

use super::{DIGEST_LEN, MAGIC, md5, proto};

/// One user record to put into an aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// The record's partition key.
    pub partition_key: String,
    /// The record's explicit hash key (a decimal `u128`), if any.
    pub explicit_hash_key: Option<String>,
    /// The record's payload.
    pub data: Bytes,
}

/// Encodes `records` as one KPL aggregate: magic, protobuf body, MD5.
///
/// Partition keys and explicit hash keys are stored once per distinct value,
/// as the KPL does. The result decodes with [`super::deaggregate`] to the
/// same records, in order, with sub-sequence numbers 0..n-1.
///
/// This is the format only, not the KPL's batching: nothing is validated
/// (an invalid explicit hash key makes the aggregate malformed to readers),
/// nothing is split (Kinesis rejects records over 1 MiB), and an empty slice
/// gives an aggregate without records, which readers treat as malformed. Put
/// the result with the first record's partition key and explicit hash key,
/// as the KPL does, so that it lands on that record's shard.
pub fn aggregate(records: &[UserRecord]) -> Bytes {
    let mut pk_index: HashMap<&str, u64> = HashMap::new();
    let mut ehk_index: HashMap<&str, u64> = HashMap::new();
    let mut agg = proto::AggregatedRecord {
        partition_key_table: Vec::new(),
        explicit_hash_key_table: Vec::new(),
        records: Vec::with_capacity(records.len()),
    };
    for r in records {
        let partition_key_index = *pk_index.entry(&r.partition_key).or_insert_with(|| {
            agg.partition_key_table.push(r.partition_key.clone());
            agg.partition_key_table.len() as u64 - 1
        });
        let explicit_hash_key_index = r.explicit_hash_key.as_deref().map(|ehk| {
            *ehk_index.entry(ehk).or_insert_with(|| {
                agg.explicit_hash_key_table.push(ehk.to_owned());
                agg.explicit_hash_key_table.len() as u64 - 1
            })
        });
        agg.records.push(proto::Record {
            partition_key_index: Some(partition_key_index),
            explicit_hash_key_index,
            data: Some(r.data.clone()),
            tags: Vec::new(),
        });
    }
    let body = agg.encode_to_vec();
    let mut out = Vec::with_capacity(MAGIC.len() + body.len() + DIGEST_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&body);
    out.extend_from_slice(&md5(&body));
    Bytes::from(out)
}
