//! An in-memory [`StateStore`] for unit tests of pure logic. Same rules as every backend.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use time::OffsetDateTime;

use crate::lease::LeaseRecord;
use crate::{
    BackupInfo, Changed, CurrentState, Fence, Lease, LeaseRequest, NewState, PutMode, Result,
    StateStore, StoreError, VersionInfo, VersionToken, WorkspaceId, sha256_hex,
};

/// A store that forgets everything when dropped.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<HashMap<WorkspaceId, Workspace>>,
}

#[derive(Debug, Default)]
struct Workspace {
    /// Every accepted write in order; `None` marks a deletion of the current state.
    entries: Vec<Option<(VersionInfo, Bytes)>>,
    lease: LeaseRecord,
    backups: Vec<(BackupInfo, Bytes)>,
    artifacts: BTreeMap<(String, String), Bytes>,
    /// The number of the latest write, until the backup sweep clears it.
    change_mark: Option<u64>,
}

impl Workspace {
    fn token(&self) -> Option<VersionToken> {
        match self.entries.last() {
            Some(Some(_)) => Some(VersionToken(self.entries.len().to_string())),
            _ => None,
        }
    }

    fn check_write(&self, ws: &WorkspaceId, mode: &PutMode, fence: Option<&Fence>) -> Result<()> {
        crate::lease::check_put(ws, &self.lease, self.token().as_ref(), mode, fence)
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, ws: &WorkspaceId, f: impl FnOnce(&mut Workspace) -> T) -> T {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(map.entry(ws.clone()).or_default())
    }
}

fn not_found(ws: &WorkspaceId, what: String) -> StoreError {
    StoreError::NotFound {
        workspace: ws.clone(),
        what,
    }
}

#[async_trait]
impl StateStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>> {
        Ok(self.with(ws, |w| {
            let token = w.token()?;
            let (version, data) = w.entries.last()?.clone()?;
            Some(CurrentState {
                token,
                data,
                version,
            })
        }))
    }

    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        self.with(ws, |w| {
            w.check_write(ws, &mode, fence)?;
            let info = VersionInfo {
                number: w.entries.len() as u64 + 1,
                serial: state.serial,
                lineage: state.lineage,
                created_at: OffsetDateTime::now_utc(),
                size: state.data.len() as u64,
                sha256: sha256_hex(&state.data),
            };
            w.entries.push(Some((info.clone(), state.data)));
            w.change_mark = Some(w.entries.len() as u64);
            Ok(info)
        })
    }

    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()> {
        self.with(ws, |w| {
            w.check_write(ws, &PutMode::Update(expected.clone()), fence)?;
            w.entries.push(None);
            w.change_mark = Some(w.entries.len() as u64);
            Ok(())
        })
    }

    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>> {
        Ok(self.with(ws, |w| {
            w.entries.iter().flatten().map(|(i, _)| i.clone()).collect()
        }))
    }

    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes> {
        self.with(ws, |w| {
            let index = usize::try_from(number).ok().and_then(|n| n.checked_sub(1));
            match index.and_then(|i| w.entries.get(i)) {
                Some(Some((_, data))) => Ok(data.clone()),
                _ => Err(not_found(ws, format!("state version {number}"))),
            }
        })
    }

    async fn acquire_lease(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease> {
        self.with(ws, |w| {
            w.lease
                .acquire(request, OffsetDateTime::now_utc())
                .map_err(|holder| StoreError::LeaseHeld {
                    workspace: ws.clone(),
                    holder,
                })
        })
    }

    async fn renew_lease(&self, ws: &WorkspaceId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.with(ws, |w| {
            w.lease
                .renew(lease, ttl, OffsetDateTime::now_utc())
                .map_err(|reason| StoreError::LeaseLost {
                    workspace: ws.clone(),
                    owner: lease.owner.clone(),
                    fence: lease.fence,
                    reason,
                })
        })
    }

    async fn release_lease(&self, ws: &WorkspaceId, lease: &Lease) -> Result<()> {
        self.with(ws, |w| w.lease.release(lease));
        Ok(())
    }

    async fn break_lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        Ok(self.with(ws, |w| w.lease.break_lease()))
    }

    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        Ok(self.with(ws, |w| w.lease.held.clone()))
    }

    async fn snapshot(&self, ws: &WorkspaceId, label: &str) -> Result<Option<BackupInfo>> {
        self.with(ws, |w| {
            let Some(Some((info, data))) = w.entries.last() else {
                return Ok(None);
            };
            if w.backups
                .last()
                .is_some_and(|(b, _)| b.sha256 == info.sha256)
            {
                return Ok(None);
            }
            let backup = BackupInfo {
                label: label.to_owned(),
                version: info.number,
                sha256: info.sha256.clone(),
            };
            w.backups.retain(|(b, _)| b.label != label);
            w.backups.push((backup.clone(), data.clone()));
            Ok(Some(backup))
        })
    }

    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        Ok(self.with(ws, |w| w.backups.iter().map(|(b, _)| b.clone()).collect()))
    }

    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()> {
        crate::check_artifact_name(job_id, name)?;
        self.with(ws, |w| {
            w.artifacts
                .insert((job_id.to_owned(), name.to_owned()), data)
        });
        Ok(())
    }

    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>> {
        crate::check_artifact_name(job_id, name)?;
        Ok(self.with(ws, |w| {
            w.artifacts
                .get(&(job_id.to_owned(), name.to_owned()))
                .cloned()
        }))
    }

    async fn delete_artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<()> {
        crate::check_artifact_name(job_id, name)?;
        self.with(ws, |w| {
            w.artifacts.remove(&(job_id.to_owned(), name.to_owned()));
        });
        Ok(())
    }

    async fn artifacts(&self, ws: &WorkspaceId, job_id: &str) -> Result<Vec<String>> {
        Ok(self.with(ws, |w| {
            w.artifacts
                .keys()
                .filter(|(job, _)| job == job_id)
                .map(|(_, name)| name.clone())
                .collect()
        }))
    }

    async fn changed(&self) -> Result<Vec<Changed>> {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Changed> = map
            .iter()
            .filter_map(|(ws, w)| {
                w.change_mark.map(|n| Changed {
                    ws: ws.clone(),
                    mark: n.to_string(),
                })
            })
            .collect();
        out.sort_by_key(|a| a.ws.to_string());
        Ok(out)
    }

    async fn workspaces(&self) -> Result<Vec<WorkspaceId>> {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<WorkspaceId> = map
            .iter()
            .filter(|(_, w)| !w.entries.is_empty() || !w.artifacts.is_empty())
            .map(|(ws, _)| ws.clone())
            .collect();
        out.sort_by_key(ToString::to_string);
        Ok(out)
    }

    async fn clear_changed(&self, changed: &Changed) -> Result<()> {
        self.with(&changed.ws, |w| {
            if w.change_mark.map(|n| n.to_string()).as_deref() == Some(changed.mark.as_str()) {
                w.change_mark = None;
            }
        });
        Ok(())
    }

    async fn delete_backup(&self, ws: &WorkspaceId, label: &str) -> Result<()> {
        self.with(ws, |w| w.backups.retain(|(b, _)| b.label != label));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        crate::conformance::run_all(std::sync::Arc::new(MemoryStore::new())).await;
    }
}
