//! Load figures (`throughputKBps`): written by the holder, carried with
//! the lease.

use super::{a_in, assert_condition_failed, cp, h, owned_by};
use crate::lease::Throughput;
use crate::store::LeaseStore;

fn kbps(x: f64) -> Throughput {
    Throughput::from_kbps(x).expect("a figure")
}

/// A lease's load figure (`throughputKBps`) is written only by its owner
/// in its tenure, on its own or with a renewal, without moving the
/// counter when on its own; it is rounded to a thousandth, and every other
/// write (renewal without one, checkpoint, handoff, take, release) leaves
/// it, so it travels with the lease to its next holder.
pub async fn a_load_figure_is_written_by_its_holder_and_travels_with_the_lease<
    S: LeaseStore + ?Sized,
>(
    store: &S,
) {
    let l = owned_by(store, "s", "a").await;
    assert_eq!(l.throughput, None, "no figure until one is published");
    assert_condition_failed(
        store.report_load("s", h("b"), kbps(1.0)).await,
        "a report by another worker",
    );
    assert_condition_failed(
        store.report_load("s", a_in("t-old"), kbps(1.0)).await,
        "a report by another tenure of the owner",
    );
    let reported = store
        .report_load("s", h("a"), kbps(12.345_678))
        .await
        .expect("the holder reports");
    assert_eq!(reported.throughput, Some(kbps(12.346)), "rounded to 1/1000");
    assert_eq!(reported.counter, l.counter, "a report renews nothing");
    let read = store.get("s").await.expect("get").expect("exists");
    assert_eq!(read.throughput, Some(kbps(12.346)));

    let renewed = store
        .renew_with("s", h("a"), l.counter, Some(kbps(3.0)))
        .await
        .expect("a renewal carrying a figure");
    assert_eq!(
        (renewed.counter, renewed.throughput),
        (l.counter + 1, Some(kbps(3.0)))
    );
    let renewed = store
        .renew("s", h("a"), renewed.counter)
        .await
        .expect("a renewal without one");
    assert_eq!(renewed.throughput, Some(kbps(3.0)), "kept");
    let checkpointed = store
        .checkpoint("s", h("a"), &cp("7"))
        .await
        .expect("checkpoint");
    assert_eq!(checkpointed.throughput, Some(kbps(3.0)));

    let handing = store.start_handoff(&renewed, h("b")).await.expect("steal");
    assert_eq!(handing.throughput, Some(kbps(3.0)), "travels with a steal");
    assert_condition_failed(
        store.report_load("s", h("a"), kbps(9.0)).await,
        "a report by the previous owner while it hands off",
    );
    let done = store.complete_handoff("s", h("a")).await.expect("complete");
    assert_eq!(done.throughput, Some(kbps(3.0)));
    let released = store.release("s", h("b")).await.expect("release");
    assert_eq!(released.throughput, Some(kbps(3.0)));
    let taken = store.take(&released, h("a")).await.expect("take");
    assert_eq!(
        taken.throughput,
        Some(kbps(3.0)),
        "the next holder starts from it"
    );
    let zero = store
        .report_load("s", h("a"), kbps(0.0))
        .await
        .expect("an idle figure");
    assert_eq!(zero.throughput, Some(kbps(0.0)));
}
