//! The workspace's lifecycle around a run (see [`crate::lifecycle`]): the move a mutating job
//! starts with, the one it ends with, and what needs an operator's attention. A record that
//! cannot be written is logged and the run goes on: it reports state, it is not state.

use super::*;
use crate::lifecycle::{self, Phase, Transition, WorkspaceStatus};

/// The workspace's record as this run has left it so far.
pub(super) struct Life {
    ws: WorkspaceId,
    fence: state_backends::Fence,
    operation: Operation,
    job_id: String,
    status: Option<WorkspaceStatus>,
    interrupted_before: Option<String>,
}

impl Life {
    /// Reads the record, records a previous run found interrupted (when it was an apply or a
    /// destroy), then the move this job starts with.
    pub(super) async fn start(
        runner: &Runner,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        lease: &Lease,
        interrupted: Option<(String, Operation)>,
        logger: &Logger,
    ) -> Self {
        let j = &job.job;
        let status = match lifecycle::read(runner.store.as_ref(), ws).await {
            Ok(status) => status,
            Err(e) => {
                logger
                    .runner(
                        "prepare",
                        &format!(
                            "the workspace's status record cannot be read ({e}); starting a new one"
                        ),
                    )
                    .await;
                None
            }
        };
        let mut life = Self {
            ws: ws.clone(),
            fence: lease.fence(),
            operation: j.operation,
            job_id: j.id.clone(),
            status,
            interrupted_before: interrupted.as_ref().map(|(id, _)| id.clone()),
        };
        if let Some((prev, operation)) = interrupted
            && operation.mutates()
        {
            let reason = "its runner stopped without a result and its lease expired".to_owned();
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
            return life;
        }
        // Without a record (a workspace older than records), whether it exists is its state's.
        let exists = match &life.status {
            Some(s) => s.exists,
            None => matches!(runner.store.current(ws).await, Ok(Some(_))),
        };
        if let Some(phase) = lifecycle::starting(j.operation, exists) {
            let id = j.id.clone();
            life.move_to(runner, phase, &id, j.operation, None, logger)
                .await;
        }
        life
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
        if self.operation.mutates() {
            let to = lifecycle::ending(self.operation, result.status);
            let reason = result.error.as_ref().map(|e| {
                redactor.redact(&format!(
                    "{} at {}: {}",
                    e.category.as_str(),
                    e.step,
                    e.message
                ))
            });
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
            &self.fence,
            self.status.clone(),
            t.clone(),
        )
        .await
        {
            Ok(next) => {
                let from = from.map_or("new", Phase::as_str);
                logger
                    .runner(
                        "",
                        &format!("workspace {}: {from} → {}", self.ws, to.as_str()),
                    )
                    .await;
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
