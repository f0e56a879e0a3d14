//! Cancel: a request in `runs/<job>/cancel.json` (`terrace cancel`). A job that finds one when
//! it gets its lease never runs; a running job looks for one every [`CANCEL_POLL`] and is
//! stopped as its caller's cancel stops it: terraform gets an interrupt, then the grace period,
//! then a kill, and the result is `cancelled`, saying what terraform left.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use state_backends::{Lease, StateStore, WorkspaceId, display_time};
use tokio_util::sync::CancellationToken;

use crate::job::validate::ValidatedJob;
use crate::run::logs::Logger;
use crate::run::records::{self, CancelRequest};
use crate::run::result::{Category, JobError, JobResult, Status};

use super::finish::Clock;
use super::lease::StopReason;
use super::report::Report;
use super::{RunError, Runner};

/// How often a running job looks for a request to cancel it: one read of `cancel.json`.
pub const CANCEL_POLL: Duration = Duration::from_secs(2);

impl Runner {
    /// Ends a job cancelled before it started: it never runs, and its result says who asked.
    pub(super) async fn cancelled_before(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        lease: &Lease,
        request: &CancelRequest,
    ) -> Result<JobResult, RunError> {
        tracing::info!(by = %request.by, "job cancelled before it started");
        let error = JobError::new(
            Category::Cancelled,
            "start",
            format!(
                "the job was cancelled before it started ({} asked at {}); nothing ran",
                request.by,
                display_time(request.requested_at)
            ),
            "send the request again, under a new job id, when it should run",
            false,
        );
        let result = Report::default().into_result(
            job,
            lease,
            &Clock::start(),
            Status::Cancelled,
            Some(error),
        );
        self.never_ran(job, ws, lease, result).await
    }
}

/// Looks for a request to cancel `job_id` every [`CANCEL_POLL`] until the job stops; when it
/// finds one, it stops the job (`stop`, with [`StopReason::Cancelled`]).
pub(super) async fn watch(
    store: Arc<dyn StateStore>,
    ws: WorkspaceId,
    job_id: String,
    (stop, reason): (CancellationToken, Arc<OnceLock<StopReason>>),
    logger: Logger,
) {
    let mut every =
        tokio::time::interval_at(tokio::time::Instant::now() + CANCEL_POLL, CANCEL_POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        match records::cancel_requested(store.as_ref(), &ws, &job_id).await {
            Ok(Some(request)) => {
                let _ = reason.set(StopReason::Cancelled);
                stop.cancel();
                logger
                    .runner(
                        "",
                        &format!(
                            "cancel asked by {} at {}: stopping terraform",
                            request.by,
                            display_time(request.requested_at)
                        ),
                    )
                    .await;
                return;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not look for a request to cancel the job; looking again");
            }
        }
    }
}
