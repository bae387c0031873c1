//! The log lines a unit test's own thread writes, for tests that judge
//! what is warned about.
//!
//! Logs go through one *global* subscriber that writes to a per-thread
//! buffer. A scoped subscriber (`with_default`) would be flaky here:
//! tracing caches each callsite's interest globally, and a parallel test
//! hitting the same `warn!` with no subscriber can leave it cached as
//! disabled (about one run in twenty failed that way).

use std::cell::RefCell;
use std::sync::Once;

thread_local! {
    /// The log text of the current test thread, while it is captured.
    static CAPTURED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Writes into the calling thread's capture buffer, if it has one.
struct ThreadLogs;

impl std::io::Write for ThreadLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|c| {
            if let Some(v) = c.borrow_mut().as_mut() {
                v.extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` and returns what it gave back and the log text this thread
/// wrote meanwhile (a current-thread runtime's tasks included).
pub(crate) fn captured<T>(f: impl FnOnce() -> T) -> (T, String) {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| ThreadLogs)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
    });
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let out = f();
    let logs = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, String::from_utf8_lossy(&logs).into_owned())
}

/// Runs `future` on a current-thread runtime under a paused clock and
/// returns its output and how many warnings it logged that contain
/// `text`.
pub(crate) fn warnings_while<T>(
    text: &str,
    future: impl std::future::Future<Output = T>,
) -> (T, usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let (out, logs) = captured(|| runtime.block_on(future));
    let warnings = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(text))
        .count();
    (out, warnings)
}
