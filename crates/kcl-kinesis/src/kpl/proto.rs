//! The KPL protobuf messages (`messages.proto` of amazon-kinesis-producer),
//! written by hand with prost's derive macros so the crate needs no `protoc`.
//!
//! The schema is proto2 and marks several fields `required`. prost does not
//! enforce `required` on decode (it fills in the default), so those fields
//! are declared `optional` here: the wire format is identical, and decoding
//! into `Option` lets [`super::deaggregate`] notice an absent field and
//! reject the aggregate, as the Java and Python decoders do.
//!
//! `data` decodes into [`Bytes`]; when the input buffer is itself `Bytes`,
//! prost slices it instead of copying, which is what makes sub-record
//! payloads zero-copy views of the fetched record.

use bytes::Bytes;

/// `message AggregatedRecord`: the body between the magic and the digest.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AggregatedRecord {
    /// `repeated string partition_key_table = 1;`
    #[prost(string, repeated, tag = "1")]
    pub(crate) partition_key_table: Vec<String>,
    /// `repeated string explicit_hash_key_table = 2;`
    #[prost(string, repeated, tag = "2")]
    pub(crate) explicit_hash_key_table: Vec<String>,
    /// `repeated Record records = 3;`
    #[prost(message, repeated, tag = "3")]
    pub(crate) records: Vec<Record>,
}

/// `message Record`: one user record, its keys as indexes into the tables.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Record {
    /// `required uint64 partition_key_index = 1;`
    #[prost(uint64, optional, tag = "1")]
    pub(crate) partition_key_index: Option<u64>,
    /// `optional uint64 explicit_hash_key_index = 2;`
    #[prost(uint64, optional, tag = "2")]
    pub(crate) explicit_hash_key_index: Option<u64>,
    /// `required bytes data = 3;`
    #[prost(bytes = "bytes", optional, tag = "3")]
    pub(crate) data: Option<Bytes>,
    /// `repeated Tag tags = 4;` (parsed and validated, not surfaced: no KCL
    /// exposes tags to processors).
    #[prost(message, repeated, tag = "4")]
    pub(crate) tags: Vec<Tag>,
}

/// `message Tag`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Tag {
    /// `required string key = 1;`
    #[prost(string, optional, tag = "1")]
    pub(crate) key: Option<String>,
    /// `optional string value = 2;`
    #[prost(string, optional, tag = "2")]
    pub(crate) value: Option<String>,
}
