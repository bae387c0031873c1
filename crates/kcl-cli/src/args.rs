//! Parsers for the values the commands take: stream positions,
//! checkpoints, durations.

use std::time::{Duration, SystemTime};

use aws_smithy_types::date_time::{DateTime, Format};
use kcl::{Checkpoint, InitialPosition};

/// `--position`: `TRIM_HORIZON`, `LATEST` or `AT_TIMESTAMP=<time>`.
pub(crate) fn initial_position(value: &str) -> Result<InitialPosition, String> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("TRIM_HORIZON") {
        return Ok(InitialPosition::TrimHorizon);
    }
    if v.eq_ignore_ascii_case("LATEST") {
        return Ok(InitialPosition::Latest);
    }
    match v.split_once('=') {
        Some((kind, at)) if kind.trim().eq_ignore_ascii_case("AT_TIMESTAMP") => {
            timestamp(at.trim()).map(InitialPosition::AtTimestamp)
        }
        _ => Err(format!(
            "{value:?} is not a position; expected TRIM_HORIZON, LATEST or \
             AT_TIMESTAMP=<RFC 3339 time or epoch seconds>"
        )),
    }
}

/// RFC 3339 with `Z` or an offset, or seconds since the epoch.
pub(crate) fn timestamp(value: &str) -> Result<SystemTime, String> {
    DateTime::from_str(value, Format::DateTimeWithOffset)
        .or_else(|_| DateTime::from_str(value, Format::EpochSeconds))
        .ok()
        .and_then(|t| SystemTime::try_from(t).ok())
        .ok_or_else(|| {
            format!(
                "{value:?} is not a time; expected RFC 3339 (2024-05-01T12:00:00Z, \
                 2024-05-01T14:00:00+02:00) or epoch seconds (1714564800)"
            )
        })
}

/// `--to`: `TRIM_HORIZON`, `LATEST`, `AT_TIMESTAMP` (the workers'
/// configured timestamp) or a sequence number with an optional
/// `/sub-sequence`.
pub(crate) fn checkpoint(value: &str) -> Result<Checkpoint, String> {
    let v = value.trim();
    let upper = v.to_ascii_uppercase();
    match upper.as_str() {
        Checkpoint::TRIM_HORIZON => return Ok(Checkpoint::TrimHorizon),
        Checkpoint::LATEST => return Ok(Checkpoint::Latest),
        Checkpoint::AT_TIMESTAMP => return Ok(Checkpoint::AtTimestamp),
        _ => {}
    }
    let (seq, sub) = match v.split_once('/') {
        Some((seq, sub)) => {
            let sub = sub.parse::<u64>().map_err(|_| {
                format!("{value:?}: the sub-sequence after '/' must be a non-negative integer")
            })?;
            (seq, sub)
        }
        None => (v, 0),
    };
    if seq.is_empty() || seq.len() > 129 || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{value:?} is not a checkpoint; expected TRIM_HORIZON, LATEST, AT_TIMESTAMP, or a \
             sequence number (digits) with an optional /sub-sequence"
        ));
    }
    Ok(Checkpoint::at(seq, sub))
}

/// `500ms`, `2s`, `1.5m`, `1h`: a positive number and a unit.
pub(crate) fn duration(value: &str) -> Result<Duration, String> {
    let bad = || format!("{value:?} is not a duration; expected e.g. 500ms, 2s, 1.5m or 1h");
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = v.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds_per_unit = match unit.trim() {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let d = Duration::try_from_secs_f64(number * seconds_per_unit).map_err(|_| bad())?;
    if d.is_zero() {
        return Err(format!("{value:?}: must be above zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions() {
        assert_eq!(
            initial_position("trim_horizon"),
            Ok(InitialPosition::TrimHorizon)
        );
        assert_eq!(initial_position("LATEST"), Ok(InitialPosition::Latest));
        let at = initial_position("AT_TIMESTAMP=2024-05-01T12:00:00Z");
        assert_eq!(
            at,
            Ok(InitialPosition::AtTimestamp(
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_564_800)
            ))
        );
        assert_eq!(initial_position("AT_TIMESTAMP=1714564800"), at);
        for bad in ["", "EARLIEST", "AT_TIMESTAMP=", "AT_TIMESTAMP=yesterday"] {
            assert!(initial_position(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn checkpoints() {
        assert_eq!(checkpoint("TRIM_HORIZON"), Ok(Checkpoint::TrimHorizon));
        assert_eq!(checkpoint("latest"), Ok(Checkpoint::Latest));
        assert_eq!(checkpoint("AT_TIMESTAMP"), Ok(Checkpoint::AtTimestamp));
        assert_eq!(checkpoint("4959"), Ok(Checkpoint::at("4959", 0)));
        assert_eq!(checkpoint("4959/3"), Ok(Checkpoint::at("4959", 3)));
        for bad in ["", "SHARD_END", "12a", "4959/", "4959/x", "/3", "-1"] {
            assert!(checkpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(duration("1.5m"), Ok(Duration::from_secs(90)));
        for bad in ["", "10", "0s", "s", "-1s", "1d"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }
}
