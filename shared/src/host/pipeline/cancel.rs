//! A cancel on the queue: `{"cancel": {"job", "tenant", "workspace"}}`. The tenant is checked
//! against the registry as a job's is, and the request is written where the job's runner looks
//! for it (`runs/<job>/cancel.json`): a queued job then never runs, a running one stops within
//! a few seconds. A job that already finished is left as it is; the answer says so.

use serde_json::Value;
use state_backends::WorkspaceId;

use crate::host::message::{
    CancelAnswer, CancelEnvelope, CancelOf, CancelStatus, MESSAGE_SCHEMA, Message,
};
use crate::host::trigger::{json_or_base64, problem, rejection};
use crate::run::records;
use crate::run::runner::previous_result;

use super::{Delivery, Fate, Trigger, authenticate, cannot, reject};
use crate::job::signature::Kind;

const FIX: &str = "send {\"cancel\": {\"job\": JOB_ID, \"tenant\": TENANT, \"workspace\": WORKSPACE}} (with its \"signature\" where the tenant takes only signed cancels)";

/// `Some` with the message's fate when it is a cancel (a JSON object with a `cancel` key).
pub(super) async fn handle_cancel<T: Trigger + ?Sized>(
    trigger: &T,
    d: &Delivery<'_>,
) -> Option<Fate> {
    let body: Value = json_or_base64(d.body).ok()?;
    body.get("cancel")?;
    Some(cancel(trigger, d, body).await)
}

async fn cancel<T: Trigger + ?Sized>(trigger: &T, d: &Delivery<'_>, body: Value) -> Fate {
    let refuse = |field: &str, why: String, fix: &str| {
        rejection(d.message_id, vec![problem(field, why, fix)])
    };
    // The sender first: a tenant that takes only signed cancels reads nothing more of one
    // that is not.
    let ask = body.get("cancel").and_then(Value::as_object);
    let tenant = ask.and_then(|a| a.get("tenant")).and_then(Value::as_str);
    if let Some(ask) = ask
        && let Err(e) = authenticate(trigger, Kind::Cancel, ask, tenant, "cancel.signature")
    {
        // (An old cancel is refused outright: it changes nothing a new one could not.)
        return reject(trigger, rejection(d.message_id, vec![e])).await;
    }
    let envelope: CancelEnvelope<T::Target> = match serde_json::from_value(body) {
        Ok(envelope) => envelope,
        Err(e) => {
            let why = format!(
                "the message is not a cancel: {}",
                crate::job::redact::unquoted(&e.to_string())
            );
            return reject(trigger, refuse("cancel", why, FIX)).await;
        }
    };
    let ask = envelope.cancel;
    // Honoured only for the tenant's own jobs, on the tenant's own store.
    let target = match (trigger.tenants(), envelope.target) {
        (Some(tenants), message) => {
            match tenants.resolve(&ask.tenant, message.as_ref(), trigger.registry_only()) {
                Ok(target) => target,
                Err(problems) => return reject(trigger, rejection(d.message_id, problems)).await,
            }
        }
        (None, Some(target)) => target,
        (None, None) if let Some(target) = trigger.own_target() => target,
        (None, None) => {
            let record = refuse("target", "is missing".into(), trigger.envelope_fix());
            return reject(trigger, record).await;
        }
    };
    let ws = match WorkspaceId::new(&ask.tenant, &ask.workspace) {
        Ok(ws) => ws,
        Err(e) => return reject(trigger, refuse("cancel.workspace", e.to_string(), FIX)).await,
    };
    if let Err(e) = crate::job::validate::check_id(&ask.job) {
        return reject(trigger, refuse("cancel.job", e.problem, &e.fix)).await;
    }
    let store = match trigger.store(&target, &ask.job, None).await {
        Ok(store) => store,
        Err(e) => return cannot(trigger, d.message_id, e).await,
    };
    let finished = match previous_result(&*store, &ws, &ask.job, None).await {
        Ok(finished) => finished,
        Err(e) if e.is_retryable() => return Fate::again(e.to_string()),
        Err(e) => return reject(trigger, refuse("cancel.job", e.to_string(), "")).await,
    };
    let (status, job_status) = match finished {
        Some(result) => (CancelStatus::AlreadyFinished, Some(result.status)),
        None => {
            let by = format!("message {}", d.message_id);
            if let Err(e) = records::request_cancel(&*store, &ws, &ask.job, &by).await {
                return Fate::again(format!("could not record the cancel: {e}"));
            }
            (CancelStatus::CancelRequested, None)
        }
    };
    let message = Message::Cancel(CancelAnswer {
        schema: MESSAGE_SCHEMA,
        status,
        cancel: CancelOf {
            job_id: ask.job,
            tenant: ask.tenant,
            workspace: ask.workspace,
        },
        message_id: d.message_id.to_owned(),
        job_status,
    });
    let record = message.to_value();
    tracing::info!(record = %record, "cancel message answered");
    trigger.report(&message).await;
    Fate::Ran(record)
}
