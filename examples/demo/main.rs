//! `demo` (`make demo`): three kcl workers sharing one stream, in one
//! process, printing where the shards are every second and checking at the
//! end that every produced record was processed.
//!
//! The demo itself lives in the `kcl` command's library
//! (`crates/kcl-cli/src/demo.rs`), so that `kcl demo` runs exactly the
//! same thing; this is the `main` that `make demo` runs.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The per-second lines are the demo's output; the library's logs stay
    // quiet unless asked for (RUST_LOG=info).
    kcl_cli::init_logging(false);
    kcl_cli::demo::run().await
}
