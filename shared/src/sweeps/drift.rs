//! The scheduled drift sweep: one `drift-check` job per workspace, rebuilt from the
//! configuration of its last successful apply (see [`crate::run::rollback`] for that record).
//!
//! The sweep only builds the jobs; the function puts them on its own job queue, so each runs
//! like any other job (its own deadline, lease, busy handling and result). Their ids are
//! `drift-<UTC hour>`, so a sweep delivered twice in one hour runs each check once.
//!
//! A sweep checks at most [`PER_TENANT`] workspaces of one tenant (`TERRACE_DRIFT_PER_TENANT`),
//! so that a tenant with thousands of workspaces in its bucket cannot flood the shared queue
//! and starve the others. A larger tenant's workspaces take turns, a different slice each hour,
//! so every one is checked within `workspaces / PER_TENANT` hours; the sweep reports how many
//! waited.
//!
//! A workspace whose last apply had sensitive variables is not checked: the record masks their
//! values, and Terrace keeps no secrets of its own. The platform that holds them sends those
//! drift checks itself (an ordinary job with `operation: drift-check`); the sweep reports which
//! workspaces and variables need that.

use serde_json::{Map, Value};
use state_backends::{StateStore, StoreError, WorkspaceId};
use time::OffsetDateTime;

use crate::job::RawJob;
use crate::run::records::JobRecord;
use crate::run::records::last_apply;
use crate::sweeps::report::{BucketReport, DriftDone, NeedsSecrets, WorkspaceFailure};

/// What one sweep found.
#[derive(Debug, Default)]
pub struct DriftPlan {
    /// The drift-check jobs to run, one per workspace.
    pub jobs: Vec<(WorkspaceId, RawJob)>,
    /// Workspaces whose last apply had sensitive variables, with their names.
    pub needs_secrets: Vec<(WorkspaceId, Vec<String>)>,
    /// Workspaces with no successful apply yet, or no state now (destroyed, deleted): nothing
    /// to compare against.
    pub never_applied: usize,
    /// Workspaces whose records could not be read, with why.
    pub failed: Vec<(WorkspaceId, String)>,
    /// Workspaces of tenants not registered with this bucket: not checked (a check of theirs
    /// would run against their own tenant's target, not this bucket).
    pub unregistered: Vec<WorkspaceId>,
    /// Per tenant, how many workspaces wait for a later sweep (over the bound).
    pub deferred: std::collections::BTreeMap<String, usize>,
}

/// The most workspaces of one tenant a sweep checks, unless `TERRACE_DRIFT_PER_TENANT` says.
pub const PER_TENANT: usize = 100;

impl DriftPlan {
    /// Keeps the checks of workspaces of `tenants` (those registered with the swept bucket);
    /// the others are listed in [`DriftPlan::unregistered`].
    pub fn only_tenants(&mut self, tenants: &std::collections::BTreeSet<String>) {
        let (keep, other): (Vec<_>, Vec<_>) = std::mem::take(&mut self.jobs)
            .into_iter()
            .partition(|(ws, _)| tenants.contains(ws.tenant()));
        self.jobs = keep;
        self.unregistered
            .extend(other.into_iter().map(|(ws, _)| ws));
        let (keep, other): (Vec<_>, Vec<_>) = std::mem::take(&mut self.needs_secrets)
            .into_iter()
            .partition(|(ws, _)| tenants.contains(ws.tenant()));
        self.needs_secrets = keep;
        self.unregistered
            .extend(other.into_iter().map(|(ws, _)| ws));
        self.deferred.retain(|tenant, _| tenants.contains(tenant));
    }

    /// The sweep's report for one bucket: `queued` checks went out; `unqueued` could not be
    /// queued, with why.
    pub fn report(
        &self,
        bucket: &str,
        queued: usize,
        unqueued: Vec<(String, String)>,
    ) -> BucketReport {
        let failed = self
            .failed
            .iter()
            .map(|(ws, why)| (ws.to_string(), why.clone()))
            .chain(unqueued)
            .map(|(workspace, error)| WorkspaceFailure { workspace, error })
            .collect();
        let needs_secrets = self
            .needs_secrets
            .iter()
            .map(|(ws, names)| NeedsSecrets {
                workspace: ws.to_string(),
                sensitive_variables: names.clone(),
            })
            .collect();
        BucketReport {
            bucket: bucket.to_owned(),
            drift: Some(DriftDone {
                queued,
                needs_secrets,
                never_applied: self.never_applied,
                unregistered: self.unregistered.iter().map(ToString::to_string).collect(),
                deferred: self.deferred.clone(),
            }),
            failed,
            ..BucketReport::default()
        }
    }
}

/// The id of the drift checks of the sweep at `now`.
pub fn job_id(now: OffsetDateTime) -> String {
    format!("drift-{}", crate::sweeps::backup::hour_label(now))
}

/// Builds the sweep's drift-check jobs over the workspaces of `store`, at most `per_tenant` of
/// each tenant: a larger tenant's take turns by the hour (`now`), the rest counted in
/// [`DriftPlan::deferred`]. Only the workspaces chosen are read.
///
/// # Errors
/// When the workspaces cannot be listed; a workspace whose records cannot be read is reported
/// in [`DriftPlan::failed`] and the others go on.
pub async fn plan(
    store: &dyn StateStore,
    now: OffsetDateTime,
    per_tenant: usize,
) -> Result<DriftPlan, StoreError> {
    let id = job_id(now);
    let mut out = DriftPlan::default();
    let mut by_tenant: std::collections::BTreeMap<String, Vec<WorkspaceId>> = Default::default();
    for ws in store.workspaces().await? {
        by_tenant
            .entry(ws.tenant().to_owned())
            .or_default()
            .push(ws);
    }
    let hour = u64::try_from(now.unix_timestamp() / 3600).unwrap_or(0);
    let mut chosen = Vec::new();
    for (tenant, mut all) in by_tenant {
        let (turn, waiting) = take_turns(&mut all, per_tenant, hour);
        if waiting > 0 {
            out.deferred.insert(tenant, waiting);
        }
        chosen.extend(turn);
    }
    for ws in chosen {
        match last_apply(store, &ws).await {
            Ok(None) => out.never_applied += 1,
            Ok(Some((_, record))) => match store.current_version(&ws).await {
                // Destroyed or deleted since: a check would only plan to recreate it all.
                Ok(None) => out.never_applied += 1,
                Ok(Some(_)) => match drift_job(&record, &ws, &id) {
                    Ok(job) => out.jobs.push((ws, job)),
                    Err(masked) => out.needs_secrets.push((ws, masked)),
                },
                Err(e) => out.failed.push((ws, e.to_string())),
            },
            Err(why) => out.failed.push((ws, why)),
        }
    }
    Ok(out)
}

/// `turn`-th slice of at most `bound` of `all` (sorted here), wrapping around, and how many
/// wait: consecutive turns cover every workspace in `all.len() / bound` turns, rounded up.
fn take_turns(all: &mut Vec<WorkspaceId>, bound: usize, turn: u64) -> (Vec<WorkspaceId>, usize) {
    if all.len() <= bound {
        return (std::mem::take(all), 0);
    }
    all.sort_by(|a, b| a.workspace().cmp(b.workspace()));
    let n = all.len();
    let start = usize::try_from((turn % n as u64) * bound as u64 % n as u64).unwrap_or(0);
    let picked = (0..bound).map(|i| all[(start + i) % n].clone()).collect();
    (picked, n - bound)
}

/// The drift check of a recorded apply, or the names of its masked (sensitive) variables.
fn drift_job(record: &JobRecord, ws: &WorkspaceId, id: &str) -> Result<RawJob, Vec<String>> {
    let masked = record.masked_variables();
    if !masked.is_empty() {
        return Err(masked.into_iter().collect());
    }
    let variables: Map<String, Value> = record
        .variables
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut doc = Map::new();
    doc.insert("id".into(), Value::from(id));
    doc.insert("tenant".into(), Value::from(ws.tenant()));
    doc.insert("workspace".into(), Value::from(ws.workspace()));
    doc.insert("operation".into(), Value::from("drift-check"));
    doc.insert(
        "template".into(),
        serde_json::to_value(&record.template).unwrap_or(Value::Null),
    );
    doc.insert("variables".into(), Value::Object(variables));
    if let Some(timeout) = record.timeout {
        doc.insert("timeout".into(), Value::from(timeout));
    }
    Ok(RawJob(doc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::redact::MASK;
    use bytes::Bytes;
    use state_backends::memory::MemoryStore;

    async fn applied(store: &MemoryStore, ws: &WorkspaceId, job: &str, variables: Value) {
        let record = serde_json::json!({
            "id": job, "tenant": ws.tenant(), "workspace": ws.workspace(), "operation": "apply",
            "template": { "name": "fleet", "version": "1.0.0" },
            "variables": variables, "timeout": 600,
        });
        store
            .put_artifact(
                ws,
                job,
                crate::run::records::JOB_FILE,
                Bytes::from(record.to_string()),
            )
            .await
            .unwrap();
        crate::run::records::record_last_apply(store, ws, job)
            .await
            .unwrap();
        if store.current(ws).await.unwrap().is_none() {
            let state =
                state_backends::NewState::parse(state_backends::tfstate::empty_state("drift", 1))
                    .unwrap();
            store
                .put(ws, state, state_backends::PutMode::Create, None)
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_sweep_checks_only_the_tenants_registered_with_the_bucket() {
        let store = MemoryStore::new();
        let ours = WorkspaceId::new("acme", "net").unwrap();
        let theirs = WorkspaceId::new("beta", "net").unwrap();
        for ws in [&ours, &theirs] {
            applied(&store, ws, "j1", serde_json::json!({ "networks": ["a"] })).await;
        }
        let mut plan = plan(&store, OffsetDateTime::now_utc(), PER_TENANT)
            .await
            .unwrap();
        assert_eq!(plan.jobs.len(), 2);
        plan.only_tenants(&["acme".to_owned()].into());
        let checked: Vec<&WorkspaceId> = plan.jobs.iter().map(|(ws, _)| ws).collect();
        assert_eq!(checked, [&ours]);
        assert_eq!(plan.unregistered, [theirs]);
        let report = plan.report("b", 1, Vec::new());
        assert_eq!(report.drift.unwrap().unregistered, ["beta/net"]);
    }

    #[tokio::test]
    async fn one_check_per_applied_workspace_and_none_that_needs_a_secret() {
        let store = MemoryStore::new();
        let plain = WorkspaceId::new("acme", "plain").unwrap();
        let secret = WorkspaceId::new("acme", "secret").unwrap();
        let fresh = WorkspaceId::new("acme", "fresh").unwrap();
        applied(
            &store,
            &plain,
            "j1",
            serde_json::json!({ "networks": ["a"] }),
        )
        .await;
        applied(
            &store,
            &plain,
            "j2",
            serde_json::json!({ "networks": ["a", "b"] }),
        )
        .await;
        applied(
            &store,
            &secret,
            "j3",
            serde_json::json!({ "networks": ["a"], "token": MASK }),
        )
        .await;
        store
            .put_artifact(&fresh, "j4", "log.txt", Bytes::from_static(b"failed"))
            .await
            .unwrap();
        // Applied, then destroyed: its state is gone.
        let gone = WorkspaceId::new("acme", "gone").unwrap();
        applied(
            &store,
            &gone,
            "j5",
            serde_json::json!({ "networks": ["a"] }),
        )
        .await;
        let token = store.current(&gone).await.unwrap().unwrap().token;
        store.delete_current(&gone, &token, None).await.unwrap();

        let now = OffsetDateTime::from_unix_timestamp(1_795_000_000).unwrap();
        let plan = plan(&store, now, PER_TENANT).await.unwrap();
        assert_eq!(plan.jobs.len(), 1);
        let (ws, job) = &plan.jobs[0];
        assert_eq!(ws, &plain);
        assert_eq!(job.0["id"], job_id(now));
        assert_eq!(job.0["operation"], "drift-check");
        assert_eq!(job.0["workspace"], "plain");
        assert_eq!(
            job.0["variables"],
            serde_json::json!({ "networks": ["a", "b"] }),
            "the last apply's configuration"
        );
        assert_eq!(job.0["timeout"], 600);
        assert_eq!(plan.needs_secrets, vec![(secret, vec!["token".to_owned()])]);
        assert_eq!(plan.never_applied, 2, "never applied, and destroyed");
        assert!(plan.failed.is_empty());
        assert!(job_id(now).starts_with("drift-20"));
    }

    /// One tenant's 1,000 workspaces beside another's 3: a sweep checks at most the bound of
    /// the large one, and all of the small one; turns over the hours cover every workspace.
    #[tokio::test]
    async fn a_tenant_with_many_workspaces_cannot_crowd_out_another() {
        let store = MemoryStore::new();
        for i in 0..1000 {
            let ws = WorkspaceId::new("big", &format!("w{i:04}")).unwrap();
            applied(&store, &ws, "j1", serde_json::json!({ "networks": ["a"] })).await;
        }
        for i in 0..3 {
            let ws = WorkspaceId::new("small", &format!("w{i}")).unwrap();
            applied(&store, &ws, "j1", serde_json::json!({ "networks": ["a"] })).await;
        }
        let hour = OffsetDateTime::from_unix_timestamp(1_795_000_000).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for turn in 0..10 {
            let now = hour + time::Duration::hours(turn);
            let plan = plan(&store, now, PER_TENANT).await.unwrap();
            let count = |tenant: &str| {
                plan.jobs
                    .iter()
                    .filter(|(ws, _)| ws.tenant() == tenant)
                    .count()
            };
            assert_eq!(count("big"), PER_TENANT);
            assert_eq!(count("small"), 3, "the small tenant is checked every sweep");
            assert_eq!(plan.deferred.get("big"), Some(&900));
            assert!(!plan.deferred.contains_key("small"));
            let report = plan.report("b", plan.jobs.len(), Vec::new());
            assert_eq!(report.drift.unwrap().deferred.get("big"), Some(&900));
            seen.extend(
                plan.jobs
                    .iter()
                    .filter(|(ws, _)| ws.tenant() == "big")
                    .map(|(ws, _)| ws.workspace().to_owned()),
            );
        }
        assert_eq!(seen.len(), 1000, "ten sweeps checked every workspace once");
    }
}
