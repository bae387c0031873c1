//! The `kcl` binary; see `kcl --help` and the crate's library.

fn main() -> std::process::ExitCode {
    kcl_cli::main()
}
