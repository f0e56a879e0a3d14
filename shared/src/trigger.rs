//! What every cloud's function does with a job message, whatever delivered it: check the job,
//! and turn the runner's outcome into what the trigger should do with the message (acknowledge
//! it, or have it delivered again later).

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value, json};
use state_backends::WorkspaceId;

use crate::job::RawJob;
use crate::runner::RunOutcome;
use crate::validate::{ValidatedJob, validate};

/// How one message ended, for the trigger to acknowledge or not.
#[derive(Debug)]
pub enum Handled {
    /// Finished, already done, rejected for good, or handed off: acknowledge the message.
    Done(Value),
    /// Deliver it again later (busy workspace, transient trouble); `delay` when known.
    Again {
        why: String,
        delay: Option<Duration>,
    },
    /// The job does not fit in the time left here.
    TooLong { job_id: String, ws: WorkspaceId },
}

/// The record of a message that will never be a job.
pub fn rejection(message_id: &str, errors: Vec<Value>) -> Value {
    json!({ "status": "rejected", "message_id": message_id, "errors": errors })
}

/// One problem with a message, as a rejection lists it.
pub fn problem(field: &str, problem: impl std::fmt::Display, fix: &str) -> Value {
    json!({ "field": field, "problem": problem.to_string(), "fix": fix })
}

/// Validates a message's job.
///
/// # Errors
/// Every problem, as a rejection lists them.
pub fn check_job(job: &Map<String, Value>, templates: &Path) -> Result<ValidatedJob, Vec<Value>> {
    validate(&RawJob(job.clone()), templates).map_err(|errors| {
        errors
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
            .collect()
    })
}

/// What the runner's outcome means for the message; the flag says whether the result is new
/// (to be reported), rather than a repeat of an earlier run's.
pub fn handled(outcome: anyhow::Result<RunOutcome>) -> (Handled, bool) {
    match outcome {
        Ok(RunOutcome::Finished(result)) => (
            Handled::Done(serde_json::to_value(&*result).unwrap_or(Value::Null)),
            true,
        ),
        Ok(RunOutcome::AlreadyDone(result)) => (
            Handled::Done(serde_json::to_value(&*result).unwrap_or(Value::Null)),
            false,
        ),
        Ok(RunOutcome::Busy { holder }) => {
            let wait = (holder.expires_at - time::OffsetDateTime::now_utc())
                .whole_seconds()
                .clamp(5, 900);
            (
                Handled::Again {
                    why: format!(
                        "workspace busy: job {} holds it until {}",
                        holder.owner,
                        state_backends::display_time(holder.expires_at)
                    ),
                    delay: Some(Duration::from_secs(wait.unsigned_abs())),
                },
                false,
            )
        }
        Err(e) => (
            Handled::Again {
                why: format!("{e:#}"),
                delay: None,
            },
            false,
        ),
    }
}
