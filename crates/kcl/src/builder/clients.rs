//! The lease-table client a worker uses: made from an `SdkConfig`, or the
//! one given, each with kcl's timeouts where its own leave them unset.

use std::time::Duration;

use aws_config::SdkConfig;

/// The lease table's client, with timeouts `sdk` leaves unset.
pub(super) fn lease_table_client(
    sdk: &SdkConfig,
    call_timeout: Duration,
) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::config::Builder::from(sdk)
        .timeout_config(lease_table_timeouts(sdk.timeout_config(), call_timeout))
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// `client` with kcl's timeouts where its own leave them unset: the lease
/// store's calls are bounded on their own, but the startup steps (the
/// tables checked or created) were not, and a request stuck on a dead
/// connection held startup for good.
pub(super) fn bounded_client(
    client: aws_sdk_dynamodb::Client,
    call_timeout: Duration,
) -> aws_sdk_dynamodb::Client {
    let config = client.config();
    let timeouts = lease_table_timeouts(config.timeout_config(), call_timeout);
    aws_sdk_dynamodb::Client::from_conf(config.to_builder().timeout_config(timeouts).build())
}

/// `set`, with a 2 s connect timeout and an attempt timeout of half the
/// lease-table call timeout where it leaves them unset.
fn lease_table_timeouts(
    set: Option<&aws_config::timeout::TimeoutConfig>,
    call_timeout: Duration,
) -> aws_config::timeout::TimeoutConfig {
    use aws_config::timeout::TimeoutConfig;
    let mut timeouts = set
        .cloned()
        .unwrap_or_else(|| TimeoutConfig::builder().build());
    timeouts.take_defaults_from(
        &TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(2))
            .operation_attempt_timeout((call_timeout / 2).max(Duration::from_millis(250)))
            .build(),
    );
    timeouts
}
