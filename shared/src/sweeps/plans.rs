//! Expired plans, deleted by the hourly sweep: a plan kept for approval
//! ([`crate::run::plans`]) is deleted once its time is up, applied or not (its record stays,
//! so an apply that names it is still told why it cannot run).
//!
//! Each workspace lists its kept plans in one small index, `runs/_workspace/plans.json`. The
//! sweep reads that index in every workspace, and only where a plan has expired does it take
//! the workspace's lease, delete the plan files and write the index again under the lease (so
//! it never loses the entry of a plan a job keeps meanwhile). A workspace whose lease a job
//! holds is left for the next sweep.
//!
//! Calls per sweep: the workspaces listed (one list per thousand on a bucket), one read per
//! workspace, and for each workspace with expired plans the lease (taken and released), one
//! delete per expired plan and the index written (a fenced write).

use std::time::Duration;

use state_backends::{LeaseRequest, StateStore, StoreError, WorkspaceId};
use time::OffsetDateTime;

use crate::run::plans::{self, PLAN_FILE};

/// What one sweep of expired plans did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanSweep {
    /// Workspaces whose index was read.
    pub workspaces: usize,
    /// Plans deleted: (`tenant/workspace`, plan job id).
    pub deleted: Vec<(String, String)>,
    /// Workspaces with expired plans that a job held: left for the next sweep.
    pub busy: Vec<String>,
    /// Workspaces the sweep could not handle, with why.
    pub failed: Vec<(String, String)>,
}

/// The lease's owner while the sweep holds a workspace.
const OWNER: &str = "plan-sweep";

/// Deletes every plan expired at `now`, [`super::backup::SWEEP_CONCURRENCY`] workspaces at a
/// time; one workspace's failure does not stop the others.
///
/// # Errors
/// Only when the workspaces cannot be listed.
pub async fn sweep(store: &dyn StateStore, now: OffsetDateTime) -> Result<PlanSweep, StoreError> {
    use futures::StreamExt as _;
    let workspaces = store.workspaces().await?;
    let mut report = PlanSweep {
        workspaces: workspaces.len(),
        ..PlanSweep::default()
    };
    let mut visits = futures::stream::iter(workspaces)
        .map(|ws| async move {
            let outcome = workspace(store, &ws, now).await;
            (ws, outcome)
        })
        .buffer_unordered(super::backup::SWEEP_CONCURRENCY);
    while let Some((ws, outcome)) = visits.next().await {
        match outcome {
            Ok(Visit::Deleted(ids)) => report
                .deleted
                .extend(ids.into_iter().map(|id| (ws.to_string(), id))),
            Ok(Visit::Busy) => report.busy.push(ws.to_string()),
            Err(e) => report.failed.push((ws.to_string(), e)),
        }
    }
    report.deleted.sort();
    report.busy.sort();
    report.failed.sort();
    Ok(report)
}

enum Visit {
    Deleted(Vec<String>),
    Busy,
}

async fn workspace(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    now: OffsetDateTime,
) -> Result<Visit, String> {
    let index = plans::kept(store, ws).await.map_err(|e| e.to_string())?;
    if index.expired(now).next().is_none() {
        return Ok(Visit::Deleted(Vec::new()));
    }
    let request = LeaseRequest {
        owner: OWNER.to_owned(),
        ttl: Duration::from_secs(60),
        info: serde_json::json!({ "operation": "delete expired plans" }),
    };
    let lease = match store.acquire_lease(ws, &request).await {
        Ok(lease) => lease,
        Err(StoreError::LeaseHeld { .. }) => return Ok(Visit::Busy),
        Err(e) => return Err(e.to_string()),
    };
    let done = delete_expired(store, ws, &lease, now).await;
    let released = store.release_lease(ws, &lease).await;
    let deleted = done?;
    if let Err(e) = released {
        tracing::warn!(workspace = %ws, error = %e, "could not release the plan sweep's lease; it frees itself at expiry");
    }
    Ok(Visit::Deleted(deleted))
}

/// Under the lease: the index read again (a job may have kept a plan since), each expired
/// plan file deleted, the index written without them.
async fn delete_expired(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    lease: &state_backends::Lease,
    now: OffsetDateTime,
) -> Result<Vec<String>, String> {
    let mut index = plans::kept(store, ws).await.map_err(|e| e.to_string())?;
    let expired: Vec<String> = index.expired(now).map(|k| k.job_id.clone()).collect();
    for id in &expired {
        store
            .delete_artifact(ws, id, PLAN_FILE)
            .await
            .map_err(|e| format!("plan {id} cannot be deleted: {e}"))?;
    }
    index.plans.retain(|k| k.expires_at > now);
    plans::record_kept(store, ws, &index, &lease.fence())
        .await
        .map_err(|e| format!("the index of kept plans cannot be written: {e}"))?;
    Ok(expired)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use state_backends::memory::MemoryStore;

    use super::*;
    use crate::run::plans::{Kept, KeptPlans};

    async fn keep(store: &MemoryStore, ws: &WorkspaceId, plans: &[(&str, OffsetDateTime)]) {
        let request = LeaseRequest {
            owner: "job".into(),
            ttl: Duration::from_secs(60),
            info: serde_json::Value::Null,
        };
        let lease = store.acquire_lease(ws, &request).await.unwrap();
        let mut index = KeptPlans::default();
        for (id, expires_at) in plans {
            store
                .put_artifact(ws, id, PLAN_FILE, Bytes::from_static(b"sealed plan"))
                .await
                .unwrap();
            index.plans.push(Kept {
                job_id: (*id).to_owned(),
                expires_at: *expires_at,
            });
        }
        plans::record_kept(store, ws, &index, &lease.fence())
            .await
            .unwrap();
        store.release_lease(ws, &lease).await.unwrap();
    }

    #[tokio::test]
    async fn expired_plans_are_deleted_once_and_a_held_workspace_waits() {
        let store = Arc::new(MemoryStore::default());
        let now = OffsetDateTime::now_utc();
        let hour = time::Duration::hours(1);
        let (a, b, c) = (
            WorkspaceId::new("t", "a").unwrap(),
            WorkspaceId::new("t", "b").unwrap(),
            WorkspaceId::new("t", "c").unwrap(),
        );
        keep(&store, &a, &[("old", now - hour), ("new", now + hour)]).await;
        keep(&store, &b, &[("held", now - hour)]).await;
        keep(&store, &c, &[("fresh", now + hour)]).await;
        // A job holds b.
        let request = LeaseRequest {
            owner: "a-job".into(),
            ttl: Duration::from_secs(60),
            info: serde_json::Value::Null,
        };
        let held = store.acquire_lease(&b, &request).await.unwrap();

        let report = sweep(store.as_ref(), now).await.unwrap();
        assert_eq!(report.deleted, [("t/a".to_owned(), "old".to_owned())]);
        assert_eq!(report.busy, ["t/b"]);
        assert!(report.failed.is_empty(), "{report:?}");
        assert!(
            store
                .artifact(&a, "old", PLAN_FILE)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store
                .artifact(&a, "new", PLAN_FILE)
                .await
                .unwrap()
                .is_some()
        );
        assert!(
            store
                .artifact(&c, "fresh", PLAN_FILE)
                .await
                .unwrap()
                .is_some()
        );
        let index = plans::kept(store.as_ref(), &a).await.unwrap();
        assert_eq!(index.plans.len(), 1, "the deleted plan left the index");
        assert!(
            store.lease(&a).await.unwrap().is_none(),
            "the sweep let a go"
        );

        // Deleted once: the next sweep has nothing to do in a; b's turn comes when it is free.
        store.release_lease(&b, &held).await.unwrap();
        let next = sweep(store.as_ref(), now).await.unwrap();
        assert_eq!(next.deleted, [("t/b".to_owned(), "held".to_owned())]);
        assert!(next.busy.is_empty());
        assert!(
            store
                .artifact(&b, "held", PLAN_FILE)
                .await
                .unwrap()
                .is_none()
        );
    }
}
