//! The `kcl` command, built inside kcl-tests so that the end-to-end tests
//! (tests/tests/cli.rs) can run it: the same `main` as crates/kcl-cli.

fn main() -> std::process::ExitCode {
    kcl_cli::main()
}
