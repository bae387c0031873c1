//! Streams named by ARN: `arn:<partition>:kinesis:<region>:<account>:stream/<name>`.
//!
//! AWS recommends the ARN, and only the ARN reaches a stream of another
//! account. A stream given as an ARN is sent as `StreamARN` on every call
//! (and a name as `StreamName`); the account and the region come from the
//! ARN, so the lease keys of a multi-stream application name the stream's
//! account, as the Java KCL writes them.

use std::fmt;

use kcl_core::ConfigError;

/// A parsed Kinesis stream ARN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamArn {
    arn: String,
    partition: String,
    region: String,
    account: String,
    name: String,
}

impl StreamArn {
    /// `Ok(None)` when `stream` is a plain name; `Ok(Some(_))` for a valid
    /// stream ARN; an error naming the problem for anything else that
    /// starts with `arn:`.
    pub fn parse(stream: &str) -> Result<Option<StreamArn>, ConfigError> {
        if !stream.starts_with("arn:") {
            return Ok(None);
        }
        let bad = |why: &str| ConfigError {
            field: "stream",
            reason: format!(
                "is {stream:?}, not a Kinesis stream ARN ({why}); expected \
                 arn:<partition>:kinesis:<region>:<account>:stream/<name>"
            ),
        };
        let parts: Vec<&str> = stream.splitn(6, ':').collect();
        let [_, partition, service, region, account, resource] = parts[..] else {
            return Err(bad("too few parts"));
        };
        if service != "kinesis" {
            return Err(bad("the service is not kinesis"));
        }
        if partition.is_empty() || region.is_empty() {
            return Err(bad("no partition or region"));
        }
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the account is not 12 digits"));
        }
        let Some(name) = resource.strip_prefix("stream/") else {
            return Err(bad("the resource is not stream/<name>"));
        };
        let valid_name = (1..=128).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !valid_name {
            return Err(bad("the stream name is invalid"));
        }
        Ok(Some(StreamArn {
            arn: stream.to_owned(),
            partition: partition.to_owned(),
            region: region.to_owned(),
            account: account.to_owned(),
            name: name.to_owned(),
        }))
    }

    /// The whole ARN.
    pub fn as_str(&self) -> &str {
        &self.arn
    }

    /// The AWS partition (`aws`, `aws-cn`, ...).
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// The stream's region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The stream's account.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for StreamArn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.arn)
    }
}

/// The `StreamName` and `StreamARN` fields of a request on `stream` as the
/// source is given it: an ARN goes as the ARN, anything else as the name.
pub(crate) fn stream_fields(stream: &str) -> (Option<String>, Option<String>) {
    if stream.starts_with("arn:") {
        (None, Some(stream.to_owned()))
    } else {
        (Some(stream.to_owned()), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stream_arn() {
        let arn = StreamArn::parse("arn:aws:kinesis:eu-west-1:123456789012:stream/orders")
            .expect("valid")
            .expect("an ARN");
        assert_eq!(
            (arn.partition(), arn.region(), arn.account(), arn.name()),
            ("aws", "eu-west-1", "123456789012", "orders")
        );
        assert_eq!(StreamArn::parse("orders"), Ok(None));
    }

    #[test]
    fn a_bad_arn_names_the_problem() {
        for (bad, why) in [
            ("arn:aws:kinesis:eu-west-1:123456789012", "too few parts"),
            ("arn:aws:sqs:eu-west-1:123456789012:stream/x", "not kinesis"),
            ("arn:aws:kinesis:eu-west-1:1234:stream/x", "12 digits"),
            (
                "arn:aws:kinesis:eu-west-1:123456789012:consumer/x",
                "stream/<name>",
            ),
            (
                "arn:aws:kinesis:eu-west-1:123456789012:stream/a b",
                "name is invalid",
            ),
            ("arn:aws:kinesis::123456789012:stream/x", "region"),
        ] {
            let e = StreamArn::parse(bad).expect_err(bad);
            assert_eq!(e.field, "stream");
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }
}
