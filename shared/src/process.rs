//! What every cloud function's process sets up first: its log, and SIGTERM.

use tokio_util::sync::CancellationToken;

/// JSON log lines on stderr, filtered by `TERRACE_LOG` (default `info`): what the clouds'
/// log services parse.
pub fn init_json_logs() {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TERRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Makes this process non-dumpable: its `/proc/<pid>` files (`environ`, `mem`, `maps`, …)
/// become root's, and no process without `CAP_SYS_PTRACE` can read them or attach to it. So
/// terraform, its providers and provisioners, running as children, cannot read the function's
/// environment, which holds or points to the function's own credentials. (Terraform itself is
/// dumpable again after its exec, which is harmless: it holds only this job's access.)
pub fn non_dumpable() {
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::error!(error = %e, "could not make the runner non-dumpable: terraform may read its environment");
    }
}

/// Cancels `token` when the process gets SIGTERM (how every platform stops a container before
/// it kills it), logging `what` happens then.
pub fn cancel_on_sigterm(token: &CancellationToken, what: &'static str) {
    let token = token.clone();
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
            tracing::warn!("SIGTERM: {what}");
            token.cancel();
        }
    });
}

/// A handed-off task's exit code for its job's fate, with the record on stdout: 0 the job
/// succeeded or went back on the queue to run later, 1 it failed, 65 the message was refused,
/// 75 it could neither run nor go back on the queue (a retry of the task may).
pub fn task_exit(name: &str, fate: crate::pipeline::Fate) -> std::process::ExitCode {
    use crate::pipeline::Fate;
    use std::process::ExitCode;
    match fate {
        Fate::Ran(record) => {
            println!("{record}");
            if record["status"] == "succeeded" {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Fate::Rejected(record) => {
            println!("{record}");
            ExitCode::from(65)
        }
        Fate::HandedOff(record) => {
            println!("{record}");
            ExitCode::SUCCESS
        }
        Fate::Requeued { why, delay } => {
            tracing::warn!(
                "{name}: the job is back on the queue, to run in {} s: {why}",
                delay.as_secs()
            );
            ExitCode::SUCCESS
        }
        Fate::Again { why, .. } => {
            tracing::error!("{name}: {why}");
            ExitCode::from(75)
        }
        Fate::Interrupted(record) => {
            println!("{record}");
            ExitCode::from(75)
        }
    }
}
