//! What the function does with each kind of invocation: a Lambda event (an SQS batch of jobs,
//! or a scheduled sweep) and `terrace-aws task` (one handed-off job). Callable in-process.

use std::collections::BTreeSet;
use std::process::ExitCode;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent};
use serde::Deserialize;
use serde_json::{Value, json};
use shared::host::pipeline::{self, Delivery};
use time::OffsetDateTime;

use crate::access::Target;
use crate::app::App;
use crate::sqs;

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
        let response = sqs::handle_batch(app, batch, deadline).await;
        return Ok(serde_json::to_value(response)?);
    }
    let scheduled: Scheduled = serde_json::from_value(event.payload).map_err(|e| {
        format!("not an SQS batch nor a Terrace schedule ({{\"terrace\": \"backup-sweep\" or \"drift-sweep\"}}, and optionally \"tenants\": [names] to sweep only those; buckets come from the tenant registry): {e}")
    })?;
    let targets = app.config.tenants.grouped(&scheduled.tenants)?;
    match scheduled.terrace.as_str() {
        "backup-sweep" => Ok(backup_sweep(app, &targets).await),
        "drift-sweep" => Ok(drift_sweep(app, &targets).await),
        other => Err(
            format!("unknown scheduled task {other:?}; known: backup-sweep, drift-sweep").into(),
        ),
    }
}

/// Each registered target, once, with the tenants registered to it.
type Targets = [(Target, BTreeSet<String>)];

/// The hourly backup sweep over each customer's bucket.
async fn backup_sweep(app: &App, targets: &Targets) -> Value {
    let mut reports = Vec::new();
    for (target, _) in targets {
        let store = app.store_for(target, "backup-sweep").await;
        let report =
            shared::sweeps::backup::bucket_report(&target.bucket, store, OffsetDateTime::now_utc())
                .await;
        tracing::info!(report = %report, "backup sweep");
        reports.push(report);
    }
    json!({ "backup_sweep": reports })
}

/// The drift sweep: a `drift-check` job for each workspace of each customer's bucket, put on
/// the function's own job queue so each runs like any other job.
async fn drift_sweep(app: &App, targets: &Targets) -> Value {
    let mut reports = Vec::new();
    for (target, tenants) in targets {
        let report = match drift_target(app, target, tenants).await {
            Ok(report) => report,
            Err(e) => json!({ "bucket": target.bucket, "error": e }),
        };
        tracing::info!(report = %report, "drift sweep");
        reports.push(report);
    }
    json!({ "drift_sweep": reports })
}

async fn drift_target(
    app: &App,
    target: &Target,
    tenants: &BTreeSet<String>,
) -> Result<Value, String> {
    let Some(queue) = &app.config.jobs_queue_url else {
        return Err("TERRACE_JOBS_QUEUE_URL is not set: the drift checks have no queue".into());
    };
    let store = app.store_for(target, "drift-sweep").await?;
    let mut plan = shared::sweeps::drift::plan(
        &*store,
        OffsetDateTime::now_utc(),
        app.config.runtime.drift_per_tenant,
    )
    .await
    .map_err(|e| e.to_string())?;
    plan.only_tenants(tenants);
    let mut queued = 0;
    let mut unqueued: Vec<(String, String)> = Vec::new();
    for chunk in plan.jobs.chunks(10) {
        let mut entries = Vec::new();
        for (i, (_, job)) in chunk.iter().enumerate() {
            // The job's tenant names its target: the registry's, this one.
            let body = json!({ "job": job.0 }).to_string();
            entries.push(
                aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body)
                    .build()
                    .map_err(|e| e.to_string())?,
            );
        }
        match app
            .sqs
            .send_message_batch()
            .queue_url(queue)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                queued += out.successful().len();
                for f in out.failed() {
                    let ws = f
                        .id()
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| chunk.get(i))
                        .map(|(ws, _)| ws.to_string())
                        .unwrap_or_default();
                    unqueued.push((ws, f.message().unwrap_or_default().to_owned()));
                }
            }
            Err(e) => {
                let why = state_backends::s3::brief(&e);
                unqueued.extend(chunk.iter().map(|(ws, _)| (ws.to_string(), why.clone())));
            }
        }
    }
    Ok(plan.report(&target.bucket, queued, unqueued))
}

/// `terrace-aws task`: one handed-off job. Exit codes: 0 the job succeeded or went back on the
/// queue to run later, 1 it failed, 65 the message was refused, 75 it could neither run nor go
/// back on the queue (the staged message stays, and the job's SQS message, which the task
/// settles, comes back: see `sqs::settle`).
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
            let keeper = sqs::keep_invisible(app, receipt.clone());
            let fate = pipeline::task(app, &reference, wait, cancel).await;
            if let Some(keeper) = keeper {
                keeper.abort();
            }
            if let Some(receipt) = &receipt {
                sqs::settle(app, receipt, &fate).await;
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
