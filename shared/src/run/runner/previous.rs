//! A job found done: the result of an earlier run of the same job id, taken only when it is
//! that job's own.

use state_backends::{StateStore, WorkspaceId};

use crate::run::records::{JOB_FILE, RESULT_FILE};
use crate::run::result::{JobResult, Status};

use super::RunError;

/// The stored result of a job id in `store`, if it finished before. An `interrupted` job did
/// not finish: it may run again.
///
/// A result is taken only when it is this job's: its job id, tenant, workspace and operation
/// (`operation`, when the caller knows it) are the delivery's, and it was written under the
/// fence that the run's `job.json` records. Anyone who can write to the bucket (terraform's
/// session, as the customer's role, among them) could otherwise put a result there that
/// would be reported for a job that never ran. One that is not is ignored, with a warning:
/// the job runs, and its own records replace it.
///
/// # Errors
/// Store failures, or a result that does not parse.
pub async fn previous_result(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
    operation: Option<crate::job::Operation>,
) -> Result<Option<JobResult>, RunError> {
    let Some(raw) = store.artifact(ws, job_id, RESULT_FILE).await? else {
        return Ok(None);
    };
    let result: JobResult = serde_json::from_slice(&raw).map_err(|source| RunError::Record {
        job_id: job_id.to_owned(),
        name: RESULT_FILE,
        source,
    })?;
    if result.status == Status::Interrupted {
        return Ok(None);
    }
    let record = match store.artifact(ws, job_id, JOB_FILE).await? {
        Some(raw) => crate::run::records::JobRecord::parse(&raw).ok(),
        None => None,
    };
    match not_this_jobs(&result, record.as_ref(), ws, job_id, operation) {
        None => Ok(Some(result)),
        Some(why) => {
            tracing::warn!(job_id, workspace = %ws, "the stored result is ignored: {why}");
            Ok(None)
        }
    }
}

/// Why a stored result is not `job_id`'s own, if it is not.
fn not_this_jobs(
    result: &JobResult,
    record: Option<&crate::run::records::JobRecord>,
    ws: &WorkspaceId,
    job_id: &str,
    operation: Option<crate::job::Operation>,
) -> Option<String> {
    let theirs = (
        result.job_id.as_str(),
        result.tenant.as_str(),
        result.workspace.as_str(),
    );
    if theirs != (job_id, ws.tenant(), ws.workspace()) {
        return Some(format!(
            "it names job {} of {}/{}",
            result.job_id, result.tenant, result.workspace
        ));
    }
    if operation.is_some_and(|op| op != result.operation) {
        return Some(format!("it is of a {} job", result.operation));
    }
    let Some(record) = record else {
        return Some(format!("the run has no readable {JOB_FILE}"));
    };
    if (record.id.as_str(), record.operation) != (job_id, result.operation)
        || (record.tenant.as_str(), record.workspace.as_str()) != (ws.tenant(), ws.workspace())
    {
        return Some(format!("it does not agree with the run's {JOB_FILE}"));
    }
    let fence = record.lease.as_ref().map(|l| l.fence);
    if result.fence.is_none() || result.fence != fence {
        return Some(format!(
            "it was not written under the run's lease (fence {:?}, {JOB_FILE}'s {fence:?})",
            result.fence
        ));
    }
    None
}
