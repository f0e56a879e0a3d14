//! The backup and drift sweeps as every function runs them, over the registered targets it is
//! given: each target's store opened through the [`Trigger`], the drift checks sent to its
//! jobs queue ([`Trigger::enqueue`]), one [`SweepReport`] for all.

use std::collections::BTreeSet;

use time::OffsetDateTime;

use crate::host::pipeline::Trigger;
use crate::job::signature::Kind;
use crate::sweeps::report::{BucketReport, SweepKind, SweepReport};
use crate::sweeps::{backup, drift};

/// Each registered target a sweep covers, once, with the tenants registered to it
/// ([`crate::host::tenants::Tenants::grouped`]).
pub type Targets<T> = [(T, BTreeSet<String>)];

/// Runs the `kind` sweep over `targets` as of `now`, one bucket after the other; a bucket that
/// cannot be swept is reported and the others go on.
pub async fn sweep<T: Trigger + ?Sized>(
    trigger: &T,
    kind: SweepKind,
    targets: &Targets<T::Target>,
    now: OffsetDateTime,
) -> SweepReport {
    let mut buckets = Vec::with_capacity(targets.len());
    for (target, tenants) in targets {
        let bucket = trigger.bucket_of(target);
        let session = format!("{}-sweep", kind.as_str());
        let report = match trigger.store(target, &session, None).await {
            Err(why) => BucketReport::error(&bucket, why.to_string()),
            Ok(store) => match kind {
                SweepKind::Backup => backup::bucket_report(&bucket, &*store, now).await,
                SweepKind::Drift => {
                    let per_tenant = trigger.runtime().drift_per_tenant;
                    match drift::plan(&*store, now, per_tenant).await {
                        Err(e) => BucketReport::error(&bucket, e.to_string()),
                        Ok(mut plan) => {
                            plan.only_tenants(tenants);
                            queue(trigger, &bucket, &plan).await
                        }
                    }
                }
            },
        };
        let line = serde_json::to_string(&report).unwrap_or_default();
        tracing::info!(report = %line, "{} sweep", kind.as_str());
        buckets.push(report);
    }
    SweepReport {
        sweep: kind,
        buckets,
    }
}

/// Sends the plan's drift checks to the jobs queue: the bucket's report. A check for a tenant
/// that takes only signed jobs is signed with the runner's own key (`TERRACE_SIGNING_KEY`), or
/// not sent, saying why.
pub(crate) async fn queue<T: Trigger + ?Sized>(
    trigger: &T,
    bucket: &str,
    plan: &drift::DriftPlan,
) -> BucketReport {
    let now = OffsetDateTime::now_utc();
    let mut bodies = Vec::with_capacity(plan.jobs.len());
    let mut sent_at = Vec::with_capacity(plan.jobs.len());
    let mut unqueued = Vec::new();
    for (i, (ws, job)) in plan.jobs.iter().enumerate() {
        let mut job = job.0.clone();
        let senders = trigger.senders(ws.tenant());
        if !senders.is_empty() {
            let listed = trigger
                .runtime()
                .signing_key
                .as_ref()
                .filter(|key| senders.contains(&key.public()));
            let Some(key) = listed else {
                let why = match &trigger.runtime().signing_key {
                    None => {
                        "this runner has no key to sign its drift checks: set TERRACE_SIGNING_KEY"
                    }
                    Some(_) => "the runner's key (TERRACE_SIGNING_KEY) is not among them",
                };
                unqueued.push((
                    ws.to_string(),
                    format!(
                        "tenant {:?} takes only signed jobs and {why}, and list its public key in the tenant's senders",
                        ws.tenant()
                    ),
                ));
                continue;
            };
            if let Err(why) = key.sign(Kind::Job, &mut job, now) {
                unqueued.push((ws.to_string(), format!("cannot be signed: {why}")));
                continue;
            }
        }
        // The job's tenant names its target: the registry's, this one.
        bodies.push(serde_json::json!({ "job": job }).to_string());
        sent_at.push(i);
    }
    let sent = trigger.enqueue(&bodies).await;
    let mut queued = 0;
    for (i, sent) in sent_at.into_iter().zip(sent) {
        match sent {
            None => queued += 1,
            Some(why) => unqueued.push((plan.jobs[i].0.to_string(), why)),
        }
    }
    plan.report(bucket, queued, unqueued)
}
