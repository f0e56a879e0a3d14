//! The core [`Runner`]: one validated job, start to end. Every function (local, AWS, GCP, Azure)
//! adapts its trigger to [`Runner::run`].
//!
//! 1. idempotency: a job id with a result is not run again;
//! 2. the workspace's lease (owner = job id), renewed by a heartbeat while the job runs;
//! 3. an isolated workdir: the template, generated tfvars and backend configuration;
//! 4. the state server on loopback, fenced by the lease;
//! 5. terraform's steps for the operation, logged live and redacted;
//! 6. the result in `runs/<job-id>/result.json`; the lease released on every path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use state_backends::{Lease, LeaseRequest, StateStore, StoreError, WorkspaceId};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::classify::classify;
use crate::client::Client;
use crate::job::{OnFailure, Operation, RetryPolicy};
use crate::logs::{self, ConsoleSink, LogSink, Logger, StoreSink};
use crate::recover::{self, Recovery};
use crate::redact::Redactor;
use crate::result::{
    Attempt, Category, Changes, Cleanup, DriftedResource, JobError, JobResult, Status, StepTiming,
    UnsavedState, outputs_from_json,
};
use crate::rollback;
use crate::state_server::{self, StateServer};
use crate::terraform::{self, Command, Outcome, PlanMode, TerraformConfig};
use crate::validate::ValidatedJob;

/// The artifact names of a run.
pub const RESULT_FILE: &str = "result.json";
pub const JOB_FILE: &str = "job.json";

/// How the runner works on this machine.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    pub terraform: TerraformConfig,
    /// How long a lease lasts without renewal; the heartbeat renews it every third of that.
    pub lease_ttl: Duration,
    /// How long to wait for a busy workspace before giving up (zero: do not wait).
    pub lease_wait: Duration,
    /// Where workdirs are made (the system's temp folder when `None`).
    pub work_root: Option<PathBuf>,
    /// Print the log to the console as well as to the store.
    pub console: bool,
    /// The templates folder, for `on_failure: rollback` to load the configuration of the
    /// workspace's last successful apply (rollback only destroys what the run created without).
    pub templates: Option<PathBuf>,
    /// Cancelled when the host is shutting down (a function's SIGTERM). A job stopped by it
    /// ends `interrupted`, not `cancelled`, so its message delivered again runs it again.
    /// Callers pass a child of it as the job's cancel token.
    pub shutdown: Option<CancellationToken>,
    /// A folder where terraform's `version -json` answer is remembered between processes
    /// (see [`crate::client::probe_cached`]); `None` reads it once per runner.
    pub client_cache: Option<PathBuf>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            terraform: TerraformConfig::default(),
            lease_ttl: Duration::from_secs(60),
            lease_wait: Duration::ZERO,
            work_root: None,
            console: true,
            templates: None,
            shutdown: None,
            client_cache: None,
        }
    }
}

/// What became of a request to run a job.
#[derive(Debug)]
pub enum RunOutcome {
    /// The job ran (successfully or not); its result is stored.
    Finished(Box<JobResult>),
    /// The job id had already finished; nothing ran. Its earlier result.
    AlreadyDone(Box<JobResult>),
    /// Another job holds the workspace's lease; nothing ran. Try again after `holder.expires_at`.
    Busy { holder: Box<Lease> },
}

/// Runs jobs against one store.
#[derive(Debug, Clone)]
pub struct Runner {
    store: Arc<dyn StateStore>,
    config: Arc<RunnerConfig>,
    /// The terraform client, read once it is first read successfully (`version -json`) and
    /// checked against the floor; a failed read is tried again by the next job.
    client: Arc<tokio::sync::OnceCell<Client>>,
}

/// The managed resources in a state read from the store.
fn addresses(
    current: Result<Option<state_backends::CurrentState>, StoreError>,
) -> Result<BTreeSet<String>, String> {
    match current {
        Ok(Some(current)) => state_backends::tfstate::resource_addresses(&current.data),
        Ok(None) => Ok(BTreeSet::new()),
        Err(e) => Err(e.to_string()),
    }
}

/// What [`Runner::acquire`] came to.
enum Acquired {
    Lease(Lease),
    /// Held by another job (given up waiting).
    Busy(Box<Lease>),
    /// The job had finished already.
    Done(Box<JobResult>),
}

/// Why a job stopped before its end.
#[derive(Clone, Debug, PartialEq, Eq)]
enum StopReason {
    Timeout,
    Cancelled,
    /// The host is shutting down (see [`RunnerConfig::shutdown`]).
    Shutdown,
    LeaseLost(String),
}

impl Runner {
    pub fn new(store: Arc<dyn StateStore>, config: RunnerConfig) -> Self {
        Self {
            store,
            config: Arc::new(config),
            client: Arc::default(),
        }
    }

    /// The terraform client this runner drives, read on first use.
    ///
    /// # Errors
    /// A binary that cannot run, or a version Terrace does not support.
    pub async fn client(&self) -> Result<&Client, crate::client::ClientError> {
        self.client
            .get_or_try_init(|| {
                crate::client::probe_cached(
                    &self.config.terraform,
                    self.config.client_cache.as_deref(),
                )
            })
            .await
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    /// The stored result of a job id, if it finished before. An `interrupted` job did not
    /// finish: it may run again.
    ///
    /// # Errors
    /// Store failures, or a result that does not parse.
    pub async fn previous_result(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
    ) -> anyhow::Result<Option<JobResult>> {
        match self.store.artifact(ws, job_id, RESULT_FILE).await? {
            Some(raw) => {
                let result: JobResult = serde_json::from_slice(&raw)?;
                Ok((result.status != Status::Interrupted).then_some(result))
            }
            None => Ok(None),
        }
    }

    /// When this job's lease took over an expired one, records the job that held it as
    /// interrupted (unless it left a result), so its status is known and it may run again.
    async fn note_interrupted(&self, ws: &WorkspaceId, lease: &Lease, logger: &Logger) {
        let Some(prev) = &lease.took_over else { return };
        let (Ok(Some(job)), Ok(None)) = (
            self.store.artifact(ws, &prev.owner, JOB_FILE).await,
            self.store.artifact(ws, &prev.owner, RESULT_FILE).await,
        ) else {
            return; // not a job of ours (a restore), or it did finish
        };
        let job = match crate::records::JobRecord::parse(&job) {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(job_id = %prev.owner, error = %e, "interrupted job has an unreadable job.json");
                return;
            }
        };
        let operation = job.operation;
        let expired = state_backends::display_time(prev.expired_at);
        let started_at = job
            .lease
            .as_ref()
            .and_then(|l| {
                OffsetDateTime::parse(
                    &l.acquired_at,
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()
            })
            .unwrap_or(prev.expired_at);
        let template = job.template.to_string();
        let result = JobResult {
            job_id: prev.owner.clone(),
            tenant: ws.tenant().to_owned(),
            workspace: ws.workspace().to_owned(),
            operation,
            template,
            status: Status::Interrupted,
            started_at,
            finished_at: prev.expired_at,
            duration_ms: 0,
            terraform: None,
            steps: Vec::new(),
            changes: None,
            drift: None,
            drifted: Vec::new(),
            outputs: Default::default(),
            state_versions: Vec::new(),
            attempts: Vec::new(),
            cleanup: None,
            recovered: Vec::new(),
            unsaved_state: None,
            error: Some(JobError {
                category: Category::Internal,
                step: "unknown".into(),
                address: None,
                message: format!(
                    "the runner stopped without finishing (killed or crashed); its lease (fence {}) expired at {expired}",
                    prev.fence
                ),
                hint: "every state version it wrote is kept; check `terrace state versions`, then run the job again".into(),
                retryable: true,
            }),
        };
        let Ok(data) = serde_json::to_vec_pretty(&result) else {
            return;
        };
        if self
            .store
            .put_artifact(ws, &prev.owner, RESULT_FILE, Bytes::from(data))
            .await
            .is_ok()
        {
            logger
                .runner("prepare", &format!("job {} was interrupted: its runner stopped without a result and its lease expired at {expired}; continuing from the current state", prev.owner))
                .await;
        }
    }

    /// Runs `job` to its end, or until `cancel` fires or its timeout passes.
    ///
    /// # Errors
    /// Only when the store cannot be reached to check, lease or record the job; every failure
    /// of the job itself is a [`RunOutcome::Finished`] result with an error.
    ///
    /// # Cancellation safety
    /// Cancel through `cancel`, not by dropping the future: a dropped `run` leaves the job
    /// running in the background to its end, and its lease is then freed by expiry instead of
    /// being released.
    pub async fn run(
        &self,
        job: &ValidatedJob,
        cancel: CancellationToken,
    ) -> anyhow::Result<RunOutcome> {
        let j = &job.job;
        let ws = WorkspaceId::new(&j.tenant, &j.workspace)?;
        // Terraform's version is read while the store is: it is needed only once leased.
        let probe = tokio::spawn({
            let runner = self.clone();
            async move {
                let _ = runner.client().await;
            }
        });
        let _probe = tokio_util::task::AbortOnDropHandle::new(probe);
        // A job delivered again is found done under the lease (see `run_leased`), or, when the
        // workspace is busy, before waiting for it.
        let lease = match self.acquire(&ws, job, &cancel).await? {
            Acquired::Lease(lease) => lease,
            Acquired::Busy(holder) => return Ok(RunOutcome::Busy { holder }),
            Acquired::Done(previous) => return Ok(RunOutcome::AlreadyDone(previous)),
        };
        // Everything under the lease runs in its own task, so that whatever happens there
        // (an error, a panic), the lease is released here.
        let leased = tokio::spawn({
            let (runner, job, ws, lease) = (self.clone(), job.clone(), ws.clone(), lease.clone());
            async move { runner.run_leased(&job, &ws, &lease, cancel).await }
        })
        .await;
        let released = self.store.release_lease(&ws, &lease).await;
        let outcome = match leased {
            Ok(outcome) => outcome?,
            Err(e) => anyhow::bail!("the job's task failed: {e}"),
        };
        released?;
        Ok(outcome)
    }

    /// The part of [`Runner::run`] that holds the lease; the caller releases it.
    async fn run_leased(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        lease: &Lease,
        cancel: CancellationToken,
    ) -> anyhow::Result<RunOutcome> {
        let j = &job.job;
        // Checked again under the lease: the same job may have run while we waited for it.
        if let Some(previous) = self.previous_result(ws, &j.id).await? {
            return Ok(RunOutcome::AlreadyDone(Box::new(previous)));
        }
        // The run starts when the workspace is ours; waiting for it is not part of the run.
        let started_at = OffsetDateTime::now_utc();
        let started = Instant::now();
        // The state server's password is a secret of this job like its sensitive variables.
        let password = state_server::random_secret();
        let redactor = Redactor::new(
            job.sensitive_values
                .iter()
                .cloned()
                .chain(self.config.terraform.env.iter().map(|(_, v)| v.clone()))
                .chain([password.clone()]),
        )
        .with_late(self.config.terraform.late_secrets.clone());
        let record = crate::records::JobRecord::new(job, &redactor, lease).to_bytes();

        // Log chunks are named by the lease's fence too, so a re-run after a crash adds to the
        // log of the attempt it follows instead of overwriting it.
        let mut sinks: Vec<Box<dyn LogSink>> = vec![Box::new(StoreSink::new(
            self.store.clone(),
            ws.clone(),
            &j.id,
            lease.fence,
        ))];
        if self.config.console {
            sinks.push(Box::new(ConsoleSink::new(&j.id)));
        }
        let (logger, pump) = logs::start(redactor.clone(), sinks);
        self.note_interrupted(ws, lease, &logger).await;

        // The job's token: fired by the caller, the deadline, or a lost lease. The watchdog
        // keeps renewing the lease after that, through terraform's grace period, until the
        // result is written.
        let stop = cancel.child_token();
        let reason: Arc<OnceLock<StopReason>> = Arc::new(OnceLock::new());
        // Aborted when dropped: on every path out of here, a panic included.
        let watchdog = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(watch(
            self.store.clone(),
            ws.clone(),
            lease.clone(),
            self.config.lease_ttl,
            j.timeout,
            stop.clone(),
            reason.clone(),
            logger.clone(),
        )));

        let mut report = Report::default();
        let outcome = self
            .execute(
                job,
                record,
                ws,
                lease,
                &password,
                &logger,
                &stop,
                &mut report,
            )
            .await;

        // A job whose steps all succeeded succeeded, even if a stop came after the last one.
        let (status, error) = match outcome {
            Ok(()) => (Status::Succeeded, None),
            Err(e) => {
                let shutting_down = self
                    .config
                    .shutdown
                    .as_ref()
                    .is_some_and(CancellationToken::is_cancelled);
                let stopped = reason
                    .get()
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
        };
        let result = JobResult {
            job_id: j.id.clone(),
            tenant: j.tenant.clone(),
            workspace: j.workspace.clone(),
            operation: j.operation,
            template: j.template.to_string(),
            status,
            started_at,
            finished_at: OffsetDateTime::now_utc(),
            duration_ms: started.elapsed().as_millis() as u64,
            terraform: report.client,
            steps: report.steps,
            changes: report.changes,
            drift: report.drift,
            drifted: report.drifted,
            outputs: report.outputs,
            state_versions: report.versions,
            attempts: report.attempts,
            cleanup: report.cleanup,
            recovered: report.recovered,
            unsaved_state: report.unsaved_state,
            error,
        };
        let summary = match &result.error {
            None => format!(
                "job {} {} in {} ms",
                j.id,
                status.as_str(),
                result.duration_ms
            ),
            Some(e) => format!(
                "job {} {} at step {}: {}",
                j.id,
                status.as_str(),
                e.step,
                e.message
            ),
        };
        logger.runner("", &summary).await;
        drop(logger);
        pump.finish().await;

        // The result is written redacted, while the lease is still renewed.
        let redacted = redactor.redact_json(&serde_json::to_value(&result)?);
        let data = Bytes::from(serde_json::to_vec_pretty(&redacted)?);
        let mut attempt = 0;
        let written = loop {
            attempt += 1;
            match self
                .store
                .put_artifact(ws, &j.id, RESULT_FILE, data.clone())
                .await
            {
                Err(e) if attempt < 3 && e.is_retryable() => {
                    tracing::warn!(error = %e, attempt, "could not write the result; retrying");
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                }
                other => break other,
            }
        };
        drop(watchdog);
        written?;
        Ok(RunOutcome::Finished(Box::new(serde_json::from_value(
            redacted,
        )?)))
    }

    /// Takes the workspace's lease, waiting up to `lease_wait` for a busy one, unless the job
    /// turns out to have finished already.
    async fn acquire(
        &self,
        ws: &WorkspaceId,
        job: &ValidatedJob,
        cancel: &CancellationToken,
    ) -> anyhow::Result<Acquired> {
        let request = LeaseRequest {
            owner: job.job.id.clone(),
            ttl: self.config.lease_ttl,
            info: serde_json::json!({
                "operation": job.job.operation,
                "template": job.job.template.to_string(),
                "host": hostname(),
                "pid": std::process::id(),
            }),
        };
        let give_up = Instant::now() + self.config.lease_wait;
        let mut announced = false;
        loop {
            match self.store.acquire_lease(ws, &request).await {
                Ok(lease) => return Ok(Acquired::Lease(lease)),
                Err(StoreError::LeaseHeld { holder, .. }) => {
                    if !announced {
                        // Its result, rather than a wait, for a finished job delivered again.
                        if let Some(previous) = self.previous_result(ws, &job.job.id).await? {
                            return Ok(Acquired::Done(Box::new(previous)));
                        }
                    }
                    if Instant::now() >= give_up || cancel.is_cancelled() {
                        return Ok(Acquired::Busy(holder));
                    }
                    if !announced {
                        tracing::info!(
                            workspace = %ws, holder = %holder.owner, expires_at = %holder.expires_at,
                            "waiting for the workspace's lease"
                        );
                        announced = true;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(250)) => {}
                        () = cancel.cancelled() => {}
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Prepares the workdir and runs the operation's steps.
    #[allow(clippy::too_many_arguments)] // the job's whole context, passed once
    async fn execute(
        &self,
        job: &ValidatedJob,
        record: Bytes,
        ws: &WorkspaceId,
        lease: &Lease,
        password: &str,
        logger: &Logger,
        stop: &CancellationToken,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let j = &job.job;
        logger
            .runner(
                "prepare",
                &format!(
                    "{} {} in {} (lease fence {})",
                    j.operation, j.template, ws, lease.fence
                ),
            )
            .await;
        // The job's record is written while the client is checked, the state server started
        // and the state read (the read that terraform's first GET is then served from).
        let prepare = async {
            // Refused before anything touches the workspace's state.
            let client = self.client().await.map_err(|e| JobError {
                category: Category::Internal,
                step: "prepare".into(),
                address: None,
                message: e.to_string(),
                hint: e.hint().into(),
                retryable: true,
            })?;
            logger
                .runner(
                    "prepare",
                    &format!("{} {}", client.flavour.name(), client.version),
                )
                .await;
            let server = StateServer::start(state_server::Config {
                store: self.store.clone(),
                ws: ws.clone(),
                fence: lease.fence(),
                password: password.to_owned(),
                logger: Some(logger.clone()),
            })
            .await
            .map_err(|e| internal("prepare", format!("cannot start the state server: {e}")))?;
            let before = addresses(server.current().await);
            Ok::<_, JobError>((client.clone(), server, before))
        };
        let (recorded, prepared) = tokio::join!(
            self.store.put_artifact(ws, &j.id, JOB_FILE, record),
            prepare
        );
        if let Err(e) = recorded {
            return Err(JobError {
                category: Category::Internal,
                step: "prepare".into(),
                address: None,
                message: format!("cannot record the job in the store: {e}"),
                hint: "check that the store is reachable and writable".into(),
                retryable: e.is_retryable(),
            });
        }
        let (client, server, before) = prepared?;
        report.client = Some(client);
        let workdir = prepare_workdir(self.config.work_root.as_deref(), job, server.endpoint())
            .map_err(|e| internal("prepare", format!("cannot prepare the workdir: {e}")))?;
        let dir = workdir.path();

        let steps = Steps {
            job_id: &j.id,
            ws,
            server: &server,
            config: &self.config.terraform,
            dir,
            logger,
            stop,
        };
        let result = self.steps(j.operation, j.retry, &steps, report).await;
        if result.is_ok() && j.operation == Operation::Apply {
            // What a later `on_failure: rollback` returns to.
            if let Err(e) = rollback::record_last_apply(self.store.as_ref(), ws, &j.id).await {
                logger
                    .runner(
                        "apply",
                        &format!("could not record this apply for later rollbacks: {e}"),
                    )
                    .await;
            }
        }
        if result.is_err() && j.operation == Operation::Apply && !stop.is_cancelled() {
            report.cleanup = Some(self.clean_up(job, before, &steps, report).await);
        }
        let activity = server.shutdown().await;
        report.versions = activity.versions;
        if report.keep_workdir {
            let kept = workdir.keep();
            tracing::error!(workdir = %kept.display(), "kept the workdir: it holds a state that could not be saved");
        }
        match result {
            Err(mut e) if !activity.refused.is_empty() => {
                e.category = Category::StateConflict;
                e.message = format!(
                    "{} (the state server refused: {})",
                    e.message,
                    activity.refused.join("; ")
                );
                e.hint = "another writer changed this workspace's state; run the job again to plan from the current state".into();
                Err(e)
            }
            other => other,
        }
    }

    /// The managed resources in the workspace's current state.
    async fn addresses(&self, ws: &WorkspaceId) -> Result<BTreeSet<String>, String> {
        addresses(self.store.current(ws).await)
    }

    /// After a failed apply: finds what the run created (state after minus state before) and,
    /// per the job's `on_failure`, keeps it, destroys exactly that (never anything that existed
    /// before the run), or rolls the workspace back to its last successful apply.
    async fn clean_up(
        &self,
        job: &ValidatedJob,
        before: Result<BTreeSet<String>, String>,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Cleanup {
        let (policy, ws) = (job.job.on_failure, s.ws);
        let policy_name = serde_json::to_value(policy)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let mut cleanup = Cleanup {
            policy: policy_name,
            ..Cleanup::default()
        };
        let (before, after) = match (before, self.addresses(ws).await) {
            (Ok(before), Ok(after)) => (before, after),
            (Err(e), _) | (_, Err(e)) => {
                cleanup.error = Some(format!("cannot tell what the run created: {e}"));
                return cleanup;
            }
        };
        let created: BTreeSet<String> = after.difference(&before).cloned().collect();
        cleanup.created = created.iter().cloned().collect();
        cleanup.left = cleanup.created.clone();
        // A rollback also reverts changes to older resources, even when nothing was created,
        // but only when this run changed the state at all (a failed plan changed nothing).
        let changed_state = !s.server.activity().versions.is_empty();
        let nothing_to_roll_back = !(policy == OnFailure::Rollback && changed_state);
        if policy == OnFailure::Keep || (created.is_empty() && nothing_to_roll_back) {
            if !created.is_empty() {
                s.logger
                    .runner(
                        "cleanup",
                        &format!(
                            "keeping what this run created: {}",
                            cleanup.created.join(", ")
                        ),
                    )
                    .await;
            }
            return cleanup;
        }
        let mut failure: Option<String> = None;
        let mut left = created.clone();
        let mut rollback_note: Option<String> = None;
        if policy == OnFailure::Rollback {
            match self.roll_back(job, s, report).await {
                Ok(Some((to, changes))) => {
                    cleanup.rolled_back_to = Some(to);
                    cleanup.reverted = changes
                        .resources
                        .iter()
                        .map(|r| r.address.clone())
                        .filter(|a| !created.contains(a))
                        .collect();
                }
                Ok(None) => {
                    rollback_note = Some(
                        "no earlier apply succeeded in this workspace: rolled back by destroying what the run created".into(),
                    );
                }
                Err(e) => failure = Some(format!("rollback failed: {e}")),
            }
            if let Ok(now) = self.addresses(ws).await {
                left = created.intersection(&now).cloned().collect();
            }
        }
        while cleanup.attempts < 3 && !left.is_empty() && !s.stop.is_cancelled() {
            cleanup.attempts += 1;
            s.logger
                .runner(
                    "cleanup",
                    &format!(
                        "attempt {} to destroy what this run created: {}",
                        cleanup.attempts,
                        left.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )
                .await;
            match self.destroy_only(&left, s, report).await {
                Ok(()) => {}
                Err(e) if e.category == Category::Internal && e.step == "cleanup" => {
                    failure = Some(e.message);
                    break;
                }
                Err(e) => failure = Some(e.message),
            }
            let Ok(now) = self.addresses(ws).await else {
                break;
            };
            left = created.intersection(&now).cloned().collect();
        }
        // A destroy failure matters only if something is still left; a failed rollback always.
        let failure = failure.filter(|f| !left.is_empty() || f.starts_with("rollback failed"));
        cleanup.error = match (rollback_note, failure) {
            (Some(note), Some(failure)) => Some(format!("{failure}; {note}")),
            (note, failure) => failure.or(note),
        };
        cleanup.destroyed = created.difference(&left).cloned().collect();
        cleanup.left = left.into_iter().collect();
        cleanup
    }

    /// Plans the destruction of exactly `targets`, checks that the plan destroys nothing else
    /// (terraform also destroys what depends on a target), and applies it.
    async fn destroy_only(
        &self,
        targets: &BTreeSet<String>,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let plan = Command::Plan {
            mode: PlanMode::Destroy,
            detailed_exitcode: false,
            targets: targets.iter().cloned().collect(),
        };
        let planned = s.run(&plan, report).await?.ok()?;
        let changes = s.changes(planned, report).await?;
        let beyond: Vec<&str> = changes
            .resources
            .iter()
            .filter(|r| !targets.contains(&r.address))
            .map(|r| r.address.as_str())
            .collect();
        if !beyond.is_empty() {
            return Err(JobError {
                category: Category::Internal,
                step: "cleanup".into(),
                address: None,
                message: format!(
                    "the cleanup would also change {}, which existed before the run; nothing was destroyed",
                    beyond.join(", ")
                ),
                hint: "clean up by hand, or change the template so nothing older depends on what the run created".into(),
                retryable: false,
            });
        }
        s.run(&Command::Apply, report).await?.ok()?;
        Ok(())
    }

    /// `init` once, then attempts of the operation; a transient failure is retried with
    /// backoff, each attempt planning afresh from the current state.
    async fn steps(
        &self,
        op: Operation,
        retry: RetryPolicy,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let backend_config = s.dir.join(BACKEND_CONFIG);
        s.run(&Command::Init { backend_config }, report)
            .await?
            .ok()?;
        let mut attempt = 1;
        loop {
            let error = match self.attempt(op, s, report).await {
                Ok(()) => {
                    report.attempts.push(Attempt {
                        attempt,
                        error: None,
                        retry_after_ms: None,
                        max_retry_after_ms: None,
                    });
                    return Ok(());
                }
                Err(e) => e,
            };
            let mut error = error;
            if error.category == Category::ProviderConflict
                && op == Operation::Apply
                && report.recovered.len() < MAX_IMPORTS
                && !s.stop.is_cancelled()
            {
                match self.import_existing(&error, s, report).await {
                    Ok(()) => {
                        report.attempts.push(Attempt {
                            attempt,
                            error: Some(error),
                            retry_after_ms: Some(0),
                            max_retry_after_ms: None,
                        });
                        attempt += 1;
                        continue;
                    }
                    Err(why) => error.hint = format!("{} ({why})", error.hint),
                }
            }
            let retryable = error.category == Category::Transient && error.retryable;
            if !retryable || attempt >= retry.attempts || s.stop.is_cancelled() {
                report.attempts.push(Attempt {
                    attempt,
                    error: Some(error.clone()),
                    retry_after_ms: None,
                    max_retry_after_ms: None,
                });
                if retryable && attempt >= retry.attempts && attempt > 1 {
                    error.message = format!("{} (gave up after {attempt} attempts)", error.message);
                }
                return Err(error);
            }
            let (delay, ceiling) = (retry.delay(attempt), retry.ceiling(attempt));
            report.attempts.push(Attempt {
                attempt,
                error: Some(error.clone()),
                retry_after_ms: Some(delay.as_millis() as u64),
                max_retry_after_ms: Some(ceiling.as_millis() as u64),
            });
            s.logger
                .runner(
                    &error.step,
                    &format!(
                        "attempt {attempt} of {} failed ({:?}): {}; retrying in {} ms",
                        retry.attempts,
                        error.category,
                        error.message,
                        delay.as_millis()
                    ),
                )
                .await;
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = s.stop.cancelled() => return Err(error),
            }
            attempt += 1;
        }
    }

    /// Re-applies the workspace's last successful configuration in a workdir of its own, through
    /// the same state server. `None` when no apply has succeeded in the workspace yet.
    async fn roll_back(
        &self,
        job: &ValidatedJob,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<Option<(String, Changes)>, String> {
        let templates =
            self.config.templates.as_deref().ok_or(
                "the runner has no templates folder to load the earlier configuration from",
            )?;
        let Some((to, previous)) =
            rollback::previous_configuration(self.store.as_ref(), s.ws, job, templates).await?
        else {
            return Ok(None);
        };
        s.logger
            .runner(
                "rollback",
                &format!(
                    "rolling back to the configuration of {to} ({})",
                    previous.job.template
                ),
            )
            .await;
        let workdir = prepare_workdir(
            self.config.work_root.as_deref(),
            &previous,
            s.server.endpoint(),
        )
        .map_err(|e| format!("cannot prepare the workdir: {e}"))?;
        let r = Steps {
            dir: workdir.path(),
            ..*s
        };
        let failed = |e: JobError| format!("{} (step {})", e.message, e.step);
        let backend_config = r.dir.join(BACKEND_CONFIG);
        r.run(&Command::Init { backend_config }, report)
            .await
            .and_then(Ran::ok)
            .map_err(failed)?;
        let plan = Command::Plan {
            mode: PlanMode::Normal,
            detailed_exitcode: false,
            targets: Vec::new(),
        };
        let planned = r
            .run(&plan, report)
            .await
            .and_then(Ran::ok)
            .map_err(failed)?;
        let changes = r.changes(planned, report).await.map_err(failed)?;
        r.run(&Command::Apply, report)
            .await
            .and_then(Ran::ok)
            .map_err(failed)?;
        Ok(Some((to, changes)))
    }

    /// After "already exists": imports the object into the state when the error and the plan
    /// say unambiguously which planned create met it and the object's id.
    async fn import_existing(
        &self,
        error: &JobError,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), String> {
        // The saved plan of the attempt that failed is still in the workdir.
        let shown = s
            .run(&Command::ShowPlan, report)
            .await
            .and_then(Ran::ok)
            .map_err(|e| format!("there is no plan to find the resource in: {}", e.message))?;
        let in_state = self.addresses(s.ws).await?;
        let import = recover::import_for(error, &shown.stdout, &in_state)?;
        s.logger
            .runner(
                "import",
                &format!(
                    "{} already exists in the cloud as {} but not in the state (a create that failed after the cloud made it); importing it",
                    import.address, import.id
                ),
            )
            .await;
        let command = Command::Import {
            address: import.address.clone(),
            id: import.id.clone(),
        };
        s.run(&command, report)
            .await
            .and_then(Ran::ok)
            .map_err(|e| {
                format!(
                    "importing {} {} failed: {}",
                    import.address, import.id, e.message
                )
            })?;
        report.recovered.push(Recovery {
            action: "imported".into(),
            address: import.address,
            id: import.id,
            after: error.message.clone(),
        });
        Ok(())
    }

    /// Terraform's own copy of a state it could not save (`errored.tfstate`): kept as a run
    /// artifact first, then pushed as a new version with the checks and the fence of any write
    /// from terraform. True when it is now the workspace's current state.
    async fn keep_unsaved_state(&self, s: &Steps<'_>, report: &mut Report) -> bool {
        let path = s.dir.join(ERRORED_STATE);
        let Ok(data) = tokio::fs::read(&path).await else {
            return false;
        };
        let data = Bytes::from(data);
        let mut unsaved = UnsavedState {
            artifact: format!("runs/{}/{ERRORED_STATE}", s.job_id),
            pushed_as: None,
            error: None,
        };
        s.logger
            .runner(
                "apply",
                &format!(
                    "terraform could not save its state ({} bytes in {ERRORED_STATE}); keeping it and pushing it",
                    data.len()
                ),
            )
            .await;
        let mut errors = Vec::new();
        for attempt in 1..=3u64 {
            match self
                .store
                .put_artifact(s.ws, s.job_id, ERRORED_STATE, data.clone())
                .await
            {
                Ok(()) => break,
                Err(e) if e.is_retryable() && attempt < 3 => {
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                }
                Err(e) => {
                    // The workdir is kept so the file is not lost with it.
                    errors.push(format!(
                        "cannot keep it in the store ({e}); it stays in {}",
                        path.display()
                    ));
                    unsaved.artifact = path.display().to_string();
                    report.keep_workdir = true;
                    break;
                }
            }
        }
        let mut pushed = false;
        for attempt in 1..=3u64 {
            match s.server.push(data.clone()).await {
                Ok(version) => {
                    unsaved.pushed_as = version;
                    pushed = true;
                    let saved = version.map_or_else(
                        || "it was already the current state".to_owned(),
                        |v| format!("saved as state version {v}"),
                    );
                    s.logger
                        .runner("apply", &format!("the unsaved state is {saved}"))
                        .await;
                    break;
                }
                Err((why, retryable)) => {
                    if retryable && attempt < 3 {
                        tokio::time::sleep(Duration::from_secs(attempt)).await;
                        continue;
                    }
                    errors.push(format!("cannot push it: {why}"));
                    s.logger
                        .runner(
                            "apply",
                            &format!(
                                "the unsaved state cannot be pushed ({why}); it is kept as {}",
                                unsaved.artifact
                            ),
                        )
                        .await;
                    break;
                }
            }
        }
        if errors.is_empty() || pushed {
            // Handled: a later step in this workdir must not see it again.
            let _ = tokio::fs::remove_file(&path).await;
        }
        unsaved.error = (!errors.is_empty()).then(|| errors.join("; "));
        report.unsaved_state = Some(unsaved);
        pushed
    }

    /// A drift check's first plan: `plan -refresh-only`, what changed in the infrastructure
    /// since terraform last saw it, attribute by attribute (from `show -json` of that plan,
    /// values terraform or the template mark sensitive masked).
    async fn check_drift(&self, s: &Steps<'_>, report: &mut Report) -> Result<(), JobError> {
        let refresh = Command::Plan {
            mode: PlanMode::RefreshOnly,
            detailed_exitcode: true,
            targets: Vec::new(),
        };
        let refreshed = s.run(&refresh, report).await?;
        if !matches!(refreshed.exit_code, Some(0 | 2)) || refreshed.interrupted.is_some() {
            refreshed.ok()?;
            return Ok(());
        }
        // Drift is what terraform names in `resource_drift` messages. Exit 2 alone is not: a
        // refresh-only plan also exits 2 when the state would only be rewritten (an apply's
        // refreshed state after a restore, say) with no resource changed.
        let drifted = !refreshed.events.drifted.is_empty();
        report.drift = Some(drifted);
        if drifted {
            let shown = s.run(&Command::ShowPlan, report).await?.ok()?;
            let drifted =
                DriftedResource::from_plan_json(&shown.stdout).map_err(|e| internal("show", e))?;
            for resource in &drifted {
                s.logger
                    .runner("drift", &resource.describe(s.logger.redactor()))
                    .await;
            }
            report.drifted = drifted;
        }
        Ok(())
    }

    /// One attempt: plan, and for apply and destroy, apply the plan; changes and outputs come
    /// from terraform's messages.
    async fn attempt(
        &self,
        op: Operation,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        if op == Operation::DriftCheck {
            self.check_drift(s, report).await?;
        }
        let plan = Command::Plan {
            mode: if op == Operation::Destroy {
                PlanMode::Destroy
            } else {
                PlanMode::Normal
            },
            detailed_exitcode: op == Operation::DriftCheck,
            targets: Vec::new(),
        };
        let planned = s.run(&plan, report).await?;
        let planned = match (op, planned.exit_code) {
            // Exit 2: the plan has changes (with -detailed-exitcode).
            (Operation::DriftCheck, Some(0 | 2)) if planned.interrupted.is_none() => {
                if planned.exit_code == Some(2) {
                    report.drift = Some(true);
                }
                planned.outcome
            }
            _ => planned.ok()?,
        };
        let changes = s.changes(planned, report).await?;
        s.logger
            .runner(
                "show",
                &format!(
                    "plan: {} to add, {} to change, {} to destroy",
                    changes.add, changes.change, changes.destroy
                ),
            )
            .await;
        report.changes = Some(changes);
        if !op.mutates() {
            return Ok(());
        }
        let applied = s.run(&Command::Apply, report).await?;
        let saved_by_runner = self.keep_unsaved_state(s, report).await;
        let applied = if saved_by_runner && applied.errors.iter().all(|e| is_state_save_error(e)) {
            // Terraform finished the apply but could not save; the runner saved its state.
            s.logger
                .runner("apply", "the apply itself succeeded; its state is saved")
                .await;
            applied.outcome
        } else {
            applied.ok().map_err(|mut e| {
                if let Some(unsaved) = report.unsaved_state.as_ref().filter(|_| !saved_by_runner) {
                    e.hint = format!(
                        "terraform's final state is kept as {}: nothing it made is lost. Push it with `terrace state push {} FILE` once the store is reachable, before any other job runs in this workspace",
                        unsaved.artifact, s.ws
                    );
                }
                e
            })?
        };
        // The apply's `outputs` message has them; `output -json` when it printed none (a state
        // the runner saved for it).
        let outputs = match applied.events.outputs {
            Some(outputs) => outputs,
            None => {
                let output = s.run(&Command::Output, report).await?.ok()?;
                outputs_from_json(&output.stdout).map_err(|e| internal("output", e))?
            }
        };
        report.outputs = outputs
            .into_iter()
            .map(|(k, mut v)| {
                v.value = s.logger.redactor().redact_json(&v.value);
                (k, v)
            })
            .collect();
        Ok(())
    }
}

/// At most this many objects are imported after "already exists" in one job.
const MAX_IMPORTS: usize = 5;

/// The file terraform writes its state to when it cannot save it to the backend.
pub const ERRORED_STATE: &str = "errored.tfstate";

/// Whether a diagnostic is terraform failing to save its state (and nothing else).
fn is_state_save_error(message: &str) -> bool {
    let m = message.to_lowercase();
    [
        "failed to persist state",
        "failed to save state",
        "error saving state",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// What the steps found, gathered as they run.
#[derive(Default)]
struct Report {
    steps: Vec<StepTiming>,
    changes: Option<Changes>,
    drift: Option<bool>,
    outputs: std::collections::BTreeMap<String, crate::result::Output>,
    versions: Vec<u64>,
    attempts: Vec<Attempt>,
    cleanup: Option<Cleanup>,
    /// Drift checks: what changed outside terraform, attribute by attribute.
    drifted: Vec<DriftedResource>,
    /// The terraform client that ran the job.
    client: Option<Client>,
    recovered: Vec<Recovery>,
    unsaved_state: Option<UnsavedState>,
    /// Something in the workdir could not be saved elsewhere: do not delete it.
    keep_workdir: bool,
}

#[derive(Clone, Copy)]
struct Steps<'a> {
    job_id: &'a str,
    ws: &'a WorkspaceId,
    server: &'a StateServer,
    config: &'a TerraformConfig,
    dir: &'a Path,
    logger: &'a Logger,
    stop: &'a CancellationToken,
}

/// A finished step and its outcome.
struct Ran {
    step: &'static str,
    outcome: Outcome,
}

impl std::ops::Deref for Ran {
    type Target = Outcome;
    fn deref(&self) -> &Outcome {
        &self.outcome
    }
}

impl Ran {
    /// The outcome when the step succeeded, else the step's error.
    fn ok(self) -> Result<Outcome, JobError> {
        if self.outcome.success() {
            return Ok(self.outcome);
        }
        Err(classify(self.step, &self.outcome))
    }
}

impl Steps<'_> {
    /// A successful plan's changes: from its own messages, else from `show -json` of the
    /// saved plan.
    async fn changes(&self, planned: Outcome, report: &mut Report) -> Result<Changes, JobError> {
        if let Some(changes) = planned.events.changes() {
            return Ok(changes);
        }
        let shown = self.run(&Command::ShowPlan, report).await?.ok()?;
        Changes::from_plan_json(&shown.stdout).map_err(|e| internal("show", e))
    }

    async fn run(&self, command: &Command, report: &mut Report) -> Result<Ran, JobError> {
        let step = command.step();
        if self.stop.is_cancelled() {
            return Err(internal(step, "stopped before the step started".into()));
        }
        self.logger.runner(step, &format!("terraform {step}")).await;
        let outcome = terraform::run(self.config, self.dir, command, self.logger, self.stop)
            .await
            .map_err(|e| JobError {
                category: Category::Internal,
                step: step.into(),
                address: None,
                message: e.to_string(),
                hint:
                    "install terraform or OpenTofu and point the runner at it (TERRACE_TERRAFORM)"
                        .into(),
                retryable: false,
            })?;
        report.steps.push(StepTiming {
            step: step.into(),
            duration_ms: outcome.duration.as_millis() as u64,
            exit_code: outcome.exit_code,
        });
        Ok(Ran { step, outcome })
    }
}

fn internal(step: &str, message: String) -> JobError {
    JobError {
        category: Category::Internal,
        step: step.into(),
        address: None,
        message,
        hint: "this is a fault of the runner or its machine; see the runner's log".into(),
        retryable: true,
    }
}

/// The error of a job stopped by its deadline, its caller or a lost lease; `step_error` is what
/// the step it stopped said, which tells what state the workspace was left in.
fn stopped_error(reason: &StopReason, step_error: JobError) -> (Status, Option<JobError>) {
    let killed = step_error.message.starts_with(crate::classify::KILLED);
    let left = if killed {
        format!(
            "; {}: objects it was creating may exist in the cloud without being in the state (the next apply imports those it can), and changes since its last saved state are not recorded",
            crate::classify::KILLED
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
        Some(JobError {
            category,
            step,
            address: step_error.address,
            message,
            hint: hint.into(),
            retryable,
        }),
    )
}

/// Renews the lease every third of its TTL until aborted, and stops the job on its deadline,
/// on the caller's cancel, or when the lease is lost. Renewal goes on after a stop: terraform
/// still writes its state during the grace period, and the result is written after that.
#[allow(clippy::too_many_arguments)] // one task's whole context; a struct would only rename it
async fn watch(
    store: Arc<dyn StateStore>,
    ws: WorkspaceId,
    mut lease: Lease,
    ttl: Duration,
    timeout: Duration,
    stop: CancellationToken,
    reason: Arc<OnceLock<StopReason>>,
    logger: Logger,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut renew = tokio::time::interval((ttl / 3).max(Duration::from_millis(100)));
    renew.tick().await;
    let mut deadline_armed = true;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline), if deadline_armed => {
                deadline_armed = false;
                let _ = reason.set(StopReason::Timeout);
                stop.cancel();
                logger.runner("", &format!("timeout of {}s reached", timeout.as_secs())).await;
            }
            () = stop.cancelled(), if reason.get().is_none() => {
                let _ = reason.set(StopReason::Cancelled);
            }
            _ = renew.tick() => match store.renew_lease(&ws, &lease, ttl).await {
                Ok(renewed) => lease = renewed,
                Err(StoreError::LeaseLost { reason: why, .. }) => {
                    let _ = reason.set(StopReason::LeaseLost(why.clone()));
                    stop.cancel();
                    logger.runner("", &format!("lease lost: {why}; stopping terraform")).await;
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "could not renew the lease; will retry"),
            }
        }
    }
}

/// The name of the generated backend configuration in the workdir.
pub const BACKEND_CONFIG: &str = "terrace.backend.hcl";

/// Makes the job's workdir: a copy of the template, the variables as tfvars, and the backend.
fn prepare_workdir(
    root: Option<&Path>,
    job: &ValidatedJob,
    endpoint: &state_server::Endpoint,
) -> std::io::Result<tempfile::TempDir> {
    let prefix = format!("terrace-{}-", job.job.id);
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    let dir = match root {
        Some(root) => {
            std::fs::create_dir_all(root)?;
            builder.tempdir_in(root)?
        }
        None => builder.tempdir()?,
    };
    copy_template(&job.template.dir, dir.path())?;
    std::fs::create_dir_all(dir.path().join(".home"))?;
    std::fs::write(
        dir.path().join("terrace.auto.tfvars.json"),
        serde_json::to_vec_pretty(&job.job.variables)?,
    )?;
    std::fs::write(
        dir.path().join("terrace_backend.tf"),
        "# Generated by Terrace: state is served by the runner.\nterraform {\n  backend \"http\" {}\n}\n",
    )?;
    let hcl = format!(
        "address        = {addr:?}\nlock_address   = {addr:?}\nunlock_address = {addr:?}\n\
         lock_method    = \"LOCK\"\nunlock_method  = \"UNLOCK\"\nusername       = {user:?}\npassword       = {pass:?}\n",
        addr = endpoint.address,
        user = endpoint.username,
        pass = endpoint.password,
    );
    write_private(&dir.path().join(BACKEND_CONFIG), hcl.as_bytes())?;
    Ok(dir)
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(data)
}

fn copy_template(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == crate::template::SPEC_FILE || name == ".terraform" || name == "terraform.tfstate"
        {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_template(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}
