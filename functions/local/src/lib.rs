//! `terrace`: the local runner. Runs jobs on this machine with the state in a local folder
//! (the `fs` store, `./.terrace` by default): one job (`run`), a folder as a queue (`serve`),
//! job checks (`validate`) and state operations (`state …`).

pub mod cli;
mod serve;
mod state_cmd;

pub use cli::exit;
use cli::{Global, cancel_on_signal, load_job, runtime};
