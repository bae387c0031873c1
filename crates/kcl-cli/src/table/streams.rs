//! Which stream a lease is of, as the commands name streams: by name, by
//! lease-key identifier (`account:name:creationEpoch`) or by ARN.

use anyhow::bail;
use kcl_kinesis::StreamArn;

/// A stream identifier's parts: account (empty when unknown), name and
/// creation time (epoch seconds). `None` if `id` is not one.
pub(super) fn identifier_parts(id: &str) -> Option<(&str, &str, i64)> {
    let mut parts = id.split(':');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(account), Some(name), Some(epoch), None) if !name.is_empty() => {
            Some((account, name, epoch.parse().ok()?))
        }
        _ => None,
    }
}

/// `given` as a stream ARN, if it is one.
fn arn(given: &str) -> Option<StreamArn> {
    StreamArn::parse(given).ok().flatten()
}

/// Whether `given` (`--stream`: a name, an identifier or an ARN) names
/// the stream of identifier `id`.
pub(super) fn names(id: &str, given: &str) -> bool {
    if id == given {
        return true;
    }
    let Some((account, name, _)) = identifier_parts(id) else {
        return false;
    };
    match arn(given) {
        Some(arn) => arn.name() == name && arn.account() == account,
        None => given == name,
    }
}

/// Where a stream is asked about: its ARN when its account is known (it
/// may be another account's), else its name.
pub(super) fn address(account: &str, name: &str, region: Option<&str>) -> String {
    match region {
        Some(region) if !account.is_empty() => {
            let partition = if region.starts_with("cn-") {
                "aws-cn"
            } else if region.starts_with("us-gov-") {
                "aws-us-gov"
            } else {
                "aws"
            };
            format!("arn:{partition}:kinesis:{region}:{account}:stream/{name}")
        }
        _ => name.to_owned(),
    }
}

/// The stream a shard's sequence number is checked in: where to ask
/// (`address`), and the creation time it must have, when known.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) address: String,
    pub(super) created: Option<i64>,
}

/// The target of a lease of stream `identifier` (the lease key's, or the
/// one a single-stream table records serving), or of `given` (`--stream`)
/// when neither is known; an ARN given is asked at as it is.
pub(super) fn target(
    identifier: Option<&str>,
    given: Option<&str>,
    region: Option<&str>,
) -> anyhow::Result<Target> {
    let known = identifier.or(given.filter(|g| identifier_parts(g).is_some()));
    let created = known.and_then(identifier_parts).map(|(_, _, epoch)| epoch);
    if let Some(arn) = given.filter(|g| arn(g).is_some()) {
        return Ok(Target {
            address: arn.to_owned(),
            created,
        });
    }
    if let Some((account, name, epoch)) = known.and_then(identifier_parts) {
        return Ok(Target {
            address: address(account, name, region),
            created: Some(epoch),
        });
    }
    match given {
        Some(name) => Ok(Target {
            address: name.to_owned(),
            created: None,
        }),
        None => bail!(
            "the table records no stream it serves (it does once a kcl worker has started): \
             add --stream so that the sequence number can be checked against the shard; \
             nothing was written"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An identifier is asked about by ARN when it names an account (the
    /// stream may be another account's; it was asked by name, in the
    /// caller's), by name otherwise; an identifier or ARN given to
    /// `--stream` is taken as such, not as a name.
    #[test]
    fn a_lease_is_checked_in_its_own_streams_account_and_creation() {
        let region = Some("eu-west-1");
        assert_eq!(
            target(Some("111122223333:orders:1700000000"), None, region).unwrap(),
            Target {
                address: "arn:aws:kinesis:eu-west-1:111122223333:stream/orders".into(),
                created: Some(1_700_000_000)
            }
        );
        let unaccounted = target(Some(":orders:1700000000"), Some("orders"), region).unwrap();
        assert_eq!(unaccounted.address, "orders");
        let given = target(None, Some("111122223333:orders:1700000000"), None).unwrap();
        assert_eq!(
            (given.address.as_str(), given.created),
            ("orders", Some(1_700_000_000))
        );
        let arn = "arn:aws-cn:kinesis:cn-north-1:111122223333:stream/orders";
        let by_arn = target(Some("111122223333:orders:1700000000"), Some(arn), region).unwrap();
        assert_eq!(
            (by_arn.address.as_str(), by_arn.created),
            (arn, Some(1_700_000_000))
        );
        assert_eq!(
            target(None, Some("orders"), region).unwrap(),
            Target {
                address: "orders".into(),
                created: None
            }
        );
        assert!(target(None, None, region).is_err());
    }

    /// `--stream` names a stream by name, identifier or ARN (an ARN named
    /// no lease of a multi-stream table).
    #[test]
    fn a_stream_is_named_by_name_identifier_or_arn() {
        let id = "111122223333:orders:1700000000";
        for given in [
            "orders",
            id,
            "arn:aws:kinesis:eu-west-1:111122223333:stream/orders",
        ] {
            assert!(names(id, given), "{given}");
        }
        for other in [
            "payments",
            "111122223333:orders:1800000000",
            "arn:aws:kinesis:eu-west-1:999999999999:stream/orders",
        ] {
            assert!(!names(id, other), "{other}");
        }
    }
}
