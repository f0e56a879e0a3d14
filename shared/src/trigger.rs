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

/// What a handed-off task (an ECS task, a Cloud Run Job) gets: where the job message is staged
/// in the customer's store (`runs/<job>/request.json`), and the account (`target`) to read it
/// with. The message itself, with the job's variables, never goes through the platform's API.
#[derive(Debug, serde::Deserialize, serde::Serialize)]
pub struct JobRef<T> {
    pub target: T,
    pub tenant: String,
    pub workspace: String,
    pub job_id: String,
}

/// The staged job message's name in the run's folder.
pub const REQUEST: &str = "request.json";

impl<T> JobRef<T> {
    pub fn new(target: T, ws: &WorkspaceId, job_id: &str) -> Self {
        Self {
            target,
            tenant: ws.tenant().to_owned(),
            workspace: ws.workspace().to_owned(),
            job_id: job_id.to_owned(),
        }
    }

    /// Stages the message for the task.
    ///
    /// # Errors
    /// Why it cannot be written, as a sentence.
    pub async fn stage(
        &self,
        store: &dyn state_backends::StateStore,
        body: &[u8],
    ) -> Result<(), String> {
        let ws = self.ws()?;
        store
            .put_artifact(
                &ws,
                &self.job_id,
                REQUEST,
                bytes::Bytes::copy_from_slice(body),
            )
            .await
            .map_err(|e| format!("cannot stage the job for its task: {e}"))
    }

    /// The staged message.
    ///
    /// # Errors
    /// Why it cannot be read, as a sentence.
    pub async fn staged(&self, store: &dyn state_backends::StateStore) -> Result<Vec<u8>, String> {
        let ws = self.ws()?;
        let data = store
            .artifact(&ws, &self.job_id, REQUEST)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("runs/{}/{REQUEST} is not in {ws}", self.job_id))?;
        Ok(data.to_vec())
    }

    /// Deletes the staged message once its job has a final result: it holds the job's
    /// variables, sensitive ones included, which must not outlive the run in the customer's
    /// bucket. A re-runnable end (interrupted, or not run) keeps it for the retry. A failure is
    /// logged, not returned: the job's result stands.
    pub async fn unstage(
        &self,
        store: &dyn state_backends::StateStore,
        result: &serde_json::Value,
    ) {
        if !is_final(result) {
            return;
        }
        let deleted = match self.ws() {
            Ok(ws) => store
                .delete_artifact(&ws, &self.job_id, REQUEST)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        if let Err(e) = deleted {
            tracing::warn!(job_id = %self.job_id, error = %e, "could not delete the staged job message");
        }
    }

    fn ws(&self) -> Result<WorkspaceId, String> {
        WorkspaceId::new(&self.tenant, &self.workspace).map_err(|e| e.to_string())
    }
}

/// Whether a job's result is its last word: anything but `interrupted` (which runs again).
#[must_use]
pub fn is_final(result: &serde_json::Value) -> bool {
    result["status"]
        .as_str()
        .is_some_and(|s| s != "interrupted")
}
