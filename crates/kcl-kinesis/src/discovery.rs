//! Shard discovery: `ListShards` following `NextToken` to the end, with
//! parent/child lineage, and the children of a closed shard.

use aws_sdk_kinesis::types::{Shard, ShardFilter, ShardFilterType};
use kcl_core::HashKeyRange;
use kcl_core::leases::LeaseHandle;
use kcl_core::metric_names::KINESIS_LIST_SHARDS_CALLS;
use kcl_core::source::{ChildShard, ShardInfo, SourceError};
use tracing::{debug, warn};

use crate::calls::classify::{Class, classify};
use crate::calls::retry::{Failure, Op, retryable, retrying};
use crate::calls::{ListShardsPage, Shared};

/// Most `ListShards` pages one listing follows; a `NextToken` that never
/// ends is a service bug, not a reason to loop forever.
const MAX_LIST_PAGES: usize = 100_000;

/// How often a listing restarts after its `NextToken` expired.
const MAX_LIST_RESTARTS: u32 = 3;

/// The children a closed shard's last response reported, or `None` when
/// they are missing or incomplete (a range absent): then `ListShards` must
/// say.
fn reported_children(
    reported: Option<Vec<aws_sdk_kinesis::types::ChildShard>>,
) -> Option<Vec<ChildShard>> {
    reported
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            Some(ChildShard {
                hash_key_range: c.hash_key_range.map(|r| HashKeyRange {
                    starting: r.starting_hash_key,
                    ending: r.ending_hash_key,
                })?,
                shard_id: c.shard_id,
                parent_shard_ids: c.parent_shards,
            })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|c| !c.is_empty())
}

/// The children of `parent` in a shard listing.
pub(crate) fn children_in(shards: Vec<ShardInfo>, parent: &str) -> Vec<ChildShard> {
    shards
        .into_iter()
        .filter(|s| s.parents().any(|p| p == parent))
        .map(|s| ChildShard {
            parent_shard_ids: s.parents().map(str::to_owned).collect(),
            shard_id: s.shard_id,
            hash_key_range: s.hash_key_range,
        })
        .collect()
}

/// The shards that follow `shard_id` (the only ones that can be its
/// children: Kinesis numbers shards in creation order), for a reader that
/// reached the end of a shard without `ChildShards` in the response.
async fn list_after(
    shared: &Shared,
    stream: &str,
    shard_id: &str,
) -> Result<Vec<ShardInfo>, SourceError> {
    let filter = ShardFilter::builder()
        .r#type(ShardFilterType::AfterShardId)
        .shard_id(shard_id)
        .build()
        .map_err(|e| SourceError::Fatal {
            stream: stream.to_owned(),
            message: "cannot build a ListShards filter".to_owned(),
            source: Some(Box::new(e)),
        })?;
    let shards = list_all(shared, stream, Some(filter)).await?;
    Ok(shards.into_iter().map(|s| shard_info(stream, s)).collect())
}

/// What made a reader look for a shard's children.
pub(crate) enum EndSeen {
    /// A response or event ended the shard, with the children it reported
    /// (if any).
    Response(Option<Vec<aws_sdk_kinesis::types::ChildShard>>),
    /// `GetShardIterator` answered with no iterator: the shard may be
    /// closed, or the endpoint may answer so for an open shard. The
    /// caller judges an empty answer; it is no oddity to warn of here.
    NoIterator,
}

/// The children of the closed shard `shard_id`: as its last response or
/// event reported them (`seen`), or, when those are missing or incomplete,
/// from `ListShards`, asked again while the lease lasts. Each retryable failure
/// of the listing goes to `report`, which tells the reader and answers
/// false if it is gone: then the answer is `None`. Shared by the polling
/// and fan-out readers.
pub(crate) async fn closed_shard_children<R, Fut>(
    shared: &Shared,
    stream: &str,
    shard_id: &str,
    lease: &LeaseHandle,
    seen: EndSeen,
    mut report: R,
) -> Result<Option<Vec<ChildShard>>, SourceError>
where
    R: FnMut(SourceError) -> Fut,
    Fut: Future<Output = bool>,
{
    let ended = match seen {
        EndSeen::Response(reported) => match reported_children(reported) {
            Some(children) => return Ok(Some(children)),
            None => true,
        },
        EndSeen::NoIterator => false,
    };
    debug!(
        stream,
        shard = shard_id,
        ended,
        "no ChildShards to go by; looking the shard's children up"
    );
    let mut pauses = shared.retry.backoff.pauses();
    loop {
        if !lease.is_valid() {
            return Err(SourceError::LeaseLost {
                shard: shard_id.to_owned(),
            });
        }
        match list_after(shared, stream, shard_id).await {
            Ok(shards) => {
                let children = children_in(shards, shard_id);
                // An ended shard always has children; an open one answered
                // with no iterator has none, and its reader reports that.
                if children.is_empty() && ended {
                    warn!(
                        stream,
                        shard = shard_id,
                        "closed shard has no children in ListShards"
                    );
                }
                return Ok(Some(children));
            }
            Err(e) if e.is_retryable() => {
                if !report(e).await {
                    return Ok(None);
                }
                // The listing's own retries back off from the start again:
                // a failure answered at once must not make the next at once.
                tokio::select! {
                    () = tokio::time::sleep(pauses.next_or_max()) => {}
                    () = lease.ended() => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Every shard of `stream` (after `filter`), following `NextToken` to the
/// end.
pub(crate) async fn list_all(
    shared: &Shared,
    stream: &str,
    filter: Option<ShardFilter>,
) -> Result<Vec<Shard>, SourceError> {
    let mut restarts = 0;
    'listing: loop {
        let mut shards = Vec::new();
        let mut token: Option<String> = None;
        for page in 0..MAX_LIST_PAGES {
            let request = match &token {
                Some(token) => ListShardsPage::Next { token },
                None => ListShardsPage::First {
                    stream,
                    filter: filter.clone(),
                },
            };
            let attempt = || {
                shared.stats.list_shards_call();
                metrics::counter!(
                    KINESIS_LIST_SHARDS_CALLS,
                    "stream" => stream.to_owned()
                )
                .increment(1);
                let request = request.clone();
                async move {
                    shared
                        .api
                        .list_shards(request, shared.max_results)
                        .await
                        .map_err(classify)
                }
            };
            let policy = shared.retry;
            let out = match retrying(shared, &policy, Op::ListShards, stream, None, attempt).await {
                Ok(out) => out,
                Err(Failure::Classified(c)) if c.class == Class::ExpiredNextToken => {
                    restarts += 1;
                    if restarts > MAX_LIST_RESTARTS {
                        return Err(retryable(stream, "ListShards", c.error));
                    }
                    debug!(stream, page, "ListShards NextToken expired; listing again");
                    continue 'listing;
                }
                Err(Failure::Classified(c)) if c.class == Class::NotFound => {
                    return Err(SourceError::StreamNotFound {
                        stream: stream.to_owned(),
                    });
                }
                Err(failure) => return Err(failure.into_source_error(stream, "ListShards")),
            };
            shards.extend(out.shards.unwrap_or_default());
            match out.next_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(shards),
            }
        }
        return Err(SourceError::Fatal {
            stream: stream.to_owned(),
            message: format!("ListShards returned a NextToken on {MAX_LIST_PAGES} pages"),
            source: None,
        });
    }
}

/// The kcl view of a listed shard.
pub(crate) fn shard_info(stream: &str, shard: Shard) -> ShardInfo {
    let hash_key_range = match shard.hash_key_range {
        Some(r) => HashKeyRange {
            starting: r.starting_hash_key,
            ending: r.ending_hash_key,
        },
        None => {
            // The API documents the range as always present. Without it the
            // shard is taken to cover everything: it still gets a lease and
            // is read, which is what matters.
            warn!(
                stream,
                shard = %shard.shard_id,
                "ListShards returned a shard without a hash-key range"
            );
            HashKeyRange {
                starting: "0".to_owned(),
                ending: u128::MAX.to_string(),
            }
        }
    };
    let (starting_sequence_number, ending_sequence_number) = match shard.sequence_number_range {
        Some(r) => (r.starting_sequence_number, r.ending_sequence_number),
        None => (String::new(), None),
    };
    ShardInfo {
        shard_id: shard.shard_id,
        parent_shard_id: shard.parent_shard_id.filter(|p| !p.is_empty()),
        adjacent_parent_shard_id: shard.adjacent_parent_shard_id.filter(|p| !p.is_empty()),
        hash_key_range,
        starting_sequence_number,
        ending_sequence_number,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kcl_core::source::{ShardSource, SourceError};

    use crate::calls::KinesisApi;
    use crate::fake::FakeKinesis;
    use crate::faults::{Call, Fault, FaultInjector, Faulty};
    use crate::polling::PollingConfig;
    use crate::source::KinesisShardSource;

    fn source(
        fake: &Arc<FakeKinesis>,
        max_results: Option<i32>,
        faults: FaultInjector,
    ) -> KinesisShardSource {
        let api: Arc<dyn KinesisApi> = Arc::new(Faulty {
            inner: Arc::clone(fake) as Arc<dyn KinesisApi>,
            faults,
        });
        let polling = PollingConfig::builder()
            .retry_min_delay(std::time::Duration::from_millis(1))
            .build()
            .expect("config");
        let mut source = KinesisShardSource::with_api(api, polling);
        source.shared.max_results = max_results;
        source
    }

    #[tokio::test(start_paused = true)]
    async fn list_follows_next_token_without_naming_the_stream() {
        let fake = Arc::new(FakeKinesis::default());
        let ids = fake.create_stream("s", 5);
        let kids = fake.split("s", &ids[1], true);
        let source = source(&fake, Some(2), FaultInjector::new());
        let shards = source.list_shards("s").await.expect("list");
        let listed: Vec<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
        let mut want: Vec<&str> = ids.iter().chain(&kids).map(String::as_str).collect();
        want.sort();
        assert_eq!(listed, want);
        let requests = fake.list_requests();
        assert_eq!(requests.len(), 4, "7 shards in pages of 2");
        assert_eq!(source.stats().list_shards_calls, 4);
        assert_eq!(requests[0].stream.as_deref(), Some("s"));
        for later in &requests[1..] {
            assert_eq!(
                later.stream, None,
                "a NextToken request must not name the stream"
            );
            assert!(later.token.is_some());
            assert_eq!(later.max_results, Some(2));
        }
        // Lineage.
        let parent = shards
            .iter()
            .find(|s| s.shard_id == ids[1])
            .expect("parent");
        assert!(parent.is_closed());
        for kid in &kids {
            let child = shards.iter().find(|s| &s.shard_id == kid).expect("child");
            assert_eq!(child.parents().collect::<Vec<_>>(), [ids[1].as_str()]);
            assert!(!child.is_closed());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn missing_stream_is_stream_not_found() {
        let fake = Arc::new(FakeKinesis::default());
        let err = source(&fake, None, FaultInjector::new())
            .list_shards("nope")
            .await
            .expect_err("missing");
        assert!(matches!(err, SourceError::StreamNotFound { stream } if stream == "nope"));
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_page_is_retried_and_expired_token_restarts_the_listing() {
        let fake = Arc::new(FakeKinesis::default());
        fake.create_stream("s", 5);
        let faults = FaultInjector::new();
        let source = source(&fake, Some(2), faults.clone());
        // Page 1 passes; page 2 is throttled, and its retry finds the token
        // expired: the listing starts over and completes in three pages.
        faults.inject_at(Call::ListShards, 2, Fault::LimitExceeded);
        faults.inject_at(Call::ListShards, 3, Fault::ExpiredNextToken);
        let shards = source.list_shards("s").await.expect("listing");
        let mut ids: Vec<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
        ids.dedup();
        assert_eq!(ids.len(), 5, "each shard once: {ids:?}");
        assert_eq!(shards.len(), 5);
        assert_eq!(faults.calls(Call::ListShards), 6);
        let stats = source.stats();
        assert_eq!((stats.throttles, stats.retries), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn persistent_failures_end_the_listing_as_retryable() {
        let fake = Arc::new(FakeKinesis::default());
        fake.create_stream("s", 1);
        let faults = FaultInjector::new();
        let source = source(&fake, None, faults.clone());
        for _ in 0..20 {
            faults.inject(Call::ListShards, Fault::InternalFailure);
        }
        let err = source.list_shards("s").await.expect_err("gives up");
        assert!(err.is_retryable(), "{err}");
    }
}
