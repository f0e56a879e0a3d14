//! A store whose state writes fail on demand, for the paths where the customer's bucket is
//! briefly unreachable while terraform saves. Everything else is the real store underneath.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use state_backends::retention::Retention;
use state_backends::{
    BackupInfo, Changed, CurrentState, Fence, Lease, LeaseRequest, NewState, PutMode, Snapshot,
    StateStore, StoreError, VersionInfo, VersionToken, WorkspaceId,
};

type Result<T> = std::result::Result<T, StoreError>;

/// Fails the next `n` writes of a state that has resources (a fresh workspace's only such
/// write is the end of the first apply) with a retryable backend error; or, made with
/// [`FailingPuts::records`], every write of run artifacts with one name.
#[derive(Debug)]
pub struct FailingPuts {
    inner: Arc<dyn StateStore>,
    remaining: AtomicU32,
    failed: AtomicU32,
    /// The artifact name whose writes all fail.
    artifact: Option<&'static str>,
}

impl FailingPuts {
    pub fn new(inner: Arc<dyn StateStore>, n: u32) -> Self {
        Self {
            inner,
            remaining: AtomicU32::new(n),
            failed: AtomicU32::new(0),
            artifact: None,
        }
    }

    /// Every write of a run artifact named `name` (`job.json`, say) fails; states are written.
    pub fn records(inner: Arc<dyn StateStore>, name: &'static str) -> Self {
        Self {
            artifact: Some(name),
            ..Self::new(inner, 0)
        }
    }

    fn unreachable() -> StoreError {
        StoreError::Backend {
            backend: "failing-puts",
            message: "injected: the bucket is unreachable".into(),
            retryable: true,
            source: None,
        }
    }

    /// How many writes failed so far.
    pub fn failed(&self) -> u32 {
        self.failed.load(Ordering::SeqCst)
    }
}

fn has_resources(state: &NewState) -> bool {
    serde_json::from_slice::<serde_json::Value>(&state.data)
        .ok()
        .and_then(|v| v["resources"].as_array().map(|r| !r.is_empty()))
        .unwrap_or(false)
}

#[async_trait::async_trait]
impl StateStore for FailingPuts {
    fn kind(&self) -> &'static str {
        "failing-puts"
    }
    fn seals(&self) -> bool {
        self.inner.seals()
    }
    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>> {
        self.inner.current(ws).await
    }
    async fn settle(&self, ws: &WorkspaceId) {
        self.inner.settle(ws).await;
    }
    fn answering(&self) -> bool {
        self.inner.answering()
    }
    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        if has_resources(&state)
            && self
                .remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(Self::unreachable());
        }
        self.inner.put(ws, state, mode, fence).await
    }
    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()> {
        self.inner.delete_current(ws, expected, fence).await
    }
    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>> {
        self.inner.versions(ws).await
    }
    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes> {
        self.inner.version(ws, number).await
    }
    async fn acquire_lease(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease> {
        self.inner.acquire_lease(ws, request).await
    }
    async fn renew_lease(&self, ws: &WorkspaceId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.renew_lease(ws, lease, ttl).await
    }
    async fn release_lease(&self, ws: &WorkspaceId, lease: &Lease) -> Result<()> {
        self.inner.release_lease(ws, lease).await
    }
    async fn break_lease(&self, ws: &WorkspaceId, only: Option<u64>) -> Result<Option<Lease>> {
        self.inner.break_lease(ws, only).await
    }
    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        self.inner.lease(ws).await
    }
    async fn snapshot(
        &self,
        ws: &WorkspaceId,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        self.inner.snapshot(ws, label, keep).await
    }
    async fn back_up(
        &self,
        changed: &state_backends::Changed,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        self.inner.back_up(changed, label, keep).await
    }
    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        self.inner.backups(ws).await
    }
    async fn backup(&self, ws: &WorkspaceId, label: &str) -> Result<Bytes> {
        self.inner.backup(ws, label).await
    }
    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()> {
        if self.artifact == Some(name) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(Self::unreachable());
        }
        self.inner.put_artifact(ws, job_id, name, data).await
    }
    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>> {
        self.inner.artifact(ws, job_id, name).await
    }
    async fn delete_artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<()> {
        self.inner.delete_artifact(ws, job_id, name).await
    }
    async fn artifacts(&self, ws: &WorkspaceId, job_id: &str) -> Result<Vec<String>> {
        self.inner.artifacts(ws, job_id).await
    }
    async fn runs(&self, ws: &WorkspaceId) -> Result<Vec<String>> {
        self.inner.runs(ws).await
    }
    async fn changed(&self) -> Result<Vec<Changed>> {
        self.inner.changed().await
    }
    async fn workspaces(&self) -> Result<Vec<WorkspaceId>> {
        self.inner.workspaces().await
    }
    async fn clear_changed(&self, changed: &Changed) -> Result<()> {
        self.inner.clear_changed(changed).await
    }
}
