use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::{FIELDS, Settings, variable};
use crate::test_support::{NoOp, offline_sdk};
use crate::{
    CheckpointPolicy, FailurePolicy, InitialPosition, LeaseRenewal, RemovedStreamPolicy, Worker,
    WorkerBuilder,
};

/// A non-default value for every field, in the environment's text form.
/// `enhanced_fan_out` stays off: fan-out and polling settings together
/// are refused by `build()` (tested on its own below).
fn every_field() -> Vec<(&'static str, &'static str)> {
    let mut fields = vec![
        ("application_name", "orders"),
        ("streams", "orders, payments"),
        ("multi_stream", "true"),
        ("enhanced_fan_out", "false"),
        ("prefetch_budget", "64MiB"),
        ("table_name", "orders-leases"),
        ("table_capacity", "provisioned:5:7"),
        ("table_creation", "never"),
        ("table_tags", "team=payments, env=prod"),
        ("table_point_in_time_recovery", "true"),
        ("table_deletion_protection", "true"),
        ("table_kms_key", "alias/kcl"),
        ("worker_id", "w-1"),
        ("lease_duration", "20s"),
        ("renew_interval", "5s"),
        ("renewal", "per_lease"),
        ("taker_interval", "7s"),
        ("max_leases_per_worker", "50"),
        ("max_leases_to_steal", "2"),
        ("handoff_timeout", "25s"),
        ("balance", "by_count"),
        ("load_report_interval", "90s"),
        ("initial_position", "AT_TIMESTAMP=2024-05-01T12:00:00Z"),
        ("failure_policy", "skip"),
        ("parallelism_per_shard", "4"),
        ("checkpoint_policy", "5s or 1000 records"),
        ("shard_sync_interval", "2m"),
        ("parent_poll_interval", "3s"),
        ("shutdown_timeout", "30s"),
        ("completed_lease_retention", "10m"),
        ("removed_stream_policy", "delete_after=1h"),
        ("max_read_failure_time", "90s"),
        ("liveness_stall_bound", "10m"),
        ("serve_health", "127.0.0.1:0"),
        ("processor_warn_after", "90s"),
        ("processor_timeout", "5m"),
        ("max_records", "500"),
        ("idle_time_between_reads", "1.5s"),
        ("time_between_reads", "200ms"),
    ];
    if cfg!(feature = "prometheus") {
        fields.push(("serve_metrics", "127.0.0.1:0"));
    }
    fields
}

/// The same settings written in code.
fn every_field_in_code() -> WorkerBuilder {
    let builder = Worker::builder("orders")
        .stream("orders")
        .stream("payments")
        .multi_stream(true)
        .prefetch_budget(64 << 20)
        .table_name("orders-leases")
        .table_options(
            crate::TableOptions::default()
                .capacity(crate::Capacity::Provisioned { read: 5, write: 7 })
                .creation(crate::TableCreation::Never)
                .tag("team", "payments")
                .tag("env", "prod")
                .point_in_time_recovery(true)
                .deletion_protection(true)
                .kms_key("alias/kcl"),
        )
        .worker_id("w-1")
        .lease_duration(Duration::from_secs(20))
        .renew_interval(Duration::from_secs(5))
        .renewal(LeaseRenewal::PerLease)
        .taker_interval(Duration::from_secs(7))
        .max_leases_per_worker(50)
        .max_leases_to_steal(2)
        .handoff_timeout(Duration::from_secs(25))
        .balance(crate::Balance::ByCount)
        .load_report_interval(Duration::from_secs(90))
        .initial_position(InitialPosition::AtTimestamp(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_564_800),
        ))
        .failure_policy(FailurePolicy::Skip)
        .parallelism_per_shard(4)
        .checkpoint_policy(CheckpointPolicy::every(Duration::from_secs(5)).or_every_records(1000))
        .shard_sync_interval(Duration::from_secs(120))
        .parent_poll_interval(Duration::from_secs(3))
        .shutdown_timeout(Duration::from_secs(30))
        .completed_lease_retention(Duration::from_secs(600))
        .removed_stream_policy(RemovedStreamPolicy::DeleteAfter(Duration::from_secs(3600)))
        .max_read_failure_time(Duration::from_secs(90))
        .liveness_stall_bound(Duration::from_secs(600))
        .serve_health("127.0.0.1:0".parse().expect("an address"))
        .processor_warn_after(Duration::from_secs(90))
        .processor_timeout(Duration::from_secs(300))
        .max_records(500)
        .idle_time_between_reads(Duration::from_millis(1500))
        .time_between_reads(Duration::from_millis(200));
    #[cfg(feature = "prometheus")]
    let builder = builder.serve_metrics("127.0.0.1:0".parse().expect("an address"));
    builder
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(field, value)| (variable("KCL", field), (*value).to_owned()))
        .collect();
    move |var| map.get(var).cloned()
}

#[test]
fn every_field_is_named_in_the_round_trip() {
    let covered: Vec<&str> = every_field().iter().map(|(f, _)| *f).collect();
    for field in FIELDS {
        assert!(
            covered.contains(field) || (*field == "serve_metrics" && !cfg!(feature = "prometheus")),
            "{field} has no value in every_field()"
        );
    }
}

#[test]
fn every_setting_read_from_its_variable_reaches_the_builder_as_written_in_code() {
    let settings = Settings::from_lookup("KCL", env(&every_field())).expect("valid settings");
    let from_env = settings.worker_builder().expect("an application name");
    assert_eq!(
        format!("{from_env:?}"),
        format!("{:?}", every_field_in_code())
    );
    // And `build()` accepts them together.
    from_env
        .sdk_config(&offline_sdk())
        .processor(|_: &crate::ShardContext| NoOp)
        .build()
        .expect("every setting valid");
}

#[test]
fn each_variable_alone_changes_the_builder() {
    let base = || Worker::builder("orders").worker_id("base");
    let unchanged = format!("{:?}", base());
    for (field, value) in every_field() {
        if field == "application_name" || field == "enhanced_fan_out" {
            continue;
        }
        let settings = Settings::from_lookup("KCL", env(&[(field, value)]))
            .unwrap_or_else(|e| panic!("{field}: {e}"));
        let applied = settings.apply(base()).expect("applies");
        assert_ne!(format!("{applied:?}"), unchanged, "{field} had no effect");
    }
    let fan_out = Settings::from_lookup("KCL", env(&[("enhanced_fan_out", "true")]))
        .expect("valid")
        .apply(base())
        .expect("applies");
    assert_eq!(
        format!("{fan_out:?}"),
        format!("{:?}", base().enhanced_fan_out())
    );
}

#[test]
fn a_wrong_value_is_refused_with_its_variable_named() {
    for field in FIELDS {
        // Free text: refused, if at all, by `build()` (see the next test).
        if matches!(
            *field,
            "application_name" | "table_name" | "worker_id" | "streams" | "table_kms_key"
        ) {
            continue;
        }
        let error = Settings::from_lookup("KCL", env(&[(field, "§nonsense§")])).expect_err(field);
        let var = variable("KCL", field);
        let problems: Vec<_> = error.problems().collect();
        assert_eq!(problems.len(), 1, "{field}: {error}");
        assert_eq!(problems[0].0, var, "{error}");
        assert!(
            error
                .to_string()
                .starts_with(&format!("invalid settings: {var} is \"§nonsense§\"")),
            "{error}"
        );
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let error = Settings::from_lookup(
        "KCL",
        env(&[
            ("lease_duration", "10"),
            ("renewal", "sometimes"),
            ("streams", "a,,b"),
        ]),
    )
    .expect_err("three bad values");
    let vars: Vec<&str> = error.problems().map(|(var, _)| var).collect();
    assert_eq!(vars, ["KCL_STREAMS", "KCL_LEASE_DURATION", "KCL_RENEWAL"]);
}

/// What `build()` refuses of a builder `settings` apply to, and where
/// `settings` say its first problem came from.
fn refused(settings: &Settings, builder: WorkerBuilder) -> (crate::Error, String) {
    let error = settings
        .apply(builder)
        .expect("applies")
        .sdk_config(&offline_sdk())
        .processor(|_: &crate::ShardContext| NoOp)
        .build()
        .expect_err("refused");
    let blamed = settings.blame(&error).expect("a setting");
    let origin = blamed.problems().next().expect("a problem").0.to_owned();
    (error, origin)
}

#[test]
fn a_setting_build_refuses_is_blamed_on_its_variable() {
    let settings = Settings::from_lookup("APP", |var| {
        (var == "APP_TABLE_NAME").then(|| "x".to_owned())
    })
    .expect("parses");
    let (_, origin) = refused(&settings, Worker::builder("orders").stream("orders"));
    assert_eq!(origin, "APP_TABLE_NAME", "a one-letter table name");
}

/// `AT_TIMESTAMP` in epoch milliseconds, read as seconds (the year
/// 56,000), is refused by `build()` and blamed on its variable; every shard
/// skipped what was written until then.
#[test]
fn an_initial_timestamp_in_milliseconds_is_blamed_on_its_variable() {
    let settings = Settings::from_lookup("APP", |var| {
        (var == "APP_INITIAL_POSITION").then(|| "AT_TIMESTAMP=1714564800000".to_owned())
    })
    .expect("parses");
    let (error, origin) = refused(&settings, Worker::builder("orders").stream("orders"));
    assert_eq!(
        origin, "APP_INITIAL_POSITION",
        "a time thousands of years ahead"
    );
    assert!(error.to_string().contains("milliseconds"), "{error}");
}

#[test]
fn an_empty_variable_is_unset() {
    let settings = Settings::from_lookup("KCL", env(&[("lease_duration", "  ")])).expect("valid");
    assert!(settings.lease_duration.is_none());
}

#[test]
fn the_application_name_is_required_for_a_builder() {
    let error = Settings::default().worker_builder().expect_err("no name");
    assert_eq!(
        error.problems().next().map(|(o, _)| o),
        Some("application_name")
    );
}

/// A required setting left unset is named by the variable that sets it,
/// as a setting that is set is: it said `application_name` and `streams`,
/// names an operator sets no variable by.
#[test]
fn a_required_setting_left_unset_is_named_by_its_variable() {
    let settings = Settings::from_lookup("APP", |_| None).expect("nothing set");
    let error = settings.worker_builder().expect_err("no name");
    assert_eq!(
        error.problems().next().map(|(o, _)| o),
        Some("APP_APPLICATION_NAME")
    );
    let (_, origin) = refused(&settings, Worker::builder("orders"));
    assert_eq!(origin, "APP_STREAMS", "no stream");
    // A field no setting has was set in code: its own name, no variable.
    let error = crate::Error::from(kcl_core::ConfigError {
        field: "retry_min_delay",
        reason: "must be above zero".into(),
    });
    let blamed = settings.blame(&error).expect("a setting");
    assert_eq!(
        blamed.problems().next().map(|(o, _)| o),
        Some("retry_min_delay")
    );
}

#[test]
fn a_toml_file_gives_the_same_builder_as_the_environment() {
    let mut document = String::new();
    for (field, value) in every_field() {
        let value = match field {
            "streams" => "[\"orders\", \"payments\"]".to_owned(),
            "multi_stream" | "enhanced_fan_out" => value.to_owned(),
            "table_point_in_time_recovery" | "table_deletion_protection" => value.to_owned(),
            "max_leases_per_worker" | "max_records" => value.to_owned(),
            _ => format!("{value:?}"),
        };
        document.push_str(&format!("{field} = {value}\n"));
    }
    let from_file = Settings::from_toml(&document).expect("valid TOML settings");
    let from_env = Settings::from_lookup("KCL", env(&every_field())).expect("valid");
    assert_eq!(
        format!("{:?}", from_file.worker_builder().expect("named")),
        format!("{:?}", from_env.worker_builder().expect("named")),
    );
    // The same through serde, which YAML or JSON readers use.
    let through_serde: Settings = toml::from_str(&document).expect("deserializes");
    assert_eq!(
        format!("{:?}", through_serde.worker_builder().expect("named")),
        format!("{:?}", every_field_in_code()),
    );
}

#[test]
fn an_unknown_key_in_a_file_is_an_error_naming_it() {
    let error = Settings::from_toml("lease_duraton = \"10s\"").expect_err("a typo");
    let (origin, reason) = error.problems().next().expect("one problem");
    assert_eq!(origin, "lease_duraton in the settings");
    assert!(reason.contains("lease_duration"), "{reason}");
}

/// `pairs` as a listing of variables, named as they are set.
fn listing(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    (pairs.iter())
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn a_misspelt_variable_is_reported_with_the_setting_it_is_close_to() {
    let settings = Settings::from_vars(
        "KCL",
        listing(&[
            ("KCL_APPLICATION_NAME", "orders"),
            ("KCL_LEASE_DURATON", "30s"),
            ("KCL_STREAM", "orders"),
            ("kcl_max_records", "100"),
            ("KCL_TAKER_INTERVAL", "5s"),
        ]),
    )
    .expect("valid");
    let misses: Vec<(&str, &str)> = (settings.near_misses().iter())
        .map(|m| (m.variable.as_str(), m.meant.as_str()))
        .collect();
    assert_eq!(
        misses,
        [
            ("KCL_LEASE_DURATON", "KCL_LEASE_DURATION"),
            ("KCL_STREAM", "KCL_STREAMS"),
            ("kcl_max_records", "KCL_MAX_RECORDS"),
        ]
    );
    assert_eq!(
        settings.near_misses()[0].to_string(),
        "KCL_LEASE_DURATON is not a kcl setting and is ignored; did you mean KCL_LEASE_DURATION?"
    );
    // The misspelt ones stay unset; the rest are read.
    assert_eq!(settings.lease_duration, None);
    assert_eq!(settings.taker_interval, Some(Duration::from_secs(5)));
}

#[test]
fn the_applications_own_variables_under_the_prefix_are_not_near_misses() {
    let settings = Settings::from_vars(
        "KCL",
        listing(&[
            ("KCL_LOG_FORMAT", "json"),
            ("KCL_SUMMARY_INTERVAL", "1m"),
            ("KCL_PORT", "8080"),
            ("KCL_REGION", "eu-west-1"),
            ("KCLX_LEASE_DURATION", "30s"),
            ("LEASE_DURATION", "30s"),
        ]),
    )
    .expect("valid");
    assert_eq!(settings.near_misses(), &[]);
}

#[test]
fn no_settings_variable_is_a_near_miss_of_another() {
    for field in FIELDS {
        assert_eq!(
            super::near_miss::of_variable("KCL", &variable("KCL", field)),
            None
        );
    }
}

#[test]
fn a_misspelt_key_in_a_file_names_the_setting_it_is_close_to() {
    let error = Settings::from_toml("max_record = 100").expect_err("a typo");
    let (_, reason) = error.problems().next().expect("one problem");
    assert_eq!(reason, "is not a setting; did you mean max_records?");
}

#[test]
fn the_environment_overrides_the_file() {
    let file = Settings::from_toml("lease_duration = \"20s\"\nmax_records = 100").expect("valid");
    let env = Settings::from_lookup("KCL", env(&[("lease_duration", "30s")])).expect("valid");
    let merged = file.overlaid_by(env);
    assert_eq!(merged.lease_duration, Some(Duration::from_secs(30)));
    assert_eq!(merged.max_records, Some(100));
    assert_eq!(merged.origin("lease_duration"), "KCL_LEASE_DURATION");
    assert_eq!(merged.origin("max_records"), "max_records in the settings");
}

#[cfg(not(feature = "prometheus"))]
#[test]
fn serving_metrics_without_the_prometheus_feature_is_refused() {
    let settings =
        Settings::from_lookup("KCL", env(&[("serve_metrics", "0.0.0.0:9090")])).expect("parses");
    let error = settings
        .apply(Worker::builder("orders"))
        .expect_err("no feature");
    assert_eq!(
        error.problems().next().map(|(o, _)| o),
        Some("KCL_SERVE_METRICS")
    );
}

#[test]
fn durations_need_a_unit_and_may_be_fractional() {
    let parse = Settings::parse_duration;
    assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
    assert_eq!(parse(" 2m "), Ok(Duration::from_secs(120)));
    assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
    for bad in [
        "10",
        "s",
        "",
        "0s",
        "-1s",
        "1.2.3s",
        "10 sec",
        "99999999999999999999h",
    ] {
        let e = parse(bad).expect_err(bad);
        assert!(e.contains("500ms"), "{bad}: {e}");
    }
}

#[test]
fn initial_positions_by_name_or_timestamp() {
    let parse = super::parse::initial_position;
    assert_eq!(parse("latest"), Ok(InitialPosition::Latest));
    assert_eq!(parse("TRIM_HORIZON"), Ok(InitialPosition::TrimHorizon));
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_564_800);
    for v in [
        "AT_TIMESTAMP=2024-05-01T12:00:00Z",
        "AT_TIMESTAMP=2024-05-01T14:00:00+02:00",
        "at_timestamp=1714564800",
    ] {
        assert_eq!(parse(v), Ok(InitialPosition::AtTimestamp(at)), "{v}");
    }
    for v in [
        "EARLIEST",
        "AT_TIMESTAMP=",
        "AT_TIMESTAMP=yesterday",
        "AT_SEQUENCE=5",
    ] {
        assert!(parse(v).is_err(), "{v}");
    }
}

#[test]
fn names_match_in_any_case_with_dashes_and_aliases() {
    use super::parse::{balance, boolean, failure_policy, renewal, table_creation};
    assert_eq!(renewal("Per-Lease"), Ok(LeaseRenewal::PerLease));
    assert_eq!(renewal("worker_liveness"), Ok(LeaseRenewal::WorkerLiveness));
    assert_eq!(balance(" COUNT "), Ok(crate::Balance::ByCount));
    assert_eq!(
        table_creation("if-missing"),
        Ok(crate::TableCreation::IfMissing)
    );
    assert_eq!(boolean("Yes"), Ok(true));
    assert_eq!(boolean("off"), Ok(false));
    assert!(matches!(
        failure_policy("ISOLATE"),
        Ok(FailurePolicy::Isolate(_))
    ));
    // The error suggests each choice's first name, not its aliases.
    assert_eq!(
        failure_policy("stop").expect_err("no such policy"),
        "is \"stop\"; expected retry, skip, release_shard or isolate"
    );
    assert_eq!(
        renewal("sometimes").expect_err("no such renewal"),
        "is \"sometimes\"; expected liveness or per_lease"
    );
    assert_eq!(
        boolean("maybe").expect_err("not a boolean"),
        "is \"maybe\"; expected true or false"
    );
}

#[test]
fn checkpoint_policies_and_sizes_in_text() {
    let policy = super::parse::checkpoint_policy;
    assert_eq!(policy("every_call"), Ok(CheckpointPolicy::every_call()));
    assert_eq!(
        policy("1000 records"),
        Ok(CheckpointPolicy::every_records(1000))
    );
    assert_eq!(
        policy("5s"),
        Ok(CheckpointPolicy::every(Duration::from_secs(5)))
    );
    for bad in ["5s or 6s", "records", "5 or 1000 records", ""] {
        assert!(policy(bad).is_err(), "{bad}");
    }
    let bytes = super::parse::bytes;
    assert_eq!(bytes("1048576"), Ok(1 << 20));
    assert_eq!(bytes("512KiB"), Ok(512 << 10));
    assert_eq!(bytes("1GiB"), Ok(1 << 30));
    assert!(bytes("1GB").is_err());
}

#[cfg(unix)]
#[test]
fn a_variable_that_is_not_utf8_is_refused_not_mangled() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"orders-\xff").to_owned();
    let error = Settings::from_variables("KCL", |var| {
        (var == "KCL_TABLE_NAME").then(|| super::os_text(bad.clone()))
    })
    .expect_err("not UTF-8");
    assert_eq!(
        error.problems().next().map(|(o, _)| o),
        Some("KCL_TABLE_NAME")
    );
}

/// A setting overrides what it names and nothing more: one `table_`
/// variable keeps the table options the code gave (a creation of `Never`,
/// a KMS key, point-in-time recovery) and adds its tags; fan-out asked
/// for keeps the code's fan-out settings, and polling asked for drops
/// them. Before, one `table_` variable replaced the code's options with
/// the defaults (a table the operator said must never be created was
/// created, unencrypted), `true` replaced the fan-out settings, and
/// `false` was ignored.
#[test]
fn a_setting_keeps_what_the_code_set_beside_it() {
    let code = || {
        Worker::builder("orders").worker_id("base").table_options(
            crate::TableOptions::default()
                .creation(crate::TableCreation::Never)
                .kms_key("alias/kcl")
                .point_in_time_recovery(true)
                .tag("team", "payments"),
        )
    };
    let tagged = Settings::from_lookup("KCL", env(&[("table_tags", "env=prod")]))
        .unwrap()
        .apply(code())
        .unwrap();
    let want = code().table_options(
        crate::TableOptions::default()
            .creation(crate::TableCreation::Never)
            .kms_key("alias/kcl")
            .point_in_time_recovery(true)
            .tag("team", "payments")
            .tag("env", "prod"),
    );
    assert_eq!(format!("{tagged:?}"), format!("{want:?}"));

    let fan_out = || {
        Worker::builder("orders")
            .worker_id("base")
            .retrieval(crate::Retrieval::FanOut(
                crate::FanOutConfig::builder()
                    .consumer_name("own")
                    .build()
                    .unwrap(),
            ))
    };
    let kept = Settings::from_lookup("KCL", env(&[("enhanced_fan_out", "true")]))
        .unwrap()
        .apply(fan_out())
        .unwrap();
    assert_eq!(format!("{kept:?}"), format!("{:?}", fan_out()));
    let polling = Settings::from_lookup("KCL", env(&[("enhanced_fan_out", "false")]))
        .unwrap()
        .apply(fan_out())
        .unwrap();
    assert_eq!(
        format!("{polling:?}"),
        format!("{:?}", Worker::builder("orders").worker_id("base"))
    );
}
