//! What the function does with each kind of invocation: a Lambda event (an SQS batch of jobs,
//! or a scheduled sweep) and `terrace-aws task` (one handed-off job). Callable in-process.

use std::process::ExitCode;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent};
use serde::Deserialize;
use serde_json::Value;
use shared::host::pipeline::{self, Delivery};
use shared::host::sweep::sweep;
use shared::sweeps::report::SweepKind;
use time::OffsetDateTime;

use crate::app::App;
use crate::transport;

/// A scheduled event from EventBridge Scheduler (its input is ours). It sweeps the buckets of
/// the registered tenants (`tenants`, or all of them), never a bucket named here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scheduled {
    terrace: String,
    #[serde(default)]
    tenants: Vec<String>,
}

/// One Lambda invocation: an SQS batch, or a scheduled sweep.
///
/// # Errors
/// An event that is neither.
pub async fn handle(app: &App, event: LambdaEvent<Value>) -> Result<Value, Error> {
    let deadline =
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(event.context.deadline) * 1_000_000)
            .unwrap_or_else(|_| OffsetDateTime::now_utc());
    if event.payload.get("Records").is_some() {
        let batch: SqsEvent = serde_json::from_value(event.payload)?;
        let response = transport::handle_batch(app, batch, deadline).await;
        return Ok(serde_json::to_value(response)?);
    }
    let scheduled: Scheduled = serde_json::from_value(event.payload).map_err(|e| {
        format!("not an SQS batch nor a Terrace schedule ({{\"terrace\": \"backup-sweep\" or \"drift-sweep\"}}, and optionally \"tenants\": [names] to sweep only those; buckets come from the tenant registry): {e}")
    })?;
    let targets = app.config.tenants.grouped(&scheduled.tenants)?;
    let kind = match scheduled.terrace.as_str() {
        "backup-sweep" => SweepKind::Backup,
        "drift-sweep" => SweepKind::Drift,
        other => {
            return Err(format!(
                "unknown scheduled task {other:?}; known: backup-sweep, drift-sweep"
            )
            .into());
        }
    };
    let report = sweep(app, kind, &targets, OffsetDateTime::now_utc()).await;
    Ok(serde_json::to_value(report)?)
}

/// `terrace-aws task`: one handed-off job. Exit codes: 0 the job succeeded or went back on the
/// queue to run later, 1 it failed, 65 the message was refused, 75 it could neither run nor go
/// back on the queue (the staged message stays, and the job's SQS message, which the task
/// settles, comes back: see `transport::settle`).
pub async fn task(app: &App) -> ExitCode {
    // Fargate stops a task with SIGTERM, then SIGKILL after its stopTimeout: the job ends
    // `interrupted` and goes back on the queue.
    shared::host::process::cancel_on_sigterm(&app.shutdown, "interrupting the job");
    let cancel = app.shutdown.child_token();
    let wait = app.config.runtime.task_lease_wait;
    let fate = match (
        std::env::var("TERRACE_JOB_REF"),
        std::env::var("TERRACE_JOB"),
    ) {
        (Ok(reference), _) => {
            // The message the job came in, when the Lambda left it for this task to settle.
            let receipt = serde_json::from_str::<crate::app::JobRef>(&reference)
                .ok()
                .and_then(|r| r.receipt);
            let keeper = transport::keep_invisible(app, receipt.clone());
            let fate = pipeline::task(app, &reference, wait, cancel).await;
            if let Some(keeper) = keeper {
                keeper.abort();
            }
            if let Some(receipt) = &receipt {
                transport::settle(app, receipt, &fate).await;
            }
            fate
        }
        (Err(_), Ok(body)) => {
            let delivery = Delivery {
                message_id: "ecs-task",
                body: body.as_bytes(),
                time_left: None,
                lease_wait: wait,
                cancel,
                receipt: None,
            };
            pipeline::handle(app, delivery).await
        }
        (Err(_), Err(_)) => {
            tracing::error!(
                "terrace-aws task: set TERRACE_JOB_REF (what the Lambda hands off) or TERRACE_JOB (a job message)"
            );
            return ExitCode::from(64);
        }
    };
    shared::host::pipeline::task_exit("terrace-aws task", fate)
}
