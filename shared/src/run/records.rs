//! The run records Terrace keeps beside a job, typed and versioned, read and written here only:
//! `runs/<job>/job.json` (what ran: [`JobRecord`]), `runs/_workspace/last-apply.json` (the
//! workspace's last successful apply: [`LastApply`]) and `runs/_workspace/sequence.json` (the
//! highest sequence that started there: [`Started`]) and `runs/<job>/cancel.json` (a request
//! to cancel the job: [`CancelRequest`]). The result, `result.json`, is
//! [`crate::run::result::JobResult`].
//!
//! A variable whose value is not recorded (it is sensitive, or redaction changed it because it
//! holds another secret) is named in [`JobRecord::masked`]. That list, not the text in its
//! place, is what makes it masked: no variable's value can pass for a masked one, and a value
//! that redaction altered is never read back as if it were the real one.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job::redact::{MASK, Redactor};
use crate::job::validate::ValidatedJob;
use crate::job::{OnFailure, Operation, TemplateRef};
use state_backends::{StateStore, WorkspaceId};

/// The format of a [`JobRecord`] written now.
pub const JOB_RECORD_SCHEMA: u32 = 1;

/// A run's record of what ran ([`JobRecord`]), in `runs/<job>/`.
pub const JOB_FILE: &str = "job.json";
/// A run's result ([`crate::run::result::JobResult`]), in `runs/<job>/`.
pub const RESULT_FILE: &str = "result.json";
/// The state terraform could not save to the backend, kept in `runs/<job>/` as it wrote it.
pub const ERRORED_STATE: &str = "errored.tfstate";
/// The pseudo-run that holds workspace-wide records (not a valid job id: `_` cannot start one).
pub const WORKSPACE_RECORDS: &str = "_workspace";
/// The workspace's last successful apply ([`LastApply`]), under [`WORKSPACE_RECORDS`].
pub const LAST_APPLY: &str = "last-apply.json";
/// The workspace's life ([`crate::run::lifecycle::WorkspaceStatus`]), under [`WORKSPACE_RECORDS`].
pub const STATUS_FILE: &str = "status.json";
/// The highest sequence that started on the workspace ([`Started`]), under
/// [`WORKSPACE_RECORDS`].
pub const SEQUENCE_FILE: &str = "sequence.json";
/// A request to cancel a job ([`CancelRequest`]), in `runs/<job>/`.
pub const CANCEL_FILE: &str = "cancel.json";

/// Why a record cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{name} is not a record Terrace can read: {source}")]
    Malformed {
        name: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{name} is of schema {found}, newer than this runner reads ({supported}): update the runner"
    )]
    Newer {
        name: &'static str,
        found: u32,
        supported: u32,
    },
}

/// `job.json`: what a run was asked to do, its sensitive values masked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The record's format; records written before it had one read as 0.
    #[serde(default)]
    pub schema: u32,
    pub id: String,
    pub tenant: String,
    pub workspace: String,
    pub operation: Operation,
    pub template: TemplateRef,
    /// The job's variables; those named in `masked` hold [`MASK`] for a reader, never a value.
    pub variables: BTreeMap<String, Value>,
    /// The variables whose values are not recorded.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub masked: BTreeSet<String>,
    /// Seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub on_failure: Option<OnFailure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseFacts>,
    /// The approved plan the job applied (its `plan_key` is never recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// A plan job's plan destroys everything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub destroy: bool,
}

/// The lease a run held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFacts {
    pub fence: u64,
    /// RFC 3339.
    pub acquired_at: String,
}

impl JobRecord {
    /// The record of `job` run under `lease`: sensitive variables masked, and any other whose
    /// value `redactor` would change (it holds a secret) masked too.
    pub fn new(job: &ValidatedJob, redactor: &Redactor, lease: &state_backends::Lease) -> Self {
        let declared = &job.template.spec.variables;
        let mut variables = BTreeMap::new();
        let mut masked = BTreeSet::new();
        for (name, value) in &job.job.variables {
            let sensitive = declared
                .get(name)
                .is_some_and(|v| v.sensitive || v.ephemeral);
            let shown = if sensitive {
                Value::String(MASK.to_owned())
            } else {
                redactor.redact_json(value)
            };
            if sensitive || &shown != value {
                masked.insert(name.clone());
            }
            variables.insert(name.clone(), shown);
        }
        let j = &job.job;
        Self {
            schema: JOB_RECORD_SCHEMA,
            id: j.id.clone(),
            tenant: j.tenant.clone(),
            workspace: j.workspace.clone(),
            operation: j.operation,
            template: j.template.clone(),
            variables,
            masked,
            timeout: Some(j.timeout.as_secs()),
            on_failure: Some(j.on_failure),
            lease: Some(LeaseFacts {
                fence: lease.fence,
                acquired_at: state_backends::display_time(lease.acquired_at),
            }),
            plan: j.plan.clone(),
            destroy: j.destroy,
        }
    }

    /// Reads a record.
    ///
    /// # Errors
    /// Bytes that are not a record, or a record of a newer schema.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        let record: Self =
            serde_json::from_slice(bytes).map_err(|source| RecordError::Malformed {
                name: crate::run::records::JOB_FILE,
                source,
            })?;
        if record.schema > JOB_RECORD_SCHEMA {
            return Err(RecordError::Newer {
                name: crate::run::records::JOB_FILE,
                found: record.schema,
                supported: JOB_RECORD_SCHEMA,
            });
        }
        Ok(record)
    }

    /// The record as stored.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec_pretty(self).unwrap_or_default())
    }

    /// The variables whose values are not in the record. Records of schema 0 did not list
    /// them: there, any value with the mask's text in it counts (it may hold a redacted secret).
    pub fn masked_variables(&self) -> BTreeSet<String> {
        if self.schema >= 1 {
            return self.masked.clone();
        }
        self.variables
            .iter()
            .filter(|(_, v)| v.to_string().contains(MASK))
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// `last-apply.json`: which job was the workspace's last successful apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastApply {
    #[serde(default)]
    pub schema: u32,
    pub job_id: String,
}

impl LastApply {
    pub fn new(job_id: &str) -> Self {
        Self {
            schema: 1,
            job_id: job_id.to_owned(),
        }
    }

    /// # Errors
    /// Bytes that are not a record.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        serde_json::from_slice(bytes).map_err(|source| RecordError::Malformed {
            name: crate::run::records::LAST_APPLY,
            source,
        })
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// Records `job_id` as the workspace's last successful apply.
///
/// # Errors
/// When the store cannot write it.
pub async fn record_last_apply(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
) -> Result<(), state_backends::StoreError> {
    store
        .put_artifact(
            ws,
            WORKSPACE_RECORDS,
            LAST_APPLY,
            LastApply::new(job_id).to_bytes(),
        )
        .await
}

/// The workspace's last successful apply: its job id and its `job.json` record (sensitive
/// values masked); `None` when no apply has succeeded there yet.
///
/// # Errors
/// Why it cannot be read, as a sentence for a result.
pub async fn last_apply(
    store: &dyn StateStore,
    ws: &WorkspaceId,
) -> Result<Option<(String, JobRecord)>, String> {
    let read = |e: state_backends::StoreError| format!("cannot read the last apply's record: {e}");
    let Some(pointer) = store
        .artifact(ws, WORKSPACE_RECORDS, LAST_APPLY)
        .await
        .map_err(read)?
    else {
        return Ok(None);
    };
    let prev_id = LastApply::parse(&pointer)
        .map_err(|e| e.to_string())?
        .job_id;
    let record = store
        .artifact(ws, &prev_id, JOB_FILE)
        .await
        .map_err(read)?
        .ok_or_else(|| format!("the last successful apply, {prev_id}, has no job record"))?;
    let record = JobRecord::parse(&record).map_err(|e| e.to_string())?;
    Ok(Some((prev_id, record)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::RawJob;

    fn job(variables: &str) -> ValidatedJob {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates");
        let raw = RawJob::parse(&format!(
            "id: j1\ntenant: acme\nworkspace: demo\noperation: apply\ntemplate: {{ name: demo, version: 1.0.0 }}\nvariables: {variables}\n"
        ))
        .unwrap();
        crate::job::validate::validate(&raw, &root).unwrap()
    }

    fn lease() -> state_backends::Lease {
        let now = time::OffsetDateTime::now_utc();
        state_backends::Lease {
            owner: "j1".into(),
            fence: 7,
            acquired_at: now,
            expires_at: now,
            info: Value::Null,
            took_over: None,
        }
    }

    #[test]
    fn sensitive_values_and_values_holding_a_secret_are_masked_by_name() {
        // cluster_name holds the password's text: redaction changes it, so it is masked too.
        let job = job(
            "{ cluster_name: abc-hunter2-hunter2, region: eu-west-1, admin_password: hunter2-hunter2 }",
        );
        let redactor = Redactor::new(job.sensitive_values.iter().cloned());
        let record = JobRecord::new(&job, &redactor, &lease());
        assert_eq!(record.schema, JOB_RECORD_SCHEMA);
        assert_eq!(
            record.masked,
            BTreeSet::from(["admin_password".to_owned(), "cluster_name".to_owned()])
        );
        assert_eq!(record.variables["admin_password"], MASK);
        assert!(!String::from_utf8_lossy(&record.to_bytes()).contains("hunter2"));
        assert_eq!(record.variables["region"], "eu-west-1");
        assert_eq!(record.lease.as_ref().unwrap().fence, 7);
        let back = JobRecord::parse(&record.to_bytes()).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.masked_variables(), record.masked);
    }

    #[test]
    fn a_plain_value_that_reads_like_the_mask_stays_a_value() {
        let job = job("{ cluster_name: demo, region: eu-west-1, admin_password: hunter2-hunter2 }");
        let redactor = Redactor::new(job.sensitive_values.iter().cloned());
        let mut record = JobRecord::new(&job, &redactor, &lease());
        // As if a variable's real value were the mask's text: not in `masked`, so a value.
        record
            .variables
            .insert("cluster_name".into(), Value::String(MASK.into()));
        let back = JobRecord::parse(&record.to_bytes()).unwrap();
        assert_eq!(
            back.masked_variables(),
            BTreeSet::from(["admin_password".to_owned()])
        );
    }

    #[test]
    fn an_old_record_counts_anything_with_the_mask_text_as_masked() {
        let old = serde_json::json!({
            "id": "j0", "tenant": "acme", "workspace": "demo", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" },
            "variables": { "a": MASK, "b": format!("x {MASK}"), "c": "plain" },
            "timeout": 600, "on_failure": "keep",
            "lease": { "fence": 1, "acquired_at": "2026-11-20T10:00:00Z" },
        });
        let record = JobRecord::parse(old.to_string().as_bytes()).unwrap();
        assert_eq!(record.schema, 0);
        assert_eq!(
            record.masked_variables(),
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
    }

    #[test]
    fn a_record_from_a_newer_runner_is_refused_by_name() {
        let newer = serde_json::json!({
            "schema": 99, "id": "j0", "tenant": "acme", "workspace": "demo",
            "operation": "apply", "template": { "name": "demo", "version": "1.0.0" },
            "variables": {},
        });
        let e = JobRecord::parse(newer.to_string().as_bytes()).unwrap_err();
        assert!(e.to_string().contains("schema 99"), "{e}");
        assert!(e.to_string().contains("update the runner"), "{e}");
    }
}

/// `sequence.json`: the job with the highest sequence that started on the workspace. Written
/// under that job's lease, before terraform runs, so a job whose sequence is not above it
/// never starts after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    #[serde(default)]
    pub schema: u32,
    pub sequence: u64,
    pub job_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
}

impl Started {
    pub fn new(job_id: &str, sequence: u64) -> Self {
        Self {
            schema: 1,
            sequence,
            job_id: job_id.to_owned(),
            started_at: time::OffsetDateTime::now_utc(),
        }
    }

    /// # Errors
    /// Bytes that are not a record, or one of a newer schema.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        let record: Self =
            serde_json::from_slice(bytes).map_err(|source| RecordError::Malformed {
                name: SEQUENCE_FILE,
                source,
            })?;
        if record.schema > 1 {
            return Err(RecordError::Newer {
                name: SEQUENCE_FILE,
                found: record.schema,
                supported: 1,
            });
        }
        Ok(record)
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// The highest sequence that started on the workspace, if any did.
///
/// # Errors
/// When the store cannot be read, or holds a record Terrace cannot read.
pub async fn started(
    store: &dyn StateStore,
    ws: &WorkspaceId,
) -> Result<Option<Started>, ReadError> {
    match store.artifact(ws, WORKSPACE_RECORDS, SEQUENCE_FILE).await? {
        None => Ok(None),
        Some(bytes) => Ok(Some(Started::parse(&bytes)?)),
    }
}

/// Records `started` as the workspace's highest started sequence, only while `fence` holds
/// the workspace's lease.
///
/// # Errors
/// When the store cannot write it, or the lease is no longer this run's.
pub async fn record_started(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    started: &Started,
    fence: &state_backends::Fence,
) -> Result<(), state_backends::StoreError> {
    use state_backends::StateStoreExt;
    store
        .put_artifact_fenced(
            ws,
            WORKSPACE_RECORDS,
            SEQUENCE_FILE,
            started.to_bytes(),
            fence,
        )
        .await
}

/// Why a record cannot be read from the store.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Store(#[from] state_backends::StoreError),
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// `cancel.json`: someone asked for the job to be cancelled. A job that finds it when it gets
/// its lease never runs; a running job looks for it every few seconds and stops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    #[serde(default)]
    pub schema: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// Who asked: `terrace cancel`, or the queue message that carried it.
    pub by: String,
}

impl CancelRequest {
    pub fn new(by: &str) -> Self {
        Self {
            schema: 1,
            requested_at: time::OffsetDateTime::now_utc(),
            by: by.to_owned(),
        }
    }

    /// # Errors
    /// Bytes that are not a record, or one of a newer schema.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        let request: Self =
            serde_json::from_slice(bytes).map_err(|source| RecordError::Malformed {
                name: CANCEL_FILE,
                source,
            })?;
        if request.schema > 1 {
            return Err(RecordError::Newer {
                name: CANCEL_FILE,
                found: request.schema,
                supported: 1,
            });
        }
        Ok(request)
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// Asks for `job_id` to be cancelled. Not fenced: it is a request to whoever holds, or will
/// hold, the workspace's lease for that job.
///
/// # Errors
/// When the store cannot write it.
pub async fn request_cancel(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
    by: &str,
) -> Result<CancelRequest, state_backends::StoreError> {
    let request = CancelRequest::new(by);
    store
        .put_artifact(ws, job_id, CANCEL_FILE, request.to_bytes())
        .await?;
    Ok(request)
}

/// The request to cancel `job_id`, if there is one.
///
/// # Errors
/// When the store cannot be read, or holds a record Terrace cannot read.
pub async fn cancel_requested(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
) -> Result<Option<CancelRequest>, ReadError> {
    match store.artifact(ws, job_id, CANCEL_FILE).await? {
        None => Ok(None),
        Some(bytes) => Ok(Some(CancelRequest::parse(&bytes)?)),
    }
}
