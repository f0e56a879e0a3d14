//! A handed-off job, in the task it was handed to ([`task`]): its staged message read and
//! checked, run through the same pipeline, and put back on the queue for any end that is not
//! final, since not every platform runs a task again.

use std::time::Duration;

use serde_json::Value;
use state_backends::WorkspaceId;
use tokio_util::sync::CancellationToken;

use crate::host::trigger::{JobRef, StagedError, TriggerError, problem, rejection};
use crate::run::retry::Tries;

use super::{Delivery, Fate, Trigger, cannot, decode, final_result, handle, ran, reject};

/// A task puts its job back for trouble that may pass at most this many times; then the job
/// ends with an error record (and the platform decides).
pub const MAX_TASK_REQUEUES: u32 = 5;

/// The waits between a task's tries to read its staged job, or to put it back on the queue (a
/// task is not retried by every platform: ECS runs it once).
const TASK_WAITS: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(4)];

/// How long a task waits before its job is delivered again after trouble that may pass.
const TROUBLE_DELAY: Duration = Duration::from_secs(60);

/// Runs the job a task was handed by `reference` (see [`JobRef`]), waiting up to `lease_wait`
/// for a busy workspace. A staged message that is not the one staged is refused and reported.
/// Any end that is not final (busy, trouble, shutdown) puts the job back on the jobs queue as a
/// fresh copy ([`Fate::Requeued`]), so a handed-off job ends with a reported result or runs
/// again; only when even that fails is it [`Fate::Again`] (the task's own retry, if any).
pub async fn task<T: Trigger + ?Sized>(
    trigger: &T,
    reference: &str,
    lease_wait: Duration,
    cancel: CancellationToken,
) -> Fate {
    let fate = task_one(trigger, reference, lease_wait, cancel).await;
    crate::host::process::flush_telemetry().await;
    fate
}

async fn task_one<T: Trigger + ?Sized>(
    trigger: &T,
    reference: &str,
    lease_wait: Duration,
    cancel: CancellationToken,
) -> Fate {
    let r: JobRef<T::Target> = match serde_json::from_str(reference) {
        Ok(r) => r,
        Err(e) => {
            let record = rejection(
                "task",
                vec![problem(
                    "TERRACE_JOB_REF",
                    format!("not a job reference: {e}"),
                    "start tasks only through the runner's hand-off",
                )],
            );
            return reject(trigger, record).await;
        }
    };
    let ws = match WorkspaceId::new(&r.tenant, &r.workspace) {
        Ok(ws) => ws,
        Err(e) => {
            let record = rejection("task", vec![problem("TERRACE_JOB_REF.workspace", e, "")]);
            return reject(trigger, record).await;
        }
    };
    // The runner made the reference from its registry: a target that is not the registry's
    // was not made by it.
    let target = match trigger.tenants() {
        None => r.target.clone(),
        Some(tenants) => match tenants.resolve(&r.tenant, Some(&r.target), trigger.registry_only())
        {
            Ok(target) => target,
            Err(problems) => return reject(trigger, rejection("task", problems)).await,
        },
    };
    // A task is not retried by every platform (ECS runs it once): trouble reading its job is
    // tried a few times here before it gives up.
    let read = || async {
        let store = trigger.store(&target, &r.job_id, None).await?;
        match r.staged(&*store).await {
            Err(StagedError::Unavailable(why)) => Err(TriggerError::again(why)),
            staged => Ok((store, staged)),
        }
    };
    let (store, staged) = match Tries::after(&TASK_WAITS)
        .run("cannot read the staged job", TriggerError::may_pass, read)
        .await
    {
        Ok(read) => read,
        Err(e) => return cannot(trigger, "task", e.context("cannot read the staged job")).await,
    };
    let body = match staged {
        Ok(body) => body,
        Err(StagedError::Refused(record)) => {
            // A task run again after its job finished (its staged copy is gone by then) gets
            // the job's result, like any delivery of a finished job.
            if let Some(result) = final_result(&*store, &ws, &r.job_id, None).await {
                return ran(trigger, result).await;
            }
            return reject(trigger, record).await;
        }
        Err(StagedError::Unavailable(why)) => {
            return Fate::again(format!("cannot read the staged job: {why}"));
        }
    };
    let message_id = format!("task-{}", r.job_id);
    let fate = handle(
        trigger,
        Delivery {
            message_id: &message_id,
            body: &body,
            time_left: None,
            lease_wait,
            cancel,
            receipt: None,
        },
    )
    .await;
    let fate = match fate {
        // `handle` queued a fresh copy of the message already.
        Fate::Requeued { .. } | Fate::Ran(_) | Fate::Rejected(_) | Fate::HandedOff(_) => fate,
        Fate::Interrupted(_) => put_back(trigger, &body, Duration::ZERO, false, fate).await,
        Fate::Again { ref why, delay } => {
            let busy = delay.is_some();
            let delay = delay.unwrap_or(TROUBLE_DELAY);
            let why = why.clone();
            put_back(
                trigger,
                &body,
                delay,
                !busy,
                Fate::Again { why, delay: None },
            )
            .await
        }
    };
    // The staged copy holds the job's variables: it goes once the job has a final result, or
    // once a fresh copy is on the queue (a later hand-off stages it again).
    match fate {
        // Final: every staging of the job goes, earlier ones whose task never ran included.
        Fate::Ran(_) | Fate::Rejected(_) => r.unstage_all(&*store).await,
        Fate::Requeued { .. } => r.unstage(&*store).await,
        _ => {}
    }
    fate
}

/// Puts a task's job back on the queue after an end that is not final; `trouble` counts
/// towards [`MAX_TASK_REQUEUES`], after which the job ends with a reported error record.
pub(super) async fn put_back<T: Trigger + ?Sized>(
    trigger: &T,
    body: &[u8],
    delay: Duration,
    trouble: bool,
    fate: Fate,
) -> Fate {
    let why = match &fate {
        Fate::Again { why, .. } => why.clone(),
        _ => "interrupted by the task's shutdown".to_owned(),
    };
    let Ok(mut envelope) = decode::<Value>(body) else {
        return fate;
    };
    if trouble {
        envelope.requeued += 1;
        if envelope.requeued > MAX_TASK_REQUEUES {
            use crate::run::result::{Category, JobError, JobResult, Status};
            let error = JobError::new(
                Category::Transient,
                "prepare",
                format!(
                    "a task could not run the job in {} tries: {why}",
                    MAX_TASK_REQUEUES + 1
                ),
                "see the tasks' logs; send the job again once the cause is fixed",
                true,
            );
            // The staged job was a valid one when it was handed off: a typed result of it.
            let Some(job) = as_handed_off(&envelope.job) else {
                let mut record =
                    rejection("task", vec![problem("job", &error.message, &error.hint)]);
                record.job_id = envelope
                    .job
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                return reject(trigger, record).await;
            };
            tracing::error!(job_id = %job.id, error = %error.message, "giving up on a handed-off job");
            return ran(
                trigger,
                JobResult::never_started(&job, Status::Failed, error),
            )
            .await;
        }
    }
    let Ok(copy) = serde_json::to_vec(&envelope) else {
        return fate;
    };
    let requeued = Tries::after(&TASK_WAITS)
        .run(
            "could not queue the task's job again",
            TriggerError::may_pass,
            || trigger.requeue(&copy, delay),
        )
        .await;
    match requeued {
        Ok(()) => {
            tracing::info!(
                why,
                delay_s = delay.as_secs(),
                "the task's job is queued again"
            );
            Fate::Requeued { why, delay }
        }
        Err(e) => {
            tracing::error!(error = %e, why, "the task's job could not be queued again");
            fate
        }
    }
}

/// What a result names of a job as it was handed off (its id, workspace, operation, template,
/// sequence and plan), read from the job as sent; `None` when it lacks one of them.
fn as_handed_off(raw: &serde_json::Map<String, Value>) -> Option<crate::job::Job> {
    let text = |k: &str| raw.get(k)?.as_str().map(str::to_owned);
    Some(crate::job::Job {
        id: text("id")?,
        tenant: text("tenant")?,
        workspace: text("workspace")?,
        operation: serde_json::from_value(raw.get("operation")?.clone()).ok()?,
        template: serde_json::from_value(raw.get("template")?.clone()).ok()?,
        variables: std::collections::BTreeMap::new(),
        timeout: crate::job::DEFAULT_TIMEOUT,
        on_failure: crate::job::OnFailure::default(),
        retry: crate::job::RetryPolicy::default(),
        budget: None,
        sequence: raw.get("sequence").and_then(Value::as_u64),
        plan: text("plan"),
        plan_key: None,
        destroy: false,
    })
}

/// A task's record as its stdout (the task's log) shows it: a plan's own key goes only to the
/// results channel.
fn for_the_log(mut record: Value) -> Value {
    if let Some(plan) = record.get_mut("plan").and_then(Value::as_object_mut) {
        plan.remove("key");
    }
    record
}

/// A handed-off task's exit code for its job's fate, with the record on stdout: 0 the job
/// succeeded or went back on the queue to run later, 1 it failed, 65 the message was refused,
/// 75 it could neither run nor go back on the queue (a retry of the task may).
pub fn task_exit(name: &str, fate: Fate) -> std::process::ExitCode {
    use std::process::ExitCode;
    match fate {
        Fate::Ran(record) => {
            let record = for_the_log(record);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tasks_log_never_shows_a_plans_own_key() {
        let record =
            json!({ "status": "succeeded", "plan": { "id": "p1", "key": "k".repeat(43) } });
        let shown = for_the_log(record);
        assert_eq!(shown["plan"]["id"], "p1");
        assert!(shown["plan"].get("key").is_none(), "{shown}");
        assert_eq!(
            for_the_log(json!({ "status": "failed" })),
            json!({ "status": "failed" })
        );
    }
}
