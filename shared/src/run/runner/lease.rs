//! The workspace's lease around a job: taking it (waiting for a busy workspace, unless the job
//! turns out to have finished), the watchdog that renews it and stops the job on its deadline,
//! its caller's cancel or a lost lease, and the record of a job whose runner died holding it.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use state_backends::{Lease, LeaseRequest, StateStore, StoreError, WorkspaceId};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::job::validate::ValidatedJob;
use crate::run::logs::Logger;
use crate::run::records::{JOB_FILE, RESULT_FILE};
use crate::run::result::{Category, JobError, JobResult, Status};
use crate::run::retry::Tries;
use crate::run::vouched::Vouched;

use super::{RunError, Runner};

impl Runner {
    /// When this job's lease took over an expired one, records the job that held it as
    /// interrupted (unless it left a result), so its status is known and it may run again.
    /// Returns that job's id when it did.
    pub(super) async fn note_interrupted(
        &self,
        ws: &WorkspaceId,
        lease: &Lease,
        logger: &Logger,
    ) -> Option<String> {
        let prev = lease.took_over.as_ref()?;
        let (Ok(Some(job)), Ok(None)) = (
            self.store.artifact(ws, &prev.owner, JOB_FILE).await,
            self.store.artifact(ws, &prev.owner, RESULT_FILE).await,
        ) else {
            return None; // not a job of ours (a restore), or it did finish
        };
        let job = match crate::run::records::JobRecord::parse(&job) {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(job_id = %prev.owner, error = %e, "interrupted job has an unreadable job.json");
                return None;
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
        let ran = crate::run::result::Ran {
            job_id: &prev.owner,
            tenant: ws.tenant(),
            workspace: ws.workspace(),
            operation,
            template: job.template.to_string(),
        };
        let error = JobError::new(
            Category::Internal,
            "unknown",
            format!(
                "the runner stopped without finishing (killed or crashed); its lease (fence {}) expired at {expired}",
                prev.fence
            ),
            "every state version it wrote is kept; check `terrace state versions`, then run the job again",
            true,
        );
        let result = JobResult {
            fence: Some(prev.fence),
            started_at,
            finished_at: prev.expired_at,
            ..JobResult::nothing_run(ran, Status::Interrupted, error)
        };
        let data = serde_json::to_vec_pretty(&result).ok()?;
        if self
            .store
            .put_artifact(ws, &prev.owner, RESULT_FILE, Bytes::from(data))
            .await
            .is_ok()
        {
            logger
                .runner("prepare", &format!("job {} was interrupted: its runner stopped without a result and its lease expired at {expired}; continuing from the current state", prev.owner))
                .await;
            return Some(prev.owner.clone());
        }
        None
    }

    /// Takes the workspace's lease, waiting up to `lease_wait` for a busy one, unless the job
    /// turns out to have finished already.
    pub(super) async fn acquire(
        &self,
        ws: &WorkspaceId,
        job: &ValidatedJob,
        cancel: &CancellationToken,
    ) -> Result<Acquired, RunError> {
        let request = LeaseRequest {
            owner: job.job.id.clone(),
            ttl: self.config.lease_ttl,
            info: serde_json::json!({
                "operation": job.job.operation,
                "template": job.job.template.to_string(),
                "host": hostname(),
                "pid": std::process::id(),
                // This request's own: a store that finds the lease held by a request the
                // client sent twice (the answer to the first lost) tells it from another
                // delivery of the same job.
                "request": &crate::run::state_server::random_secret()[..16],
            }),
        };
        // When the first try that failed in a way that may pass was asked: any such try may
        // have taken the lease though its answer was lost.
        let mut unseen_since: Option<tokio::time::Instant> = None;
        let taken = self
            .take(ws, job, cancel, &request, &mut unseen_since)
            .await;
        if taken.is_err() && unseen_since.is_some() {
            self.let_go_unseen(ws, &request).await;
        }
        taken
    }

    /// [`Runner::acquire`]'s tries.
    async fn take(
        &self,
        ws: &WorkspaceId,
        job: &ValidatedJob,
        cancel: &CancellationToken,
        request: &LeaseRequest,
        unseen_since: &mut Option<tokio::time::Instant>,
    ) -> Result<Acquired, RunError> {
        let give_up = Instant::now() + self.config.lease_wait;
        let mut announced = false;
        // The waits left after failures that may pass, and when the first of this run of
        // failures was seen; an answered try starts them afresh.
        let mut waits = ACQUIRE_WAITS.iter();
        let mut failing_since: Option<tokio::time::Instant> = None;
        // Polled quickly at first, then less often (a task may wait minutes on a cloud store,
        // where every look is a billed call), never past the wait's end.
        let mut pause = Duration::from_millis(250);
        loop {
            // The lease is ours for its TTL from no later than this instant (by this machine's
            // monotonic clock, which no clock step moves).
            let asked = tokio::time::Instant::now();
            match self.store.acquire_lease(ws, request).await {
                Ok(lease) => return Ok(Acquired::Lease(lease, asked)),
                // A try whose answer was lost took it: the holder is this very request (its
                // random id is in the info). Held since no later than that try was asked.
                Err(StoreError::LeaseHeld { holder, .. }) if is_ours(&holder, request) => {
                    tracing::info!(
                        workspace = %ws, fence = holder.fence,
                        "the lease was taken by an earlier try whose answer was lost"
                    );
                    return Ok(Acquired::Lease(*holder, unseen_since.unwrap_or(asked)));
                }
                Err(e) if e.is_retryable() && !matches!(e, StoreError::LeaseHeld { .. }) => {
                    unseen_since.get_or_insert(asked);
                    // Counted from the failure seen, not the try asked: a try that stalls
                    // lasts the client's own attempts, and still gets tries after it.
                    let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    let wait = waits.next().filter(|w| {
                        since.elapsed() + **w < ACQUIRE_BUDGET && !cancel.is_cancelled()
                    });
                    let Some(wait) = wait else {
                        return Err(e.into());
                    };
                    tracing::warn!(workspace = %ws, error = %e, "could not take the lease; trying again in {wait:?}");
                    tokio::select! {
                        () = tokio::time::sleep(*wait) => {}
                        () = cancel.cancelled() => return Err(e.into()),
                    }
                }
                Err(StoreError::LeaseHeld { holder, .. }) => {
                    waits = ACQUIRE_WAITS.iter();
                    failing_since = None;
                    if !announced {
                        // Its result, rather than a wait, for a finished job delivered again.
                        if let Some(previous) = self.previous_result(ws, job).await? {
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
                    let left = give_up.saturating_duration_since(Instant::now());
                    tokio::select! {
                        () = tokio::time::sleep(pause.min(left)) => {}
                        () = cancel.cancelled() => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Runner {
    /// After giving up on taking the lease: a try whose answer was lost may have taken it, and
    /// a lease no run knows it holds would keep this job, delivered again, waiting for its
    /// expiry. Let go of it if the store now says so (best effort: the store was failing).
    async fn let_go_unseen(&self, ws: &WorkspaceId, request: &LeaseRequest) {
        match self.store.lease(ws).await {
            Ok(Some(held)) if is_ours(&held, request) => {
                match release(self.store.as_ref(), ws, &held).await {
                    Ok(()) => {
                        tracing::info!(workspace = %ws, fence = held.fence, "let go of the lease an unanswered try had taken")
                    }
                    Err(e) => {
                        tracing::warn!(workspace = %ws, fence = held.fence, error = %e, "a try whose answer was lost took the lease, and it could not be let go; it frees itself at expiry")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(workspace = %ws, error = %e, "could not read the lease after giving up on it");
            }
        }
    }
}

/// Whether `held` was taken by `request` itself: its owner and its info, which carries the
/// request's own random id.
fn is_ours(held: &Lease, request: &LeaseRequest) -> bool {
    held.owner == request.owner && held.info == request.info
}

/// The waits before taking the lease is tried again after a failure that may pass.
const ACQUIRE_WAITS: [Duration; 5] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// No try starts later than this after the first failure seen (of a run of failures with no
/// answer between them).
const ACQUIRE_BUDGET: Duration = Duration::from_secs(30);

/// What [`Runner::acquire`] came to.
pub(super) enum Acquired {
    /// The lease, and when it was asked for.
    Lease(Lease, tokio::time::Instant),
    /// Held by another job (given up waiting).
    Busy(Box<Lease>),
    /// The job had finished already.
    Done(Box<JobResult>),
}

/// Why a job stopped before its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum StopReason {
    Timeout,
    Cancelled,
    /// The host is shutting down (see [`RunnerConfig::shutdown`]).
    Shutdown,
    LeaseLost(String),
}

/// What the watchdog is given: the job's lease and limits, and the tokens it fires.
pub(super) struct Watch {
    pub(super) store: Arc<dyn StateStore>,
    pub(super) ws: WorkspaceId,
    pub(super) lease: Lease,
    /// When the lease was asked for: it holds until `granted + ttl` at least.
    pub(super) granted: tokio::time::Instant,
    pub(super) ttl: Duration,
    pub(super) timeout: Duration,
    /// The job's stop: terraform gets SIGINT.
    pub(super) stop: CancellationToken,
    /// Fired when the lease is lost or cannot be confirmed: the state server then refuses
    /// every write, and no clean-up starts.
    pub(super) lost: CancellationToken,
    pub(super) reason: Arc<OnceLock<StopReason>>,
    pub(super) logger: Logger,
}

/// The job's fence, vouched for while the watchdog has not found the lease lost: until it
/// does, the lease is the runner's own for at least [`fence_margin`] more by this machine's
/// clock (it fires `lost` that long before the lease could expire). Half the margin is vouched
/// for, the other half is slack for a watchdog late to fire.
pub(super) fn vouched(lease: &Lease, lost: &CancellationToken, ttl: Duration) -> Vouched {
    Vouched::new(lease.fence(), lost.clone(), fence_margin(ttl) / 2)
}

/// The least time a renewal attempt is given before it is abandoned and tried again (never past
/// the give-up time): with a short TTL, half a period is shorter than a busy store may take.
const RENEWAL_ATTEMPT: Duration = Duration::from_secs(2);

/// How long before the lease would expire the runner gives up on confirming it: a renewal
/// that has not answered by then is taken as a lost lease.
pub(super) fn fence_margin(ttl: Duration) -> Duration {
    (ttl / 6).max(Duration::from_millis(50))
}

/// Renews the lease every third of its TTL until aborted, and stops the job on its deadline,
/// on the caller's cancel, or when the lease is lost. The runner fences itself: when a renewal
/// fails or hangs until the lease is about to expire, it takes the lease as lost (terraform is
/// stopped, the state server refuses writes) rather than write on after another runner may have
/// taken the workspace. Renewal goes on after a stop: terraform still writes its state during
/// the grace period, and the result is written after that. The deadline fires whatever the
/// renewals do.
pub(super) async fn watch(w: Watch) {
    let Watch {
        store,
        ws,
        mut lease,
        granted,
        ttl,
        timeout,
        stop,
        lost,
        reason,
        logger,
    } = w;
    let deadline = deadline(timeout, &stop, &reason, &logger);
    let margin = fence_margin(ttl);
    // Until when the lease is known to be ours, by this clock: as granted, then a renewal
    // asked at `t` and granted holds it until `t + ttl` at least.
    let mut confirmed_until = granted + ttl;
    let Schedule {
        every,
        mut renew,
        soon,
    } = Schedule::new(ttl, confirmed_until.checked_sub(margin));
    // The owner and fence stay the same across renewals.
    let (owner, fence_token) = (lease.owner.clone(), lease.fence);
    let fence = |why: String| {
        let why = format!(
            "{why}; the lease could not be confirmed before it would expire, so terraform is stopped and no more writes are made"
        );
        let _ = reason.set(StopReason::LeaseLost(why.clone()));
        lost.cancel();
        stop.cancel();
        // In the host's log too: the job's own log may be in the store that stopped answering.
        tracing::error!(workspace = %ws, owner = %owner, fence = fence_token, "{why}");
        why
    };
    loop {
        tokio::select! {
            () = stop.cancelled(), if reason.get().is_none() => {
                let _ = reason.set(StopReason::Cancelled);
            }
            // No renewal has succeeded in time (they failed, or the store is slow): give up on
            // the lease before it expires, not after.
            () = tokio::time::sleep_until(confirmed_until.checked_sub(margin).unwrap_or_else(tokio::time::Instant::now)) => {
                let why = fence("no renewal of the lease succeeded in time".into());
                logger.runner("", &why).await;
                break;
            }
            _ = renew.tick() => {
                let asked = tokio::time::Instant::now();
                let give_up = confirmed_until.checked_sub(margin).unwrap_or(asked);
                // An attempt gets half a period (at least RENEWAL_ATTEMPT, so that a store slow
                // under load is not taken for a stalled one): one that stalls (a request never
                // answered) is abandoned and tried again soon, while the lease still holds,
                // rather than waited for until the runner must fence itself. One that landed
                // unseen is renewed again by the next.
                let attempt_until = give_up.min(asked + (every / 2).max(RENEWAL_ATTEMPT));
                match tokio::time::timeout_at(attempt_until, store.renew_lease(&ws, &lease, ttl)).await {
                    Ok(Ok(renewed)) => {
                        lease = renewed;
                        confirmed_until = asked + ttl;
                    }
                    Ok(Err(StoreError::LeaseLost { reason: why, .. })) => {
                        let _ = reason.set(StopReason::LeaseLost(why.clone()));
                        lost.cancel();
                        stop.cancel();
                        tracing::error!(workspace = %ws, owner = %lease.owner, fence = lease.fence, "lease lost: {why}; stopping terraform");
                        logger.runner("", &format!("lease lost: {why}; stopping terraform")).await;
                        break;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "could not renew the lease; will retry");
                        renew.reset_after(soon);
                    }
                    Err(_) if attempt_until < give_up => {
                        tracing::warn!("renewing the lease did not answer in {:?}; will retry", every / 2);
                        renew.reset_after(soon);
                    }
                    Err(_) => {
                        let why = fence("renewing the lease did not answer".into());
                        logger.runner("", &why).await;
                        break;
                    }
                }
            }
        }
    }
    // Lost: nothing more to renew; the deadline may still mark the reason (already set).
    drop(deadline);
}

/// Stops the job when its timeout is reached, unless dropped first.
fn deadline(
    timeout: Duration,
    stop: &CancellationToken,
    reason: &Arc<OnceLock<StopReason>>,
    logger: &Logger,
) -> tokio_util::task::AbortOnDropHandle<()> {
    let (stop, reason, logger) = (stop.clone(), reason.clone(), logger.clone());
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        tokio::time::sleep(timeout).await;
        let _ = reason.set(StopReason::Timeout);
        stop.cancel();
        logger
            .runner("", &format!("timeout of {}s reached", timeout.as_secs()))
            .await;
    }))
}

/// When the lease is renewed.
struct Schedule {
    /// The period: a third of the TTL.
    every: Duration,
    renew: tokio::time::Interval,
    /// After a failed renewal, the next try comes this much later, sooner than the period.
    soon: Duration,
}

impl Schedule {
    /// Every third of the TTL, the first time no later than half way to `give_up` (the job
    /// did some work under the lease before the watchdog started).
    fn new(ttl: Duration, give_up: Option<tokio::time::Instant>) -> Self {
        let every = (ttl / 3).max(Duration::from_millis(100));
        let now = tokio::time::Instant::now();
        let first = every.min(give_up.unwrap_or(now).saturating_duration_since(now) / 2);
        Self {
            every,
            renew: tokio::time::interval_at(now + first, every),
            soon: (ttl / 12).clamp(Duration::from_millis(50), Duration::from_secs(5)),
        }
    }
}

/// The waits between tries of releasing a lease while the store fails in a way that may pass:
/// 7.75 s in all, enough to ride out a short outage. A lease left behind holds the workspace
/// until it expires (its TTL), so the next job waits that long.
const RELEASE_WAITS: [Duration; 5] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// How long releasing may take in all, tries and waits: a store that does not answer (each
/// try then lasts as long as the client's own attempts) must not hold the job much longer.
const RELEASE_BUDGET: Duration = Duration::from_secs(10);

/// Releases `lease`, trying again after each of [`RELEASE_WAITS`] while the store fails in a
/// way that may pass, within [`RELEASE_BUDGET`]. A try whose answer was lost and that did
/// release leaves nothing for the next to do (the record no longer holds this lease).
pub(super) async fn release(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    lease: &Lease,
) -> Result<(), StoreError> {
    let tries = Tries::after(&RELEASE_WAITS).run(
        "could not release the lease",
        StoreError::is_retryable,
        || store.release_lease(ws, lease),
    );
    tokio::time::timeout(RELEASE_BUDGET, tries)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Backend {
                backend: "lease",
                message: format!(
                    "releasing the lease of {ws} did not succeed within {RELEASE_BUDGET:?}; it frees itself at expiry"
                ),
                retryable: true,
                source: None,
            })
        })
}

pub(super) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::redact::Redactor;
    use crate::run::runner::RunnerConfig;
    use state_backends::memory::{MemoryStore, Renewals};

    fn ws() -> WorkspaceId {
        WorkspaceId::new("acme", "demo").unwrap()
    }

    async fn hold(store: &MemoryStore, owner: &str, ttl: Duration) -> Lease {
        let request = LeaseRequest {
            owner: owner.into(),
            ttl,
            info: serde_json::Value::Null,
        };
        store.acquire_lease(&ws(), &request).await.unwrap()
    }

    fn runner(store: Arc<MemoryStore>, wait: Duration) -> Runner {
        let config = RunnerConfig {
            lease_wait: wait,
            ..RunnerConfig::default()
        };
        Runner::new(store, config)
    }

    fn job(id: &str) -> ValidatedJob {
        super::super::workdir::tests::demo_job(id)
    }

    #[tokio::test]
    async fn a_busy_workspace_is_waited_for_until_the_lease_wait_then_given_up() {
        let store = Arc::new(MemoryStore::new());
        hold(&store, "other", Duration::from_secs(60)).await;
        let started = Instant::now();
        let acquired = runner(store, Duration::from_millis(400))
            .acquire(&ws(), &job("j1"), &CancellationToken::new())
            .await
            .unwrap();
        let Acquired::Busy(holder) = acquired else {
            panic!("not busy")
        };
        assert_eq!(holder.owner, "other");
        assert!(started.elapsed() >= Duration::from_millis(400));
    }

    #[tokio::test]
    async fn a_lease_freed_while_waiting_is_taken_with_a_new_fence() {
        let store = Arc::new(MemoryStore::new());
        let held = hold(&store, "other", Duration::from_secs(60)).await;
        let releaser = {
            let store = store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                store.release_lease(&ws(), &held).await.unwrap();
            })
        };
        let acquired = runner(store, Duration::from_secs(10))
            .acquire(&ws(), &job("j1"), &CancellationToken::new())
            .await
            .unwrap();
        releaser.await.unwrap();
        let Acquired::Lease(lease, _) = acquired else {
            panic!("no lease")
        };
        assert_eq!(lease.owner, "j1");
        assert_eq!(lease.fence, 2);
    }

    #[tokio::test]
    async fn a_finished_job_gets_its_result_rather_than_a_wait() {
        let store = Arc::new(MemoryStore::new());
        hold(&store, "other", Duration::from_secs(60)).await;
        let result = serde_json::json!({
            "job_id": "j1", "tenant": "acme", "workspace": "demo", "operation": "apply",
            "template": "demo@1.0.0", "status": "succeeded",
            "started_at": "2026-11-24T00:00:00Z", "finished_at": "2026-11-24T00:00:01Z",
            "duration_ms": 1000, "steps": [], "fence": 1,
        });
        let record = serde_json::json!({
            "id": "j1", "tenant": "acme", "workspace": "demo", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" }, "variables": {},
            "lease": { "fence": 1, "acquired_at": "2026-11-24T00:00:00Z" },
        });
        for (name, data) in [(JOB_FILE, record), (RESULT_FILE, result)] {
            store
                .put_artifact(&ws(), "j1", name, Bytes::from(data.to_string()))
                .await
                .unwrap();
        }
        let started = Instant::now();
        let acquired = runner(store, Duration::from_secs(30))
            .acquire(&ws(), &job("j1"), &CancellationToken::new())
            .await
            .unwrap();
        assert!(matches!(acquired, Acquired::Done(_)));
        assert!(started.elapsed() < Duration::from_secs(5), "no wait");
    }

    #[tokio::test]
    async fn a_cancelled_wait_gives_up_at_once() {
        let store = Arc::new(MemoryStore::new());
        hold(&store, "other", Duration::from_secs(60)).await;
        let cancel = CancellationToken::new();
        cancel.cancel();
        let acquired = runner(store, Duration::from_secs(30))
            .acquire(&ws(), &job("j1"), &cancel)
            .await
            .unwrap();
        assert!(matches!(acquired, Acquired::Busy(_)));
    }

    fn silent() -> Logger {
        crate::run::logs::start(Redactor::new(Vec::<String>::new()), Vec::new()).0
    }

    struct Dog {
        stop: CancellationToken,
        lost: CancellationToken,
        reason: Arc<OnceLock<StopReason>>,
        task: tokio::task::JoinHandle<()>,
    }

    fn start(store: Arc<MemoryStore>, lease: Lease, ttl: Duration, timeout: Duration) -> Dog {
        let (stop, lost, reason) = (
            CancellationToken::new(),
            CancellationToken::new(),
            Arc::new(OnceLock::new()),
        );
        let task = tokio::spawn(watch(Watch {
            store,
            ws: ws(),
            granted: tokio::time::Instant::now(),
            lease,
            ttl,
            timeout,
            stop: stop.clone(),
            lost: lost.clone(),
            reason: reason.clone(),
            logger: silent(),
        }));
        Dog {
            stop,
            lost,
            reason,
            task,
        }
    }

    #[tokio::test]
    async fn the_watchdog_stops_the_job_at_its_deadline_and_keeps_the_lease_renewed() {
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_millis(600);
        let lease = hold(&store, "j1", ttl).await;
        let dog = start(
            store.clone(),
            lease.clone(),
            ttl,
            Duration::from_millis(300),
        );
        tokio::time::timeout(Duration::from_secs(5), dog.stop.cancelled())
            .await
            .expect("stopped at the deadline");
        assert_eq!(dog.reason.get(), Some(&StopReason::Timeout));
        assert!(!dog.lost.is_cancelled());
        // Renewed past the job's stop, through terraform's grace: still live well after its TTL.
        tokio::time::sleep(ttl * 2).await;
        let now = store.lease(&ws()).await.unwrap().expect("still held");
        assert_eq!(now.owner, "j1");
        assert!(now.expires_at > lease.expires_at);
        dog.task.abort();
    }

    #[tokio::test]
    async fn a_lost_lease_stops_the_job_and_says_why() {
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_millis(300);
        let lease = hold(&store, "j1", ttl).await;
        store.break_lease(&ws(), None).await.unwrap();
        let dog = start(store, lease, ttl, Duration::from_secs(60));
        tokio::time::timeout(Duration::from_secs(5), dog.lost.cancelled())
            .await
            .expect("taken as lost");
        assert!(dog.stop.is_cancelled());
        assert!(
            matches!(dog.reason.get(), Some(StopReason::LeaseLost(_))),
            "{:?}",
            dog.reason
        );
        tokio::time::timeout(Duration::from_secs(5), dog.task)
            .await
            .expect("the watchdog ends once the lease is lost")
            .unwrap();
    }

    /// The runner fences itself when it cannot confirm its lease: before the lease expires
    /// (when another runner could take the workspace), the job is stopped and writes end.
    async fn fences_itself_before_the_lease_expires(mode: Renewals) {
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_millis(900);
        let lease = hold(&store, "j1", ttl).await;
        store.set_renewals(mode);
        let dog = start(store.clone(), lease.clone(), ttl, Duration::from_secs(60));
        tokio::time::timeout(Duration::from_secs(5), dog.lost.cancelled())
            .await
            .expect("fenced");
        let fenced_at = time::OffsetDateTime::now_utc();
        assert!(
            fenced_at < lease.expires_at,
            "fenced at {fenced_at}, after the lease expired at {}",
            lease.expires_at
        );
        assert!(dog.stop.is_cancelled(), "terraform is stopped");
        let Some(StopReason::LeaseLost(why)) = dog.reason.get() else {
            panic!("{:?}", dog.reason)
        };
        assert!(why.contains("could not be confirmed"), "{why}");
        tokio::time::timeout(Duration::from_secs(5), dog.task)
            .await
            .expect("the watchdog ends")
            .unwrap();
    }

    #[tokio::test]
    async fn a_runner_whose_renewals_fail_fences_itself_before_its_lease_expires() {
        fences_itself_before_the_lease_expires(Renewals::Fail).await;
    }

    #[tokio::test]
    async fn a_runner_whose_renewal_hangs_fences_itself_before_its_lease_expires() {
        fences_itself_before_the_lease_expires(Renewals::Hang).await;
    }

    #[tokio::test]
    async fn the_deadline_fires_while_a_renewal_hangs() {
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_secs(30);
        let lease = hold(&store, "j1", ttl).await;
        store.set_renewals(Renewals::Hang);
        let dog = start(store, lease, ttl, Duration::from_millis(12_500));
        // The first renewal (at 10 s) hangs; the deadline (12.5 s) fires all the same, before
        // the renewal is abandoned (15 s) or the lease given up on (25 s).
        tokio::time::timeout(Duration::from_secs(20), dog.stop.cancelled())
            .await
            .expect("stopped at the deadline");
        assert_eq!(dog.reason.get(), Some(&StopReason::Timeout));
        assert!(!dog.lost.is_cancelled());
        dog.task.abort();
    }

    #[tokio::test]
    async fn a_renewal_that_stalls_is_abandoned_and_tried_again_and_the_job_goes_on() {
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_secs(6);
        let lease = hold(&store, "j1", ttl).await;
        store.set_renewals(Renewals::Hang);
        let dog = start(store.clone(), lease.clone(), ttl, Duration::from_secs(60));
        // The renewal at 2 s never answers; waited for, it would hold the runner until the
        // give-up time (5 s) and fence it. Abandoned after half a period (3 s), the next try
        // (3.5 s) answers.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        store.set_renewals(Renewals::Answer);
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert!(!dog.lost.is_cancelled(), "{:?}", dog.reason);
        assert!(!dog.stop.is_cancelled());
        let now = store.lease(&ws()).await.unwrap().unwrap();
        assert!(now.expires_at > lease.expires_at, "renewed");
        dog.task.abort();
    }

    #[tokio::test]
    async fn a_release_the_store_fails_is_tried_again_and_the_lease_let_go() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(60);
        let lease = hold(&store, "j1", ttl).await;
        store.fail_releases(3);
        release(&store, &ws(), &lease).await.unwrap();
        assert!(store.lease(&ws()).await.unwrap().is_none(), "let go");
    }

    #[tokio::test]
    async fn a_release_that_keeps_failing_gives_up_after_its_waits() {
        let store = MemoryStore::new();
        let lease = hold(&store, "j1", Duration::from_secs(60)).await;
        store.fail_releases(u32::MAX);
        let started = tokio::time::Instant::now();
        let e = release(&store, &ws(), &lease).await.unwrap_err();
        assert!(e.is_retryable(), "{e}");
        assert!(started.elapsed() >= RELEASE_WAITS.iter().sum::<Duration>());
        assert!(
            store.lease(&ws()).await.unwrap().is_some(),
            "it expires by itself"
        );
    }

    #[tokio::test]
    async fn a_lease_taken_by_a_try_whose_answer_was_lost_is_the_jobs() {
        let store = Arc::new(MemoryStore::new());
        store.fail_acquires(3, true);
        let r = runner(store.clone(), Duration::ZERO);
        let cancel = CancellationToken::new();
        let Acquired::Lease(lease, _) = r.acquire(&ws(), &job("j1"), &cancel).await.unwrap() else {
            panic!("the job should hold the lease its first try took");
        };
        assert_eq!((lease.owner.as_str(), lease.fence), ("j1", 1));
        let held = store.lease(&ws()).await.unwrap().unwrap();
        assert_eq!(held, lease, "one acquisition, not a second one");
        // Another delivery of the same job is another request: it must wait, not share it.
        let again = runner(store.clone(), Duration::ZERO);
        assert!(matches!(
            again.acquire(&ws(), &job("j1"), &cancel).await.unwrap(),
            Acquired::Busy(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_that_stalls_past_the_budget_is_still_tried_again() {
        // A store that takes 40 s to fail (the client's own attempts), the first try landing:
        // the budget counts from the failure seen, so a second try finds the lease.
        let store = Arc::new(MemoryStore::new());
        store.fail_acquires(1, true);
        store.fail_acquires_after(ACQUIRE_BUDGET + Duration::from_secs(10));
        let r = runner(store.clone(), Duration::ZERO);
        let got = r
            .acquire(&ws(), &job("j1"), &CancellationToken::new())
            .await;
        assert!(matches!(got, Ok(Acquired::Lease(ref l, _)) if l.fence == 1));
    }

    #[tokio::test]
    async fn failed_tries_to_take_the_lease_are_tried_again() {
        let store = Arc::new(MemoryStore::new());
        store.fail_acquires(2, false);
        let r = runner(store.clone(), Duration::ZERO);
        let got = r
            .acquire(&ws(), &job("j1"), &CancellationToken::new())
            .await;
        assert!(matches!(got, Ok(Acquired::Lease(ref l, _)) if l.fence == 1));
    }

    #[tokio::test]
    async fn giving_up_on_the_lease_lets_go_of_one_an_unanswered_try_took() {
        let store = Arc::new(MemoryStore::new());
        store.fail_acquires(u32::MAX, true);
        let r = runner(store.clone(), Duration::ZERO);
        let started = tokio::time::Instant::now();
        let Err(e) = r
            .acquire(&ws(), &job("j1"), &CancellationToken::new())
            .await
        else {
            panic!("the store never answers: the job must give up");
        };
        assert!(e.to_string().contains("cannot be reached"), "{e}");
        assert!(started.elapsed() < ACQUIRE_BUDGET + Duration::from_secs(1));
        assert!(
            store.lease(&ws()).await.unwrap().is_none(),
            "the lease the first try took was let go"
        );
        // So the job, delivered again, takes it at once.
        store.fail_acquires(0, false);
        let got = r
            .acquire(&ws(), &job("j1"), &CancellationToken::new())
            .await;
        assert!(matches!(got, Ok(Acquired::Lease(ref l, _)) if l.fence == 2));
    }

    #[tokio::test]
    async fn a_store_that_fails_for_a_while_is_retried_soon_and_the_job_goes_on() {
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_secs(6);
        let lease = hold(&store, "j1", ttl).await;
        store.set_renewals(Renewals::Fail);
        let dog = start(store.clone(), lease.clone(), ttl, Duration::from_secs(60));
        // Renewals at 2 s and 4 s fail; at one try per period the next (6 s) would come after
        // the give-up time (5 s). Tried again soon after a failure, one succeeds in time.
        tokio::time::sleep(Duration::from_millis(4200)).await;
        store.set_renewals(Renewals::Answer);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!dog.lost.is_cancelled(), "{:?}", dog.reason);
        assert!(!dog.stop.is_cancelled());
        let now = store.lease(&ws()).await.unwrap().unwrap();
        assert!(now.expires_at > lease.expires_at, "renewed");
        dog.task.abort();
    }
}
