//! Everything a runner sends a platform on its results channel (SQS, Pub/Sub, a Storage
//! Queue), as one typed record told apart by `kind`, serialized here and nowhere else. Its
//! JSON Schema is `docs/schema/message.schema.json` (`terrace schema message`), generated from
//! these types.
//!
//! Within a `schema` number fields are only ever added; a platform reads them by name and
//! skips a `kind` it does not know.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job::validate::ValidationError;
use crate::run::result::{JobResult, Status};

/// The format of the records here written now.
pub const MESSAGE_SCHEMA: u32 = 1;

/// One message on the results channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Message {
    /// A job's final result: `succeeded`, `failed`, `cancelled`, `timed-out` or `superseded`
    /// (the job's `result.json`, as `terrace result JOB --json` prints it). Every delivery of
    /// a job that has one reports it again.
    Result(Box<JobResult>),
    /// A message that will never be a job (or a cancel): nothing ran.
    Rejection(Rejection),
    /// A job too long for the function that received it, handed to a task of the same image:
    /// its result follows when the task ends.
    HandedOff(HandedOff),
    /// The answer to a cancel message.
    Cancel(CancelAnswer),
}

impl Message {
    /// The message as it is sent: the one place a record becomes JSON.
    pub fn to_value(&self) -> Value {
        // Every field is a string, number, list or map with string keys: this cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl From<JobResult> for Message {
    fn from(result: JobResult) -> Self {
        Self::Result(Box::new(result))
    }
}

/// A message the runner moved to its dead-letter queue (the Azure Storage queue's poison
/// queue; `docs/schema/dead-letter.schema.json`): why, and the message as it came with its
/// values masked. SQS and Pub/Sub dead-letter the original message themselves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeadLetter {
    /// Always `rejection`: the record is the rejection reported for the message, and more.
    pub kind: DeadLetterKind,
    #[serde(flatten)]
    pub rejection: Rejection,
    /// How many times the queue had delivered it.
    pub dequeue_count: u64,
    /// The message's text, every variable's value masked but those its template declares not
    /// sensitive; cut to fit a queue message when `message_truncated`.
    pub message: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub message_truncated: bool,
}

/// Always `rejection`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DeadLetterKind {
    Rejection,
}

/// A message that will never be a job: every problem found, each with the field it is about
/// and the fix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Rejection {
    pub schema: u32,
    pub status: Rejected,
    /// The queue's id of the message (`task` for a handed-off task's reference).
    pub message_id: String,
    /// The job's id, when the rejected message names a job whose id is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    pub errors: Vec<ValidationError>,
}

impl Rejection {
    pub fn new(message_id: &str, errors: Vec<ValidationError>) -> Self {
        Self {
            schema: MESSAGE_SCHEMA,
            status: Rejected::Rejected,
            message_id: message_id.to_owned(),
            job_id: None,
            errors,
        }
    }
}

/// Always `rejected`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Rejected {
    Rejected,
}

/// A job handed to a task, and how to find the task in its cloud.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HandedOff {
    pub schema: u32,
    pub status: Handed,
    pub job_id: String,
    /// `TENANT/WORKSPACE`.
    pub workspace: String,
    #[serde(flatten)]
    pub task: TaskStarted,
}

impl HandedOff {
    pub fn new(job: &crate::job::Job, task: TaskStarted) -> Self {
        Self {
            schema: MESSAGE_SCHEMA,
            status: Handed::HandedOff,
            job_id: job.id.clone(),
            workspace: format!("{}/{}", job.tenant, job.workspace),
            task,
        }
    }
}

/// Always `handed-off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Handed {
    HandedOff,
}

/// The task a job was handed to, as its cloud names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskStarted {
    /// AWS: the ECS (Fargate) task's ARN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_arn: Option<String>,
    /// Google Cloud: the Cloud Run job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_run_job: Option<String>,
    /// Google Cloud: the long-running operation of the Cloud Run job's execution (not the
    /// job's terraform operation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
}

/// The answer to a cancel message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CancelAnswer {
    pub schema: u32,
    pub status: CancelStatus,
    /// The job the cancel named.
    pub cancel: CancelOf,
    /// The queue's id of the cancel message.
    pub message_id: String,
    /// For `already-finished`: how the job ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_status: Option<Status>,
}

/// What a cancel message did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CancelStatus {
    /// Recorded: the job stops at its next step (a running apply cleans up as its
    /// `on_failure` says), or never starts; its result says `cancelled`.
    CancelRequested,
    /// The job had already finished (`job_status`): nothing changed.
    AlreadyFinished,
}

/// The job a cancel names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelOf {
    pub job_id: String,
    pub tenant: String,
    pub workspace: String,
}

/// A cancel on the jobs queue (`docs/schema/cancel-message.schema.json`): the job to cancel
/// and where it is; a target only where the runner has no tenant registry.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, bound(deserialize = "T: Deserialize<'de>"))]
#[schemars(bound = "T: JsonSchema")]
pub struct CancelEnvelope<T> {
    pub cancel: CancelAsk,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<T>,
}

/// The job a cancel message asks to stop.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelAsk {
    /// The job's id.
    pub job: String,
    pub tenant: String,
    pub workspace: String,
    /// The sender's signature of this object (`docs/signing.md`): required where the tenant's
    /// registry entry names `senders`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<crate::job::signature::Signature>,
}
