//! In-memory stores for unit tests of pure logic: a [`StateStore`] with the same rules as every
//! backend, and a [`Bucket`] with the conditional writes of S3, GCS and Azure Blob, so the
//! object-store protocol ([`crate::objects::BucketStore`]) runs without an emulator.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use time::OffsetDateTime;

use crate::lease::LeaseRecord;
use crate::objects::{Bucket, Condition, Listed, Object};
use crate::retention::{Retention, to_prune};
use crate::{
    BackupInfo, Changed, CurrentState, Fence, Lease, LeaseRequest, NewState, PutMode, Result,
    Snapshot, StateStore, StoreError, VersionInfo, VersionToken, WorkspaceId, sha256_hex,
};

/// What a failing renewal or release answers: the store cannot be reached (an error that may
/// pass).
fn unreachable() -> StoreError {
    StoreError::Backend {
        backend: "memory",
        message: "the store cannot be reached".into(),
        retryable: true,
        source: None,
    }
}

/// A store that forgets everything when dropped.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<HashMap<WorkspaceId, Workspace>>,
    renewals: Mutex<Renewals>,
    /// How many releases of a lease fail (the store unreachable) before one is done.
    failing_releases: Mutex<u32>,
    /// How many acquisitions fail before one is answered, and whether the first of them takes
    /// the lease all the same (its answer lost).
    failing_acquires: Mutex<(u32, bool)>,
    /// How long each failing acquisition takes to fail (a client's attempts at a store that
    /// does not answer).
    failing_acquire_time: Mutex<Duration>,
}

/// How [`MemoryStore`] answers lease renewals, for tests of what a runner does when its store
/// stops answering.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Renewals {
    /// As every store: renewed, or `LeaseLost`.
    #[default]
    Answer,
    /// A failure that may pass (the store unreachable).
    Fail,
    /// No answer at all (a hung connection).
    Hang,
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

    /// From now on, renewals are answered as `mode` says.
    pub fn set_renewals(&self, mode: Renewals) {
        *self.renewals.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    /// The next `n` releases of a lease fail with an error that may pass.
    pub fn fail_releases(&self, n: u32) {
        *self
            .failing_releases
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = n;
    }

    /// The next `n` acquisitions of a lease fail with an error that may pass; when
    /// `first_lands`, the first of them takes the lease all the same (its answer lost).
    pub fn fail_acquires(&self, n: u32, first_lands: bool) {
        *self
            .failing_acquires
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = (n, first_lands);
    }

    /// Each failing acquisition fails only after `time`.
    pub fn fail_acquires_after(&self, time: Duration) {
        *self
            .failing_acquire_time
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = time;
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
        let lands = {
            let mut failing = self
                .failing_acquires
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match *failing {
                (0, _) => None,
                (n, first_lands) => {
                    *failing = (n - 1, false);
                    Some(first_lands)
                }
            }
        };
        if let Some(lands) = lands {
            let time = *self
                .failing_acquire_time
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            tokio::time::sleep(time).await;
            if lands {
                let _ = self.with(ws, |w| w.lease.acquire(request, OffsetDateTime::now_utc()));
            }
            return Err(unreachable());
        }
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
        let mode = *self.renewals.lock().unwrap_or_else(|e| e.into_inner());
        match mode {
            Renewals::Answer => {}
            Renewals::Fail => {
                return Err(unreachable());
            }
            Renewals::Hang => std::future::pending::<()>().await,
        }
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
        {
            let mut failing = self
                .failing_releases
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *failing > 0 {
                *failing -= 1;
                return Err(unreachable());
            }
        }
        self.with(ws, |w| w.lease.release(lease));
        Ok(())
    }

    async fn break_lease(&self, ws: &WorkspaceId, only: Option<u64>) -> Result<Option<Lease>> {
        Ok(self.with(ws, |w| w.lease.break_lease(only)))
    }

    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        Ok(self.with(ws, |w| w.lease.held.clone()))
    }

    async fn snapshot(
        &self,
        ws: &WorkspaceId,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
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
            let labels: Vec<String> = w.backups.iter().map(|(b, _)| b.label.clone()).collect();
            let pruned = to_prune(&labels, keep);
            w.backups.retain(|(b, _)| !pruned.contains(&b.label));
            Ok(Some(Snapshot { backup, pruned }))
        })
    }

    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        Ok(self.with(ws, |w| w.backups.iter().map(|(b, _)| b.clone()).collect()))
    }

    async fn backup(&self, ws: &WorkspaceId, label: &str) -> Result<Bytes> {
        self.with(ws, |w| {
            w.backups
                .iter()
                .find(|(b, _)| b.label == label)
                .map(|(_, data)| data.clone())
        })
        .ok_or_else(|| StoreError::NotFound {
            workspace: ws.clone(),
            what: format!("backup {label}"),
        })
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

    async fn runs(&self, ws: &WorkspaceId) -> Result<Vec<String>> {
        let mut ids: Vec<String> = self.with(ws, |w| {
            w.artifacts.keys().map(|(job, _)| job.clone()).collect()
        });
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    async fn changed(&self) -> Result<Vec<Changed>> {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Changed> = map
            .iter()
            .filter_map(|(ws, w)| {
                w.change_mark.map(|n| Changed {
                    ws: ws.clone(),
                    mark: n.to_string(),
                    marked: None,
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

/// A bucket that forgets everything when its last handle is dropped (clones are handles to the
/// same objects). Tags are a counter, new on every write, like a generation; conditions are
/// honoured on writes and on [`Bucket::clear_if`] alike. Every call first yields to the
/// runtime, as a network call would, so concurrent callers interleave.
#[derive(Clone, Debug, Default)]
pub struct MemoryBucket {
    inner: std::sync::Arc<Mutex<BucketInner>>,
}

#[derive(Debug, Default)]
struct BucketInner {
    objects: BTreeMap<String, Object>,
    writes: u64,
}

impl BucketInner {
    fn tag(&mut self) -> String {
        self.writes += 1;
        self.writes.to_string()
    }
}

impl MemoryBucket {
    pub fn new() -> Self {
        Self::default()
    }

    async fn with<T>(&self, f: impl FnOnce(&mut BucketInner) -> T) -> T {
        tokio::task::yield_now().await;
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[async_trait]
impl Bucket for MemoryBucket {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn get(&self, key: &str) -> Result<Option<Object>> {
        Ok(self.with(|b| b.objects.get(key).cloned()).await)
    }

    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
        Ok(self
            .with(|b| b.objects.get(key).map(|o| o.metadata.clone()))
            .await)
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<bool> {
        Ok(self
            .with(|b| {
                let allowed = match (condition, b.objects.get(key)) {
                    (Condition::None, _) | (Condition::Absent, None) => true,
                    (Condition::Matches(tag), Some(o)) => o.tag == tag,
                    (Condition::Absent, Some(_)) | (Condition::Matches(_), None) => false,
                };
                if allowed {
                    let tag = b.tag();
                    b.objects.insert(
                        key.to_owned(),
                        Object {
                            data,
                            tag,
                            metadata,
                        },
                    );
                }
                allowed
            })
            .await)
    }

    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        self.with(|b| {
            let source = b
                .objects
                .get(from)
                .cloned()
                .ok_or_else(|| StoreError::Backend {
                    backend: "memory",
                    message: format!("COPY {from} → {to}: no such object"),
                    retryable: false,
                    source: None,
                })?;
            let tag = b.tag();
            b.objects.insert(
                to.to_owned(),
                Object {
                    data: source.data,
                    tag,
                    metadata: metadata.unwrap_or(source.metadata),
                },
            );
            Ok(())
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.with(|b| b.objects.remove(key)).await;
        Ok(())
    }

    async fn clear_if(&self, key: &str, tag: &str) -> Result<()> {
        self.with(|b| {
            if b.objects.get(key).is_some_and(|o| o.tag == tag) {
                b.objects.remove(key);
            }
        })
        .await;
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        Ok(self
            .with(|b| {
                b.objects
                    .range(prefix.to_owned()..)
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(key, o)| Listed {
                        key: key.clone(),
                        tag: o.tag.clone(),
                        size: o.data.len() as u64,
                    })
                    .collect()
            })
            .await)
    }

    async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .with(|b| {
                let mut folders: Vec<String> = b
                    .objects
                    .range(prefix.to_owned()..)
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .filter_map(|(k, _)| Some(k[prefix.len()..].split_once('/')?.0.to_owned()))
                    .collect();
                folders.dedup();
                folders
            })
            .await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        crate::conformance::run_all(std::sync::Arc::new(MemoryStore::new())).await;
    }

    /// The object-store protocol (commit by create-only write, fencing by the lock object,
    /// change marks, backups), with no emulator: under a prefix and at the bucket's root.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bucket_protocol_passes_the_conformance_suite() {
        use crate::objects::BucketStore;
        for prefix in ["terrace", ""] {
            let store = BucketStore::over(MemoryBucket::new(), prefix, None);
            crate::conformance::run_all(std::sync::Arc::new(store)).await;
        }
    }

    #[tokio::test]
    async fn a_backup_restores_without_its_versions() {
        let store = crate::objects::BucketStore::over(MemoryBucket::new(), "terrace", None);
        crate::conformance::a_bucket_backup_restores_without_its_versions(&store).await;
    }

    #[tokio::test]
    async fn the_bucket_honours_its_conditions() {
        let b = MemoryBucket::new();
        let put = |data: &'static str, condition| {
            b.put("k", Bytes::from(data), HashMap::new(), condition)
        };
        assert!(put("1", Condition::Absent).await.unwrap());
        assert!(!put("2", Condition::Absent).await.unwrap(), "created twice");
        let tag = b.get("k").await.unwrap().unwrap().tag;
        assert!(!put("3", Condition::Matches("stale")).await.unwrap());
        assert!(put("4", Condition::Matches(&tag)).await.unwrap());
        assert_eq!(b.get("k").await.unwrap().unwrap().data, "4");
        // A mark written again since it was listed stays.
        b.clear_if("k", &tag).await.unwrap();
        assert!(b.get("k").await.unwrap().is_some());
        let now = b.get("k").await.unwrap().unwrap().tag;
        b.clear_if("k", &now).await.unwrap();
        assert!(b.get("k").await.unwrap().is_none());
        assert!(!put("5", Condition::Matches(&now)).await.unwrap());

        for key in ["p/a/1", "p/a/2", "p/b/x/1", "p/c", "q/d/1"] {
            b.put(
                key,
                Bytes::from_static(b"x"),
                HashMap::new(),
                Condition::None,
            )
            .await
            .unwrap();
        }
        assert_eq!(b.folders("p/").await.unwrap(), ["a", "b"]);
        let listed: Vec<String> = b
            .list("p/a/")
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect();
        assert_eq!(listed, ["p/a/1", "p/a/2"]);
        assert!(b.copy("p/none", "p/copy", None).await.is_err());
    }
}
