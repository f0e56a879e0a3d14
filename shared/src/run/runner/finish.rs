//! How a run ends: its status and error (a stopped job's told apart from a failed one's), its
//! result assembled from what the steps found, and that result written under the lease.

use std::time::{Duration, Instant};

use bytes::Bytes;
use state_backends::{Lease, StateStoreExt, StoreError, WorkspaceId};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::job::redact::Redactor;
use crate::job::validate::ValidatedJob;
use crate::run::records::{JOB_FILE, JobRecord, RESULT_FILE};
use crate::run::result::{Category, JobError, JobResult, Status};
use crate::run::retry::Tries;
use crate::run::vouched::Vouched;

use super::lease::StopReason;
use super::report::Report;
use super::{RunError, Runner};

/// When a run started: the wall clock for its result, a monotonic one for its duration.
pub(super) struct Clock {
    at: OffsetDateTime,
    started: Instant,
}

impl Clock {
    pub(super) fn start() -> Self {
        Self {
            at: OffsetDateTime::now_utc(),
            started: Instant::now(),
        }
    }
}

/// The waits between tries of writing a job's result while the store fails in a way that may
/// pass.
const RESULT_WAITS: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(2)];

impl Runner {
    /// The run's status and error from how its steps ended and why it was stopped, if it was.
    /// A job whose steps all succeeded succeeded, even if a stop came after the last one.
    pub(super) fn ending(
        &self,
        outcome: Result<(), JobError>,
        reason: Option<&StopReason>,
        stop: &CancellationToken,
    ) -> (Status, Option<JobError>) {
        let Err(e) = outcome else {
            return (Status::Succeeded, None);
        };
        let shutting_down = self.shutting_down();
        let stopped = reason
            .cloned()
            .or_else(|| stop.is_cancelled().then_some(StopReason::Cancelled))
            .map(|r| match r {
                StopReason::Cancelled if shutting_down => StopReason::Shutdown,
                other => other,
            });
        match stopped {
            Some(reason) => stopped_error(&reason, e),
            None => (Status::Failed, Some(e)),
        }
    }

    /// Whether the host is shutting down (a job it stops runs again).
    pub(super) fn shutting_down(&self) -> bool {
        self.config
            .shutdown
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Writes the result (redacted already) while the lease is still renewed, and only while
    /// it is still this run's: a runner that lost it never replaces a later run's result.
    pub(super) async fn write_result(
        &self,
        ws: &WorkspaceId,
        lease: &Lease,
        vouched: &Vouched,
        redacted: &JobResult,
    ) -> Result<(), RunError> {
        let job_id = &redacted.job_id;
        let data = serde_json::to_vec_pretty(redacted).map_err(|source| RunError::Record {
            job_id: job_id.clone(),
            name: RESULT_FILE,
            source,
        })?;
        let data = Bytes::from(data);
        // A lease lost while the write is under way abandons it, which narrows (not closes) the
        // window between the store's check and the write: a request already sent may still
        // land. (One already lost still tries: the check says whether the store still holds it
        // as this run's.)
        let lost = vouched.lost();
        let lost_before = lost.is_cancelled();
        let fence = vouched.fence();
        let write = || async {
            let write =
                self.store
                    .put_artifact_fenced(ws, job_id, RESULT_FILE, data.clone(), &fence);
            tokio::select! {
                outcome = write => outcome,
                () = lost.cancelled(), if !lost_before => Err(StoreError::LeaseLost {
                    workspace: ws.clone(),
                    owner: lease.owner.clone(),
                    fence: lease.fence,
                    reason: "the lease was lost while the result was being written".into(),
                }),
            }
        };
        Tries::after(&RESULT_WAITS)
            .run(
                "could not write the result",
                StoreError::is_retryable,
                write,
            )
            .await?;
        Ok(())
    }
}

impl Runner {
    /// Ends a job that never ran (superseded, cancelled before it started) with `result`:
    /// its `job.json` (what was asked, as every run records it, so the stored result is known
    /// as this job's own and a delivery of it again gets the same answer) and its result,
    /// both fenced by its lease.
    pub(super) async fn never_ran(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        lease: &Lease,
        result: JobResult,
    ) -> Result<JobResult, RunError> {
        let redactor = Redactor::new(job.sensitive_values.iter().cloned());
        let record = JobRecord::new(job, &redactor, lease).to_bytes();
        self.store
            .put_artifact_fenced(ws, &job.job.id, JOB_FILE, record, &lease.fence())
            .await?;
        // No watchdog watches this lease: nothing is vouched for.
        let unvouched = Vouched::unvouched(lease.fence(), CancellationToken::new());
        self.write_result(ws, lease, &unvouched, &result).await?;
        Ok(result)
    }
}

impl Report {
    /// The job's result: what the steps found, with the run's status and error.
    pub(super) fn into_result(
        self,
        job: &ValidatedJob,
        lease: &Lease,
        clock: &Clock,
        status: Status,
        error: Option<JobError>,
    ) -> JobResult {
        let j = &job.job;
        JobResult {
            schema: crate::run::result::RESULT_SCHEMA,
            job_id: j.id.clone(),
            tenant: j.tenant.clone(),
            workspace: j.workspace.clone(),
            operation: j.operation,
            template: j.template.to_string(),
            status,
            fence: Some(lease.fence),
            started_at: clock.at,
            finished_at: OffsetDateTime::now_utc(),
            duration_ms: clock.started.elapsed().as_millis() as u64,
            terraform: self.client,
            steps: self.steps,
            changes: self.changes,
            cost: self.cost,
            policy: self.policy,
            drift: self.drift,
            drifted: self.drifted,
            outputs: self.outputs,
            sealed_outputs: self.sealed_outputs,
            state_versions: self.versions,
            attempts: self.attempts,
            cleanup: self.cleanup,
            recovered: self.recovered,
            unsaved_state: self.unsaved_state,
            error,
            lifecycle: None,
            attention: Vec::new(),
            sequence: j.sequence,
            superseded_by: None,
            plan: self.plan,
            approved_plan: j.plan.clone(),
        }
    }
}

/// The run's last line in its log: how it ended, and where it failed.
pub(super) fn summary(result: &JobResult) -> String {
    let status = result.status.as_str();
    match &result.error {
        None => format!(
            "job {} {status} in {} ms",
            result.job_id, result.duration_ms
        ),
        Some(e) => format!(
            "job {} {status} at step {}: {}",
            result.job_id, e.step, e.message
        ),
    }
}

/// The error of a job stopped by its deadline, its caller or a lost lease; `step_error` is what
/// the step it stopped said, which tells what state the workspace was left in.
pub(super) fn stopped_error(
    reason: &StopReason,
    step_error: JobError,
) -> (Status, Option<JobError>) {
    let killed = step_error.message.starts_with(crate::run::classify::KILLED);
    let left = if killed {
        format!(
            "; {}: objects it was creating may exist in the cloud without being in the state (the next apply imports those it can), and changes since its last saved state are not recorded",
            crate::run::classify::KILLED
        )
    } else if step_error.category != Category::Internal {
        format!("; terraform stopped gracefully ({})", step_error.message)
    } else {
        String::new()
    };
    let step = step_error.step;
    let (status, category, message, hint, retryable) = match reason {
        StopReason::Timeout => (
            Status::TimedOut,
            Category::Timeout,
            format!("the job ran past its timeout during {step} and was interrupted{left}"),
            "raise the job's timeout, or check why the step is slow",
            true,
        ),
        StopReason::Cancelled => (
            Status::Cancelled,
            Category::Cancelled,
            format!("the job was cancelled during {step}{left}"),
            "run the job again when ready",
            true,
        ),
        StopReason::Shutdown => (
            Status::Interrupted,
            Category::Cancelled,
            format!("the runner was shut down during {step}{left}"),
            "nothing to do: the job runs again when its message is delivered again",
            true,
        ),
        StopReason::LeaseLost(why) => (
            Status::Failed,
            Category::StateConflict,
            format!(
                "the workspace's lease was lost ({why}); terraform was stopped and its writes are refused"
            ),
            "another runner may now hold the workspace; check `terrace state versions` before running again",
            true,
        ),
    };
    (
        status,
        Some(JobError::new(category, step, message, hint, retryable).at(step_error.address)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step_error(message: &str, category: Category) -> JobError {
        JobError {
            category,
            step: "apply".into(),
            address: Some("testcloud_cluster.main".into()),
            message: message.into(),
            hint: String::new(),
            retryable: false,
        }
    }

    #[test]
    fn a_stopped_job_says_why_where_and_what_terraform_left() {
        let graceful = step_error("interrupted by the user", Category::Provider);
        let (status, e) = stopped_error(&StopReason::Timeout, graceful.clone());
        let e = e.unwrap();
        assert_eq!(status, Status::TimedOut);
        assert_eq!(e.category, Category::Timeout);
        assert_eq!(e.step, "apply");
        assert_eq!(e.address.as_deref(), Some("testcloud_cluster.main"));
        assert!(
            e.message.contains("past its timeout during apply"),
            "{}",
            e.message
        );
        assert!(e.message.contains("stopped gracefully"), "{}", e.message);

        let (status, e) = stopped_error(&StopReason::Shutdown, graceful.clone());
        assert_eq!(
            status,
            Status::Interrupted,
            "a host's shutdown is not final"
        );
        assert!(e.unwrap().retryable);

        let (status, e) = stopped_error(&StopReason::Cancelled, graceful.clone());
        assert_eq!(status, Status::Cancelled);
        assert_eq!(e.unwrap().category, Category::Cancelled);

        let (status, e) = stopped_error(&StopReason::LeaseLost("taken over".into()), graceful);
        let e = e.unwrap();
        assert_eq!(status, Status::Failed);
        assert_eq!(e.category, Category::StateConflict);
        assert!(e.message.contains("taken over"), "{}", e.message);

        let killed = step_error(
            &format!("{}: after the grace period", crate::run::classify::KILLED),
            Category::Internal,
        );
        let (_, e) = stopped_error(&StopReason::Timeout, killed);
        assert!(
            e.unwrap()
                .message
                .contains("may exist in the cloud without being in the state"),
            "a killed terraform may have left objects"
        );
    }
}
