//! The lock-object lease (`lease.json` in the workspace's folder): a [`LeaseKeeper`] kept in
//! the bucket itself, changed only when its tag (ETag, generation) still matches, or created
//! only if absent the first time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use time::OffsetDateTime;

use super::{Bucket, Condition, LeaseKeeper, Taken, corrupt, gave_up};
use crate::lease::LeaseRecord;
use crate::{Lease, LeaseRequest, Result, StoreError, WorkspaceId};

/// The lease as an object of the bucket, the default of every [`super::BucketStore`].
#[derive(Clone, Debug)]
pub struct LockObject<B> {
    bucket: B,
    /// Each lock object as this keeper last read or wrote it, with its tag: a change starts
    /// from it instead of reading the object again (a round trip), and its tag condition makes
    /// a stale one cost a read, never a wrong record. Only a write is answered from it: an
    /// answer without one (held by another) is read from the object.
    known: Arc<Mutex<HashMap<String, (LeaseRecord, String)>>>,
}

impl<B: Bucket> LockObject<B> {
    pub fn new(bucket: B) -> Self {
        Self {
            bucket,
            known: Arc::default(),
        }
    }

    fn object(key: &str) -> String {
        format!("{key}/lease.json")
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, (LeaseRecord, String)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn read(&self, object: &str) -> Result<(LeaseRecord, Option<String>)> {
        match self.bucket.get(object).await? {
            None => {
                self.known().remove(object);
                Ok((LeaseRecord::default(), None))
            }
            Some(obj) => {
                let parsed = if obj.data.is_empty() && self.bucket.empty_lock_object_is_unrecorded()
                {
                    Ok(LeaseRecord::default())
                } else {
                    serde_json::from_slice(&obj.data)
                };
                let record: LeaseRecord =
                    parsed.map_err(|e| corrupt(self.bucket.backend(), object, &e.to_string()))?;
                self.known()
                    .insert(object.to_owned(), (record.clone(), obj.tag.clone()));
                Ok((record, Some(obj.tag)))
            }
        }
    }

    /// Reads the lock object, applies `change`, and writes it back if its tag still matches,
    /// retrying on a concurrent change. `change` returns what to answer and whether to write.
    async fn change<T>(
        &self,
        key: &str,
        mut change: impl FnMut(&mut LeaseRecord) -> Result<(T, bool)> + Send,
    ) -> Result<T> {
        let object = Self::object(key);
        // The record last written and its answer, when the write's condition failed.
        let mut tried: Option<(LeaseRecord, T)> = None;
        // The tag a write was refused at: found again, something other than the condition
        // refused it (see [`Bucket::unlock`]).
        let mut refused: Option<String> = None;
        for attempt in 0..20 {
            // First from what this keeper last saw, when it saw the object; a failed condition
            // sends every later attempt to the object itself.
            let known = (attempt == 0)
                .then(|| self.known().get(&object).cloned())
                .flatten();
            let from_known = known.is_some();
            let (mut record, tag) = match known {
                Some((record, tag)) => (record, Some(tag)),
                None => self.read(&object).await?,
            };
            // A client that lost the answer to a write and sent it again finds the object
            // changed, by that very write: the record it wrote is there (a lease carries its
            // time to the nanosecond, so no other writer's record is the same).
            if let Some((wrote, answer)) = tried.take()
                && record == wrote
            {
                return Ok(answer);
            }
            let changed = change(&mut record);
            // A remembered record answers only through a write, which its tag checks: what it
            // would answer without one (held by another, nothing to release) may be long past,
            // so that is asked of the object itself.
            if from_known && !matches!(changed, Ok((_, true))) {
                continue;
            }
            let (answer, write) = changed?;
            if !write {
                return Ok(answer);
            }
            if tag.is_some() && refused.take() == tag {
                self.bucket.unlock(&object).await?;
            }
            let data = Bytes::from(serde_json::to_vec(&record).expect("lease record serializes"));
            let condition = match &tag {
                Some(tag) => Condition::Matches(tag),
                None => Condition::Absent,
            };
            match self
                .bucket
                .put_tagged(&object, data, HashMap::new(), condition)
                .await?
            {
                Some(Some(tag)) => {
                    self.known().insert(object, (record, tag));
                    return Ok(answer);
                }
                Some(None) => {
                    self.known().remove(&object);
                    return Ok(answer);
                }
                None => {
                    self.known().remove(&object);
                    refused = tag;
                    // Another writer changed the object between this read and this write
                    // (a runner racing for the lease, or an earlier Azure runner holding its
                    // blob lease for its own change): let it finish before reading again,
                    // rather than spend every attempt in one burst. A guess from memory that
                    // proved stale is read again at once.
                    if !from_known {
                        tokio::time::sleep(contention_pause(attempt)).await;
                    }
                }
            }
            tried = Some((record, answer));
        }
        Err(gave_up(self.bucket.backend(), &object))
    }
}

/// The wait after the `attempt`th write was refused by another writer's change: up to 5 ms
/// doubling to 80 ms, each drawn from its upper half so that racers part; 0.7-1.4 s over the
/// 20 attempts of [`LockObject::change`].
fn contention_pause(attempt: u32) -> Duration {
    let ceiling = 5u64 << attempt.min(4);
    Duration::from_millis(rand::random_range(ceiling / 2..=ceiling))
}

#[async_trait]
impl<B: Bucket + 'static> LeaseKeeper for LockObject<B> {
    async fn record(&self, key: &str) -> Result<LeaseRecord> {
        Ok(self.read(&Self::object(key)).await?.0)
    }

    async fn acquire(&self, ws: &WorkspaceId, key: &str, request: &LeaseRequest) -> Result<Taken> {
        let now = OffsetDateTime::now_utc();
        self.change(key, |record| {
            let settled = record.settled;
            match record.acquire(request, now) {
                Ok(lease) => Ok((Taken { lease, settled }, true)),
                Err(holder) => Err(StoreError::LeaseHeld {
                    workspace: ws.clone(),
                    holder,
                }),
            }
        })
        .await
    }

    async fn renew(
        &self,
        ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease> {
        let now = OffsetDateTime::now_utc();
        self.change(key, |record| {
            record
                .renew(lease, ttl, now)
                .map(|l| (l, true))
                .map_err(|reason| StoreError::LeaseLost {
                    workspace: ws.clone(),
                    owner: lease.owner.clone(),
                    fence: lease.fence,
                    reason,
                })
        })
        .await
    }

    async fn release(
        &self,
        _ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        settled: Option<u64>,
    ) -> Result<()> {
        self.change(key, |record| Ok(((), record.release(lease, settled))))
            .await
    }

    async fn break_lease(
        &self,
        _ws: &WorkspaceId,
        key: &str,
        only: Option<u64>,
    ) -> Result<Option<Lease>> {
        self.change(key, |record| {
            let broken = record.break_lease(only);
            let write = broken.is_some();
            Ok((broken, write))
        })
        .await
    }
}
