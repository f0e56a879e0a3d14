//! The workspace's lifecycle around a run (see [`crate::run::lifecycle`]): the move a mutating job
//! starts with, the one it ends with, and what needs an operator's attention. A record that
//! cannot be written is logged and the run goes on: it reports state, it is not state. A record
//! that cannot be read for now (a store error, a newer runner's schema) is left alone for the
//! whole run, never replaced; only one that is not a record at all is started afresh.

use state_backends::WorkspaceId;
use time::OffsetDateTime;

use crate::job::Operation;
use crate::job::redact::Redactor;
use crate::job::validate::ValidatedJob;
use crate::run::lifecycle;
use crate::run::lifecycle::{Phase, Transition, WorkspaceStatus};
use crate::run::logs::Logger;
use crate::run::result::JobResult;
use crate::run::vouched::Vouched;

use super::Runner;

/// What a run found of its workspace as it started, under its lease.
pub(super) struct Found {
    /// The job found interrupted when this one took the workspace.
    pub(super) interrupted: Option<String>,
    /// The workspace's status record.
    pub(super) status: Result<Option<WorkspaceStatus>, lifecycle::StatusError>,
    /// Whether the workspace has a state, from the run's own read of it (`None`: that read
    /// failed).
    pub(super) exists: Option<bool>,
}

/// The workspace's record as this run has left it so far.
pub(super) struct Life {
    ws: WorkspaceId,
    fence: Vouched,
    operation: Operation,
    job_id: String,
    status: Option<WorkspaceStatus>,
    /// The record could not be read: this run writes none.
    skip: bool,
    /// A job found interrupted when this one took the workspace (for `attention`).
    interrupted_before: Option<String>,
    /// Runs since the workspace last ended a run `active` or `deleted`, newest first: the
    /// runs that ended without finishing (failed, timed out, killed), at most
    /// [`UNFINISHED_KEPT`].
    unfinished: Vec<String>,
}

/// How many earlier unfinished runs a job looks back over for creates they started.
const UNFINISHED_KEPT: usize = 5;

/// The runs a status record shows ending without finishing since its last clean end (`active`
/// or `deleted`), newest first, and `interrupted` (a run whose expired lease this job took).
fn unfinished_runs(
    status: Option<&lifecycle::WorkspaceStatus>,
    interrupted: Option<&str>,
) -> Vec<String> {
    let mut runs: Vec<String> = interrupted.map(str::to_owned).into_iter().collect();
    if let Some(status) = status {
        for t in status.history.iter().rev() {
            if matches!(t.to, Phase::Active | Phase::Deleted) {
                break;
            }
            if !runs.contains(&t.job_id) {
                runs.push(t.job_id.clone());
            }
        }
        if !matches!(status.status, Phase::Active | Phase::Deleted)
            && !runs.contains(&status.job_id)
        {
            runs.push(status.job_id.clone());
        }
    }
    runs.truncate(UNFINISHED_KEPT);
    runs
}

impl Life {
    /// The run's life from what it found; [`Life::begin`] then writes the moves it starts
    /// with. Whether the workspace has a state, for `begin`.
    pub(super) async fn new(
        job: &ValidatedJob,
        ws: &WorkspaceId,
        fence: &Vouched,
        Found {
            interrupted,
            status: read,
            exists,
        }: Found,
        logger: &Logger,
    ) -> (Self, Option<bool>) {
        let j = &job.job;
        let (status, skip) = match read {
            Ok(status) => (status, false),
            Err(lifecycle::StatusError::Record(crate::run::records::RecordError::Malformed {
                source,
                ..
            })) => {
                let line = format!(
                    "the workspace's status record is not one ({source}); starting a new one"
                );
                logger.runner("prepare", &line).await;
                (None, false)
            }
            Err(e) => {
                let line = format!(
                    "the workspace's status record cannot be read ({e}); this run leaves it as it is"
                );
                logger.runner("prepare", &line).await;
                (None, true)
            }
        };
        let unfinished = unfinished_runs(status.as_ref(), interrupted.as_deref());
        let life = Self {
            ws: ws.clone(),
            fence: fence.clone(),
            operation: j.operation,
            job_id: j.id.clone(),
            status,
            skip,
            interrupted_before: interrupted,
            unfinished,
        };
        (life, exists)
    }

    /// Records as interrupted a run the record shows under way, then the move this job starts
    /// with. `exists`: whether the workspace has a state, as read (`None`: read it here).
    pub(super) async fn begin(
        &mut self,
        runner: &Runner,
        job: &ValidatedJob,
        exists: Option<bool>,
        logger: &Logger,
    ) {
        let (j, ws, life) = (&job.job, self.ws.clone(), self);
        // The workspace is ours now, so a run the record shows under way has stopped without
        // finishing (killed or crashed, even before it wrote its job record).
        if let Some(stale) = life.status.as_ref().filter(|s| s.status.in_progress()) {
            let prev = stale.job_id.clone();
            let operation = stale
                .history
                .last()
                .map_or(Operation::Apply, |t| t.operation);
            let reason =
                "its runner stopped without finishing (killed, crashed, or its lease broken)"
                    .to_owned();
            life.move_to(
                runner,
                Phase::Interrupted,
                &prev,
                operation,
                Some(reason),
                logger,
            )
            .await;
        }
        if !j.operation.mutates() {
            return;
        }
        // Without a record (a workspace older than records), whether it exists is its state's.
        let exists = match &life.status {
            Some(s) => s.exists,
            None => match exists {
                Some(exists) => exists,
                // A state this runner cannot read (sealed with a key it lacks) still exists.
                None => matches!(runner.store.current_version(&ws).await, Ok(Some(_))),
            },
        };
        if let Some(phase) = lifecycle::starting(j.operation, exists) {
            let id = j.id.clone();
            life.move_to(runner, phase, &id, j.operation, None, logger)
                .await;
        }
    }

    /// Earlier runs of the workspace that did not finish, newest first (see [`unfinished_runs`]).
    pub(super) fn unfinished_runs(&self) -> &[String] {
        &self.unfinished
    }

    /// Records the move the run ends with (apply and destroy), and sets the result's
    /// `lifecycle` and `attention`.
    pub(super) async fn end(
        &mut self,
        runner: &Runner,
        result: &mut JobResult,
        redactor: &Redactor,
        logger: &Logger,
    ) {
        if let Some(to) =
            lifecycle::ending(self.operation, result.status).filter(|_| self.operation.mutates())
        {
            let reason = result.error.as_ref().map(|e| redactor.redact(&e.summary()));
            let id = self.job_id.clone();
            result.lifecycle = self
                .move_to(runner, to, &id, self.operation, reason, logger)
                .await;
        }
        let status = self
            .operation
            .mutates()
            .then_some(self.status.as_ref())
            .flatten();
        result.attention = lifecycle::attention(result, status, self.interrupted_before.as_deref());
        for a in &result.attention {
            logger
                .runner("", &format!("needs attention ({}): {}", a.kind, a.message))
                .await;
        }
    }

    /// Writes one move under the lease; the transition when it was written.
    async fn move_to(
        &mut self,
        runner: &Runner,
        to: Phase,
        job_id: &str,
        operation: Operation,
        reason: Option<String>,
        logger: &Logger,
    ) -> Option<Transition> {
        if self.skip {
            return None;
        }
        let from = self.status.as_ref().map(|s| s.status);
        let t = Transition {
            from,
            to,
            at: OffsetDateTime::now_utc(),
            job_id: job_id.to_owned(),
            operation,
            reason,
        };
        match lifecycle::record(
            runner.store.as_ref(),
            &self.ws,
            &self.fence.fence(),
            self.status.clone(),
            t.clone(),
        )
        .await
        {
            Ok(next) => {
                let line = format!("workspace {}: {} → {}", self.ws, t.from_name(), to.as_str());
                logger.runner("", &line).await;
                self.status = Some(next);
                Some(t)
            }
            Err(e) => {
                logger
                    .runner(
                        "",
                        &format!(
                            "could not record the workspace's status {} ({e})",
                            to.as_str()
                        ),
                    )
                    .await;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: &str, job: &str, moves: &[(&str, &str)]) -> WorkspaceStatus {
        let history: Vec<serde_json::Value> = moves
            .iter()
            .map(|(to, job)| {
                serde_json::json!({
                    "to": to, "at": "2026-11-24T10:00:00Z", "job_id": job, "operation": "apply",
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "schema": 1, "status": status, "since": "2026-11-24T10:00:00Z", "job_id": job,
            "exists": true, "consecutive_failures": 1, "history": history,
        }))
        .unwrap()
    }

    #[test]
    fn unfinished_runs_are_those_since_the_last_clean_end_newest_first() {
        let status = record(
            "updating",
            "d",
            &[
                ("provisioning", "a"),
                ("active", "a"),
                ("updating", "b"),
                ("failed", "b"),
                ("updating", "c"),
                ("interrupted", "c"),
                ("updating", "d"),
            ],
        );
        assert_eq!(unfinished_runs(Some(&status), None), ["d", "c", "b"]);
        // A run whose expired lease this job took comes first, once.
        assert_eq!(unfinished_runs(Some(&status), Some("c")), ["c", "d", "b"]);
        // After a clean end there is nothing to look back over.
        let clean = record("active", "a", &[("provisioning", "a"), ("active", "a")]);
        assert!(unfinished_runs(Some(&clean), None).is_empty());
        assert_eq!(unfinished_runs(None, Some("x")), ["x"]);
    }
}
