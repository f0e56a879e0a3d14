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
use tracing::Instrument;

use crate::job::redact::Redactor;
use crate::job::validate::ValidatedJob;
use crate::job::{OnFailure, Operation, RetryPolicy};
use crate::run::classify::classify_after;
use crate::run::client::Client;
use crate::run::cost;
use crate::run::logs::{self, ConsoleSink, LogSink, Logger, StoreSink};
use crate::run::recover::{self, Recovery};
use crate::run::result::{
    Attempt, Category, Changes, Cleanup, DriftedResource, JobError, JobResult, Status, StepTiming,
    UnsavedState, outputs_from_json,
};
use crate::run::retry::Tries;
use crate::run::rollback;
use crate::run::state_server::{self, StateServer};
use crate::run::terraform::{self, Command, Outcome, PlanMode, RunAs, TerraformConfig};

mod cleanup;
mod lease;
mod life;
mod steps;
mod workdir;

use cleanup::*;
use lease::*;
use life::Life;
use steps::*;
use workdir::*;

use crate::run::records::{ERRORED_STATE, JOB_FILE, RESULT_FILE};
pub use workdir::{BACKEND_CONFIG, sweep_workdirs};

/// The waits between tries of writing a job's result while the store fails in a way that may
/// pass.
const RESULT_WAITS: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(2)];

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
    /// (see [`crate::run::client::probe_cached`]); `None` reads it once per runner.
    pub client_cache: Option<PathBuf>,
    /// One metrics record per finished job on stderr, in this format (none: no record).
    pub metrics: Option<crate::run::metrics::Format>,
    /// A folder of price books (see [`crate::run::cost`]): plans are estimated when it exists, read
    /// afresh by each job.
    pub price_books: Option<PathBuf>,
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
    /// The task running the job under its lease ended without an outcome (it panicked).
    #[error("the job's task failed: {0}")]
    Task(String),
}

impl RunError {
    /// Whether the same job may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        match self {
            RunError::Store(e) => e.is_retryable(),
            RunError::Task(_) => true,
            RunError::Workspace(_) | RunError::Record { .. } => false,
        }
    }

    /// Whether the job can never run as things stand (a record in the store Terrace cannot
    /// read, a name it cannot use), whatever the store does next.
    pub fn is_permanent(&self) -> bool {
        matches!(self, RunError::Workspace(_) | RunError::Record { .. })
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
            let waited = granted.saturating_duration_since(asked);
            async move {
                runner
                    .run_leased(&job, &ws, (&lease, granted, waited), cancel)
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
        (lease, granted, waited): (&Lease, tokio::time::Instant, Duration),
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        let j = &job.job;
        // Checked again under the lease: the same job may have run while we waited for it.
        if let Some(previous) = self.previous_result(ws, job).await? {
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
        let record = crate::run::records::JobRecord::new(job, &redactor, lease).to_bytes();

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
        let interrupted = self.note_interrupted(ws, lease, &logger).await;
        let mut life = Life::start(self, job, ws, lease, interrupted, &logger).await;

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

        let mut report = Report {
            earlier: Earlier {
                runs: life.unfinished_runs().to_vec(),
                fence: lease.fence,
                made: None,
            },
            ..Report::default()
        };
        let outcome = self
            .execute(
                job,
                record,
                ws,
                lease,
                &password,
                &logger,
                (&stop, &lost),
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
        let state_bytes = report.state_bytes;
        let mut result = JobResult {
            schema: crate::run::result::RESULT_SCHEMA,
            job_id: j.id.clone(),
            tenant: j.tenant.clone(),
            workspace: j.workspace.clone(),
            operation: j.operation,
            template: j.template.to_string(),
            status,
            fence: Some(lease.fence),
            started_at,
            finished_at: OffsetDateTime::now_utc(),
            duration_ms: started.elapsed().as_millis() as u64,
            terraform: report.client,
            steps: report.steps,
            changes: report.changes,
            cost: report.cost,
            drift: report.drift,
            drifted: report.drifted,
            outputs: report.outputs,
            state_versions: report.versions,
            attempts: report.attempts,
            cleanup: report.cleanup,
            recovered: report.recovered,
            unsaved_state: report.unsaved_state,
            error,
            lifecycle: None,
            attention: Vec::new(),
        };
        life.end(self, &mut result, &redactor, &logger).await;
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

        // The result is written redacted, while the lease is still renewed, and only while it
        // is still this run's: a runner that lost it never replaces a later run's result.
        let record_error = |source| RunError::Record {
            job_id: j.id.clone(),
            name: RESULT_FILE,
            source,
        };
        let redacted = result.redacted(&redactor);
        let data = Bytes::from(serde_json::to_vec_pretty(&redacted).map_err(record_error)?);
        // A lease lost while the write is under way abandons it, which narrows (not closes) the
        // window between the store's check and the write: a request already sent may still
        // land. (One already lost still tries: the check says whether the store still holds it
        // as this run's.)
        let lost_before = lost.is_cancelled();
        let fence = lease.fence();
        let write = || async {
            let write =
                self.store
                    .put_artifact_fenced(ws, &j.id, RESULT_FILE, data.clone(), &fence);
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
        let written = Tries::after(&RESULT_WAITS)
            .run(
                "could not write the result",
                StoreError::is_retryable,
                write,
            )
            .await;
        drop(watchdog);
        tracing::info!(
            status = redacted.status.as_str(),
            duration_ms = redacted.duration_ms,
            "job {}",
            redacted.status.as_str()
        );
        if let Some(format) = self.config.metrics {
            let extra = crate::run::metrics::Extra {
                lease_wait_ms: waited.as_millis() as u64,
                state_bytes,
            };
            crate::run::metrics::emit(&redacted, extra, format);
        }
        written?;
        Ok(RunOutcome::Finished(Box::new(redacted)))
    }

    /// The price books and budget the job's plans are estimated with: none for drift checks,
    /// or without books. A budget that cannot be checked (no books, books that cannot be
    /// read, another currency) stops the job before terraform runs; without a budget, books
    /// that cannot be read only cost the job its estimate.
    async fn costing(
        &self,
        job: &ValidatedJob,
        logger: &Logger,
    ) -> Result<Option<Costing>, JobError> {
        let j = &job.job;
        // A drift check changes nothing; a destroy only lowers the cost, so its budget holds
        // whatever the books say.
        let budget = j
            .budget
            .as_ref()
            .filter(|_| j.operation != Operation::Destroy);
        if j.operation == Operation::DriftCheck {
            return Ok(None);
        }
        let loaded = match self.config.price_books.clone() {
            None => Ok(None),
            Some(dir) => tokio::task::spawn_blocking(move || cost::PriceBooks::load(&dir))
                .await
                .unwrap_or_else(|e| Err(e.to_string())),
        };
        const FIX_BOOKS: &str = "fix the price book as the message says (docs/templates.md describes the format), or remove the job's budget";
        match (loaded, budget) {
            (Ok(None), None) => Ok(None),
            (Err(why), None) => {
                logger
                    .runner("estimate", &format!("no cost estimate: {why}"))
                    .await;
                Ok(None)
            }
            (Ok(None), Some(_)) => Err(JobError::budget(
                "the job sets a budget, but this runner has no price books to estimate its cost with",
                "set TERRACE_PRICE_BOOKS (terrace: --price-books) to a folder of price books, or remove the job's budget",
            )),
            (Err(why), Some(_)) => Err(JobError::budget(
                format!("the job sets a budget, but the price books cannot be read: {why}"),
                FIX_BOOKS,
            )),
            (Ok(Some(books)), budget) => {
                if let Some(currency) = budget.as_ref().and_then(|b| b.currency.as_deref())
                    && currency != books.currency
                {
                    return Err(JobError::budget(
                        format!(
                            "budget.currency is {currency}, but this runner's price books are in {}",
                            books.currency
                        ),
                        BUDGET_CURRENCY_HINT,
                    ));
                }
                Ok(Some(Costing {
                    books,
                    budget: budget.cloned(),
                }))
            }
        }
    }

    /// The job id a template's tags name: the job's own, but for a drift check the last
    /// successful apply's, so that the check finds only what changed since, not the tag.
    async fn tag_job(&self, job: &ValidatedJob, ws: &WorkspaceId, logger: &Logger) -> String {
        let j = &job.job;
        let tagged = job
            .template
            .spec
            .variables
            .contains_key(crate::job::template::TAGS_VARIABLE);
        if !tagged || j.operation != Operation::DriftCheck {
            return j.id.clone();
        }
        match crate::run::records::last_apply(self.store.as_ref(), ws).await {
            Ok(Some((id, _))) => id,
            Ok(None) => j.id.clone(),
            Err(why) => {
                let line = format!(
                    "the tags name this check, not the last apply ({why}): they may read as drift"
                );
                logger.runner("prepare", &line).await;
                j.id.clone()
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
        (stop, lost): (&CancellationToken, &CancellationToken),
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
            let client = self.client().await.map_err(|e| {
                JobError::new(Category::Internal, "prepare", e.to_string(), e.hint(), true)
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
                lease_lost: lost.clone(),
                max_body: self.config.max_state_bytes,
                header_read_timeout: crate::run::state_server::HEADER_READ_TIMEOUT,
            })
            .await
            .map_err(|e| {
                JobError::internal("prepare", format!("cannot start the state server: {e}"))
            })?;
            let current = server.current().await;
            // A sealed state this runner cannot open: said here, before terraform, which would
            // only see its state server fail.
            if let Err(e @ StoreError::Sealed { .. }) = &current {
                return Err(JobError::new(
                    Category::Auth,
                    "prepare",
                    e.to_string(),
                    "give the runner the key that sealed the workspace's state (TERRACE_STATE_KEY_FILE, TERRACE_STATE_OLD_KEY_FILES for a key rotated out, or the target's client_side_kms_key); nothing was changed",
                    false,
                ));
            }
            // A job that may change infrastructure first proves it can seal the state it will
            // write: an apply whose state could not be saved must never start.
            if j.operation.mutates()
                && let Err(e) = self.store.check_keys(ws).await
            {
                let category = if e.is_retryable() {
                    Category::Transient
                } else {
                    Category::Auth
                };
                return Err(JobError::new(
                    category,
                    "prepare",
                    e.to_string(),
                    "the runner must be able to seal this workspace's states before it changes anything (a KMS key: kms:GenerateDataKey and kms:Decrypt for the runner's role, with the encryption context terrace:workspace); nothing was changed",
                    e.is_retryable(),
                ));
            }
            let before = addresses(current);
            Ok::<_, JobError>((client.clone(), server, before))
        };
        let fence = lease.fence();
        let (recorded, prepared) = tokio::join!(
            self.store
                .put_artifact_fenced(ws, &j.id, JOB_FILE, record, &fence),
            prepare
        );
        if let Err(e) = recorded {
            return Err(JobError::new(
                Category::Internal,
                "prepare",
                format!("cannot record the job in the store: {e}"),
                "check that the store is reachable and writable",
                e.is_retryable(),
            ));
        }
        let (client, server, before) = prepared?;
        // Refused before terraform runs: a budget this runner cannot check.
        let costing = self.costing(job, logger).await?;
        report.client = Some(client);
        let tag_job = self.tag_job(job, ws, logger).await;
        let workdir = prepare_workdir(
            self.config.work_root.as_deref(),
            job,
            &tag_job,
            server.endpoint(),
            self.config.terraform.user,
        )
        .map_err(|e| JobError::internal("prepare", format!("cannot prepare the workdir: {e}")))?;
        let dir = workdir.path();

        let steps = Steps {
            job_id: &j.id,
            ws,
            server: &server,
            config: &self.config.terraform,
            dir,
            logger,
            stop,
            costing: costing.as_ref(),
        };
        let result = self.steps(j.operation, j.retry, &steps, report).await;
        if result.is_ok() && j.operation == Operation::Apply {
            // What a later `on_failure: rollback` returns to.
            if let Err(e) =
                crate::run::records::record_last_apply(self.store.as_ref(), ws, &j.id).await
            {
                logger
                    .runner(
                        "apply",
                        &format!("could not record this apply for later rollbacks: {e}"),
                    )
                    .await;
            }
        }
        // Never without a live lease: a clean-up's destroy could otherwise reach what another
        // runner, which took the workspace, has made since.
        if result.is_err()
            && j.operation == Operation::Apply
            && !stop.is_cancelled()
            && !lost.is_cancelled()
        {
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
