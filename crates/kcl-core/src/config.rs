//! Lease engine settings, validated at `build()`.

use std::time::Duration;

/// An impossible setting, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: `{field}` {reason}")]
pub struct ConfigError {
    /// The offending field, as named on the builder.
    pub field: &'static str,
    /// Why the value cannot work.
    pub reason: String,
}

/// How held leases are kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeaseRenewal {
    /// One liveness record per worker process, written every renew
    /// interval; a lease item is written only when its owner or checkpoint
    /// changes. A lease is alive while the instance named by its tenure
    /// beats. Idle cost grows with workers, not shards. Every worker of the
    /// table must be a kcl worker (a Java KCL worker would see the leases
    /// unrenewed and take them). The default.
    #[default]
    WorkerLiveness,
    /// Every held lease renewed every renew interval, as the Java KCL
    /// does: the mode for a table shared with Java KCL workers, which judge
    /// leases by their counters. kcl workers in this mode beat a liveness
    /// record too (one write per worker per interval), and kcl peers judge
    /// their leases by it, so a fleet can mix the modes and lease durations
    /// during a rolling restart, and fails over as fast in both.
    PerLease,
}

/// How the lease taker balances the fleet when it steals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Balance {
    /// Weigh leases by what they carry: each holder measures its leases'
    /// bytes a second (and a lag that keeps growing) and publishes the
    /// figure on the lease item (`throughputKBps`, as the Java KCL 3.x
    /// does); steals move load from the most loaded worker, with a margin
    /// that figures 20 % off cannot defeat. Counts are the fallback while
    /// no lease carries a figure, and with Java KCL workers on the table.
    /// The default.
    #[default]
    ByLoad,
    /// Balance lease counts only (every worker within one lease of the
    /// others), whatever the leases carry. Figures are still published.
    ByCount,
}

/// Settings of the lease taker and renewer. Build with
/// [`LeaseConfig::builder`].
///
/// Defaults follow the Java KCL where it has one: lease duration
/// (`failoverTimeMillis`) 10 s, renewal every third of it. The taker ticks
/// every 10 s (the Java KCL's fixed 2 x (failover + epsilon) is 20 s); this
/// engine makes one scan per tick, so ticking twice as often costs less
/// than the Java KCL's tick does.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    pub(crate) worker_id: String,
    pub(crate) lease_duration: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) fence_margin: Duration,
    pub(crate) taker_interval: Duration,
    pub(crate) jitter: f64,
    pub(crate) max_leases_per_worker: usize,
    pub(crate) max_leases_to_steal: usize,
    pub(crate) renew_concurrency: usize,
    pub(crate) handoff_timeout: Duration,
    pub(crate) store_timeout: Duration,
    pub(crate) release_on_drop: bool,
    pub(crate) seed: Option<u64>,
    pub(crate) renewal: LeaseRenewal,
    pub(crate) balance: Balance,
    pub(crate) load_report_interval: Duration,
}

impl LeaseConfig {
    /// A builder for `worker_id` with default settings.
    pub fn builder(worker_id: impl Into<String>) -> LeaseConfigBuilder {
        LeaseConfigBuilder {
            worker_id: worker_id.into(),
            lease_duration: Duration::from_secs(10),
            renew_interval: None,
            fence_margin: None,
            taker_interval: Duration::from_secs(10),
            jitter: 0.25,
            max_leases_per_worker: usize::MAX,
            max_leases_to_steal: 4,
            renew_concurrency: 32,
            handoff_timeout: None,
            store_timeout: None,
            release_on_drop: true,
            seed: None,
            renewal: LeaseRenewal::default(),
            balance: Balance::default(),
            load_report_interval: None,
        }
    }

    /// This worker's id, written as the owner of the leases it holds.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }
    /// How long a lease's counter must stand still before others take it.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }
    /// How often held leases are renewed (each lease, or this worker's
    /// liveness record, as [`LeaseConfig::renewal`] says).
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
    }
    /// How held leases are kept alive.
    pub fn renewal(&self) -> LeaseRenewal {
        self.renewal
    }
    /// How long before expiry (as peers judge it) a worker stops using a
    /// lease it could not renew.
    pub fn fence_margin(&self) -> Duration {
        self.fence_margin
    }
    /// The mean time between lease-taker ticks.
    pub fn taker_interval(&self) -> Duration {
        self.taker_interval
    }
    /// Upper bound on leases held by this worker.
    pub fn max_leases_per_worker(&self) -> usize {
        self.max_leases_per_worker
    }
    /// Upper bound on leases stolen per tick.
    pub fn max_leases_to_steal(&self) -> usize {
        self.max_leases_to_steal
    }
    /// How long a thief waits for the previous owner to hand a lease over
    /// before it forces the handoff.
    pub fn handoff_timeout(&self) -> Duration {
        self.handoff_timeout
    }
    /// The longest one lease-table call may take before it counts as
    /// failed (its write may still have applied, which every caller
    /// reconciles).
    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }
    /// How the taker balances: by load (the default) or by count.
    pub fn balance(&self) -> Balance {
        self.balance
    }
    /// How often, at most, a lease's load figure is written on its own
    /// (with liveness records; renewing per lease, every renewal carries
    /// it), and the span of the window it is measured over.
    pub fn load_report_interval(&self) -> Duration {
        self.load_report_interval
    }
}

/// Builder of [`LeaseConfig`].
#[derive(Debug, Clone)]
pub struct LeaseConfigBuilder {
    worker_id: String,
    lease_duration: Duration,
    renew_interval: Option<Duration>,
    fence_margin: Option<Duration>,
    taker_interval: Duration,
    jitter: f64,
    max_leases_per_worker: usize,
    max_leases_to_steal: usize,
    renew_concurrency: usize,
    handoff_timeout: Option<Duration>,
    store_timeout: Option<Duration>,
    release_on_drop: bool,
    seed: Option<u64>,
    renewal: LeaseRenewal,
    balance: Balance,
    load_report_interval: Option<Duration>,
}

impl LeaseConfigBuilder {
    /// This worker's id in the lease table, replacing the one given to
    /// [`LeaseConfig::builder`]. Keep it unique per process.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = id.into();
        self
    }
    crate::setters!(self {
        /// How held leases are kept alive (default
        /// [`LeaseRenewal::WorkerLiveness`]; [`LeaseRenewal::PerLease`] for a
        /// table shared with Java KCL workers).
        renewal(mode: LeaseRenewal),
        /// How long a lease's counter must stand still, as seen by a peer,
        /// before the peer may take it (default 10 s, the Java KCL's
        /// `failoverTimeMillis`).
        lease_duration(d: Duration),
        /// How often held leases are renewed (default a third of the lease
        /// duration per lease, half of it for the liveness record, which is
        /// retried until its validity runs out). Must leave time for at least
        /// one retry before fencing.
        renew_interval(d: Duration) = Some(d),
        /// How long before peers could judge a lease expired this worker stops
        /// using it when renewals fail (default a tenth of the lease duration).
        fence_margin(d: Duration) = Some(d),
        /// Mean time between lease-taker ticks (default 10 s).
        taker_interval(d: Duration),
        /// Relative jitter of the taker interval, in `0.0..1.0` (default 0.25:
        /// each tick waits interval x [0.75, 1.25]).
        jitter(j: f64),
        /// Upper bound on leases held by this worker (default unbounded).
        max_leases_per_worker(n: usize),
        /// Upper bound on leases stolen per tick (default 4; 0 disables
        /// stealing). The Java KCL steals one per tick, so a worker joining a
        /// fleet of 64 shards needs 16 ticks to get its share; the balancing
        /// rule never lets a thief end above its victim, so a larger cap
        /// cannot make steals flip-flop.
        max_leases_to_steal(n: usize),
        /// Renewals in flight at once (default 32).
        renew_concurrency(n: usize),
        /// How long a thief waits for the previous owner to finish its batch,
        /// checkpoint and hand a stolen lease over before forcing the handoff
        /// (default: the lease duration, which is also the minimum: by then
        /// the previous owner's own validity has run out, so a forced handoff
        /// never overlaps a worker that still believes in the lease).
        handoff_timeout(d: Duration) = Some(d),
        /// The longest one lease-table call may take (default: half the renew
        /// interval, at most 5 s, so a renewal stuck on a dead connection is
        /// retried within the same round). It must be below the renew
        /// interval.
        store_timeout(d: Duration) = Some(d),
        /// Whether a coordinator dropped without
        /// [`crate::LeaseCoordinator::shutdown`] (a panic unwinding the
        /// application, a runtime shut down under the worker) releases its
        /// leases, best effort and within two seconds, instead of leaving them
        /// to expire (default true). Turn it off only to simulate a crash.
        release_on_drop(on: bool),
        /// How the taker balances the fleet (default [`Balance::ByLoad`]).
        /// Every worker of a fleet should balance the same way: a worker
        /// balancing counts steals back what load balance left uneven in
        /// count.
        balance(balance: Balance),
        /// How often, at most, each lease's load figure is written to its item
        /// on its own, and the window it is measured over (default 60 s, or the
        /// renew interval if that is longer). With
        /// liveness records a figure is written only when it moved by more than
        /// a fifth since the last one written, so an idle fleet writes none;
        /// renewing per lease, every renewal carries it at no extra request.
        /// At least the renew interval.
        load_report_interval(d: Duration) = Some(d),
        /// Seeds the tick jitter, the renewals' retry jitter and the instance
        /// id, for reproducible simulations. Two processes of one worker id
        /// need different seeds: with one instance id, each would take the
        /// other's tenures for its own.
        seed(seed: u64) = Some(seed),
    });

    /// Validates the settings.
    pub fn build(self) -> Result<LeaseConfig, ConfigError> {
        self.check_bounds()?;
        self.check_identity()?;
        let Renewal {
            renew_interval,
            fence_margin,
        } = self.renewal_timing()?;
        self.check_taker()?;
        let handoff_timeout = self.resolved_handoff_timeout()?;
        let store_timeout = self.resolved_store_timeout(renew_interval)?;
        self.check_limits()?;
        let load_report_interval = self.resolved_load_report_interval(renew_interval)?;
        Ok(LeaseConfig {
            worker_id: self.worker_id,
            lease_duration: self.lease_duration,
            renew_interval,
            fence_margin,
            taker_interval: self.taker_interval,
            jitter: self.jitter,
            max_leases_per_worker: self.max_leases_per_worker,
            max_leases_to_steal: self.max_leases_to_steal,
            renew_concurrency: self.renew_concurrency,
            handoff_timeout,
            store_timeout,
            release_on_drop: self.release_on_drop,
            seed: self.seed,
            renewal: self.renewal,
            balance: self.balance,
            load_report_interval,
        })
    }

    /// A worker id, and a lease duration a renewal can keep up with.
    fn check_identity(&self) -> Result<(), ConfigError> {
        if self.worker_id.trim().is_empty() {
            return invalid("worker_id", "must not be empty");
        }
        if self.lease_duration < Duration::from_millis(100) {
            return invalid(
                "lease_duration",
                format!("is {:?}; it must be at least 100ms", self.lease_duration),
            );
        }
        Ok(())
    }

    /// The renew interval and fence margin (defaults resolved), checked to
    /// leave a retry room before a lease is fenced.
    fn renewal_timing(&self) -> Result<Renewal, ConfigError> {
        let liveness = self.renewal == LeaseRenewal::WorkerLiveness;
        let renew_interval = self.renew_interval.unwrap_or(if liveness {
            self.lease_duration / 2
        } else {
            self.lease_duration / 3
        });
        let fence_margin = self.fence_margin.unwrap_or(self.lease_duration / 10);
        if fence_margin >= self.lease_duration {
            return invalid(
                "fence_margin",
                format!(
                    "is {fence_margin:?}; it must be below lease_duration ({:?})",
                    self.lease_duration
                ),
            );
        }
        let usable = self.lease_duration - fence_margin;
        // Per lease, the next round is the retry; a liveness beat retries
        // inside its round until the validity runs out, so one round must
        // leave room for a retry after a timed-out attempt.
        let retry_room = if liveness {
            renew_interval + renew_interval / 2 > usable
        } else {
            renew_interval * 2 > usable
        };
        if renew_interval.is_zero() || retry_room {
            return invalid(
                "renew_interval",
                format!(
                    "is {renew_interval:?}; it must be above zero and leave lease_duration - \
                     fence_margin ({usable:?}) room for a retry before the lease is fenced: \
                     at most half of it per lease, two thirds of it for liveness records"
                ),
            );
        }
        Ok(Renewal {
            renew_interval,
            fence_margin,
        })
    }

    /// The taker's tick and its jitter.
    fn check_taker(&self) -> Result<(), ConfigError> {
        if self.taker_interval.is_zero() {
            return invalid("taker_interval", "must be above zero");
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return invalid(
                "jitter",
                format!("is {}; it must be in 0.0..1.0", self.jitter),
            );
        }
        Ok(())
    }

    /// The handoff timeout (default resolved), never below a lease duration.
    fn resolved_handoff_timeout(&self) -> Result<Duration, ConfigError> {
        let handoff_timeout = self.handoff_timeout.unwrap_or(self.lease_duration);
        if handoff_timeout < self.lease_duration {
            return invalid(
                "handoff_timeout",
                format!(
                    "is {handoff_timeout:?}; it must be at least lease_duration ({:?}) so a \
                     forced handoff never overlaps the previous owner",
                    self.lease_duration
                ),
            );
        }
        Ok(handoff_timeout)
    }

    /// The store call timeout (default resolved), below `renew_interval`.
    fn resolved_store_timeout(&self, renew_interval: Duration) -> Result<Duration, ConfigError> {
        let store_timeout = self
            .store_timeout
            .unwrap_or((renew_interval / 2).min(Duration::from_secs(5)));
        if store_timeout.is_zero() || store_timeout >= renew_interval {
            return invalid(
                "store_timeout",
                format!(
                    "is {store_timeout:?}; it must be above zero and below renew_interval \
                     ({renew_interval:?}) so a stuck renewal is retried before the next round"
                ),
            );
        }
        Ok(store_timeout)
    }

    /// The counts that must be at least 1.
    fn check_limits(&self) -> Result<(), ConfigError> {
        if self.max_leases_per_worker == 0 {
            return invalid("max_leases_per_worker", "must be at least 1");
        }
        count_in(
            "renew_concurrency",
            self.renew_concurrency,
            MAX_RENEW_CONCURRENCY,
        )?;
        Ok(())
    }

    /// Every duration at most [`MAX_DURATION`], before any arithmetic on
    /// them.
    fn check_bounds(&self) -> Result<(), ConfigError> {
        let set = [
            ("lease_duration", Some(self.lease_duration)),
            ("renew_interval", self.renew_interval),
            ("fence_margin", self.fence_margin),
            ("taker_interval", Some(self.taker_interval)),
            ("handoff_timeout", self.handoff_timeout),
            ("store_timeout", self.store_timeout),
            ("load_report_interval", self.load_report_interval),
        ];
        each_at_most_max(&set)
    }

    /// The load report interval (default resolved), at least
    /// `renew_interval`.
    fn resolved_load_report_interval(
        &self,
        renew_interval: Duration,
    ) -> Result<Duration, ConfigError> {
        let load_report_interval = self
            .load_report_interval
            .unwrap_or(Duration::from_secs(60).max(renew_interval));
        if load_report_interval < renew_interval {
            return invalid(
                "load_report_interval",
                format!(
                    "is {load_report_interval:?}; it must be at least renew_interval \
                     ({renew_interval:?})"
                ),
            );
        }
        Ok(load_report_interval)
    }
}

/// The renewal timing `build()` resolves.
struct Renewal {
    renew_interval: Duration,
    fence_margin: Duration,
}

/// The longest a duration setting may be: a year. Longer ones (`Duration::MAX`
/// for "never", say) overflowed the clock arithmetic that turns them into
/// deadlines, and panicked while the worker ran.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most renewals in flight at once: more would only queue in the store.
pub const MAX_RENEW_CONCURRENCY: usize = 10_000;

/// An error naming `field` if `d` is longer than [`MAX_DURATION`] (for
/// the other crates' settings too).
#[doc(hidden)]
pub fn at_most_max(field: &'static str, d: Duration) -> Result<(), ConfigError> {
    if d > MAX_DURATION {
        return invalid(
            field,
            format!("is {d:?}; it must be at most a year ({MAX_DURATION:?})"),
        );
    }
    Ok(())
}

/// [`at_most_max`] of each duration of `set` that is set.
#[doc(hidden)]
pub fn each_at_most_max(set: &[(&'static str, Option<Duration>)]) -> Result<(), ConfigError> {
    for (field, d) in set {
        if let Some(d) = d {
            at_most_max(field, *d)?;
        }
    }
    Ok(())
}

/// An error naming `field` unless `count` is 1 to `max` (for the other
/// crates' settings too).
#[doc(hidden)]
pub fn count_in(field: &'static str, count: usize, max: usize) -> Result<(), ConfigError> {
    if !(1..=max).contains(&count) {
        return invalid(field, format!("is {count}; it must be 1 to {max}"));
    }
    Ok(())
}

/// The error for an impossible `field`.
pub(crate) fn invalid<T>(field: &'static str, reason: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        field,
        reason: reason.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_java_kcl() {
        let c = LeaseConfig::builder("w")
            .renewal(LeaseRenewal::PerLease)
            .build()
            .unwrap();
        assert_eq!(c.lease_duration(), Duration::from_secs(10));
        assert_eq!(c.renew_interval(), Duration::from_secs(10) / 3);
        let c = LeaseConfig::builder("w").build().unwrap();
        assert_eq!(c.renewal(), LeaseRenewal::WorkerLiveness);
        assert_eq!(c.renew_interval(), Duration::from_secs(5));
        // Deliberately above the Java KCL's 1: see `max_leases_to_steal`.
        assert_eq!(c.max_leases_to_steal(), 4);
    }

    /// Durations past a year (`Duration::MAX` for "never") and more
    /// renewals in flight than a semaphore holds are refused, naming the
    /// setting. Before, `build()` took them and the worker panicked: in
    /// `build()` itself for `renew_interval`, on the first renewal round
    /// for `renew_concurrency`, at the first deadline for the others.
    #[test]
    fn settings_past_their_bounds_are_refused_not_a_panic_later() {
        let b = || LeaseConfig::builder("w");
        let cases = [
            (b().lease_duration(Duration::MAX), "lease_duration"),
            (b().renew_interval(Duration::MAX), "renew_interval"),
            (b().taker_interval(Duration::MAX), "taker_interval"),
            (b().handoff_timeout(Duration::MAX), "handoff_timeout"),
            (
                b().load_report_interval(Duration::MAX),
                "load_report_interval",
            ),
            (b().renew_concurrency(usize::MAX), "renew_concurrency"),
        ];
        for (builder, field) in cases {
            let err = builder.build().expect_err(field);
            assert_eq!(err.field, field, "{err}");
        }
        let year = b()
            .lease_duration(MAX_DURATION)
            .handoff_timeout(MAX_DURATION)
            .build();
        assert!(year.is_ok(), "{year:?}");
    }

    #[test]
    fn impossible_settings_name_the_field() {
        let cases = [
            (LeaseConfig::builder(""), "worker_id"),
            (
                LeaseConfig::builder("w").lease_duration(Duration::ZERO),
                "lease_duration",
            ),
            (
                LeaseConfig::builder("w").renew_interval(Duration::from_secs(10)),
                "renew_interval",
            ),
            (
                LeaseConfig::builder("w").fence_margin(Duration::from_secs(10)),
                "fence_margin",
            ),
            (
                LeaseConfig::builder("w").taker_interval(Duration::ZERO),
                "taker_interval",
            ),
            (LeaseConfig::builder("w").jitter(1.0), "jitter"),
            (
                LeaseConfig::builder("w").store_timeout(Duration::from_secs(6)),
                "store_timeout",
            ),
            (
                LeaseConfig::builder("w").max_leases_per_worker(0),
                "max_leases_per_worker",
            ),
        ];
        for (builder, field) in cases {
            let e = builder.build().unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.to_string().contains(field), "{e}");
        }
    }
}
