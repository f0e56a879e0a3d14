//! The pieces of a job message every trigger shares: its rejection record, the validation of
//! its job, and the reference a handed-off task gets to the message staged for it (see
//! [`crate::host::pipeline`] for the message's path).

use std::path::Path;

use serde_json::{Map, Value};
use state_backends::WorkspaceId;

use crate::host::message::Rejection;
use crate::job::RawJob;
use crate::job::template::source::{SourceError, Templates};
use crate::job::validate::{ValidatedJob, ValidationError, fetch_and_validate};

/// Why a trigger could not do what the pipeline asked (reach the store, give terraform access,
/// start a task, queue a message): trouble that may pass, or a reason the job can never run
/// this way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TriggerError {
    /// Trouble that may pass (a service that did not answer, a throttle): the message is
    /// delivered again.
    #[error("{0}")]
    Again(String),
    /// Nothing will change by trying again (the target lacks what this cloud needs, this host
    /// has no task to hand a job to): the job is rejected with `problem` at `field` and `fix`.
    #[error("{problem}")]
    Never {
        field: &'static str,
        problem: String,
        fix: String,
    },
}

impl TriggerError {
    /// Trouble that may pass.
    pub fn again(why: impl Into<String>) -> Self {
        Self::Again(why.into())
    }

    /// A reason the job can never run this way, the field it is about and the fix.
    pub fn never(field: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::Never {
            field,
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// Whether trying again may help.
    pub fn may_pass(&self) -> bool {
        matches!(self, Self::Again(_))
    }

    /// Adds what was being done to the reason: "could not …: why".
    #[must_use]
    pub fn context(self, doing: &str) -> Self {
        match self {
            Self::Again(why) => Self::Again(format!("{doing}: {why}")),
            Self::Never {
                field,
                problem,
                fix,
            } => Self::Never {
                field,
                problem: format!("{doing}: {problem}"),
                fix,
            },
        }
    }
}

/// A sentence from a call that failed is trouble that may pass, unless the trigger says
/// otherwise with [`TriggerError::never`].
impl From<String> for TriggerError {
    fn from(why: String) -> Self {
        Self::Again(why)
    }
}

impl From<&str> for TriggerError {
    fn from(why: &str) -> Self {
        Self::Again(why.to_owned())
    }
}

/// The record of a message that will never be a job.
pub fn rejection(message_id: &str, errors: Vec<ValidationError>) -> Rejection {
    Rejection::new(message_id, errors)
}

/// One problem with a message, as a rejection lists it.
pub fn problem(field: &str, problem: impl std::fmt::Display, fix: &str) -> ValidationError {
    ValidationError::new(field, problem.to_string(), fix)
}

/// Validates a message's job, its template fetched first if it comes from a bucket.
///
/// # Errors
/// Every problem, as a rejection lists them; the outer error when the template could not be
/// fetched for a reason that may pass.
pub async fn check_job(
    job: &Map<String, Value>,
    templates: &Templates,
    cloud: Option<&str>,
) -> Result<Result<ValidatedJob, Vec<ValidationError>>, SourceError> {
    fetch_and_validate(&RawJob(job.clone()), templates, cloud).await
}

/// A message's text as a dead-letter record may keep it: its job, with every variable's value
/// masked but those its template declares not sensitive (a variable it does not declare, a
/// misspelt secret say, is masked; so is every value when the template cannot be read) and
/// every field a job does not have masked (a misspelt `variables`), its target without what a
/// URL's query or a credential field holds (an Azure SAS), and no other field's value. The
/// envelope is written anew from what was read (a key given twice is refused on the way in).
/// Text that is not a job envelope (JSON, or base64 of it, holding a `job` object: a job
/// encoded twice is not one) cannot be searched for secrets: only its size and SHA-256 are kept.
pub fn masked_message(text: &str, templates: &Path) -> String {
    let digest = |what: &str| {
        format!(
            "({what}: {} bytes, sha256 {})",
            text.len(),
            state_backends::sha256_hex(text.as_bytes())
        )
    };
    let Ok(Value::Object(envelope)) = json_or_base64::<Value>(text.as_bytes()) else {
        return digest("not a job envelope");
    };
    let Some(Value::Object(job)) = envelope.get("job") else {
        // JSON, but no job to find the variables of (a misspelt key, say): a digest only.
        return digest("no job object");
    };
    let mut job = job.clone();
    mask_job(&mut job, templates);
    let mut kept = Map::new();
    for (key, value) in envelope {
        let value = match key.as_str() {
            "job" => Value::Object(std::mem::take(&mut job)),
            "target" => masked_target(value),
            "requeued" if value.is_u64() => value,
            _ => Value::String(crate::job::redact::MASK.to_owned()),
        };
        kept.insert(key, value);
    }
    Value::Object(kept).to_string()
}

/// A target as a record may show it: a URL keeps its address but not its query (where a SAS
/// signature goes), a field named like a credential keeps its name only.
fn masked_target(target: Value) -> Value {
    fn credential(name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        [
            "sas",
            "sig",
            "token",
            "secret",
            "password",
            "credential",
            "external_id",
            "key",
        ]
        .iter()
        .any(|word| name.contains(word))
            && !name.ends_with("kms_key")
    }
    match target {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(name, value)| {
                    let value = if credential(&name) {
                        Value::String(crate::job::redact::MASK.to_owned())
                    } else {
                        masked_target(value)
                    };
                    (name, value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(masked_target).collect()),
        Value::String(s) => match s.split_once('?') {
            Some((address, _)) => Value::String(format!("{address}?{}", crate::job::redact::MASK)),
            None => Value::String(s),
        },
        other => other,
    }
}

/// Masks what a record of `job` (a job document) must not keep: every variable's value but
/// those its template declares not sensitive ([`mask_variables`]), and the value of every field
/// a job does not have (a misspelt `variables` holds the same secrets). Whether any value was
/// masked.
pub fn mask_job(job: &mut Map<String, Value>, templates: &Path) -> bool {
    let mut masked = mask_variables(job, templates);
    for (name, value) in job.iter_mut() {
        if !crate::job::FIELDS.contains(&name.as_str())
            && value.as_str() != Some(crate::job::redact::MASK)
        {
            *value = Value::String(crate::job::redact::MASK.to_owned());
            masked = true;
        }
    }
    masked
}

/// Masks the value of every variable of `job` (a job document) but those its template declares
/// not sensitive; every value when the template cannot be read. Whether any value was masked.
pub fn mask_variables(job: &mut Map<String, Value>, templates: &Path) -> bool {
    let template = job.get("template").and_then(|t| {
        crate::job::template::Template::load(
            templates,
            t.get("name")?.as_str()?,
            t.get("version")?.as_str()?,
        )
        .ok()
    });
    let mut masked = false;
    if let Some(variables) = job.get_mut("variables").and_then(Value::as_object_mut) {
        for (name, value) in variables.iter_mut() {
            let plain = template
                .as_ref()
                .and_then(|t| t.spec.variables.get(name))
                .is_some_and(|v| !v.sensitive);
            if !plain && value.as_str() != Some(crate::job::redact::MASK) {
                *value = Value::String(crate::job::redact::MASK.to_owned());
                masked = true;
            }
        }
    }
    masked
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
    /// The queue's handle on the message the job came in, where the task settles that message
    /// itself (SQS): the message stays on the queue, invisible while the task keeps it so,
    /// and is deleted only once the job has a result or a fresh copy on the queue. A task that
    /// never starts, or dies, leaves it to come back. Without one, the message was settled when
    /// the task was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
}

/// The staged job message's name in the run's folder, in references without a name of its own.
pub const REQUEST: &str = "request.json";

/// A fresh name for a staged message: `request-<16 hex>.json`.
fn staged_name() -> String {
    let nonce: [u8; 8] = rand::random();
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    format!("request-{hex}.json")
}

/// Whether `name` is one `staged_name` makes (a reference names nothing else), or the
/// [`REQUEST`] of older references: a staged job message.
pub fn is_staged_name(name: &str) -> bool {
    if name == REQUEST {
        return true;
    }
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
    Refused(Rejection),
}

impl std::fmt::Display for StagedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StagedError::Unavailable(why) => f.write_str(why),
            StagedError::Refused(record) => write!(
                f,
                "refused: {}",
                record.errors.first().map_or("", |e| e.problem.as_str())
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
            receipt: None,
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
            record.job_id = Some(self.job_id.clone());
            StagedError::Refused(record)
        };
        if self.sha256.is_empty() {
            return Err(refuse(
                "the task's job reference carries no digest of the staged message, so the message cannot be trusted".into(),
            ));
        }
        if !is_staged_name(name) {
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
        if !is_staged_name(name) {
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
        for name in names.iter().filter(|n| is_staged_name(n)) {
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

/// A message's body as `T`: JSON, or JSON in base64 (what many senders put on queues).
///
/// # Errors
/// Why it is not JSON (as read without base64).
pub fn json_or_base64<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    let read = |bytes: &[u8]| {
        crate::job::strict_json(bytes).and_then(|value| serde_json::from_value::<T>(value))
    };
    read(body).or_else(|json_error| {
        std::str::from_utf8(body)
            .ok()
            .and_then(|text| {
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, text.trim()).ok()
            })
            .and_then(|bytes| read(&bytes).ok())
            .ok_or(json_error)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use serde_json::json;

    fn templates() -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates")
    }

    fn message(template: &str) -> String {
        json!({
            "job": {
                "id": "j1", "tenant": "acme", "workspace": "w",
                "template": { "name": template, "version": "1.0.0" },
                "variables": {
                    "cluster_name": "demo", "admin_password": "hunter2-hunter2",
                    "admin_pasword": "typo-5ecret",
                },
            },
        })
        .to_string()
    }

    #[test]
    fn a_dead_letter_keeps_the_job_but_not_its_template_s_secrets() {
        let kept = masked_message(&message("demo"), &templates());
        let kept: Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(
            kept["job"]["variables"]["admin_password"],
            crate::job::redact::MASK
        );
        assert_eq!(kept["job"]["variables"]["cluster_name"], "demo");
        assert_eq!(kept["job"]["id"], "j1");
        // A name the template does not declare (a misspelt secret) is masked too.
        assert_eq!(
            kept["job"]["variables"]["admin_pasword"],
            crate::job::redact::MASK
        );
        // The same from base64, as many senders put it on queues.
        let encoded = base64::engine::general_purpose::STANDARD.encode(message("demo"));
        assert!(!masked_message(&encoded, &templates()).contains("hunter2"));
    }

    #[test]
    fn without_its_template_every_value_is_masked() {
        let kept = masked_message(&message("no-such-template"), &templates());
        assert!(
            !kept.contains("hunter2") && !kept.contains("\"demo\""),
            "{kept}"
        );
        assert!(kept.contains("admin_password") && kept.contains("no-such-template"));
    }

    #[test]
    fn text_that_is_no_job_keeps_only_its_size_and_digest() {
        let cut = r#"{"job": {"variables": {"pw": "hunter2"#;
        let kept = masked_message(cut, &templates());
        assert!(!kept.contains("hunter2"), "{kept}");
        assert!(
            kept.starts_with(&format!(
                "(not a job envelope: {} bytes, sha256 ",
                cut.len()
            )),
            "{kept}"
        );
        let plain = json!({ "job": { "id": "j1" } }).to_string();
        assert_eq!(masked_message(&plain, &templates()), plain);
        let misspelt = json!({ "jbo": { "variables": { "pw": "hunter2" } } }).to_string();
        let kept = masked_message(&misspelt, &templates());
        assert!(kept.starts_with("(no job object: "), "{kept}");
    }

    #[test]
    fn a_variables_key_given_twice_keeps_neither_secret() {
        let twice = r#"{"job": {"id": "j1", "variables": {"pw": "first-5ecret"}, "variables": {"pw": "second-5ecret"}}}"#;
        let kept = masked_message(twice, &templates());
        assert!(!kept.contains("5ecret"), "{kept}");
    }

    /// What the third security review found kept in dead letters: a misspelt `variables` key's
    /// values, a SAS in a target, other fields of the envelope, and a job encoded twice.
    #[test]
    fn a_dead_letter_keeps_no_misspelt_variables_no_sas_and_no_unknown_field() {
        let message = json!({
            "job": {
                "id": "j1", "tenant": "acme", "workspace": "w",
                "template": { "name": "demo", "version": "1.0.0" },
                "varaibles": { "admin_password": "canary-misspelt" },
            },
            "target": {
                "container_url": "https://acme.blob.core.windows.net/states?sv=2024&sig=canary-sas",
                "client_id": "c1",
                "sas_token": "canary-token",
            },
            "extra": { "token": "canary-extra" },
        })
        .to_string();
        let kept = masked_message(&message, &templates());
        assert!(!kept.contains("canary"), "{kept}");
        let kept: Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(kept["job"]["varaibles"], crate::job::redact::MASK, "{kept}");
        assert_eq!(
            kept["target"]["container_url"],
            format!(
                "https://acme.blob.core.windows.net/states?{}",
                crate::job::redact::MASK
            )
        );
        assert_eq!(
            kept["target"]["client_id"], "c1",
            "what is not secret stays"
        );
        assert_eq!(kept["job"]["workspace"], "w");
        // A job encoded twice (a string where the job goes) is no job: a digest only.
        let twice = json!({ "job": message }).to_string();
        let kept = masked_message(&twice, &templates());
        assert!(kept.starts_with("(no job object: "), "{kept}");
    }
}
