//! `terrace`: the local runner's process (see the `local` library for what it does).

fn main() -> std::process::ExitCode {
    local::cli::main()
}
