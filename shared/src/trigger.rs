//! The pieces of a job message every trigger shares: its rejection record, the validation of
//! its job, and the reference a handed-off task gets to the message staged for it (see
//! [`crate::pipeline`] for the message's path).

use std::path::Path;

use serde_json::{Map, Value, json};
use state_backends::WorkspaceId;

use crate::job::RawJob;
use crate::validate::{ValidatedJob, validate};

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

/// What a handed-off task (an ECS task, a Cloud Run Job) gets: where the job message is staged
/// in the customer's store (`runs/<job>/request-<nonce>.json`, a name of its own per staging, so
/// a task only ever deletes its own), the account (`target`) to read it with, and the SHA-256
/// of the staged bytes. The message itself, with the job's variables, never goes
/// through the platform's API; the digest, which does, is what lets the task trust the staged
/// copy (anyone who can write to the customer's bucket could otherwise change the job).
#[derive(Debug, serde::Deserialize, serde::Serialize)]
pub struct JobRef<T> {
    pub target: T,
    pub tenant: String,
    pub workspace: String,
    pub job_id: String,
    /// Hex SHA-256 of the staged message; a reference without one is refused.
    #[serde(default)]
    pub sha256: String,
    /// The staged message's name in the run's folder (`request-<16 hex>.json`); references
    /// made before it had one name [`REQUEST`].
    #[serde(default)]
    pub staged: String,
}

/// The staged job message's name in the run's folder, in references without a name of its own.
pub const REQUEST: &str = "request.json";

/// A fresh name for a staged message: `request-<16 hex>.json`.
fn staged_name() -> String {
    let nonce: [u8; 8] = rand::random();
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    format!("request-{hex}.json")
}

/// Whether `name` is one [`staged_name`] makes (a reference names nothing else).
fn is_staged_name(name: &str) -> bool {
    name.strip_prefix("request-")
        .and_then(|rest| rest.strip_suffix(".json"))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Why a task cannot use its staged message.
#[derive(Debug)]
pub enum StagedError {
    /// It cannot be read now (the store, the role): the task may be tried again.
    Unavailable(String),
    /// It is not the message that was staged, or cannot be checked: never run. The rejection
    /// record to report.
    Refused(Value),
}

impl std::fmt::Display for StagedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StagedError::Unavailable(why) => f.write_str(why),
            StagedError::Refused(record) => write!(
                f,
                "refused: {}",
                record["errors"][0]["problem"].as_str().unwrap_or_default()
            ),
        }
    }
}

impl<T> JobRef<T> {
    /// Stages `body` for a task and returns the reference to hand it.
    ///
    /// # Errors
    /// Why it cannot be written, as a sentence.
    pub async fn stage(
        target: T,
        ws: &WorkspaceId,
        job_id: &str,
        body: &[u8],
        store: &dyn state_backends::StateStore,
    ) -> Result<Self, String> {
        let staged = staged_name();
        store
            .put_artifact(ws, job_id, &staged, bytes::Bytes::copy_from_slice(body))
            .await
            .map_err(|e| format!("cannot stage the job for its task: {e}"))?;
        Ok(Self {
            target,
            tenant: ws.tenant().to_owned(),
            workspace: ws.workspace().to_owned(),
            job_id: job_id.to_owned(),
            sha256: state_backends::sha256_hex(body),
            staged,
        })
    }

    /// The staged message, if it is byte for byte the one that was staged.
    ///
    /// # Errors
    /// [`StagedError`].
    pub async fn staged(
        &self,
        store: &dyn state_backends::StateStore,
    ) -> Result<Vec<u8>, StagedError> {
        let ws = self.ws().map_err(StagedError::Unavailable)?;
        let name = self.name();
        let field = format!("runs/{}/{name}", self.job_id);
        let refuse = |problem: String| {
            let mut record = rejection(
                &format!("task-{}", self.job_id),
                vec![self::problem(
                    &field,
                    problem,
                    "send the job's message again to stage it afresh, and check who can write to the bucket",
                )],
            );
            record["job_id"] = Value::from(self.job_id.clone());
            StagedError::Refused(record)
        };
        if self.sha256.is_empty() {
            return Err(refuse(
                "the task's job reference carries no digest of the staged message, so the message cannot be trusted".into(),
            ));
        }
        if name != REQUEST && !is_staged_name(name) {
            return Err(refuse(format!(
                "the task's job reference names {name:?}, which is not a staged message"
            )));
        }
        let data = store
            .artifact(&ws, &self.job_id, name)
            .await
            .map_err(|e| StagedError::Unavailable(e.to_string()))?
            .ok_or_else(|| refuse(format!("{field} is not in {ws}")))?;
        let found = state_backends::sha256_hex(&data);
        if found != self.sha256 {
            return Err(refuse(format!(
                "{field} changed after it was staged (sha256 {found}, staged {})",
                self.sha256
            )));
        }
        Ok(data.to_vec())
    }

    /// Deletes the staged message: it holds the job's variables, sensitive ones included,
    /// which must not outlive the run in the customer's bucket. Called once the job has a final
    /// result or a fresh copy of it is back on the queue. A failure is logged, not returned: the
    /// job's fate stands.
    pub async fn unstage(&self, store: &dyn state_backends::StateStore) {
        let name = self.name();
        if name != REQUEST && !is_staged_name(name) {
            return;
        }
        let deleted = match self.ws() {
            Ok(ws) => store
                .delete_artifact(&ws, &self.job_id, name)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        if let Err(e) = deleted {
            tracing::warn!(job_id = %self.job_id, error = %e, "could not delete the staged job message");
        }
    }

    /// Deletes every staged copy of this job (stagings of earlier deliveries whose task never
    /// ran included), once the job has a final result. Failures are logged.
    pub async fn unstage_all(&self, store: &dyn state_backends::StateStore) {
        let Ok(ws) = self.ws() else { return };
        let names = match store.artifacts(&ws, &self.job_id).await {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(job_id = %self.job_id, error = %e, "could not list the job's staged messages");
                return;
            }
        };
        for name in names
            .iter()
            .filter(|n| n.as_str() == REQUEST || is_staged_name(n))
        {
            if let Err(e) = store.delete_artifact(&ws, &self.job_id, name).await {
                tracing::warn!(job_id = %self.job_id, name, error = %e, "could not delete a staged job message");
            }
        }
    }

    /// The staged message's name.
    pub fn name(&self) -> &str {
        if self.staged.is_empty() {
            REQUEST
        } else {
            &self.staged
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
