//! Delegation of [`LeaseStore`]: through an `Arc`, and for the decorators
//! (metering, call timeouts, cost) by [`decorate!`]. Both are written from
//! one table of the trait's calls.

/// Implements [`LeaseStore`] for a decorator `$ty<S> { inner: S, .. }`
/// whose every call but `scan` runs as `self.$around(op, inner_call)`, and
/// whose `scan` is the given body (with `$this` bound to `&self`). Keeps the
/// decorators, and the delegation through an `Arc`, free of copies of the
/// same delegation: each call is one row of the `@calls` table (name,
/// arguments, answer, the operation it counts as), expanded by the `@impl`
/// arm for the way (`$how`) it delegates.
macro_rules! decorate {
    ($ty:ident, around: $around:ident, scan: |$this:ident| $scan:block) => {
        $crate::store::decorate!(@calls [decorator $ty, $around, |$this| $scan]);
    };
    (@calls $how:tt) => {
        // A block of its own, so that the table's short names resolve
        // without leaking into the caller's module.
        const _: () = {
            use $crate::lease::{Lease, Throughput};
            use $crate::store::{
                Beat, BeatUpdate, CheckpointUpdate, CheckpointWrite, Holder, JavaWorker,
                LeaseStore, Page, StoreError,
            };

            $crate::store::decorate!(@impl $how;
                create_if_absent(lease: &Lease) -> Lease = Create;
                get(key: &str) -> Option<Lease> = Get;
                take(seen: &Lease, by: Holder<'_>) -> Lease = Take;
                reclaim(seen: &Lease, by: Holder<'_>) -> Lease = Reclaim;
                renew(key: &str, by: Holder<'_>, counter: u64) -> Lease = Renew;
                renew_with(key: &str, by: Holder<'_>, counter: u64, load: Option<Throughput>)
                    -> Lease = Renew;
                report_load(key: &str, by: Holder<'_>, load: Throughput) -> Lease = ReportLoad;
                release(key: &str, by: Holder<'_>) -> Lease = Release;
                hand_back(seen: &Lease, drain: bool) -> Lease = Release;
                checkpoint(key: &str, by: Holder<'_>, update: &CheckpointUpdate)
                    -> Lease = Checkpoint;
                checkpoint_many(writes: &[CheckpointWrite<'_>])
                    -> Vec<Result<(), StoreError>> = CheckpointMany;
                start_handoff(seen: &Lease, to: Holder<'_>) -> Lease = StartHandoff;
                complete_handoff(key: &str, from: Holder<'_>) -> Lease = CompleteHandoff;
                delete(key: &str, counter: u64) -> () = Delete;
                beat(update: &BeatUpdate<'_>) -> Beat = Beat;
                beats() -> Vec<Beat> = ReadBeats;
                poke(instance: &str, ask: Option<&str>) -> () = Poke;
                forget(instance: &str, counter: Option<u64>) -> () = Forget;
                java_workers() -> Vec<JavaWorker> = ReadJavaWorkers;
            );
        };
    };
    (@impl [decorator $ty:ident, $around:ident, |$this:ident| $scan:block];
        $($name:ident($($arg:ident: $arg_ty:ty),*) -> $answer:ty = $op:ident;)+
    ) => {
        #[async_trait::async_trait]
        impl<S: LeaseStore> LeaseStore for $ty<S> {
            fn scan(&self) -> futures::stream::BoxStream<'_, Result<Page, StoreError>> {
                let $this = self;
                $scan
            }
            $(
                async fn $name(&self, $($arg: $arg_ty),*) -> Result<$answer, StoreError> {
                    self.$around($crate::store::StoreOp::$op, self.inner.$name($($arg),*)).await
                }
            )+
        }
    };
    // Shared stores are stores: workers and decorators hold
    // `Arc<dyn LeaseStore>`.
    (@impl [shared];
        $($name:ident($($arg:ident: $arg_ty:ty),*) -> $answer:ty = $op:ident;)+
    ) => {
        #[async_trait::async_trait]
        impl<S: LeaseStore + ?Sized> LeaseStore for std::sync::Arc<S> {
            fn scan(&self) -> futures::stream::BoxStream<'_, Result<Page, StoreError>> {
                (**self).scan()
            }
            $(
                async fn $name(&self, $($arg: $arg_ty),*) -> Result<$answer, StoreError> {
                    (**self).$name($($arg),*).await
                }
            )+
        }
    };
}
pub(crate) use decorate;

decorate!(@calls [shared]);
