//! The core [`Runner`]: one validated job, start to end. Every function (local, AWS, GCP, Azure)
//! adapts its trigger to [`Runner::run`].
//!
//! 1. idempotency: a job id with a result is not run again;
//! 2. the workspace's lease (owner = job id), renewed by a heartbeat while the job runs;
//! 3. an isolated workdir: the template, generated tfvars and backend configuration;
//! 4. the state server on loopback, fenced by the lease;
//! 5. terraform's steps for the operation, logged live and redacted;
//! 6. the result in `runs/<job-id>/result.json`; the lease released on every path.
//!
//! Its parts, each owning one thing: `lease` takes the lease and watches it (a
//! `Watch`); `prepare` readies the run (client, state server, job record, costing); `steps`
//! runs terraform's steps (a `Steps` context, gathering a `Report`); `imports` and `unsaved`
//! recover from "already exists" and from a state terraform could not save; `cleanup` handles a
//! failed apply; `life` moves the workspace's lifecycle; `finish` ends the run and writes its
//! result; `previous` finds a job done; `order` keeps requests in order (`sequence`);
//! `workdir` makes the workdir.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use state_backends::{CurrentState, Lease, StateStore, StateStoreExt, StoreError, WorkspaceId};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::job::Operation;
use crate::job::redact::Redactor;
use crate::job::validate::ValidatedJob;
use crate::run::client::Client;
use crate::run::logs::{ConsoleSink, LogSink, Logger, StoreSink};
use crate::run::result::{Category, JobError, JobResult};
use crate::run::terraform::TerraformConfig;
use crate::run::vouched::Vouched;
use crate::run::{logs, state_server};

use finish::{Clock, summary};
use lease::{Acquired, StopReason, Watch, watch};
use life::Life;
use prepare::Started;
use report::{Earlier, Report};
use steps::Steps;
use workdir::prepare_workdir;

mod approved;
mod cancel;
mod cleanup;
mod finish;
mod imports;
mod lease;
mod life;
mod order;
mod prepare;
mod previous;
mod report;
mod steps;
mod unsaved;
mod workdir;

pub use previous::previous_result;
pub use workdir::sweep_workdirs;

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
    /// The templates, for `on_failure: rollback` to load the configuration of the workspace's
    /// last successful apply (rollback only destroys what the run created without).
    pub templates: Option<crate::job::template::source::Templates>,
    /// Cancelled when the host is shutting down (a function's SIGTERM). A job stopped by it
    /// ends `interrupted`, not `cancelled`, so its message delivered again runs it again.
    /// Callers pass a child of it as the job's cancel token.
    pub shutdown: Option<CancellationToken>,
    /// The largest state (request body) the state server accepts.
    pub max_state_bytes: usize,
    /// A folder where terraform's `version -json` answer is remembered between processes
    /// (see [`crate::run::client::probe_cached`]); `None` reads it once per process.
    pub client_cache: Option<PathBuf>,
    /// One metrics record per finished job on stderr, in this format (none: no record).
    pub metrics: Option<crate::run::metrics::Format>,
    /// A folder of price books (see [`crate::run::cost`]): plans are estimated when it exists, read
    /// afresh by each job.
    pub price_books: Option<PathBuf>,
    /// How long a plan job's plan may wait for its approval (see [`crate::run::plans`]).
    pub plan_ttl: Duration,
    /// The platform's key the sensitive outputs are sealed to (see
    /// [`crate::run::sealed_outputs`]); without one they are masked only.
    pub outputs_recipient: Option<crate::run::sealed_outputs::OutputsRecipient>,
    /// A live copy of each job's log besides the stored one (a worker's log exchange).
    pub log_tap: Option<Arc<dyn crate::run::logs::LogTap>>,
    /// The policies every plan is held to before it is applied (see [`crate::run::policy`]).
    pub policies: Option<Arc<crate::run::policy::Policies>>,
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
            metrics: None,
            price_books: None,
            max_state_bytes: crate::run::state_server::MAX_STATE_BYTES,
            plan_ttl: crate::run::plans::DEFAULT_PLAN_TTL,
            outputs_recipient: None,
            log_tap: None,
            policies: None,
        }
    }
}

/// The longest a cancelled job's clean-up (`on_failure`) may take.
const CANCELLED_CLEANUP: Duration = Duration::from_secs(10 * 60);

/// A token for a cancelled job's clean-up: fired when the lease is lost, the host shuts down
/// (its deadline, a signal) or after `limit`. The guard stops the timer when dropped.
fn cleanup_token(
    lost: &CancellationToken,
    shutdown: Option<&CancellationToken>,
    limit: Duration,
) -> (CancellationToken, tokio_util::task::AbortOnDropHandle<()>) {
    let token = lost.child_token();
    let timer = {
        let token = token.clone();
        let shutdown = shutdown.cloned().unwrap_or_default();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(limit) => {}
                () = shutdown.cancelled() => {}
            }
            token.cancel();
        })
    };
    (token, tokio_util::task::AbortOnDropHandle::new(timer))
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

/// Why a job could not be run at all (its own failures are results, not errors).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The job's tenant or workspace is not a valid name.
    #[error(transparent)]
    Workspace(#[from] state_backends::InvalidName),
    /// The store could not be reached to check, lease or record the job.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record in the store is not what Terrace writes.
    #[error("{name} of job {job_id} cannot be read: {source}")]
    Record {
        job_id: String,
        name: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A record of the workspace or a request about the job (`runs/_workspace/…`,
    /// `cancel.json`) is not one this runner can read.
    #[error(transparent)]
    WorkspaceRecord(#[from] crate::run::records::RecordError),
    /// The task running the job under its lease ended without an outcome (it panicked).
    #[error("the job's task failed: {0}")]
    Task(String),
}

impl From<crate::run::records::ReadError> for RunError {
    fn from(e: crate::run::records::ReadError) -> Self {
        match e {
            crate::run::records::ReadError::Store(e) => RunError::Store(e),
            crate::run::records::ReadError::Record(e) => RunError::WorkspaceRecord(e),
        }
    }
}

impl RunError {
    /// Whether the same job may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        match self {
            RunError::Store(e) => e.is_retryable(),
            RunError::Task(_) => true,
            RunError::Workspace(_) | RunError::Record { .. } | RunError::WorkspaceRecord(_) => {
                false
            }
        }
    }

    /// Whether the job can never run as things stand (a record in the store Terrace cannot
    /// read, a name it cannot use), whatever the store does next.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            RunError::Workspace(_) | RunError::Record { .. } | RunError::WorkspaceRecord(_)
        )
    }
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

impl Runner {
    pub fn new(store: Arc<dyn StateStore>, config: RunnerConfig) -> Self {
        // Once per process: what runners killed on this machine left behind.
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            workdir::sweep_workdirs(config.work_root.as_deref());
        });
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
    pub async fn client(&self) -> Result<&Client, crate::run::client::ClientError> {
        self.client
            .get_or_try_init(|| {
                crate::run::client::probe_cached(
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
        job: &ValidatedJob,
    ) -> Result<Option<JobResult>, RunError> {
        previous_result(
            self.store.as_ref(),
            ws,
            &job.job.id,
            Some(job.job.operation),
        )
        .await
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
    ) -> Result<RunOutcome, RunError> {
        let j = &job.job;
        // Every event of the job, in this task or the ones it starts, carries these.
        let span = tracing::info_span!(
            "job",
            job_id = %j.id,
            tenant = %j.tenant,
            workspace = %j.workspace,
            operation = %j.operation,
        );
        self.run_in_span(job, cancel).instrument(span).await
    }

    async fn run_in_span(
        &self,
        job: &ValidatedJob,
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
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
        let asked = tokio::time::Instant::now();
        let (lease, granted) = match self.acquire(&ws, job, &cancel).await? {
            Acquired::Lease(lease, granted) => (lease, granted),
            Acquired::Busy(holder) => return Ok(RunOutcome::Busy { holder }),
            Acquired::Done(previous) => return Ok(RunOutcome::AlreadyDone(previous)),
        };
        // Everything under the lease runs in its own task, so that whatever happens there
        // (an error, a panic), the lease is released here.
        let leased = tokio::spawn({
            let (runner, job, ws, lease) = (self.clone(), job.clone(), ws.clone(), lease.clone());
            async move {
                runner
                    .run_leased(&job, &ws, (&lease, granted, asked), cancel)
                    .await
            }
            .instrument(tracing::Span::current())
        })
        .await;
        let released = lease::release(&*self.store, &ws, &lease).await;
        let outcome = match leased {
            Ok(outcome) => outcome?,
            Err(e) => return Err(RunError::Task(e.to_string())),
        };
        match (&outcome, released) {
            (_, Ok(())) => {}
            // The job's result is written: a lease that could not be released frees itself
            // at expiry, and the job's fate does not change.
            (RunOutcome::Finished(_), Err(e)) => {
                tracing::warn!(workspace = %ws, error = %e, "could not release the lease; it frees itself at expiry");
            }
            (_, Err(e)) => return Err(e.into()),
        }
        Ok(outcome)
    }

    /// The part of [`Runner::run`] that holds the lease; the caller releases it.
    async fn run_leased(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        (lease, granted, asked): (&Lease, tokio::time::Instant, tokio::time::Instant),
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        let j = &job.job;
        // What the run starts from, read side by side with whether it runs at all: the
        // workspace's status record and its state (the read terraform's first GET is served
        // from). Each is a store round trip; one after the other they would add up.
        let held = tokio::time::Instant::now();
        let (settled, status, state) = tokio::join!(
            self.settled_before_running(job, ws, lease),
            crate::run::lifecycle::read(self.store.as_ref(), ws),
            self.store.current(ws)
        );
        // How long the lease took to answer (a wait for a busy workspace included), and the
        // reads under it.
        let (lease_ms, reads_ms) = (
            held.saturating_duration_since(asked).as_millis() as u64,
            held.elapsed().as_millis() as u64,
        );
        if let Some(settled) = settled? {
            return Ok(settled);
        }
        // The run starts when the workspace is ours; waiting for it is not part of the run.
        let clock = Clock::start();
        // The state server's password is a secret of this job like its sensitive variables.
        let password = state_server::random_secret();
        let redactor = self.redactor(job, &password);
        let record = crate::run::records::JobRecord::new(job, &redactor, lease).to_bytes();
        let (logger, pump) = self.open_log(ws, &j.id, lease, &redactor);
        // The job's token: fired by the caller, the deadline, or a lost lease. The watchdog
        // keeps renewing the lease after that, through terraform's grace period, until the
        // result is written.
        let stop = cancel.child_token();
        let reason: Arc<OnceLock<StopReason>> = Arc::new(OnceLock::new());
        // Aborted when dropped: on every path out of here, a panic included.
        let lost = CancellationToken::new();
        let watchdog = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(watch(Watch {
            store: self.store.clone(),
            ws: ws.clone(),
            lease: lease.clone(),
            granted,
            ttl: self.config.lease_ttl,
            timeout: j.timeout,
            stop: stop.clone(),
            lost: lost.clone(),
            reason: reason.clone(),
            logger: logger.clone(),
        })));

        // The watchdog vouches for the lease until it finds it lost: writes under it need no
        // read of the lease first.
        let vouched = lease::vouched(lease, &lost, self.config.lease_ttl);
        let interrupted = self.note_interrupted(ws, lease, &logger).await;
        let (mut life, exists) = Life::new(
            job,
            ws,
            &vouched,
            life::Found {
                interrupted,
                status,
                exists: state.as_ref().map(Option::is_some).ok(),
            },
            &logger,
        )
        .await;

        // A cancel asked for while the job runs stops it as the caller's cancel does.
        let _cancel = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(cancel::watch(
            self.store.clone(),
            ws.clone(),
            j.id.clone(),
            (stop.clone(), reason.clone()),
            logger.clone(),
        )));
        let mut report = Report {
            earlier: Earlier {
                runs: life.unfinished_runs().to_vec(),
                fence: lease.fence,
                made: None,
            },
            ..Report::default()
        };
        // The run's start records (the job's record, the workspace's status moving) are
        // written while terraform initialises and plans; nothing changes before they are.
        let (tell, started) = Started::new();
        let starting = async {
            let fence = vouched.fence();
            let ((), recorded) = tokio::join!(
                life.begin(self, job, exists, &logger),
                self.store.put_artifact_fenced(
                    ws,
                    &j.id,
                    crate::run::records::JOB_FILE,
                    record,
                    &fence
                )
            );
            let _ = tell.send(Some(
                recorded.map_err(|e| (e.to_string(), e.is_retryable())),
            ));
        };
        let executing = self.execute(
            job,
            (&started, state),
            ws,
            lease,
            &password,
            &logger,
            (&stop, &vouched, &reason),
            &mut report,
        );
        let ((), outcome) = tokio::join!(starting, executing);
        let (status, error) = self.ending(outcome, reason.get(), &stop);
        let state_bytes = report.state_bytes;
        // From asking for the lease to terraform's first command.
        let to_terraform = report
            .first_command
            .map(|at| at.saturating_duration_since(asked).as_millis() as u64);
        let applied = report.applied.take();
        let mut result = report.into_result(job, lease, &clock, status, error);
        // The run's ending records, side by side: the workspace's status, what a later
        // rollback returns to, and the follow-ups of its state writes (see `StateStore::settle`).
        let last_apply = async {
            let Some(made) = applied else { return };
            if let Err(e) =
                crate::run::records::record_last_apply(self.store.as_ref(), ws, &made).await
            {
                logger
                    .runner(
                        "apply",
                        &format!("could not record this apply for later rollbacks: {e}"),
                    )
                    .await;
            }
        };
        tokio::join!(
            life.end(self, &mut result, &redactor, &logger),
            last_apply,
            self.store.settle(ws)
        );
        logger.runner("", &summary(&result)).await;
        drop(logger);

        let redacted = result.redacted(&redactor);
        // A plan's own key is delivered with the result, never stored with it.
        let mut stored = redacted.clone();
        if let Some(plan) = stored.plan.as_mut() {
            plan.key = None;
        }
        // The log's last lines and the result, side by side; both before the lease is let go
        // (which is what `terrace logs --follow` waits for).
        let ((), written) = tokio::join!(
            pump.finish(),
            self.write_result(ws, lease, &vouched, &stored)
        );
        drop(watchdog);
        tracing::info!(
            status = redacted.status.as_str(),
            duration_ms = redacted.duration_ms,
            "job {}",
            redacted.status.as_str()
        );
        if let Some(format) = self.config.metrics {
            let extra = crate::run::metrics::Extra {
                lease_wait_ms: lease_ms,
                state_bytes,
                to_terraform_ms: to_terraform,
                reads_ms: Some(reads_ms),
            };
            crate::run::metrics::emit(&redacted, extra, format);
        }
        written?;
        Ok(RunOutcome::Finished(Box::new(redacted)))
    }

    /// What masks this job's secrets in every line and record: its sensitive values, the
    /// values the runner gives terraform, the state server's password and secrets learnt
    /// later (a session handed out while it runs).
    fn redactor(&self, job: &ValidatedJob, password: &str) -> Redactor {
        let terraform = &self.config.terraform;
        Redactor::new(
            job.sensitive_values
                .iter()
                .cloned()
                .chain(terraform.env.iter().map(|(_, v)| v.clone()))
                .chain([password.to_owned()]),
        )
        .with_late(terraform.late_secrets.clone())
    }

    /// The job's log: chunks in the store, named by the lease's fence (a re-run after a crash
    /// adds to the log of the attempt it follows instead of overwriting it), and the console.
    fn open_log(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        lease: &Lease,
        redactor: &Redactor,
    ) -> (Logger, logs::Pump) {
        let mut sinks: Vec<Box<dyn LogSink>> = vec![Box::new(StoreSink::new(
            self.store.clone(),
            ws.clone(),
            job_id,
            lease.fence,
        ))];
        if self.config.console {
            sinks.push(Box::new(ConsoleSink::new(job_id)));
        }
        if let Some(tap) = &self.config.log_tap {
            sinks.push(tap.open(ws, job_id));
        }
        logs::start(redactor.clone(), sinks)
    }

    /// Prepares the workdir and runs the operation's steps.
    #[allow(clippy::too_many_arguments)] // the job's whole context, passed once
    async fn execute(
        &self,
        job: &ValidatedJob,
        (started, state): (&Started, Result<Option<CurrentState>, StoreError>),
        ws: &WorkspaceId,
        lease: &Lease,
        password: &str,
        logger: &Logger,
        (stop, vouched, reason): (&CancellationToken, &Vouched, &OnceLock<StopReason>),
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
        let (client, server, before) = self
            .prepare(job, state, ws, password, logger, vouched)
            .await?;
        // Refused before terraform runs: a budget this runner cannot check.
        let costing = self.costing(job, logger).await?;
        report.client = Some(client);
        let tag_job = self.tag_job(job, ws, logger).await;
        let workdir = prepare_workdir(
            self.config.work_root.as_deref(),
            job,
            &tag_job,
            self.config.terraform.user,
        )
        .map_err(|e| JobError::internal("prepare", format!("cannot prepare the workdir: {e}")))?;
        let dir = workdir.path();
        if j.plan.is_some() {
            let record = self.fetch_plan(job, ws, dir).await?;
            report.changes = Some(record.changes);
        }
        // This run's state server, in terraform's environment.
        let terraform = TerraformConfig {
            backend: server.endpoint().backend_env(),
            ..self.config.terraform.clone()
        };

        let steps = Steps {
            job_id: &j.id,
            ws,
            server: &server,
            config: &terraform,
            dir,
            logger,
            stop,
            costing: costing.as_ref(),
            destroy: j.destroy,
            approved: j.plan.is_some(),
            seal_to: self.config.outputs_recipient.as_ref(),
            started,
            policies: self.config.policies.as_deref(),
            template: &j.template,
        };
        let mut result = self.steps(j.operation, j.retry, &steps, report).await;
        // A job that changed nothing (a plan, a drift check) still ends only once its start
        // records are written; a plan is kept only then.
        if result.is_ok() {
            result = started.wait().await;
        }
        if result.is_ok() && j.operation == Operation::Plan {
            result = self.keep_plan(job, lease, &server, &steps, report).await;
        }
        if result.is_ok() && j.operation == Operation::Apply {
            // What a later `on_failure: rollback` returns to: for an approved plan, the plan
            // job, whose record holds the variables.
            report.applied = Some(j.plan.clone().unwrap_or_else(|| j.id.clone()));
        }
        // Never without a live lease: a clean-up's destroy could otherwise reach what another
        // runner, which took the workspace, has made since. A job cancelled (not stopped by its
        // host's shutdown, which runs it again) is cleaned up too, under a token of its own.
        // Only a cancel asked for (`terrace cancel`, a cancel message): a signal to the runner
        // stops the job and nothing else.
        let cancelled = reason.get() == Some(&StopReason::Cancelled)
            && !self.shutting_down()
            && matches!(
                crate::run::records::cancel_requested(self.store.as_ref(), ws, &j.id).await,
                Ok(Some(_))
            );
        if result.is_err()
            && j.operation == Operation::Apply
            && (!stop.is_cancelled() || cancelled)
            && !vouched.is_lost()
            && !started.failed()
        {
            let (bounded, _guard) = cleanup_token(
                vouched.lost(),
                self.config.shutdown.as_ref(),
                j.timeout.min(CANCELLED_CLEANUP),
            );
            let steps = Steps {
                stop: if cancelled { &bounded } else { stop },
                ..steps
            };
            report.cleanup = Some(self.clean_up(job, before, &steps, report).await);
        }
        let activity = server.shutdown().await;
        report.versions = activity.versions;
        report.state_bytes = activity.state_bytes;
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
}
