//! In-memory stores for unit tests of pure logic: a [`Bucket`] with the conditional writes of
//! S3, GCS and Azure Blob, and over it the object-store protocol ([`BucketStore`]) as a
//! [`crate::StateStore`] that runs without an emulator ([`MemoryStore`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::lease::LeaseRecord;
use crate::objects::{
    Bucket, BucketStore, Condition, LeaseKeeper, Listed, LockObject, Object, Taken,
};
use crate::{Lease, LeaseRequest, Result, StoreError, WorkspaceId};

/// What a failing lease call answers: the store cannot be reached (an error that may pass).
fn unreachable() -> StoreError {
    StoreError::Backend {
        backend: "memory",
        message: "the store cannot be reached".into(),
        retryable: true,
        source: None,
    }
}

/// A store that forgets everything when dropped: the object-store protocol of every cloud
/// ([`BucketStore`]) over a [`MemoryBucket`], its lease in a lock object whose calls tests can
/// make fail ([`MemoryStore::set_renewals`], [`MemoryStore::fail_releases`],
/// [`MemoryStore::fail_acquires`]). The rules are the buckets' own: nothing is restated here.
pub type MemoryStore = BucketStore<MemoryBucket>;

impl Default for MemoryStore {
    fn default() -> Self {
        let bucket = MemoryBucket::new();
        let leases = FaultyLeases {
            lock: LockObject::new(bucket.clone()),
            faults: bucket.faults.clone(),
        };
        BucketStore::over(bucket, "", Some(Arc::new(leases)))
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, LeaseFaults> {
        self.bucket()
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// From now on, renewals are answered as `mode` says.
    pub fn set_renewals(&self, mode: Renewals) {
        self.faults().renewals = mode;
    }

    /// The next `n` releases of a lease fail with an error that may pass.
    pub fn fail_releases(&self, n: u32) {
        self.faults().failing_releases = n;
    }

    /// The next `n` acquisitions of a lease fail with an error that may pass; when
    /// `first_lands`, the first of them takes the lease all the same (its answer lost).
    pub fn fail_acquires(&self, n: u32, first_lands: bool) {
        self.faults().failing_acquires = (n, first_lands);
    }

    /// Each failing acquisition fails only after `time`.
    pub fn fail_acquires_after(&self, time: Duration) {
        self.faults().failing_acquire_time = time;
    }
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

/// The lease calls a test has made fail, shared by a bucket's handles.
#[derive(Debug, Default)]
struct LeaseFaults {
    renewals: Renewals,
    /// How many releases of a lease fail (the store unreachable) before one is done.
    failing_releases: u32,
    /// How many acquisitions fail before one is answered, and whether the first of them takes
    /// the lease all the same (its answer lost).
    failing_acquires: (u32, bool),
    /// How long each failing acquisition takes to fail (a client's attempts at a store that
    /// does not answer).
    failing_acquire_time: Duration,
}

/// The lock object, failing the calls a test asked to fail.
#[derive(Debug)]
struct FaultyLeases {
    lock: LockObject<MemoryBucket>,
    faults: Arc<Mutex<LeaseFaults>>,
}

impl FaultyLeases {
    fn faults(&self) -> std::sync::MutexGuard<'_, LeaseFaults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl LeaseKeeper for FaultyLeases {
    async fn record(&self, key: &str) -> Result<LeaseRecord> {
        self.lock.record(key).await
    }

    async fn acquire(&self, ws: &WorkspaceId, key: &str, request: &LeaseRequest) -> Result<Taken> {
        let failing = {
            let mut faults = self.faults();
            match faults.failing_acquires {
                (0, _) => None,
                (n, first_lands) => {
                    faults.failing_acquires = (n - 1, false);
                    Some((first_lands, faults.failing_acquire_time))
                }
            }
        };
        let Some((lands, time)) = failing else {
            return self.lock.acquire(ws, key, request).await;
        };
        tokio::time::sleep(time).await;
        if lands {
            let _ = self.lock.acquire(ws, key, request).await;
        }
        Err(unreachable())
    }

    async fn renew(
        &self,
        ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease> {
        let mode = self.faults().renewals;
        match mode {
            Renewals::Answer => self.lock.renew(ws, key, lease, ttl).await,
            Renewals::Fail => Err(unreachable()),
            Renewals::Hang => std::future::pending().await,
        }
    }

    async fn release(
        &self,
        ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        settled: Option<u64>,
    ) -> Result<()> {
        {
            let mut faults = self.faults();
            if faults.failing_releases > 0 {
                faults.failing_releases -= 1;
                return Err(unreachable());
            }
        }
        self.lock.release(ws, key, lease, settled).await
    }

    async fn break_lease(
        &self,
        ws: &WorkspaceId,
        key: &str,
        only: Option<u64>,
    ) -> Result<Option<Lease>> {
        self.lock.break_lease(ws, key, only).await
    }
}

/// A bucket that forgets everything when its last handle is dropped (clones are handles to the
/// same objects). Tags are a counter, new on every write, like a generation; conditions are
/// honoured on writes and on [`Bucket::clear_if`] alike. Every call first yields to the
/// runtime, as a network call would, so concurrent callers interleave.
#[derive(Clone, Debug, Default)]
pub struct MemoryBucket {
    inner: Arc<Mutex<BucketInner>>,
    faults: Arc<Mutex<LeaseFaults>>,
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

    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<Option<String>>> {
        Ok(self
            .with(|b| {
                let allowed = match (condition, b.objects.get(key)) {
                    (Condition::None, _) | (Condition::Absent, None) => true,
                    (Condition::Matches(tag), Some(o)) => o.tag == tag,
                    (Condition::Absent, Some(_)) | (Condition::Matches(_), None) => false,
                };
                if !allowed {
                    return None;
                }
                let tag = b.tag();
                b.objects.insert(
                    key.to_owned(),
                    Object {
                        data,
                        tag: tag.clone(),
                        metadata,
                    },
                );
                Some(Some(tag))
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
        crate::conformance::run_all(Arc::new(MemoryStore::new())).await;
    }

    /// The object-store protocol (commit by create-only write, fencing by the lock object,
    /// change marks, backups), with no emulator: under a prefix and at the bucket's root.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bucket_protocol_passes_the_conformance_suite() {
        for prefix in ["terrace", ""] {
            let store = BucketStore::over(MemoryBucket::new(), prefix, None);
            crate::conformance::run_all(Arc::new(store)).await;
        }
    }

    #[tokio::test]
    async fn a_backup_restores_without_its_versions() {
        let store = BucketStore::over(MemoryBucket::new(), "terrace", None);
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
