//! `terrace`: the local runner and the operator's CLI. Runs jobs on this machine with the state
//! in a local folder (the `fs` store, `./.terrace` by default) or any cloud store by URL: one
//! job (`run`), a folder as a queue (`serve`), job checks (`validate`), state operations
//! (`state …`, `backup`, `drift`) and what happened (`workspaces`, `runs`, `result`, `logs`).

/// `println!` that ends the process quietly, with success, when stdout has closed (`terrace
/// runs | head`), as ripgrep does, instead of panicking.
macro_rules! outln {
    () => { outln!("") };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout().lock(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

pub mod cli;
mod ops;
mod serve;
mod state_cmd;
pub mod store;

pub use cli::exit;
use cli::{Global, cancel_on_signal, load_job, runtime};
