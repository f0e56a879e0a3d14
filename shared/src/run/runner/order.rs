//! What settles a job before it runs (done before, cancelled, superseded), and runs in order:
//! a job that carries a `sequence` starts only if no job with a higher or equal one has
//! started on the workspace, and then records its own, under its lease, before terraform
//! runs (after an approved plan's checks: a refused one never started). A job that comes back
//! after a later request ran (it waited for a busy
//! workspace and was queued again, or its queue does not keep order) never puts an older
//! configuration back: its result is `superseded`.

use state_backends::{Lease, WorkspaceId};

use crate::job::validate::ValidatedJob;
use crate::run::records::{self, Started};
use crate::run::result::{Category, JobError, JobResult, Status, SupersededBy};

use super::finish::Clock;
use super::report::Report;
use super::{RunError, RunOutcome, Runner};

impl Runner {
    /// What settles the job before it runs, under its lease: it ran before (the same job
    /// delivered again), it was cancelled before it started, or a later request started first.
    pub(super) async fn settled_before_running(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        lease: &Lease,
    ) -> Result<Option<RunOutcome>, RunError> {
        let j = &job.job;
        // Checked again under the lease: the same job may have run while we waited for it.
        // A request to cancel it is read side by side.
        let (previous, asked) = tokio::join!(
            self.previous_result(ws, job),
            records::cancel_requested(self.store.as_ref(), ws, &j.id)
        );
        if let Some(previous) = previous? {
            return Ok(Some(RunOutcome::AlreadyDone(Box::new(previous))));
        }
        if let Some(request) = asked? {
            let cancelled = self.cancelled_before(job, ws, lease, &request).await?;
            return Ok(Some(RunOutcome::Finished(Box::new(cancelled))));
        }
        let turn = self.turn(job, ws).await?;
        if let Turn::Superseded(started) = turn {
            tracing::info!(
                superseded_by = %started.job_id,
                "job superseded: a later request on the workspace started first"
            );
            let result = superseded(job, lease, started);
            let result = self.never_ran(job, ws, lease, result).await?;
            return Ok(Some(RunOutcome::Finished(Box::new(result))));
        }
        // An approved plan refused never started: its sequence is not recorded.
        if let Some(refused) = self.check_approved(job, ws, lease).await? {
            return Ok(Some(RunOutcome::Finished(Box::new(refused))));
        }
        if let Turn::Record(sequence) = turn {
            let started = Started::new(&job.job.id, sequence);
            records::record_started(self.store.as_ref(), ws, &started, &lease.fence()).await?;
        }
        Ok(None)
    }

    /// The job's place in the workspace's order, read under its lease.
    async fn turn(&self, job: &ValidatedJob, ws: &WorkspaceId) -> Result<Turn, RunError> {
        let j = &job.job;
        let Some(sequence) = j.sequence else {
            return Ok(Turn::Unordered);
        };
        Ok(match records::started(self.store.as_ref(), ws).await? {
            // The same job again (its run was interrupted): its turn is still its own.
            Some(started) if started.job_id == j.id => Turn::Unordered,
            Some(started) if started.sequence >= sequence => Turn::Superseded(started),
            _ => Turn::Record(sequence),
        })
    }
}

/// Where a job stands in its workspace's order.
enum Turn {
    /// No sequence, or its own recorded already: nothing to record.
    Unordered,
    /// A later request started first: the job never runs.
    Superseded(Started),
    /// It goes on: its sequence is recorded before anything runs.
    Record(u64),
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
        "nothing to do if the later request is what the workspace should hold; otherwise send it again as a new job (a new id: this one's result stays superseded) with a sequence above the latest",
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
