//! `terrace-azure`: the Azure function, a Container Apps job. An event-driven execution
//! (started by KEDA's azure-queue scaler when the jobs queue has messages) takes one message,
//! runs its job and exits; see `app` for what happens to the message. A scheduled execution
//! runs `terrace-azure sweep backup` (hourly) or `terrace-azure sweep drift` over the
//! containers of the registered tenants (`TERRACE_SWEEP_TENANTS`, or all of them).
//!
//! On SIGTERM (the replica stopping) it interrupts the running job (terraform gets SIGINT, the
//! lease is released, the result says `interrupted`) and makes the message visible again.
//!
//! Exit codes: 0 when the message was handled (its job's own status is in its result), or
//! the queue was empty, or the sweep did everything; 1 when a sweep left something undone;
//! 75 when the queue could not be used; 78 for bad settings.

pub mod access;
pub mod app;
pub mod broker;
pub mod config;
pub mod transport;

use std::process::ExitCode;

use shared::host::sweep;
use shared::sweeps::report::SweepKind;

use crate::app::App;

/// `terrace-azure sweep backup|drift`: a scheduled execution's sweep over the containers of
/// the registered tenants (`TERRACE_SWEEP_TENANTS`, or all); its report on stdout.
pub async fn sweep(app: &App, kind: &str) -> ExitCode {
    let targets = match app.config.tenants.grouped(&app.config.sweep_tenants) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("terrace-azure: TERRACE_SWEEP_TENANTS: {e}");
            return ExitCode::from(78);
        }
    };
    let kind = if kind == "backup" {
        SweepKind::Backup
    } else {
        SweepKind::Drift
    };
    let report = sweep::sweep(app, kind, &targets, time::OffsetDateTime::now_utc()).await;
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
    if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
