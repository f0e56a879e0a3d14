//! The backup and drift sweeps as every function runs them, over the registered targets it is
//! given: each target's store opened through the [`Trigger`], the drift checks sent to its
//! jobs queue ([`Trigger::enqueue`]), one [`SweepReport`] for all.

use std::collections::BTreeSet;

use time::OffsetDateTime;

use crate::host::pipeline::Trigger;
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

/// Sends the plan's drift checks to the jobs queue: the bucket's report.
async fn queue<T: Trigger + ?Sized>(
    trigger: &T,
    bucket: &str,
    plan: &drift::DriftPlan,
) -> BucketReport {
    // The job's tenant names its target: the registry's, this one.
    let bodies: Vec<String> = plan
        .jobs
        .iter()
        .map(|(_, job)| serde_json::json!({ "job": job.0 }).to_string())
        .collect();
    let sent = trigger.enqueue(&bodies).await;
    let mut queued = 0;
    let mut unqueued = Vec::new();
    for ((ws, _), sent) in plan.jobs.iter().zip(sent) {
        match sent {
            None => queued += 1,
            Some(why) => unqueued.push((ws.to_string(), why)),
        }
    }
    plan.report(bucket, queued, unqueued)
}
