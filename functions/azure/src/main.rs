//! `terrace-azure`: the Azure function, a Container Apps job. An event-driven execution
//! (started by KEDA's azure-queue scaler when the jobs queue has messages) takes one message,
//! runs its job and exits; see `app` for what happens to the message. A scheduled execution
//! runs `terrace-azure sweep backup` (hourly) or `terrace-azure sweep drift` over the
//! customers' containers in `TERRACE_SWEEP_TARGETS`.
//!
//! On SIGTERM (the replica stopping) it interrupts the running job (terraform gets SIGINT, the
//! lease is released, the result says `interrupted`) and makes the message visible again.
//!
//! Exit codes: 0 when the message was handled (its job's own status is in its result), or
//! the queue was empty, or the sweep did everything; 1 when a sweep left something undone;
//! 75 when the queue could not be used; 78 for bad settings.

mod access;
mod app;
mod config;
mod queue;

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::app::{App, Targets};

#[tokio::main]
async fn main() -> ExitCode {
    shared::process::init_json_logs();
    let config = match config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("terrace-azure: {e}");
            return ExitCode::from(78);
        }
    };
    let own = if config.sas.is_some() {
        None
    } else {
        match access::own(config.managed_identity.as_deref()) {
            Ok(own) => Some(own),
            Err(e) => {
                eprintln!("terrace-azure: {e}");
                return ExitCode::from(78);
            }
        }
    };
    let shutdown = CancellationToken::new();
    shared::process::cancel_on_sigterm(&shutdown, "interrupting the job");
    let app = App {
        config,
        own,
        shutdown,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["run"] => match app.run_one().await {
            Ok(outcome) => {
                tracing::info!(?outcome, "execution ends");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("terrace-azure: {e}");
                ExitCode::from(75)
            }
        },
        ["sweep", kind @ ("backup" | "drift")] => sweep(&app, kind).await,
        _ => {
            eprintln!("usage: terrace-azure [run] | terrace-azure sweep backup|drift");
            ExitCode::from(64)
        }
    }
}

async fn sweep(app: &App, kind: &str) -> ExitCode {
    let targets: Targets = match std::env::var("TERRACE_SWEEP_TARGETS")
        .map_err(|_| "TERRACE_SWEEP_TARGETS is not set".to_owned())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "terrace-azure: TERRACE_SWEEP_TARGETS must be a JSON list of targets ({{\"container_url\", \"tenant_id\", \"client_id\", …}}): {e}"
            );
            return ExitCode::from(78);
        }
    };
    let reports = if kind == "backup" {
        app.backup_sweep(&targets).await
    } else {
        app.drift_sweep(&targets).await
    };
    println!(
        "{}",
        serde_json::json!({ "sweep": kind, "targets": reports })
    );
    if reports.iter().any(shared::backup::report_failed) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
