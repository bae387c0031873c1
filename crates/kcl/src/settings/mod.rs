//! A worker's settings from the environment or a file, so a service
//! deployed on ECS or Kubernetes is configured without code.
//!
//! Every field is named as the [`WorkerBuilder`] setter it feeds. From the
//! environment, a field is the variable `<PREFIX>_<FIELD>` in upper case
//! (`KCL_LEASE_DURATION` for `lease_duration` with the prefix `KCL`); other
//! variables under the prefix are left to the application, but one close to
//! a setting's (`KCL_LEASE_DURATON`, `KCL_STREAM`) is logged as a warning
//! naming the setting, and listed by [`Settings::near_misses`]. From a file
//! (TOML with [`Settings::from_toml`], or any serde format through
//! [`Settings`]' `Deserialize`), a field is its own key and an unknown key
//! is an error: a typo in a file must not be silently ignored.
//!
//! | field | value |
//! | --- | --- |
//! | `application_name` | also names the lease table (required by [`Settings::worker_builder`]) |
//! | `streams` | comma-separated names or ARNs (a list in a file) |
//! | `table_name`, `worker_id` | text |
//! | `multi_stream`, `enhanced_fan_out` | `true` or `false` |
//! | `table_capacity` | `on_demand` or `provisioned:<read>:<write>` |
//! | `table_creation` | `if_missing` or `never` (startup fails naming a missing table) |
//! | `table_tags` | `key=value` pairs, comma-separated |
//! | `table_point_in_time_recovery`, `table_deletion_protection` | `true` or `false`, for a table kcl creates |
//! | `table_kms_key` | a KMS key id, ARN or alias to encrypt a table kcl creates |
//! | `lease_duration`, `renew_interval`, `taker_interval`, `handoff_timeout`, `load_report_interval`, `shard_sync_interval`, `parent_poll_interval`, `shutdown_timeout`, `completed_lease_retention`, `max_read_failure_time`, `liveness_stall_bound`, `processor_warn_after`, `processor_timeout`, `idle_time_between_reads`, `time_between_reads` | a duration: `500ms`, `10s`, `1.5m`, `1h` |
//! | `renewal` | `liveness` or `per_lease` |
//! | `balance` | `by_load` or `by_count` |
//! | `max_leases_per_worker`, `max_leases_to_steal`, `parallelism_per_shard`, `max_records` | a whole number |
//! | `initial_position` | `LATEST`, `TRIM_HORIZON` or `AT_TIMESTAMP=<RFC 3339 or epoch seconds>` |
//! | `failure_policy` | `retry`, `skip`, `release_shard` or `isolate` (poison records dropped and counted) |
//! | `checkpoint_policy` | `every_call`, `5s`, `1000 records` or `5s or 1000 records` |
//! | `removed_stream_policy` | `keep` or `delete_after=<duration>` |
//! | `prefetch_budget` | bytes: `1048576`, `512KiB`, `64MiB`, `1GiB` |
//! | `serve_health` | an address such as `0.0.0.0:8080`: `/healthz`, `/readyz`, `/status` |
//! | `serve_metrics` | an address such as `0.0.0.0:9090` (feature `prometheus`) |
//!
//! An empty variable counts as unset (templated manifests render an absent
//! value as ""). Every problem is reported at once, each naming where the
//! value came from, so a deployment is fixed in one round.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = [("KCL_APPLICATION_NAME", "orders"), ("KCL_STREAMS", "orders"), ("KCL_LEASE_DURATION", "15s")];
//! let from_env = kcl::Settings::from_lookup("KCL", |var| {
//!     env.iter().find(|(k, _)| *k == var).map(|(_, v)| v.to_string())
//! })?;
//! let from_file = kcl::Settings::from_toml("max_leases_to_steal = 2\ninitial_position = \"TRIM_HORIZON\"")?;
//! // The environment wins over the file; then the code adds the rest.
//! let builder = from_file.overlaid_by(from_env).worker_builder()?;
//! # let _ = builder;
//! # Ok(())
//! # }
//! ```

mod near_miss;
mod parse;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kcl_core::checkpointer::CheckpointPolicy;
use kcl_core::config::{Balance, LeaseRenewal};
use kcl_core::processor::FailurePolicy;
use kcl_core::source::InitialPosition;
use kcl_core::worker::RemovedStreamPolicy;
use kcl_dynamodb::{Capacity, TableCreation, TableOptions};

use crate::{Error, WorkerBuilder};

pub use near_miss::NearMiss;

/// Declares the fields once: the struct, the names, the parsers, merging,
/// and (for the `forward` group) the builder setter of the same name.
macro_rules! settings {
    (
        special { $( $(#[$sdoc:meta])* $sname:ident: $sty:ty = $sparse:path, )* }
        forward { $( $(#[$fdoc:meta])* $fname:ident: $fty:ty = $fparse:path, )* }
    ) => {
        /// A worker's settings as loaded from the environment or a file;
        /// `None` leaves the builder's default. See the module docs for
        /// each field's text form.
        #[derive(Debug, Clone, Default)]
        #[non_exhaustive]
        pub struct Settings {
            $( $(#[$sdoc])* pub $sname: Option<$sty>, )*
            $( $(#[$fdoc])* pub $fname: Option<$fty>, )*
            /// Where each set field came from (a variable, or a key in a
            /// file), to name it in an error `build()` returns later.
            origins: BTreeMap<&'static str, String>,
            /// Variables under the prefix that are close to a setting.
            near_misses: Vec<NearMiss>,
            /// The variables' prefix, when read from the environment: an
            /// error about a setting left unset names its variable.
            prefix: Option<String>,
        }

        /// Every field's name, in declaration order.
        pub(crate) const FIELDS: &[&str] = &[$( stringify!($sname), )* $( stringify!($fname), )*];

        impl Settings {
            /// Parses `raw` into `field`; `None` if there is no such field.
            fn set(&mut self, field: &str, raw: &str) -> Option<Result<(), String>> {
                match field {
                    $( stringify!($sname) => Some($sparse(raw).map(|v| self.$sname = Some(v))), )*
                    $( stringify!($fname) => Some($fparse(raw).map(|v| self.$fname = Some(v))), )*
                    _ => None,
                }
            }

            /// These settings with every field `over` sets replaced by its
            /// value.
            pub fn overlaid_by(mut self, over: Settings) -> Settings {
                $( if over.$sname.is_some() { self.$sname = over.$sname; } )*
                $( if over.$fname.is_some() { self.$fname = over.$fname; } )*
                self.origins.extend(over.origins);
                self.near_misses.extend(over.near_misses);
                self.prefix = over.prefix.or(self.prefix);
                self
            }

            fn forward(&self, mut builder: WorkerBuilder) -> WorkerBuilder {
                $( if let Some(value) = &self.$fname { builder = builder.$fname(value.clone()); } )*
                builder
            }
        }
    };
}

settings! {
    special {
        /// The application name, which also names the lease table.
        application_name: String = parse::text,
        /// The streams, by name or ARN.
        streams: Vec<String> = parse::list,
        /// See [`WorkerBuilder::multi_stream`].
        multi_stream: bool = parse::boolean,
        /// See [`WorkerBuilder::enhanced_fan_out`].
        enhanced_fan_out: bool = parse::boolean,
        /// See [`WorkerBuilder::prefetch_budget`].
        prefetch_budget: usize = parse::bytes,
        /// The metrics and probes address; see `WorkerBuilder::serve_metrics`
        /// (feature `prometheus`).
        serve_metrics: SocketAddr = parse::address,
        /// See [`WorkerBuilder::serve_health`].
        serve_health: SocketAddr = parse::address,
        /// See [`WorkerBuilder::table_capacity`].
        table_capacity: Capacity = parse::capacity,
        /// See [`TableOptions::creation`].
        table_creation: TableCreation = parse::table_creation,
        /// See [`TableOptions::tag`].
        table_tags: Vec<(String, String)> = parse::tags,
        /// See [`TableOptions::point_in_time_recovery`].
        table_point_in_time_recovery: bool = parse::boolean,
        /// See [`TableOptions::deletion_protection`].
        table_deletion_protection: bool = parse::boolean,
        /// See [`TableOptions::kms_key`].
        table_kms_key: String = parse::text,
    }
    forward {
        /// See [`WorkerBuilder::table_name`].
        table_name: String = parse::text,
        /// See [`WorkerBuilder::worker_id`].
        worker_id: String = parse::text,
        /// See [`WorkerBuilder::lease_duration`].
        lease_duration: Duration = parse::duration,
        /// See [`WorkerBuilder::renew_interval`].
        renew_interval: Duration = parse::duration,
        /// See [`WorkerBuilder::renewal`].
        renewal: LeaseRenewal = parse::renewal,
        /// See [`WorkerBuilder::taker_interval`].
        taker_interval: Duration = parse::duration,
        /// See [`WorkerBuilder::max_leases_per_worker`].
        max_leases_per_worker: usize = parse::count,
        /// See [`WorkerBuilder::max_leases_to_steal`].
        max_leases_to_steal: usize = parse::count,
        /// See [`WorkerBuilder::handoff_timeout`].
        handoff_timeout: Duration = parse::duration,
        /// See [`WorkerBuilder::balance`].
        balance: Balance = parse::balance,
        /// See [`WorkerBuilder::load_report_interval`].
        load_report_interval: Duration = parse::duration,
        /// See [`WorkerBuilder::initial_position`].
        initial_position: InitialPosition = parse::initial_position,
        /// See [`WorkerBuilder::failure_policy`].
        failure_policy: FailurePolicy = parse::failure_policy,
        /// See [`WorkerBuilder::parallelism_per_shard`].
        parallelism_per_shard: usize = parse::count,
        /// See [`WorkerBuilder::checkpoint_policy`].
        checkpoint_policy: CheckpointPolicy = parse::checkpoint_policy,
        /// See [`WorkerBuilder::shard_sync_interval`].
        shard_sync_interval: Duration = parse::duration,
        /// See [`WorkerBuilder::parent_poll_interval`].
        parent_poll_interval: Duration = parse::duration,
        /// See [`WorkerBuilder::shutdown_timeout`].
        shutdown_timeout: Duration = parse::duration,
        /// See [`WorkerBuilder::completed_lease_retention`].
        completed_lease_retention: Duration = parse::duration,
        /// See [`WorkerBuilder::removed_stream_policy`].
        removed_stream_policy: RemovedStreamPolicy = parse::removed_stream_policy,
        /// See [`WorkerBuilder::max_read_failure_time`].
        max_read_failure_time: Duration = parse::duration,
        /// See [`WorkerBuilder::liveness_stall_bound`].
        liveness_stall_bound: Duration = parse::duration,
        /// See [`WorkerBuilder::processor_warn_after`].
        processor_warn_after: Duration = parse::duration,
        /// See [`WorkerBuilder::processor_timeout`].
        processor_timeout: Duration = parse::duration,
        /// See [`WorkerBuilder::max_records`].
        max_records: i32 = parse::records_per_call,
        /// See [`WorkerBuilder::idle_time_between_reads`].
        idle_time_between_reads: Duration = parse::duration,
        /// See [`WorkerBuilder::time_between_reads`].
        time_between_reads: Duration = parse::duration,
    }
}

/// Settings that could not be read: every problem found, each naming the
/// variable or the file key it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    problems: Vec<(String, String)>,
}

impl SettingsError {
    fn one(origin: impl Into<String>, reason: impl Into<String>) -> Self {
        SettingsError {
            problems: vec![(origin.into(), reason.into())],
        }
    }

    /// Each problem: where the value came from (`KCL_LEASE_DURATION`,
    /// `lease_duration in kcl.toml`) and why it was refused.
    pub fn problems(&self) -> impl Iterator<Item = (&str, &str)> {
        self.problems.iter().map(|(o, r)| (o.as_str(), r.as_str()))
    }
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid settings: ")?;
        for (i, (origin, reason)) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{origin} {reason}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SettingsError {}

impl Settings {
    /// Reads `<prefix>_<FIELD>` for every field from the process's
    /// environment. A variable that is not UTF-8 is refused, not ignored;
    /// one close to a setting's is a [near miss](Self::near_misses).
    pub fn from_env(prefix: &str) -> Result<Settings, SettingsError> {
        // A name that is not UTF-8 cannot be a setting's nor close to one.
        let vars = std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, os_text(value))));
        Self::from_listing(prefix, vars)
    }

    /// [`Self::from_env`] over the variables `vars` (for tests, or another
    /// source of variables that can be listed), near misses included.
    pub fn from_vars(
        prefix: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, SettingsError> {
        Self::from_listing(prefix, vars.into_iter().map(|(k, v)| (k, Ok(v))))
    }

    fn from_listing(
        prefix: &str,
        vars: impl IntoIterator<Item = (String, Result<String, String>)>,
    ) -> Result<Settings, SettingsError> {
        let vars: BTreeMap<String, Result<String, String>> = vars.into_iter().collect();
        // Logged before the settings are read, so that a startup they fail
        // still names the misspelling beside the error.
        let misses: Vec<NearMiss> = (vars.keys())
            .filter_map(|name| near_miss::of_variable(prefix, name))
            .inspect(
                |miss| tracing::warn!(variable = %miss.variable, meant = %miss.meant, "{miss}"),
            )
            .collect();
        let mut settings = Self::from_variables(prefix, |var| vars.get(var).cloned())?;
        settings.near_misses = misses;
        Ok(settings)
    }

    /// Variables under the prefix that name no setting but are close to
    /// one (most likely misspelt), as [`Self::from_env`] or
    /// [`Self::from_vars`] found them; each was also logged as a warning.
    /// [`Self::from_lookup`] cannot list variables, so it finds none.
    pub fn near_misses(&self) -> &[NearMiss] {
        &self.near_misses
    }

    /// [`Self::from_env`] with the variables looked up by `lookup` (for
    /// tests, or another source of variables).
    pub fn from_lookup(
        prefix: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, SettingsError> {
        Self::from_variables(prefix, |var| lookup(var).map(Ok))
    }

    /// Each field's variable, looked up: unset, its text, or why it has
    /// none.
    fn from_variables(
        prefix: &str,
        lookup: impl Fn(&str) -> Option<Result<String, String>>,
    ) -> Result<Settings, SettingsError> {
        let mut settings = Settings {
            prefix: Some(prefix.to_owned()),
            ..Settings::default()
        };
        let mut problems = Vec::new();
        for &field in FIELDS {
            let var = variable(prefix, field);
            match lookup(&var) {
                None => {}
                Some(Ok(raw)) if raw.trim().is_empty() => {}
                Some(Ok(raw)) => settings.note(field, var, &raw, &mut problems),
                Some(Err(reason)) => problems.push((var, reason)),
            }
        }
        settings.finish(problems)
    }

    /// Reads a TOML document whose keys are the field names; an unknown key
    /// is an error. Values are strings as in the environment, or TOML
    /// integers, booleans and (for `streams`) arrays of strings.
    pub fn from_toml(document: &str) -> Result<Settings, SettingsError> {
        Self::from_toml_named(document, "the settings")
    }

    /// Reads a TOML file (see [`Self::from_toml`]); errors name the file.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Settings, SettingsError> {
        let path = path.as_ref();
        let document = std::fs::read_to_string(path).map_err(|e| {
            SettingsError::one(path.display().to_string(), format!("cannot be read: {e}"))
        })?;
        Self::from_toml_named(&document, &path.display().to_string())
    }

    fn from_toml_named(document: &str, name: &str) -> Result<Settings, SettingsError> {
        let table: toml::Table = toml::from_str(document)
            .map_err(|e| SettingsError::one(name, format!("is not valid TOML: {e}")))?;
        Self::from_pairs(table.into_iter().map(|(k, v)| (k, toml_text(v))), name)
    }

    /// Parses key/value pairs of a file called `name`.
    fn from_pairs(
        pairs: impl IntoIterator<Item = (String, Result<String, String>)>,
        name: &str,
    ) -> Result<Settings, SettingsError> {
        let mut settings = Settings::default();
        let mut problems = Vec::new();
        for (key, value) in pairs {
            let origin = format!("{key} in {name}");
            let Some(&field) = FIELDS.iter().find(|f| **f == key) else {
                let reason = match near_miss::closest(&key) {
                    Some(meant) => format!("is not a setting; did you mean {meant}?"),
                    None => format!("is not a setting; the settings are {}", FIELDS.join(", ")),
                };
                problems.push((origin, reason));
                continue;
            };
            match value {
                Ok(raw) => settings.note(field, origin, &raw, &mut problems),
                Err(reason) => problems.push((origin, reason)),
            }
        }
        settings.finish(problems)
    }

    fn note(
        &mut self,
        field: &'static str,
        origin: String,
        raw: &str,
        problems: &mut Vec<(String, String)>,
    ) {
        match self.set(field, raw) {
            Some(Ok(())) => {
                self.origins.insert(field, origin);
            }
            Some(Err(reason)) => problems.push((origin, reason)),
            None => unreachable!("{field} is in FIELDS"),
        }
    }

    fn finish(self, problems: Vec<(String, String)>) -> Result<Settings, SettingsError> {
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(SettingsError { problems })
        }
    }

    /// A builder for `application_name` with every setting applied; the
    /// caller adds the AWS configuration and the processor.
    pub fn worker_builder(&self) -> Result<WorkerBuilder, SettingsError> {
        let app = self.application_name.clone().ok_or_else(|| {
            SettingsError::one(
                self.named("application_name"),
                "is required: the application name, which also names the lease table",
            )
        })?;
        self.apply(crate::Worker::builder(app))
    }

    /// Applies every setting that is set to `builder` (all but
    /// `application_name`, which names the builder). Each overrides only
    /// what it names: a `table_` setting keeps the table options the code
    /// gave beside it (its tags add to the code's), and `enhanced_fan_out`
    /// keeps a retrieval of the kind it asks for.
    pub fn apply(&self, mut builder: WorkerBuilder) -> Result<WorkerBuilder, SettingsError> {
        for stream in self.streams.iter().flatten() {
            builder = builder.stream(stream);
        }
        if let Some(on) = self.multi_stream {
            builder = builder.multi_stream(on);
        }
        if let Some(on) = self.enhanced_fan_out {
            builder = builder.fan_out_or_polling(on);
        }
        if let Some(bytes) = self.prefetch_budget {
            builder = builder.prefetch_budget(bytes);
        }
        if let Some(options) = self.table_options(builder.table_options_so_far().clone()) {
            builder = builder.table_options(options);
        }
        if let Some(addr) = self.serve_health {
            builder = builder.serve_health(addr);
        }
        if let Some(addr) = self.serve_metrics {
            builder = serve_metrics(builder, addr, self.origin("serve_metrics"))?;
        }
        Ok(self.forward(builder))
    }

    /// Parses a duration in the settings' text form (`500ms`, `10s`,
    /// `1.5m`, `1h`; a bare number is refused), for an application's own
    /// settings beside kcl's. The error says what was expected.
    pub fn parse_duration(value: &str) -> Result<Duration, String> {
        parse::duration(value)
    }

    /// `options` (the builder's) with the `table_` fields that are set, if
    /// any is: what the code set stays wherever no setting overrides it (a
    /// KMS key, a creation of `Never`), and tags add to its tags.
    fn table_options(&self, mut options: TableOptions) -> Option<TableOptions> {
        let set = self.table_capacity.is_some()
            || self.table_creation.is_some()
            || self.table_tags.is_some()
            || self.table_point_in_time_recovery.is_some()
            || self.table_deletion_protection.is_some()
            || self.table_kms_key.is_some();
        if !set {
            return None;
        }
        if let Some(capacity) = self.table_capacity {
            options = options.capacity(capacity);
        }
        if let Some(creation) = self.table_creation {
            options = options.creation(creation);
        }
        if let Some(on) = self.table_point_in_time_recovery {
            options = options.point_in_time_recovery(on);
        }
        if let Some(on) = self.table_deletion_protection {
            options = options.deletion_protection(on);
        }
        for (key, value) in self.table_tags.iter().flatten() {
            options = options.tag(key, value);
        }
        if let Some(key) = &self.table_kms_key {
            options = options.kms_key(key);
        }
        Some(options)
    }

    /// Where `field` was set (a variable or a file key), or the field's
    /// own name if it was set in code.
    pub fn origin<'a>(&'a self, field: &'a str) -> &'a str {
        match self.origins.get(field) {
            Some(origin) => origin,
            None => field,
        }
    }

    /// Where `field` came from, or, unset, the variable that would set it
    /// (the field's own name without a prefix, and for a field no setting
    /// has, set in code): what an error names.
    fn named(&self, field: &str) -> String {
        match (self.origins.get(field), &self.prefix) {
            (Some(origin), _) => origin.clone(),
            (None, Some(prefix)) if FIELDS.contains(&field) => variable(prefix, field),
            (None, _) => field.to_owned(),
        }
    }

    /// Names where the setting that `build()` refused came from, so an
    /// operator sees `KCL_LEASE_DURATION`, not the builder's field name.
    /// `None` if `error` is not about a setting.
    pub fn blame(&self, error: &Error) -> Option<SettingsError> {
        if let Some(setting) = error.bind_setting() {
            return Some(SettingsError::one(
                self.named(setting),
                format!("is rejected: {error}"),
            ));
        }
        let field = error.config()?.field;
        // Settings the builder derives from the lease duration are
        // refused under their own name when the duration makes them
        // impossible.
        let source = match field {
            "stream" => "streams",
            "application_name" => "application_name",
            "fence_margin" | "renew_interval" | "handoff_timeout"
                if !self.origins.contains_key(field) =>
            {
                "lease_duration"
            }
            other => other,
        };
        Some(SettingsError::one(
            self.named(source),
            format!("is rejected: {error}"),
        ))
    }
}

#[cfg(feature = "prometheus")]
fn serve_metrics(
    builder: WorkerBuilder,
    addr: SocketAddr,
    _origin: &str,
) -> Result<WorkerBuilder, SettingsError> {
    Ok(builder.serve_metrics(addr))
}

#[cfg(not(feature = "prometheus"))]
fn serve_metrics(
    _builder: WorkerBuilder,
    _addr: SocketAddr,
    origin: &str,
) -> Result<WorkerBuilder, SettingsError> {
    Err(SettingsError::one(
        origin,
        "needs kcl's `prometheus` feature, which this build does not have",
    ))
}

/// A variable's value as text; not UTF-8 is refused, not mangled into a
/// stream or table name that does not exist.
fn os_text(value: std::ffi::OsString) -> Result<String, String> {
    value
        .into_string()
        .map_err(|v| format!("is not valid UTF-8 ({v:?})"))
}

/// `<PREFIX>_<FIELD>`: `KCL_LEASE_DURATION`.
pub(crate) fn variable(prefix: &str, field: &str) -> String {
    format!("{prefix}_{}", field.to_ascii_uppercase())
}

/// A TOML value in the text form the parsers read.
fn toml_text(value: toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                toml::Value::String(s) => Ok(s),
                other => Err(format!(
                    "has a {}; expected a list of strings",
                    other.type_str()
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|items| items.join(",")),
        other => Err(format!(
            "is a {}; expected a string, a whole number, true or false, or a list of strings",
            other.type_str()
        )),
    }
}

impl<'de> serde::Deserialize<'de> for Settings {
    /// Reads a map of field names to values in any serde format (YAML,
    /// JSON, TOML): strings in the text form of the module docs, whole
    /// numbers, booleans, or a list of strings for `streams`.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Whole(i64),
            Flag(bool),
            List(Vec<String>),
        }
        let map = BTreeMap::<String, Raw>::deserialize(deserializer)?;
        let pairs = map.into_iter().map(|(k, v)| {
            let text = match v {
                Raw::Text(s) => s,
                Raw::Whole(n) => n.to_string(),
                Raw::Flag(b) => b.to_string(),
                Raw::List(items) => items.join(","),
            };
            (k, Ok(text))
        });
        Settings::from_pairs(pairs, "the settings").map_err(serde::de::Error::custom)
    }
}
