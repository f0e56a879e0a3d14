//! One pipeline for every trigger's job messages: decode → check the target → validate the job →
//! does it fit in the time left here? (else hand it off) → open the customer's store → run →
//! report. A trigger (SQS on Lambda, a Pub/Sub push, a Storage Queue message, a handed-off task)
//! supplies only what is its own through [`Trigger`], and turns the message's [`Fate`] into its
//! queue's verbs (delete, return, answer 200 or 503, move to the poison queue).
//!
//! What every trigger gets the same way:
//! - every delivery of a job that has a final result reports that result, whether it ran now
//!   or before (a job id runs once): a platform never misses a result because an earlier
//!   delivery's report or acknowledgement was lost;
//! - a message whose workspace is busy goes back on the queue as a fresh copy, delayed until the
//!   lease holding it should end ([`Fate::Requeued`]): waiting behind another job is never a
//!   failed delivery, so it never counts towards a dead-letter limit;
//! - a handed-off task ([`task`]) reads only a staged message whose digest matches its reference,
//!   waits for a busy workspace, and puts its job back on the queue for any end that is not
//!   final: it ends with a reported result or its job goes back on the queue.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use state_backends::{StateStore, WorkspaceId};
use tokio_util::sync::CancellationToken;

use crate::host::message::{HandedOff, Message, Rejection, TaskStarted};
use crate::host::settings::Runtime;
use crate::host::tenants::Tenants;
use crate::host::trigger::{JobRef, TriggerError, check_job, problem, rejection};
use crate::job::signature::{self, Kind, SenderKey};
use crate::job::validate::ValidatedJob;
use crate::job::validate::ValidationError;
use crate::run::result::{Category, JobError, JobResult, Status};
use crate::run::runner::{RunOutcome, Runner};
use crate::run::terraform::{SharedUser, TerraformConfig};

/// A job message: the job, and the customer's side it runs against
/// (`docs/schema/job-message.schema.json`).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, bound(deserialize = "T: Deserialize<'de>"))]
#[schemars(bound = "T: schemars::JsonSchema")]
pub struct Envelope<T> {
    #[schemars(with = "crate::job::document::JobDocument")]
    pub job: Map<String, Value>,
    /// The customer's side: from the runner's tenant registry for the job's tenant when the
    /// trigger has one (a target here must then agree with it), else required. Its fields are
    /// the cloud's (docs/deploy.md); a registry-only field (AWS's `external_id`) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<T>,
    /// How many times a handed-off task has put this job back on the queue after trouble that
    /// may pass (waiting for a busy workspace does not count). Set by Terrace, not by senders.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(skip)]
    pub requeued: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What must live until a job ends (e.g. the broker terraform asks for sessions).
pub type Keep = Option<Box<dyn std::any::Any + Send + Sync>>;

/// What is a trigger's own: its target type, how it reaches the customer, where results go,
/// how a message goes back on its queue, and how a long job is handed off.
#[async_trait]
pub trait Trigger: Send + Sync {
    /// The customer's side a message names (a role and bucket, a service account, a container).
    type Target: DeserializeOwned + Serialize + Clone + Send + Sync + 'static;

    /// The shape of a job message, for the rejection of one that is not.
    fn envelope_fix(&self) -> &'static str;

    /// The message as an envelope: by default JSON, or base64 of it.
    ///
    /// # Errors
    /// Why it is not one, as a sentence.
    fn decode(&self, body: &[u8]) -> Result<Envelope<Self::Target>, String> {
        decode(body)
    }

    /// Every problem with a message's target, as [`problem`]s.
    fn check_target(&self, target: &Self::Target) -> Vec<ValidationError>;

    /// The operator's tenant registry, which chooses each job's target. `None` only where the
    /// target is this host itself (the local queue): anywhere else, whoever can enqueue would
    /// choose the customer's account.
    fn tenants(&self) -> Option<&Tenants<Self::Target>>;

    /// The keys allowed to send `tenant`'s jobs and cancels: by default the registry's
    /// `senders`. None: any sender may.
    fn senders(&self, tenant: &str) -> &[SenderKey] {
        self.tenants().map_or(&[], |t| t.senders(tenant))
    }

    /// The target of every message where this host is the customer's side itself (the local
    /// queue): no message names one.
    fn own_target(&self) -> Option<Self::Target> {
        None
    }

    /// The fields of a target that only the registry may give (AWS: the ExternalId); a message
    /// that carries one is rejected.
    fn registry_only(&self) -> &'static [&'static str] {
        &[]
    }

    /// What runs a job here (the templates, terraform, the lease's TTL).
    fn runtime(&self) -> &Runtime;

    /// Cancelled when this host is shutting down: a job stopped by it ends `interrupted`.
    fn shutdown(&self) -> Option<&CancellationToken> {
        None
    }

    /// The customer's store. `ws` is given when a job is about to run there, so the trigger
    /// may start reaching it (AWS reads its lease, assuming the role meanwhile).
    ///
    /// # Errors
    /// Why it cannot be reached: now ([`TriggerError::Again`], the message is delivered
    /// again), or ever ([`TriggerError::Never`], the job is rejected).
    async fn store(
        &self,
        target: &Self::Target,
        session: &str,
        ws: Option<&WorkspaceId>,
    ) -> Result<Arc<dyn StateStore>, TriggerError>;

    /// Gives terraform access to the customer for `job` (its settings and secrets in
    /// `terraform`), and what must live as long as the job.
    ///
    /// # Errors
    /// Why terraform cannot be given access, now or ever (as [`Trigger::store`]).
    async fn terraform_access(
        &self,
        target: &Self::Target,
        job: &ValidatedJob,
        terraform: &mut TerraformConfig,
    ) -> Result<Keep, TriggerError>;

    /// Sends a message (a result, a rejection, a hand-off, a cancel's answer) to the results
    /// channel, if any, as [`Message::to_value`] writes it.
    async fn report(&self, message: &Message);

    /// Puts a fresh copy of `body` on the jobs queue, to be delivered no sooner than `delay`
    /// where the queue can delay it.
    ///
    /// # Errors
    /// Why not: the queue refused it ([`TriggerError::Again`]), or this host has no jobs
    /// queue to put it on ([`TriggerError::Never`]). Either way the message itself is then
    /// delivered again.
    async fn requeue(&self, body: &[u8], delay: Duration) -> Result<(), TriggerError>;

    /// Sends new job messages to the jobs queue (the drift sweep's checks): for each body,
    /// `None` once it is queued, or why it is not. By default one by one through
    /// [`Trigger::requeue`]; a queue that takes batches does better.
    async fn enqueue(&self, bodies: &[String]) -> Vec<Option<String>> {
        let mut out = Vec::with_capacity(bodies.len());
        for body in bodies {
            out.push(
                self.requeue(body.as_bytes(), Duration::ZERO)
                    .await
                    .err()
                    .map(|e| e.to_string()),
            );
        }
        out
    }

    /// The bucket (or container) `target` names, as a sweep's report names it.
    fn bucket_of(&self, target: &Self::Target) -> String;

    /// `None` when a job too long for this host can be handed off; otherwise the fix to put
    /// in its rejection.
    fn cannot_hand_off(&self) -> Option<String>;

    /// Starts a task (of the same image) for the job staged under `reference`.
    ///
    /// # Errors
    /// Why it was not started: now (the message is delivered again), or ever (the job is
    /// rejected).
    async fn start_task(
        &self,
        reference: &JobRef<Self::Target>,
        timeout: Duration,
    ) -> Result<TaskStarted, TriggerError>;
}

/// What became of one message, for the trigger to carry out. Every record here has been
/// reported already when the fate says so.
#[derive(Debug)]
pub enum Fate {
    /// The job has a final result, from this delivery or an earlier one, or the message was a
    /// cancel that is now recorded (or found its job finished): acknowledge. Reported.
    Ran(Value),
    /// The message can never be a job: acknowledge it, or dead-letter it where the trigger
    /// keeps those. Reported.
    Rejected(Value),
    /// Staged and handed to a task: acknowledge. Reported.
    HandedOff(Value),
    /// A fresh copy is on the queue (a busy workspace, or a task's job put back): acknowledge
    /// this one.
    Requeued { why: String, delay: Duration },
    /// Deliver this message again: trouble that may pass, or a busy workspace whose copy
    /// could not be queued (`delay`: when to try again, if known).
    Again {
        why: String,
        delay: Option<Duration>,
    },
    /// Stopped by this host's shutdown: not the job's fault, deliver it again at once. The
    /// `interrupted` result (not reported: the job runs again).
    Interrupted(Value),
}

impl Fate {
    fn again(why: impl Into<String>) -> Self {
        Fate::Again {
            why: why.into(),
            delay: None,
        }
    }
}

/// One delivery of a message.
#[derive(Clone, Debug)]
pub struct Delivery<'a> {
    /// The queue's id of the message, for rejections and logs.
    pub message_id: &'a str,
    /// The message as it came (JSON, or base64 of it).
    pub body: &'a [u8],
    /// The time this host has left for a job; a longer job is handed off (or rejected).
    pub time_left: Option<Duration>,
    /// How long to wait for a busy workspace before the message goes back on the queue.
    pub lease_wait: Duration,
    /// Cancels the job (its runner ends it `cancelled`, or `interrupted` on shutdown).
    pub cancel: CancellationToken,
    /// The queue's handle on the message, for a task the job is handed to that settles the
    /// message itself ([`JobRef::receipt`]); `None` where the message is settled once the task
    /// is started.
    pub receipt: Option<&'a str>,
}

/// The message as an envelope. The error quotes no value of the message (a job encoded twice
/// would be quoted whole, with its secrets).
fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<Envelope<T>, String> {
    crate::host::trigger::json_or_base64(body).map_err(|e| {
        format!(
            "the message is not a job envelope: {}",
            crate::job::redact::unquoted(&e.to_string())
        )
    })
}

/// The target a message's job runs against: the registry's for its tenant, else the message's.
///
/// # Errors
/// Every problem, as a rejection lists them.
fn target_of<T: Trigger + ?Sized>(
    trigger: &T,
    envelope: &Envelope<T::Target>,
) -> Result<Option<T::Target>, Vec<ValidationError>> {
    match (
        trigger.tenants(),
        envelope.job.get("tenant").and_then(Value::as_str),
    ) {
        (Some(tenants), Some(tenant)) => tenants
            .resolve(tenant, envelope.target.as_ref(), trigger.registry_only())
            .map(Some),
        // The job's validation says what is wrong with its tenant.
        (Some(_), None) => Ok(None),
        // This host is the customer's side itself (a local queue, a self-hosted worker): no
        // message chooses another.
        (None, _) if let Some(own) = trigger.own_target() => Ok(Some(own)),
        (None, _) => match &envelope.target {
            Some(target) => Ok(Some(target.clone())),
            None => Err(vec![problem(
                "target",
                "is missing",
                trigger.envelope_fix(),
            )]),
        },
    }
}

/// Checks the sender's signature of `object` (a job, or a cancel's `cancel`) when `tenant`
/// takes only signed ones (`docs/signing.md`). `Ok(Some(refusal))`: a good signature older than
/// the window, which a job may still run on only if this store knows it already (its records:
/// a redelivery, not a replay of a job whose records are gone).
///
/// # Errors
/// The rejection's entry, at `field`, saying whether the signature is missing, malformed,
/// wrong, replayed or ahead of this runner's clock.
fn authenticate<T: Trigger + ?Sized>(
    trigger: &T,
    kind: Kind,
    object: &Map<String, Value>,
    tenant: Option<&str>,
    field: &str,
) -> Result<Option<ValidationError>, ValidationError> {
    let Some(tenant) = tenant else {
        return Ok(None);
    };
    let keys = trigger.senders(tenant);
    if keys.is_empty() {
        return Ok(None);
    }
    let refused = |refusal: signature::Refusal| {
        tracing::warn!(
            tenant,
            signature = refusal.word(),
            "message refused: its signature"
        );
        refusal.to_error(field, kind, tenant, keys.len())
    };
    let now = time::OffsetDateTime::now_utc();
    let window = trigger.runtime().signature_window;
    let (signer, too_old) =
        signature::verify_signer(kind, object, keys, now, window).map_err(refused)?;
    // The runner's own key signs its drift checks, and nothing else.
    let own = trigger.runtime().signing_key.as_ref();
    let drift =
        kind == Kind::Job && object.get("operation").and_then(Value::as_str) == Some("drift-check");
    if own.is_some_and(|own| own.public() == keys[signer]) && !drift {
        tracing::warn!(tenant, "message refused: signed with the runner's own key");
        return Err(problem(
            field,
            "is made with this runner's own key (TERRACE_SIGNING_KEY), which signs only its drift checks",
            "sign with the platform's key",
        ));
    }
    match too_old {
        None => Ok(None),
        Some(refusal) if kind == Kind::Job => {
            Ok(Some(refusal.to_error(field, kind, tenant, keys.len())))
        }
        Some(refusal) => Err(refused(refusal)),
    }
}

/// Checks a message: its sender first (a tenant that takes only signed jobs reads nothing
/// more of one that is not), then its envelope, target and job, and whether it fits in the
/// time left. Every problem at once.
///
/// # Errors
/// The problems, or [`Fate::Again`] when the job's template could not be fetched from its
/// bucket for a reason that may pass.
async fn check<T: Trigger + ?Sized>(
    trigger: &T,
    d: &Delivery<'_>,
) -> Result<Checked<T::Target>, Result<Vec<ValidationError>, Fate>> {
    let envelope = trigger
        .decode(d.body)
        .map_err(|e| Ok(vec![problem("", e, trigger.envelope_fix())]))?;
    let tenant = envelope.job.get("tenant").and_then(Value::as_str);
    let too_old = authenticate(trigger, Kind::Job, &envelope.job, tenant, signature::FIELD)
        .map_err(|e| Ok(vec![e]))?;
    let (target, mut problems) = match target_of(trigger, &envelope) {
        Ok(target) => (target, Vec::new()),
        Err(problems) => (None, problems),
    };
    if let Some(target) = &target {
        problems.extend(trigger.check_target(target));
    }
    let job = match check_job(
        &envelope.job,
        &trigger.runtime().templates,
        trigger.runtime().cloud,
    )
    .await
    {
        Ok(Ok(job)) => Some(job),
        Ok(Err(more)) => {
            problems.extend(more);
            None
        }
        // Nothing to retry for when the message can never be a job anyway.
        Err(e) if problems.is_empty() => {
            tracing::warn!(error = %e, "the job's template cannot be fetched");
            return Err(Err(Fate::again(e.to_string())));
        }
        Err(e) => {
            problems.push(problem("template", &e, &e.fix()));
            None
        }
    };
    if let (Some(job), Some(left), Some(fix)) = (&job, d.time_left, trigger.cannot_hand_off())
        && job.job.timeout > left
    {
        problems.push(problem(
            "timeout",
            format!(
                "{} s is longer than this runner can run a job ({} s), and no task is configured to run longer ones",
                job.job.timeout.as_secs(),
                left.as_secs()
            ),
            &fix,
        ));
    }
    match (target, job) {
        (Some(target), Some(job)) if problems.is_empty() => Ok(Checked {
            target,
            job,
            too_old,
        }),
        _ => Err(Ok(problems)),
    }
}

/// A message that may run: its target and job, and, when its signature is older than the
/// window, the refusal it gets unless the store knows the job already.
struct Checked<T> {
    target: T,
    job: ValidatedJob,
    too_old: Option<ValidationError>,
}

/// Sees one message through: check, hand off or run, report; then sends its spans, when they
/// are exported, before the platform may freeze or stop the process.
pub async fn handle<T: Trigger + ?Sized>(trigger: &T, d: Delivery<'_>) -> Fate {
    let fate = handle_one(trigger, d).await;
    crate::host::process::flush_telemetry().await;
    fate
}

async fn handle_one<T: Trigger + ?Sized>(trigger: &T, d: Delivery<'_>) -> Fate {
    if let Some(fate) = cancel::handle_cancel(trigger, &d).await {
        return fate;
    }
    let Checked {
        target,
        job,
        too_old,
    } = match check(trigger, &d).await {
        Ok(checked) => checked,
        Err(Ok(problems)) => return reject(trigger, rejection(d.message_id, problems)).await,
        Err(Err(again)) => return again,
    };
    let ws = match WorkspaceId::new(&job.job.tenant, &job.job.workspace) {
        Ok(ws) => ws,
        Err(e) => {
            let record = rejection(d.message_id, vec![problem("workspace", e, "")]);
            return reject(trigger, record).await;
        }
    };
    // An old signature: a redelivery of a job this store knows goes on (to its result, or its
    // run); one it does not know is a replay.
    if let Some(refusal) = too_old {
        let store = match trigger.store(&target, &job.job.id, None).await {
            Ok(store) => store,
            Err(e) => return cannot(trigger, d.message_id, e).await,
        };
        match store.artifacts(&ws, &job.job.id).await {
            Ok(known) if !known.is_empty() => {}
            Ok(_) => return reject(trigger, rejection(d.message_id, vec![refusal])).await,
            Err(e) => return Fate::again(e.to_string()),
        }
    }
    if d.time_left.is_some_and(|left| job.job.timeout > left) {
        return hand_off(trigger, &target, &job, &ws, &d).await;
    }
    run(trigger, &target, &job, &ws, &d).await
}

/// What a trigger's failure means for the message: delivered again, or rejected for good.
async fn cannot<T: Trigger + ?Sized>(trigger: &T, message_id: &str, e: TriggerError) -> Fate {
    match e {
        TriggerError::Again(why) => Fate::again(why),
        TriggerError::Never {
            field,
            problem: why,
            fix,
        } => {
            let record = rejection(message_id, vec![problem(field, why, &fix)]);
            reject(trigger, record).await
        }
    }
}

async fn reject<T: Trigger + ?Sized>(trigger: &T, rejection: Rejection) -> Fate {
    let message = Message::Rejection(rejection);
    let record = message.to_value();
    tracing::warn!(record = %record, "job message rejected");
    trigger.report(&message).await;
    Fate::Rejected(record)
}

/// Reports a job's final result: the job has run (now or before).
async fn ran<T: Trigger + ?Sized>(trigger: &T, result: JobResult) -> Fate {
    let message = Message::from(result);
    trigger.report(&message).await;
    Fate::Ran(message.to_value())
}

/// Stages the message in the customer's store and starts a task for it.
async fn hand_off<T: Trigger + ?Sized>(
    trigger: &T,
    target: &T::Target,
    job: &ValidatedJob,
    ws: &WorkspaceId,
    d: &Delivery<'_>,
) -> Fate {
    let id = &job.job.id;
    let store = match trigger.store(target, id, None).await {
        Ok(store) => store,
        Err(e) => return cannot(trigger, d.message_id, e).await,
    };
    // A finished job delivered again gets its result, not a task.
    if let Some(result) = final_result(&*store, ws, id, Some(job.job.operation)).await {
        return ran(trigger, result).await;
    }
    // The task reads what only the registry gives from its own registry: none of it travels
    // through the platform's API with the reference.
    let shown = crate::host::tenants::without(target, trigger.registry_only());
    let mut reference = match JobRef::stage(shown, ws, id, d.body, &*store).await {
        Ok(reference) => reference,
        Err(why) => return Fate::again(why),
    };
    reference.receipt = d.receipt.map(str::to_owned);
    match trigger.start_task(&reference, job.job.timeout).await {
        Ok(task) => {
            let message = Message::HandedOff(HandedOff::new(&job.job, task));
            let record = message.to_value();
            tracing::info!(job_id = %id, record = %record, "job handed off to a task");
            trigger.report(&message).await;
            Fate::HandedOff(record)
        }
        // No task will read it: the next delivery stages it afresh under a name of its own.
        Err(e) => {
            reference.unstage(&*store).await;
            cannot(
                trigger,
                d.message_id,
                e.context("could not hand the job off"),
            )
            .await
        }
    }
}

/// Runs a checked job against the customer's store.
async fn run<T: Trigger + ?Sized>(
    trigger: &T,
    target: &T::Target,
    job: &ValidatedJob,
    ws: &WorkspaceId,
    d: &Delivery<'_>,
) -> Fate {
    let id = &job.job.id;
    // The store and terraform's access are made side by side (each may be a role to assume).
    let mut config = trigger.runtime().runner_config();
    config.lease_wait = d.lease_wait;
    // The tenant's own key, else the runner's.
    if let Some(recipient) = trigger
        .tenants()
        .and_then(|t| t.outputs_recipient(&job.job.tenant))
    {
        config.outputs_recipient = Some(recipient.clone());
    }
    // The tenant's own policy set, with the runner's beside it.
    if let Some(policies) = trigger.runtime().policy.tenants.get(&job.job.tenant) {
        config.policies = Some(policies.clone());
    }
    config.shutdown = trigger.shutdown().cloned();
    // Terraform's user for this job: one of the job's own, or this runner's turn for the user
    // jobs share. Given back (and whatever still runs as it killed) when the last copy of the
    // configuration holding it goes: after the job's task.
    let guarded = matches!(config.terraform.shared_user, SharedUser::OneAtATime { .. });
    if config.terraform.per_job_users || guarded {
        let asked = std::time::Instant::now();
        if let Err(why) = config.terraform.take_user().await {
            return Fate::again(why);
        }
        // Waiting for the jobs before (of one batch, say) took time this delivery had: a job
        // that no longer fits in what is left goes to a task, as it would have at once.
        let left = d.time_left.map(|left| left.saturating_sub(asked.elapsed()));
        if !config.terraform.per_job_users && left.is_some_and(|left| job.job.timeout > left) {
            config.terraform.job_user = None;
            return hand_off(trigger, target, job, ws, d).await;
        }
    }
    let (store, keep) = tokio::join!(
        trigger.store(target, id, Some(ws)),
        trigger.terraform_access(target, job, &mut config.terraform),
    );
    let (store, keep) = match (store, keep) {
        (Ok(store), Ok(keep)) => (store, keep),
        // A reason the job can never run comes first: trying again would not help.
        (Err(e @ TriggerError::Never { .. }), _)
        | (_, Err(e @ TriggerError::Never { .. }))
        | (Err(e), _)
        | (_, Err(e)) => return cannot(trigger, d.message_id, e).await,
    };
    let runner = Runner::new(store, config);
    let outcome = runner.run(job, d.cancel.clone()).await;
    drop(keep);
    match outcome {
        Ok(RunOutcome::Finished(result) | RunOutcome::AlreadyDone(result)) => {
            if result.status == Status::Interrupted {
                Fate::Interrupted(Message::from(*result).to_value())
            } else {
                ran(trigger, *result).await
            }
        }
        Ok(RunOutcome::Busy { holder }) => {
            let wait = (holder.expires_at - time::OffsetDateTime::now_utc())
                .whole_seconds()
                .clamp(5, 900);
            let delay = Duration::from_secs(wait.unsigned_abs());
            let why = format!(
                "workspace busy: job {} holds it until {}",
                holder.owner,
                state_backends::display_time(holder.expires_at)
            );
            match trigger.requeue(d.body, delay).await {
                Ok(()) => {
                    tracing::info!(job_id = %id, why, delay_s = delay.as_secs(), "job queued again for later");
                    Fate::Requeued { why, delay }
                }
                Err(e) => {
                    tracing::warn!(job_id = %id, error = %e, "could not queue the job again; it is delivered again instead");
                    Fate::Again {
                        why,
                        delay: Some(delay),
                    }
                }
            }
        }
        // Nothing will change by trying again (a record in the store Terrace cannot read): the
        // job ends here, with a record that says why, rather than being delivered until it is
        // dead-lettered without a word.
        Err(e) if e.is_permanent() => {
            let error = JobError::new(
                Category::Internal,
                "prepare",
                e.to_string(),
                "fix or move aside the record named in the message, then send the job again",
                false,
            );
            let result = JobResult::never_started(&job.job, Status::Failed, error);
            tracing::error!(job_id = %id, error = %e, "the job cannot run");
            ran(trigger, result).await
        }
        Err(e) => Fate::again(e.to_string()),
    }
}

/// The final result of `job_id` (of `operation`, when known), if it has one.
async fn final_result(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
    operation: Option<crate::job::Operation>,
) -> Option<JobResult> {
    crate::run::runner::previous_result(store, ws, job_id, operation)
        .await
        .ok()?
}

mod cancel;
mod task;
pub use task::{MAX_TASK_REQUEUES, task, task_exit};

#[cfg(test)]
mod tests;
