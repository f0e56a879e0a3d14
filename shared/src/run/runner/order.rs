//! Runs in order: a job that carries a `sequence` starts only if no job with a higher or equal
//! one has started on the workspace, and then records its own, under its lease, before
//! terraform runs. A job that comes back after a later request ran (it waited for a busy
//! workspace and was queued again, or its queue does not keep order) never puts an older
//! configuration back: its result is `superseded`.

use bytes::Bytes;
use state_backends::{Lease, StateStoreExt, WorkspaceId};

use crate::job::redact::Redactor;
use crate::job::validate::ValidatedJob;
use crate::run::records::{self, JOB_FILE, RESULT_FILE, Started, StartedError};
use crate::run::result::{Category, JobError, JobResult, Status, SupersededBy};

use super::finish::Clock;
use super::report::Report;
use super::{RunError, Runner};

impl Runner {
    /// Checks the job's place in the workspace's order, under its lease. `Some` with the
    /// job's `superseded` result (written) when a later request started first; otherwise the
    /// job's sequence, if it has one, is now the workspace's highest started.
    pub(super) async fn take_turn(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        lease: &Lease,
    ) -> Result<Option<JobResult>, RunError> {
        let j = &job.job;
        let Some(sequence) = j.sequence else {
            return Ok(None);
        };
        let store = self.store.as_ref();
        let unreadable = |e: StartedError| match e {
            StartedError::Store(e) => RunError::Store(e),
            StartedError::Record(e) => RunError::WorkspaceRecord(e),
        };
        match records::started(store, ws).await.map_err(unreadable)? {
            // The same job again (its run was interrupted): its turn is still its own.
            Some(started) if started.job_id == j.id => Ok(None),
            Some(started) if started.sequence >= sequence => {
                // What was asked, as every run records it: the stored result is then known as
                // this job's own, and a delivery of it again gets the same answer.
                let redactor = Redactor::new(job.sensitive_values.iter().cloned());
                let record = records::JobRecord::new(job, &redactor, lease).to_bytes();
                store
                    .put_artifact_fenced(ws, &j.id, JOB_FILE, record, &lease.fence())
                    .await?;
                let result = superseded(job, lease, started);
                let data =
                    serde_json::to_vec_pretty(&result).map_err(|source| RunError::Record {
                        job_id: j.id.clone(),
                        name: RESULT_FILE,
                        source,
                    })?;
                store
                    .put_artifact_fenced(ws, &j.id, RESULT_FILE, Bytes::from(data), &lease.fence())
                    .await?;
                tracing::info!(
                    superseded_by = %result.superseded_by.as_ref().map_or("", |s| s.job_id.as_str()),
                    "job superseded: a later request on the workspace started first"
                );
                Ok(Some(result))
            }
            _ => {
                records::record_started(store, ws, &Started::new(&j.id, sequence), &lease.fence())
                    .await?;
                Ok(None)
            }
        }
    }
}

/// The result of a job that never ran because `started` (a later request) started first.
fn superseded(job: &ValidatedJob, lease: &Lease, started: Started) -> JobResult {
    let j = &job.job;
    let sequence = j.sequence.unwrap_or_default();
    let error = JobError::new(
        Category::Superseded,
        "order",
        format!(
            "job {} (sequence {}) started on this workspace before this job (sequence {sequence}) got its turn; this job never ran, so it cannot put an older configuration back",
            started.job_id, started.sequence
        ),
        "nothing to do if the later request is what the workspace should hold; otherwise send this request again with a sequence above the latest",
        false,
    );
    let mut result =
        Report::default().into_result(job, lease, &Clock::start(), Status::Superseded, Some(error));
    result.superseded_by = Some(SupersededBy {
        job_id: started.job_id,
        sequence: started.sequence,
    });
    result
}
