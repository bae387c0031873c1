//! Delegation of [`LeaseStore`]: through an `Arc`, and for the decorators
//! (metering, call timeouts, cost) by [`decorate!`].

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;

use super::{
    Beat, BeatUpdate, CheckpointUpdate, CheckpointWrite, Holder, JavaWorker, LeaseStore, Page,
    StoreError,
};
use crate::lease::{Lease, Throughput};

/// Shared stores are stores: workers and decorators hold `Arc<dyn LeaseStore>`.
#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseStore for Arc<S> {
    async fn create_if_absent(&self, lease: &Lease) -> Result<Lease, StoreError> {
        (**self).create_if_absent(lease).await
    }
    fn scan(&self) -> BoxStream<'_, Result<Page, StoreError>> {
        (**self).scan()
    }
    async fn get(&self, key: &str) -> Result<Option<Lease>, StoreError> {
        (**self).get(key).await
    }
    async fn take(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).take(seen, by).await
    }
    async fn reclaim(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).reclaim(seen, by).await
    }
    async fn renew(&self, key: &str, by: Holder<'_>, counter: u64) -> Result<Lease, StoreError> {
        (**self).renew(key, by, counter).await
    }
    async fn renew_with(
        &self,
        key: &str,
        by: Holder<'_>,
        counter: u64,
        load: Option<Throughput>,
    ) -> Result<Lease, StoreError> {
        (**self).renew_with(key, by, counter, load).await
    }
    async fn report_load(
        &self,
        key: &str,
        by: Holder<'_>,
        load: Throughput,
    ) -> Result<Lease, StoreError> {
        (**self).report_load(key, by, load).await
    }
    async fn release(&self, key: &str, by: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).release(key, by).await
    }
    async fn hand_back(&self, seen: &Lease, drain: bool) -> Result<Lease, StoreError> {
        (**self).hand_back(seen, drain).await
    }
    async fn checkpoint(
        &self,
        key: &str,
        by: Holder<'_>,
        update: &CheckpointUpdate,
    ) -> Result<Lease, StoreError> {
        (**self).checkpoint(key, by, update).await
    }
    async fn checkpoint_many(
        &self,
        writes: &[CheckpointWrite<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        (**self).checkpoint_many(writes).await
    }
    async fn start_handoff(&self, seen: &Lease, to: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).start_handoff(seen, to).await
    }
    async fn complete_handoff(&self, key: &str, from: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).complete_handoff(key, from).await
    }
    async fn delete(&self, key: &str, counter: u64) -> Result<(), StoreError> {
        (**self).delete(key, counter).await
    }
    async fn beat(&self, update: &BeatUpdate<'_>) -> Result<Beat, StoreError> {
        (**self).beat(update).await
    }
    async fn beats(&self) -> Result<Vec<Beat>, StoreError> {
        (**self).beats().await
    }
    async fn poke(&self, instance: &str, ask: Option<&str>) -> Result<(), StoreError> {
        (**self).poke(instance, ask).await
    }
    async fn forget(&self, instance: &str, counter: Option<u64>) -> Result<(), StoreError> {
        (**self).forget(instance, counter).await
    }
    async fn java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        (**self).java_workers().await
    }
}

/// Implements [`LeaseStore`] for a decorator `$ty<S> { inner: S, .. }`
/// whose every call but `scan` runs as `self.$around(op, inner_call)`, and
/// whose `scan` is the given body (with `$this` bound to `&self`). Keeps the
/// decorators free of fifteen copies of the same delegation: each call is
/// one row of the table below (name, arguments, answer, the operation it
/// counts as), expanded by the `@impl` arm.
macro_rules! decorate {
    ($ty:ident, around: $around:ident, scan: |$this:ident| $scan:block) => {
        $crate::store::decorate!(@impl $ty, $around, |$this| $scan;
            create_if_absent(lease: &Lease) -> Lease = Create;
            get(key: &str) -> Option<Lease> = Get;
            take(seen: &Lease, by: Holder<'_>) -> Lease = Take;
            reclaim(seen: &Lease, by: Holder<'_>) -> Lease = Reclaim;
            renew_with(key: &str, by: Holder<'_>, counter: u64, load: Option<Throughput>)
                -> Lease = Renew;
            report_load(key: &str, by: Holder<'_>, load: Throughput) -> Lease = ReportLoad;
            release(key: &str, by: Holder<'_>) -> Lease = Release;
            hand_back(seen: &Lease, drain: bool) -> Lease = Release;
            checkpoint(key: &str, by: Holder<'_>, update: &CheckpointUpdate) -> Lease = Checkpoint;
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
    (@impl $ty:ident, $around:ident, |$this:ident| $scan:block;
        $($name:ident($($arg:ident: $arg_ty:ty),*) -> $answer:ty = $op:ident;)+
    ) => {
        // A block of its own, so that the table's short names resolve
        // without leaking into the decorator's module.
        const _: () = {
            use $crate::lease::{Lease, Throughput};
            use $crate::store::{
                Beat, BeatUpdate, CheckpointUpdate, CheckpointWrite, Holder, JavaWorker,
                LeaseStore, Page, StoreError, StoreOp,
            };

            #[async_trait::async_trait]
            impl<S: LeaseStore> LeaseStore for $ty<S> {
                fn scan(&self) -> futures::stream::BoxStream<'_, Result<Page, StoreError>> {
                    let $this = self;
                    $scan
                }
                $(
                    async fn $name(&self, $($arg: $arg_ty),*) -> Result<$answer, StoreError> {
                        self.$around(StoreOp::$op, self.inner.$name($($arg),*)).await
                    }
                )+
            }
        };
    };
}
pub(crate) use decorate;
