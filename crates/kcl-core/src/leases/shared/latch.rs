//! A flag set once, that tasks wait for: what the taker and the watcher
//! wait on before their first tick and read.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// A flag set once; its waiters wake in a fixed order. (A
/// `tokio::sync::watch` wakes its waiters in an order drawn from the
/// runtime's random generator, seeded anew in every process: two tasks
/// waiting on one ran in either order, and a seeded simulation did not
/// replay exactly.)
#[derive(Debug, Default)]
pub(crate) struct Latch {
    set: AtomicBool,
    notify: Notify,
}

impl Latch {
    /// Sets the flag and, the first time, wakes every waiter.
    pub(crate) fn set(&self) {
        if !self.set.swap(true, Ordering::AcqRel) {
            self.notify.notify_waiters();
        }
    }

    /// Completes once the flag is set.
    pub(crate) async fn wait(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a set in between wakes it.
        notified.as_mut().enable();
        if self.set.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test]
    async fn waiters_wake_once_set_and_a_late_one_at_once() {
        let latch = Arc::new(Latch::default());
        let woke = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (latch, woke) = (Arc::clone(&latch), Arc::clone(&woke));
            tasks.push(tokio::spawn(async move {
                latch.wait().await;
                woke.lock().unwrap().push(i);
            }));
            tokio::task::yield_now().await;
        }
        assert!(woke.lock().unwrap().is_empty());
        latch.set();
        latch.set();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*woke.lock().unwrap(), vec![0, 1, 2, 3]);
        latch.wait().await;
    }
}
