//! A workspace's lifecycle, as a platform tracks it: `provisioning` → `active` → `updating` →
//! `active` … `deleting` → `deleted`, with `failed` (and why) and `interrupted` (a run that
//! stopped without finishing). The runner writes each transition, under the workspace's lease
//! (fenced like state), to the record `runs/_workspace/status.json` with its history; the
//! job's result carries the transition and anything that needs an operator's attention.
//!
//! Only `apply` and `destroy` move a workspace; a plan or a drift check leaves it where it is.
//! `pending` is never written: a workspace is in the store only once a job holds it, so
//! `terrace status` reports `pending` for a workspace with runs but no record yet.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use state_backends::{Fence, StateStore, StateStoreExt, StoreError, WorkspaceId};
use time::OffsetDateTime;

use crate::job::Operation;
use crate::run::records::{STATUS_FILE, WORKSPACE_RECORDS};
use crate::run::result::{JobResult, Status};

/// The record's format.
pub const STATUS_SCHEMA: u32 = 1;
/// Transitions kept in a record's history (the oldest are dropped).
pub const HISTORY_KEPT: usize = 100;
/// Failed runs in a row after which the workspace needs attention.
pub const FAILING_REPEATEDLY: u32 = 3;

/// Where a workspace is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Pending,
    Provisioning,
    Active,
    Updating,
    Deleting,
    Deleted,
    Failed,
    Interrupted,
}

impl Phase {
    /// A run of the workspace is under way in this phase (a record left in it by a run that
    /// has ended means that run stopped without finishing).
    pub fn in_progress(self) -> bool {
        matches!(self, Self::Provisioning | Self::Updating | Self::Deleting)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Provisioning => "provisioning",
            Self::Active => "active",
            Self::Updating => "updating",
            Self::Deleting => "deleting",
            Self::Deleted => "deleted",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
        }
    }
}

/// One move of a workspace from one phase to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Transition {
    /// Absent for a workspace's first transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Phase>,
    pub to: Phase,
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(schema_with = "crate::job::schema::date_time")]
    pub at: OffsetDateTime,
    pub job_id: String,
    pub operation: Operation,
    /// Why a run failed or stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Transition {
    /// The phase it left, `new` for a workspace's first move.
    pub fn from_name(&self) -> &'static str {
        self.from.map_or("new", Phase::as_str)
    }
}

/// `status.json`: where the workspace is, since when and why, and how it got there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkspaceStatus {
    pub schema: u32,
    pub status: Phase,
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(schema_with = "crate::job::schema::date_time")]
    pub since: OffsetDateTime,
    pub job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether the workspace's infrastructure has been made (an apply succeeded) and not
    /// destroyed since: the next apply is then an update, not a provisioning.
    pub exists: bool,
    /// Runs in a row that ended `failed` (reset by one that succeeds).
    pub consecutive_failures: u32,
    /// Oldest first; the newest [`HISTORY_KEPT`].
    pub history: Vec<Transition>,
}

impl WorkspaceStatus {
    /// Reads a record.
    ///
    /// # Errors
    /// Bytes that are not a record, or a record of a newer schema.
    pub fn parse(bytes: &[u8]) -> Result<Self, crate::run::records::RecordError> {
        #[derive(Deserialize)]
        struct Head {
            schema: u32,
        }
        let malformed = |source| crate::run::records::RecordError::Malformed {
            name: STATUS_FILE,
            source,
        };
        // A newer record is refused for its schema, before its fields are looked at.
        let head: Head = serde_json::from_slice(bytes).map_err(malformed)?;
        if head.schema > STATUS_SCHEMA {
            return Err(crate::run::records::RecordError::Newer {
                name: STATUS_FILE,
                found: head.schema,
                supported: STATUS_SCHEMA,
            });
        }
        serde_json::from_slice(bytes).map_err(malformed)
    }

    /// The record after `t` (a new one when there was none).
    #[must_use]
    pub fn after(previous: Option<Self>, t: Transition) -> Self {
        let mut history = previous
            .as_ref()
            .map(|p| p.history.clone())
            .unwrap_or_default();
        let exists = match t.to {
            Phase::Active => true,
            Phase::Deleted => false,
            _ => previous.as_ref().is_some_and(|p| p.exists),
        };
        let consecutive_failures = match t.to {
            Phase::Failed => previous.as_ref().map_or(0, |p| p.consecutive_failures) + 1,
            Phase::Active | Phase::Deleted => 0,
            _ => previous.as_ref().map_or(0, |p| p.consecutive_failures),
        };
        history.push(t.clone());
        if history.len() > HISTORY_KEPT {
            history.drain(..history.len() - HISTORY_KEPT);
        }
        Self {
            schema: STATUS_SCHEMA,
            status: t.to,
            since: t.at,
            job_id: t.job_id,
            reason: t.reason,
            exists,
            consecutive_failures,
            history,
        }
    }
}

/// The phase an operation moves a workspace into when it starts; `None` for one that leaves
/// it where it is (plan, drift check).
pub fn starting(operation: Operation, exists: bool) -> Option<Phase> {
    match operation {
        Operation::Apply if exists => Some(Phase::Updating),
        Operation::Apply => Some(Phase::Provisioning),
        Operation::Destroy => Some(Phase::Deleting),
        Operation::Plan | Operation::DriftCheck => None,
    }
}

/// The phase a run that ended with `status` leaves its workspace in; `None` for a job that
/// never ran (superseded), which leaves it where it is.
pub fn ending(operation: Operation, status: Status) -> Option<Phase> {
    Some(match (status, operation) {
        (Status::Succeeded, Operation::Destroy) => Phase::Deleted,
        (Status::Succeeded, _) => Phase::Active,
        (Status::Failed | Status::TimedOut, _) => Phase::Failed,
        (Status::Cancelled | Status::Interrupted, _) => Phase::Interrupted,
        (Status::Superseded, _) => return None,
    })
}

/// Reads a workspace's record; `None` when it has none.
///
/// # Errors
/// Store failures, or a record that cannot be read.
pub async fn read(
    store: &dyn StateStore,
    ws: &WorkspaceId,
) -> Result<Option<WorkspaceStatus>, StatusError> {
    match store.artifact(ws, WORKSPACE_RECORDS, STATUS_FILE).await? {
        Some(bytes) => Ok(Some(WorkspaceStatus::parse(&bytes)?)),
        None => Ok(None),
    }
}

/// Why a status could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Record(#[from] crate::run::records::RecordError),
}

/// Records `t` under the lease `fence` and returns the new record. A record that cannot be
/// read is started afresh (it is a report, not state; the run must not fail for it).
///
/// # Errors
/// Store failures, and [`StoreError::LeaseLost`] when `fence` no longer holds the workspace.
pub async fn record(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    fence: &Fence,
    previous: Option<WorkspaceStatus>,
    t: Transition,
) -> Result<WorkspaceStatus, StoreError> {
    let next = WorkspaceStatus::after(previous, t);
    let data = serde_json::to_vec_pretty(&next).expect("a status serializes");
    store
        .put_artifact_fenced(ws, WORKSPACE_RECORDS, STATUS_FILE, Bytes::from(data), fence)
        .await?;
    Ok(next)
}

/// Something about a run a platform should alert its operators to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Attention {
    /// `resources-left`, `interrupted` or `failing-repeatedly`.
    pub kind: String,
    pub message: String,
}

/// What in `result` (and the workspace's record after it) needs an operator.
pub fn attention(
    result: &JobResult,
    status: Option<&WorkspaceStatus>,
    interrupted_before: Option<&str>,
) -> Vec<Attention> {
    let mut out = Vec::new();
    if let Some(c) = &result.cleanup {
        if !c.left.is_empty() {
            out.push(Attention {
                kind: "resources-left".into(),
                message: format!(
                    "the failed run left {} in place: {}",
                    c.left.len(),
                    c.left.join(", ")
                ),
            });
        } else if let Some(e) = &c.error {
            out.push(Attention {
                kind: "resources-left".into(),
                message: format!("cleanup after the failure did not finish: {e}"),
            });
        }
    }
    if matches!(result.status, Status::Interrupted | Status::Cancelled) {
        out.push(Attention {
            kind: "interrupted".into(),
            message: format!(
                "this run stopped before its end ({}); the infrastructure may be half changed",
                result.status.as_str()
            ),
        });
    }
    if let Some(prev) = interrupted_before {
        out.push(Attention {
            kind: "interrupted".into(),
            message: format!(
                "job {prev} on this workspace was interrupted (its runner stopped without a result) before this run"
            ),
        });
    }
    if let Some(s) = status
        && s.consecutive_failures >= FAILING_REPEATEDLY
    {
        out.push(Attention {
            kind: "failing-repeatedly".into(),
            message: format!(
                "the workspace's last {} runs failed; the latest: {}",
                s.consecutive_failures,
                s.reason.as_deref().unwrap_or("no reason recorded")
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(to: Phase, job: &str) -> Transition {
        Transition {
            from: None,
            to,
            at: OffsetDateTime::UNIX_EPOCH,
            job_id: job.into(),
            operation: Operation::Apply,
            reason: None,
        }
    }

    #[tokio::test]
    async fn a_move_is_written_only_under_the_live_lease() {
        use state_backends::memory::MemoryStore;
        use state_backends::{LeaseRequest, StateStore};
        let store = MemoryStore::new();
        let ws = WorkspaceId::new("acme", "demo").unwrap();
        let request = |owner: &str| LeaseRequest {
            owner: owner.into(),
            ttl: std::time::Duration::from_secs(60),
            info: serde_json::Value::Null,
        };
        let first = store.acquire_lease(&ws, &request("a")).await.unwrap();
        let written = record(
            &store,
            &ws,
            &first.fence(),
            None,
            t(Phase::Provisioning, "a"),
        )
        .await
        .unwrap();
        assert_eq!(read(&store, &ws).await.unwrap(), Some(written.clone()));
        store.break_lease(&ws, None).await.unwrap();
        let second = store.acquire_lease(&ws, &request("b")).await.unwrap();
        let refused = record(
            &store,
            &ws,
            &first.fence(),
            Some(written.clone()),
            t(Phase::Active, "a"),
        )
        .await
        .unwrap_err();
        assert!(matches!(refused, StoreError::LeaseLost { .. }), "{refused}");
        assert_eq!(
            read(&store, &ws).await.unwrap(),
            Some(written.clone()),
            "a runner that lost the lease changes nothing"
        );
        record(
            &store,
            &ws,
            &second.fence(),
            Some(written),
            t(Phase::Interrupted, "a"),
        )
        .await
        .unwrap();
    }

    #[test]
    fn phases_follow_the_operation_and_its_end() {
        assert_eq!(starting(Operation::Apply, false), Some(Phase::Provisioning));
        assert_eq!(starting(Operation::Apply, true), Some(Phase::Updating));
        assert_eq!(starting(Operation::Destroy, true), Some(Phase::Deleting));
        assert_eq!(starting(Operation::Plan, true), None);
        assert_eq!(starting(Operation::DriftCheck, true), None);
        assert_eq!(
            ending(Operation::Apply, Status::Succeeded),
            Some(Phase::Active)
        );
        assert_eq!(
            ending(Operation::Destroy, Status::Succeeded),
            Some(Phase::Deleted)
        );
        assert_eq!(
            ending(Operation::Apply, Status::TimedOut),
            Some(Phase::Failed)
        );
        assert_eq!(
            ending(Operation::Apply, Status::Cancelled),
            Some(Phase::Interrupted)
        );
        assert_eq!(ending(Operation::Apply, Status::Superseded), None);
    }

    #[test]
    fn the_record_counts_failures_knows_existence_and_keeps_a_bounded_history() {
        let mut s = WorkspaceStatus::after(None, t(Phase::Provisioning, "a"));
        assert!(!s.exists);
        s = WorkspaceStatus::after(Some(s), t(Phase::Active, "a"));
        assert!(s.exists);
        for i in 0..3 {
            s = WorkspaceStatus::after(Some(s), t(Phase::Failed, &format!("f{i}")));
        }
        assert_eq!(s.consecutive_failures, 3);
        assert!(s.exists, "a failed update leaves the workspace existing");
        s = WorkspaceStatus::after(Some(s), t(Phase::Active, "ok"));
        assert_eq!(s.consecutive_failures, 0);
        s = WorkspaceStatus::after(Some(s), t(Phase::Deleted, "d"));
        assert!(!s.exists);
        for i in 0..200 {
            s = WorkspaceStatus::after(Some(s), t(Phase::Updating, &format!("u{i}")));
        }
        assert_eq!(s.history.len(), HISTORY_KEPT);
        assert_eq!(s.history.last().unwrap().job_id, "u199");
        let written = serde_json::to_vec(&s).unwrap();
        assert_eq!(WorkspaceStatus::parse(&written).unwrap(), s);
        let newer = serde_json::json!({ "schema": 9, "status": "active" }).to_string();
        assert!(matches!(
            WorkspaceStatus::parse(newer.as_bytes()),
            Err(crate::run::records::RecordError::Newer { found: 9, .. })
        ));
    }
}
