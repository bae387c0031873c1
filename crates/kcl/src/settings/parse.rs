//! The text form of each kind of setting: what an environment variable or a
//! file value may say. Each parser returns the reason a value is refused,
//! worded to follow the variable's name ("KCL_LEASE_DURATION is ...").

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use aws_sdk_kinesis::primitives::{DateTime, DateTimeFormat};
use kcl_core::checkpointer::CheckpointPolicy;
use kcl_core::config::{Balance, LeaseRenewal};
use kcl_core::poison::PoisonPolicy;
use kcl_core::processor::FailurePolicy;
use kcl_core::source::InitialPosition;
use kcl_core::worker::RemovedStreamPolicy;
use kcl_dynamodb::{Capacity, TableCreation};

pub(super) type Parsed<T> = Result<T, String>;

/// Any non-empty text, trimmed.
pub(super) fn text(value: &str) -> Parsed<String> {
    Ok(value.trim().to_owned())
}

/// Comma-separated, no empty entry (a trailing comma is a typo, not a
/// stream called "").
pub(super) fn list(value: &str) -> Parsed<Vec<String>> {
    let items: Vec<String> = value.split(',').map(|s| s.trim().to_owned()).collect();
    if items.iter().any(String::is_empty) {
        return Err(format!(
            "is {value:?}; expected comma-separated names without empty entries"
        ));
    }
    Ok(items)
}

pub(super) fn boolean(value: &str) -> Parsed<bool> {
    one_of(
        value,
        &[
            (&["true", "1", "yes", "on"], true),
            (&["false", "0", "no", "off"], false),
        ],
    )
}

/// The value of the choice that names `value`, in any case and with `-`
/// for `_`. A choice's first name is the one the error suggests; the
/// others are accepted aliases.
fn one_of<T: Clone>(value: &str, choices: &[(&[&str], T)]) -> Parsed<T> {
    let name = value.trim().to_ascii_lowercase().replace('-', "_");
    if let Some((_, chosen)) = choices
        .iter()
        .find(|(names, _)| names.contains(&name.as_str()))
    {
        return Ok(chosen.clone());
    }
    let suggested: Vec<&str> = choices
        .iter()
        .filter_map(|(names, _)| names.first().copied())
        .collect();
    let expected = match suggested.as_slice() {
        [first @ .., last] if !first.is_empty() => format!("{} or {last}", first.join(", ")),
        _ => suggested.concat(),
    };
    Err(format!("is {value:?}; expected {expected}"))
}

pub(super) fn count(value: &str) -> Parsed<usize> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("is {value:?}; expected a whole number such as 4"))
}

pub(super) fn records_per_call(value: &str) -> Parsed<i32> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("is {value:?}; expected a whole number such as 1000"))
}

/// `500ms`, `10s`, `1.5m`, `2h`: a positive number and a unit. A bare
/// number is refused: whether `10` means seconds or milliseconds is exactly
/// the mistake this parser exists to catch.
pub(super) fn duration(value: &str) -> Parsed<Duration> {
    let bad =
        || format!("is {value:?}; expected a positive duration such as 500ms, 10s, 1.5m or 1h");
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = v.split_at(split);
    let millis_per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    let duration = if number.contains('.') {
        let n: f64 = number.parse().map_err(|_| bad())?;
        Duration::try_from_secs_f64(n * millis_per_unit as f64 / 1_000.0).map_err(|_| bad())?
    } else {
        let n: u64 = number.parse().map_err(|_| bad())?;
        Duration::from_millis(n.checked_mul(millis_per_unit).ok_or_else(bad)?)
    };
    if duration.is_zero() {
        return Err(bad());
    }
    Ok(duration)
}

/// Bytes, with an optional binary unit: `1048576`, `512KiB`, `64MiB`,
/// `1GiB`.
pub(super) fn bytes(value: &str) -> Parsed<usize> {
    let bad = || format!("is {value:?}; expected a size such as 1048576, 512KiB, 64MiB or 1GiB");
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    let n: usize = number.parse().map_err(|_| bad())?;
    n.checked_mul(multiplier).ok_or_else(bad)
}

pub(super) fn address(value: &str) -> Parsed<SocketAddr> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("is {value:?}; expected an address and port such as 0.0.0.0:9090"))
}

/// `LATEST`, `TRIM_HORIZON` or `AT_TIMESTAMP=<RFC 3339 time or epoch
/// seconds>`, in any case.
pub(super) fn initial_position(value: &str) -> Parsed<InitialPosition> {
    let v = value.trim();
    let expected = "expected LATEST, TRIM_HORIZON or AT_TIMESTAMP=<RFC 3339 time or epoch seconds>";
    if v.eq_ignore_ascii_case("LATEST") {
        return Ok(InitialPosition::Latest);
    }
    if v.eq_ignore_ascii_case("TRIM_HORIZON") {
        return Ok(InitialPosition::TrimHorizon);
    }
    let Some((kind, at)) = v.split_once('=') else {
        return Err(format!("is {value:?}; {expected}"));
    };
    if !kind.trim().eq_ignore_ascii_case("AT_TIMESTAMP") {
        return Err(format!("is {value:?}; {expected}"));
    }
    timestamp(at.trim())
        .map(InitialPosition::AtTimestamp)
        .ok_or_else(|| {
            format!(
                "is {value:?}; the time must be RFC 3339 (2024-05-01T12:00:00Z, \
                 2024-05-01T14:00:00+02:00) or epoch seconds (1714564800)"
            )
        })
}

/// RFC 3339 (with `Z` or an offset) or seconds since the epoch.
fn timestamp(value: &str) -> Option<SystemTime> {
    let parsed = DateTime::from_str(value, DateTimeFormat::DateTimeWithOffset)
        .or_else(|_| DateTime::from_str(value, DateTimeFormat::EpochSeconds))
        .ok()?;
    SystemTime::try_from(parsed).ok()
}

/// `liveness` (one record per worker, the default) or `per_lease` (every
/// lease renewed, as a table shared with Java KCL workers needs).
pub(super) fn renewal(value: &str) -> Parsed<LeaseRenewal> {
    one_of(
        value,
        &[
            (
                &["liveness", "worker_liveness"],
                LeaseRenewal::WorkerLiveness,
            ),
            (&["per_lease"], LeaseRenewal::PerLease),
        ],
    )
}

/// `by_load` (the default: leases weighed by what they carry) or
/// `by_count`.
pub(super) fn balance(value: &str) -> Parsed<Balance> {
    one_of(
        value,
        &[
            (&["by_load", "load"], Balance::ByLoad),
            (&["by_count", "count"], Balance::ByCount),
        ],
    )
}

/// `on_demand`, or `provisioned:<read units>:<write units>`.
pub(super) fn capacity(value: &str) -> Parsed<Capacity> {
    let bad = || format!("is {value:?}; expected on_demand or provisioned:<read>:<write> (units)");
    let v = value.trim().to_ascii_lowercase().replace('-', "_");
    if v == "on_demand" {
        return Ok(Capacity::OnDemand);
    }
    let mut parts = v.split(':');
    if parts.next() != Some("provisioned") {
        return Err(bad());
    }
    let mut units = || -> Parsed<i64> {
        parts
            .next()
            .and_then(|u| u.trim().parse().ok())
            .filter(|u| *u > 0)
            .ok_or_else(bad)
    };
    let (read, write) = (units()?, units()?);
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(Capacity::Provisioned { read, write })
}

/// `every_call`, a period (`5s`), a record count (`1000 records`), or
/// both joined by `or` (`5s or 1000 records`).
pub(super) fn checkpoint_policy(value: &str) -> Parsed<CheckpointPolicy> {
    let bad = || {
        format!(
            "is {value:?}; expected every_call, a period (5s), a record count (1000 records) or \
             both (5s or 1000 records)"
        )
    };
    let v = value.trim();
    if v.eq_ignore_ascii_case("every_call") {
        return Ok(CheckpointPolicy::every_call());
    }
    let (mut period, mut records) = (None, None);
    for part in v.split(" or ") {
        let part = part.trim();
        if let Some(n) = part.strip_suffix("records") {
            let n: u64 = n.trim().parse().map_err(|_| bad())?;
            if records.replace(n).is_some() {
                return Err(bad());
            }
        } else if period.replace(duration(part).map_err(|_| bad())?).is_some() {
            return Err(bad());
        }
    }
    Ok(match (period, records) {
        (Some(p), Some(n)) => CheckpointPolicy::every(p).or_every_records(n),
        (Some(p), None) => CheckpointPolicy::every(p),
        (None, Some(n)) => CheckpointPolicy::every_records(n),
        (None, None) => return Err(bad()),
    })
}

/// `keep`, or `delete_after=<duration>`.
pub(super) fn removed_stream_policy(value: &str) -> Parsed<RemovedStreamPolicy> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("keep") {
        return Ok(RemovedStreamPolicy::Keep);
    }
    match v.split_once('=') {
        Some((kind, after)) if kind.trim().eq_ignore_ascii_case("delete_after") => {
            duration(after).map(RemovedStreamPolicy::DeleteAfter)
        }
        _ => Err(format!(
            "is {value:?}; expected keep or delete_after=<duration> (delete_after=10m)"
        )),
    }
}

/// `retry`, `skip`, `release_shard`, or `isolate` (poison records found,
/// dropped and counted; a destination for them is set in code with
/// [`PoisonPolicy::send_to`]).
pub(super) fn failure_policy(value: &str) -> Parsed<FailurePolicy> {
    one_of(
        value,
        &[
            (&["retry"], FailurePolicy::Retry),
            (&["skip"], FailurePolicy::Skip),
            (&["release_shard"], FailurePolicy::ReleaseShard),
            (
                &["isolate"],
                FailurePolicy::Isolate(PoisonPolicy::drop_failed()),
            ),
        ],
    )
}

/// `if_missing` or `never`.
pub(super) fn table_creation(value: &str) -> Parsed<TableCreation> {
    one_of(
        value,
        &[
            (&["if_missing"], TableCreation::IfMissing),
            (&["never"], TableCreation::Never),
        ],
    )
}

/// `key=value` pairs, comma-separated: `team=payments,env=prod`.
pub(super) fn tags(value: &str) -> Parsed<Vec<(String, String)>> {
    list(value)?
        .into_iter()
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(format!(
                "is {value:?}; expected comma-separated key=value pairs (team=payments,env=prod)"
            )),
        })
        .collect()
}
