//! What a run needs before terraform's first step: the client checked, the state server
//! started, the job recorded, the price books and budget it is held to, and the job id its
//! tags name.

use std::collections::BTreeSet;

use state_backends::{CurrentState, StoreError, WorkspaceId};

use crate::job::Operation;
use crate::job::validate::ValidatedJob;
use crate::run::client::Client;
use crate::run::logs::Logger;
use crate::run::result::{Category, JobError};
use crate::run::state_server::StateServer;
use crate::run::vouched::Vouched;
use crate::run::{cost, state_server};

use super::Runner;
use super::cleanup::addresses;
use super::report::Costing;

/// The run's start records (the job's record, the workspace's status moving), written while
/// terraform initialises and plans. Awaited before anything changes infrastructure (an apply, an
/// import) and before a run that changed nothing ends: the next run must find that this one
/// started before there is anything to find.
#[derive(Clone, Debug)]
pub(super) struct Started(Told);

/// `None` until written; then whether the job's record was (its error, and whether it may pass).
type Told = tokio::sync::watch::Receiver<Option<Result<(), (String, bool)>>>;

/// Where the start records' outcome is told.
pub(super) type Tell = tokio::sync::watch::Sender<Option<Result<(), (String, bool)>>>;

impl Started {
    pub(super) fn new() -> (Tell, Self) {
        let (tell, told) = tokio::sync::watch::channel(None);
        (tell, Self(told))
    }

    /// Whether the job's record could not be written: then nothing was applied, and there is
    /// nothing to clean up.
    pub(super) fn failed(&self) -> bool {
        matches!(*self.0.borrow(), Some(Err(_)))
    }

    /// Waits until the start records are written; a job that could not be recorded stops here.
    pub(super) async fn wait(&self) -> Result<(), JobError> {
        let mut told = self.0.clone();
        let written = match told.wait_for(Option::is_some).await {
            Ok(written) => written.clone().unwrap_or(Ok(())),
            Err(_) => Err(("the run ended before its records were written".into(), true)),
        };
        written.map_err(|(e, retryable)| {
            JobError::new(
                Category::Internal,
                "prepare",
                format!("cannot record the job in the store: {e}"),
                "check that the store is reachable and writable",
                retryable,
            )
        })
    }
}

/// What [`Runner::prepare`] readies: the client, the state server, and the addresses the
/// state held before the run (or why it could not be read).
pub(super) type Prepared = (Client, StateServer, Result<BTreeSet<String>, String>);

impl Runner {
    /// Before terraform runs: the client checked and the state server started with the state
    /// read when the run started (terraform's first GET is served from it). The client, the
    /// state server and what the state held (or why it could not be read).
    #[allow(clippy::too_many_arguments)] // the run's context, passed once
    pub(super) async fn prepare(
        &self,
        job: &ValidatedJob,
        state: Result<Option<CurrentState>, StoreError>,
        ws: &WorkspaceId,
        password: &str,
        logger: &Logger,
        vouched: &Vouched,
    ) -> Result<Prepared, JobError> {
        let j = &job.job;
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
                fence: vouched.clone(),
                password: password.to_owned(),
                logger: Some(logger.clone()),
                max_body: self.config.max_state_bytes,
                header_read_timeout: crate::run::state_server::HEADER_READ_TIMEOUT,
            })
            .await
            .map_err(|e| {
                JobError::internal("prepare", format!("cannot start the state server: {e}"))
            })?;
            // The state as read when the run started, under the lease; read again only if that
            // read failed.
            if let Ok(state) = state {
                server.seed(state);
            }
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
        prepare.await
    }

    /// The price books and budget the job's plans are estimated with: none for drift checks,
    /// or without books. A budget that cannot be checked (no books, books that cannot be
    /// read, another currency) stops the job before terraform runs; without a budget, books
    /// that cannot be read only cost the job its estimate.
    pub(super) async fn costing(
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
                .map_err(|e| e.to_string())
                .and_then(|loaded| loaded.map_err(|e| e.to_string())),
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
    pub(super) async fn tag_job(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        logger: &Logger,
    ) -> String {
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
}

/// What fixes a budget in another currency than the runner's price books.
pub(super) const BUDGET_CURRENCY_HINT: &str =
    "give the budget in the price books' currency, or leave budget.currency out";
