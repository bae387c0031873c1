//! Which shard a record belongs to.
//!
//! Kinesis maps every record to a 128-bit hash key: the explicit hash key
//! when the producer set one, otherwise the MD5 digest of the UTF-8
//! partition key read as a big-endian unsigned integer. Each open shard owns
//! a contiguous, inclusive range of hash keys.
//!
//! A plain record always lies in the range of the shard it was read from
//! (Kinesis routed it there). The sub-records of a KPL aggregate need not:
//! the KPL routes the whole aggregate by one key after predicting which
//! shard its sub-records map to, and a prediction made before a resharding
//! can be wrong afterwards.

use kcl_core::{HashKeyRange, Record};

use super::md5;

/// A hash key or hash-key range that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HashKeyError {
    /// Not a decimal integer in `0..=2^128-1`.
    #[error("invalid hash key {0:?}: expected a decimal integer in 0..=2^128-1")]
    Invalid(String),
    /// The range's start lies after its end.
    #[error("empty hash-key range: start {starting} is after end {ending}")]
    EmptyRange {
        /// The range's first hash key.
        starting: u128,
        /// The range's last hash key.
        ending: u128,
    },
}

/// Parses a decimal hash key (explicit hash key, or a shard range bound).
///
/// Only ASCII digits are accepted (leading zeros allowed, no sign, no
/// whitespace), at most 39 of them, up to `2^128-1`: the values Kinesis
/// itself accepts. The
/// offending text kept in the error is cut to 64 characters, since an
/// explicit hash key inside an aggregate can be any length.
pub fn parse_hash_key(s: &str) -> Result<u128, HashKeyError> {
    // `u128::from_str` alone would also accept a leading '+', and any
    // number of leading zeros: 2^128 - 1 has 39 digits, and a key is
    // copied into each sub-record of an aggregate that names it.
    if !s.is_empty()
        && s.len() <= 39
        && s.bytes().all(|b| b.is_ascii_digit())
        && let Ok(v) = s.parse::<u128>()
    {
        return Ok(v);
    }
    Err(HashKeyError::Invalid(s.chars().take(64).collect()))
}

/// The hash key Kinesis derives from a partition key: MD5 of its UTF-8
/// bytes, read as a big-endian `u128`.
pub fn partition_key_hash(partition_key: &str) -> u128 {
    u128::from_be_bytes(md5(partition_key.as_bytes()))
}

/// The hash key that decides the record's shard: its explicit hash key if
/// present, else [`partition_key_hash`] of its partition key.
///
/// Fails only when the explicit hash key is not a valid hash key. Records
/// produced by [`super::deaggregate`] from an aggregate never fail: an
/// invalid explicit hash key makes the aggregate malformed.
pub fn effective_hash_key(record: &Record) -> Result<u128, HashKeyError> {
    match &record.explicit_hash_key {
        Some(ehk) => parse_hash_key(ehk),
        None => Ok(partition_key_hash(&record.partition_key)),
    }
}

/// Whether the record's [effective hash key](effective_hash_key) lies in the
/// shard's hash-key range (inclusive at both ends).
///
/// Parses `range` on every call; to check many records, parse it once with
/// [`ShardHashRange::parse`].
pub fn record_in_range(range: &HashKeyRange, record: &Record) -> Result<bool, HashKeyError> {
    ShardHashRange::parse(range)?.contains_record(record)
}

/// A shard's hash-key range as integers: [`HashKeyRange`] parsed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardHashRange {
    starting: u128,
    ending: u128,
}

impl ShardHashRange {
    /// The whole hash-key space, `0..=2^128-1` (a stream with one shard).
    pub const FULL: ShardHashRange = ShardHashRange {
        starting: 0,
        ending: u128::MAX,
    };

    /// The inclusive range `starting..=ending`; fails if `starting > ending`.
    pub fn new(starting: u128, ending: u128) -> Result<Self, HashKeyError> {
        if starting > ending {
            return Err(HashKeyError::EmptyRange { starting, ending });
        }
        Ok(ShardHashRange { starting, ending })
    }

    /// Parses the decimal bounds Kinesis reports for a shard.
    pub fn parse(range: &HashKeyRange) -> Result<Self, HashKeyError> {
        Self::new(
            parse_hash_key(&range.starting)?,
            parse_hash_key(&range.ending)?,
        )
    }

    /// First hash key of the range.
    pub fn starting(&self) -> u128 {
        self.starting
    }

    /// Last hash key of the range (inclusive).
    pub fn ending(&self) -> u128 {
        self.ending
    }

    /// Whether `hash_key` lies in the range.
    pub fn contains(&self, hash_key: u128) -> bool {
        (self.starting..=self.ending).contains(&hash_key)
    }

    /// Whether the record's [effective hash key](effective_hash_key) lies in
    /// the range.
    pub fn contains_record(&self, record: &Record) -> Result<bool, HashKeyError> {
        Ok(self.contains(effective_hash_key(record)?))
    }
}

impl TryFrom<&HashKeyRange> for ShardHashRange {
    type Error = HashKeyError;

    fn try_from(range: &HashKeyRange) -> Result<Self, HashKeyError> {
        Self::parse(range)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn record(pk: &str, ehk: Option<&str>) -> Record {
        Record {
            data: Bytes::new(),
            partition_key: pk.to_owned(),
            explicit_hash_key: ehk.map(str::to_owned),
            sequence_number: "1".to_owned(),
            sub_sequence_number: 0,
            approximate_arrival: None,
            aggregated: true,
        }
    }

    fn range(starting: &str, ending: &str) -> HashKeyRange {
        HashKeyRange {
            starting: starting.to_owned(),
            ending: ending.to_owned(),
        }
    }

    // Known values, computed independently:
    //   python3 -c "import hashlib; print(int.from_bytes(hashlib.md5(b'...').digest(), 'big'))"
    // md5("") = d41d8cd98f00b204e9800998ecf8427e
    // md5("a") = 0cc175b9c0f1b6a831c399e269772661
    const MD5_EMPTY: u128 = 0xd41d8cd98f00b204e9800998ecf8427e;
    const MD5_A: u128 = 0x0cc175b9c0f1b6a831c399e269772661;
    const MD5_PK1_DECIMAL: u128 = 273_922_656_776_327_812_788_301_823_748_127_981_641;

    #[test]
    fn partition_key_hash_is_big_endian_md5() {
        assert_eq!(partition_key_hash(""), MD5_EMPTY);
        assert_eq!(partition_key_hash("a"), MD5_A);
        assert_eq!(partition_key_hash("pk-1"), MD5_PK1_DECIMAL);
        assert_eq!(
            MD5_A.to_string(),
            "16955237001963240173058271559858726497",
            "the decimal form Kinesis reports"
        );
    }

    #[test]
    fn partition_key_hash_uses_utf8_bytes() {
        // md5("ключ".encode("utf-8")) = c3657b66c60a307292aae11f07b04ae7
        assert_eq!(
            partition_key_hash("ключ"),
            0xc3657b66c60a307292aae11f07b04ae7
        );
    }

    #[test]
    fn explicit_hash_key_wins_over_partition_key() {
        assert_eq!(effective_hash_key(&record("a", Some("7"))), Ok(7));
        assert_eq!(effective_hash_key(&record("a", None)), Ok(MD5_A));
        assert_eq!(
            effective_hash_key(&record(
                "a",
                Some("340282366920938463463374607431768211455")
            )),
            Ok(u128::MAX)
        );
    }

    #[test]
    fn parse_hash_key_rejects_what_kinesis_rejects() {
        assert_eq!(parse_hash_key("0"), Ok(0));
        assert_eq!(parse_hash_key("007"), Ok(7));
        assert_eq!(parse_hash_key(&format!("{:039}", 7)), Ok(7));
        for bad in [
            "",
            "+1",
            "-1",
            " 1",
            "1 ",
            "0x10",
            "1e3",
            "340282366920938463463374607431768211456", // 2^128
            "99999999999999999999999999999999999999999999",
            "0000000000000000000000000000000000000007", // 40 digits
        ] {
            assert!(
                matches!(parse_hash_key(bad), Err(HashKeyError::Invalid(_))),
                "{bad:?} should be rejected"
            );
        }
        let long = "x".repeat(10_000);
        assert_eq!(
            parse_hash_key(&long),
            Err(HashKeyError::Invalid("x".repeat(64))),
            "the error keeps a bounded excerpt"
        );
    }

    #[test]
    fn range_bounds_are_inclusive() {
        let r = ShardHashRange::parse(&range("10", "20")).unwrap();
        assert!(!r.contains(9));
        assert!(r.contains(10));
        assert!(r.contains(20));
        assert!(!r.contains(21));
        assert!(ShardHashRange::FULL.contains(0));
        assert!(ShardHashRange::FULL.contains(u128::MAX));
        assert_eq!(ShardHashRange::new(5, 5).map(|r| r.contains(5)), Ok(true));
    }

    #[test]
    fn record_in_range_by_partition_key() {
        // Split the key space in half, as a two-shard stream does:
        // shard 0: 0..=2^127-1, shard 1: 2^127..=2^128-1.
        let low = range("0", "170141183460469231731687303715884105727");
        let high = range(
            "170141183460469231731687303715884105728",
            "340282366920938463463374607431768211455",
        );
        // md5("a") starts with 0x0c: lower half. md5("") starts with 0xd4: upper half.
        assert_eq!(record_in_range(&low, &record("a", None)), Ok(true));
        assert_eq!(record_in_range(&high, &record("a", None)), Ok(false));
        assert_eq!(record_in_range(&low, &record("", None)), Ok(false));
        assert_eq!(record_in_range(&high, &record("", None)), Ok(true));
        // An explicit hash key overrides the partition key's hash.
        assert_eq!(
            record_in_range(
                &high,
                &record("a", Some("170141183460469231731687303715884105728"))
            ),
            Ok(true)
        );
        assert_eq!(
            record_in_range(
                &low,
                &record("a", Some("170141183460469231731687303715884105728"))
            ),
            Ok(false)
        );
    }

    #[test]
    fn exact_boundary_from_md5() {
        // A shard whose range ends exactly at md5("a") holds "a"; one that
        // ends just below it does not.
        let r_at = ShardHashRange::new(0, MD5_A).unwrap();
        let r_below = ShardHashRange::new(0, MD5_A - 1).unwrap();
        assert_eq!(r_at.contains_record(&record("a", None)), Ok(true));
        assert_eq!(r_below.contains_record(&record("a", None)), Ok(false));
    }

    #[test]
    fn invalid_inputs_are_errors_not_panics() {
        assert!(matches!(
            record_in_range(&range("x", "1"), &record("a", None)),
            Err(HashKeyError::Invalid(_))
        ));
        assert_eq!(
            ShardHashRange::parse(&range("20", "10")),
            Err(HashKeyError::EmptyRange {
                starting: 20,
                ending: 10
            })
        );
        assert!(matches!(
            record_in_range(&range("0", "1"), &record("a", Some("-5"))),
            Err(HashKeyError::Invalid(_))
        ));
    }
}
