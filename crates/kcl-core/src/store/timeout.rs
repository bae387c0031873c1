//! A [`LeaseStore`](super::LeaseStore) decorator that bounds every call (invariant 11).
//!
//! A request stuck on a dead connection would otherwise hold its caller
//! forever: a renewal round, a consumer's checkpoint, a shard sync. Each
//! call (each scan page) that has not answered within the attempt timeout
//! fails as [`StoreError::Retryable`]: like a lost response, the write may
//! or may not have applied, which every caller already handles (a replay
//! reconciles, see [`super::Intent`]). Callers with a tighter deadline (the
//! renewer, inside a lease's remaining validity) bound their calls further
//! themselves.

use std::time::Duration;

use futures::stream::{self, StreamExt};

use super::{StoreError, StoreOp};

/// Wraps a [`super::LeaseStore`], failing every call that takes longer than
/// the attempt timeout.
#[derive(Debug, Clone)]
pub struct TimeoutStore<S> {
    inner: S,
    attempt: Duration,
}

/// A store call that did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct CallTimedOut(pub Duration);

impl<S> TimeoutStore<S> {
    /// Wraps `inner`; every call gets at most `attempt`.
    pub fn new(inner: S, attempt: Duration) -> Self {
        TimeoutStore { inner, attempt }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn bounded<T>(
        &self,
        op: StoreOp,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        bounded(op, self.attempt, fut).await
    }
}

/// Runs `fut` for at most `limit`; past it, a retryable error of `op`.
pub(crate) async fn bounded<T>(
    op: StoreOp,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::retryable(op, CallTimedOut(limit))),
    }
}

super::decorate! {
    TimeoutStore, around: bounded,
    scan: |this| {
        let attempt = this.attempt;
        // Each page gets the attempt timeout; a page that times out ends
        // the scan with its error, as any failed page does.
        stream::unfold(Some(this.inner.scan()), move |pages| async move {
            let mut pages = pages?;
            match tokio::time::timeout(attempt, pages.next()).await {
                Ok(Some(Ok(page))) => Some((Ok(page), Some(pages))),
                Ok(Some(Err(e))) => Some((Err(e), None)),
                Ok(None) => None,
                Err(_) => Some((
                    Err(StoreError::retryable(StoreOp::ScanPage, CallTimedOut(attempt))),
                    None,
                )),
            }
        })
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Checkpoint, Lease};
    use crate::store::LeaseStore;
    use crate::store::memory::InMemoryLeaseStore;
    use futures::TryStreamExt;

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_fails_retryably_after_the_attempt_timeout() {
        let table = InMemoryLeaseStore::new();
        table
            .create_if_absent(&Lease::new("s", Checkpoint::TrimHorizon))
            .await
            .unwrap();
        let store = TimeoutStore::new(table.clone(), Duration::from_secs(2));
        table.blackhole(&["s"]);
        let started = tokio::time::Instant::now();
        let err = store.get("s").await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        // Scans name no key: a blackholed lease does not stop them.
        let all: Vec<Lease> = store.scan().try_concat().await.unwrap();
        assert_eq!(all.len(), 1);
        table.blackhole(&[]);
        assert!(store.get("s").await.unwrap().is_some());
    }
}
