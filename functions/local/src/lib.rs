//! `terrace`: the local runner and the operator's CLI. Runs jobs on this machine with the state
//! in a local folder (the `fs` store, `./.terrace` by default) or any cloud store by URL: one
//! job (`run`), a folder as a queue (`serve`), job checks (`validate`), state operations
//! (`state …`, `backup`, `drift`) and what happened (`workspaces`, `runs`, `result`, `logs`).

/// `println!` that never panics: once stdout is closed (`terrace runs | head`) the rest is
/// dropped and the command ends with its own exit code, as ripgrep does; any other failure to
/// write (a full disk) ends it with 70.
macro_rules! outln {
    () => { $crate::out(format_args!("")) };
    ($($arg:tt)*) => { $crate::out(format_args!($($arg)*)) };
}

static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One line on stdout (see `outln!`).
pub(crate) fn out(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_fmt(line)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush())
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
        }
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            std::process::exit(i32::from(exit::INTERNAL));
        }
    }
}

/// Whether stdout has closed.
pub(crate) fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed)
}

mod cancel_cmd;
pub mod cli;
mod job_cmd;
mod ops;
pub mod output;
mod policy_cmd;
mod serve;
mod state_cmd;
pub mod store;
mod submit_cmd;
mod summary;
mod sweep_cmd;
mod template_cmd;

pub use cli::exit;
use cli::{Global, runtime};
use job_cmd::{cancel_on_signal, load_job};
