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

pub mod access;
pub mod app;
pub mod config;
pub mod queue;

use std::process::ExitCode;

use crate::app::{App, Targets};

/// `terrace-azure sweep backup|drift`: a scheduled execution's sweep over the customers'
/// containers in `TERRACE_SWEEP_TARGETS`; its report on stdout.
pub async fn sweep(app: &App, kind: &str) -> ExitCode {
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
