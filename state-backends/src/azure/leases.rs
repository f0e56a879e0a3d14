//! Leases kept as Azure blob leases: a lease blob per workspace whose content is the
//! [`LeaseRecord`], changed only under the blob's lease, so two runners never both hold it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use azure_storage_blob::models::{BlobClientAcquireLeaseOptions, BlobClientBreakLeaseOptions};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::lease::LeaseRecord;
use crate::objects::{Bucket, Condition, LeaseKeeper, Taken};
use crate::{Lease, LeaseRequest, Result, StoreError, WorkspaceId};

use super::{AzureBucket, backend_error, client_error, scrub, status};

/// The workspace's lease as a blob lease on its `lease.json`, whose content is the
/// [`LeaseRecord`] every store keeps (holder, expiry, fence) and the blob lease's id.
///
/// - Every change of the record is a write that carries the blob lease's id **and** the ETag
///   the record was read at: only the blob lease's holder can write, and only over what it
///   read. A holder that stalled between its read and its write cannot put back a record that
///   others changed meanwhile, even if it got the blob lease back.
/// - Taking the lease takes the blob lease (infinite: it lasts as long as the job's lease is
///   renewed, so it cannot lapse under a slow renewal), reads the record and, if no live lease
///   is recorded, writes the new one. A workspace with no `lease.json` yet gets one holding
///   the taker's lease, made create-only (so one taker alone can make it), before the taker
///   takes its blob lease: until then nobody else can write it, since no other may hold a live
///   recorded lease.
/// - What this process last wrote to a record, and the ETag that write gave it, is kept: the
///   next write over it (a renewal, the release, a take after its own release) is tried from
///   it, without reading the record first. The write's ETag condition makes a stale guess fail,
///   and then the record is read as ever.
/// - A taker breaks a blob lease only when the record says the lease expired, when the record
///   stays free while the blob stays leased longer than a take and a write need (its taker died
///   between the two), or when the record holds a live lease of its own (one it just made, or at
///   a renewal or release the one it holds): another holds the blob lease then only to read
///   that, or died holding it. Another's live recorded lease makes the taker wait.
/// - Renewing writes the new expiry; releasing clears the record, then gives the blob lease
///   back.
#[derive(Clone, Debug)]
pub struct BlobLeases {
    bucket: AzureBucket,
    /// By `lease.json`'s key: the record this process last wrote there, and its ETag then.
    known: Arc<Mutex<HashMap<String, Known>>>,
}

/// A record as written, and the ETag the write gave it.
type Known = (BlobRecord, String);

/// `lease.json`'s content: the record, and the id of the blob lease its holder took.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(super) struct BlobRecord {
    #[serde(flatten)]
    pub(super) record: LeaseRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) blob_lease: Option<String>,
}

/// How often taking, renewing or releasing a lease is tried before giving up.
const ATTEMPTS: u32 = 12;
/// How many times a taker finds the record free but the blob leased before it breaks that
/// blob lease (its taker died between taking it and writing the record).
const FREE_BUT_LEASED: u32 = 4;

pub(super) fn new_lease_id() -> String {
    let n: u128 = rand::random();
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A short, jittered pause between attempts, so contenders do not move in step.
async fn pause(attempt: u32) {
    let base = 40 * u64::from(attempt.min(6) + 1);
    let jitter: u64 = rand::random::<u64>() % base;
    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
}

/// How [`BlobLeases::take`] went.
#[derive(Debug, PartialEq, Eq)]
enum Took {
    Taken,
    /// Another holds the blob lease.
    Held,
    /// There is no `lease.json` to lease.
    Missing,
}

impl BlobLeases {
    pub(super) fn new(bucket: AzureBucket) -> Self {
        Self {
            bucket,
            known: Arc::default(),
        }
    }

    fn key(base: &str) -> String {
        format!("{base}/lease.json")
    }

    fn known(&self, key: &str) -> Option<Known> {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.get(key).cloned()
    }

    /// The record and the ETag it was read at (`None`: no blob yet).
    async fn read(&self, key: &str) -> Result<(BlobRecord, Option<String>)> {
        match self.bucket.get(key).await? {
            None => Ok((BlobRecord::default(), None)),
            Some(obj) if obj.data.is_empty() => Ok((BlobRecord::default(), Some(obj.tag))),
            Some(obj) => {
                let record =
                    serde_json::from_slice(&obj.data).map_err(|e| StoreError::Corrupt {
                        path: key.to_owned(),
                        detail: format!("not a lease record: {e}"),
                    })?;
                Ok((record, Some(obj.tag)))
            }
        }
    }

    /// Writes `record` under the blob lease `lease_id` (none: a create-only write of a blob
    /// nobody can lease yet) if the blob is still at `tag`; `Ok(false)` when a condition fails.
    /// What it wrote is then known.
    async fn write(
        &self,
        key: &str,
        record: &BlobRecord,
        lease_id: Option<&str>,
        tag: Option<&str>,
    ) -> Result<bool> {
        let data = Bytes::from(serde_json::to_vec(record).expect("lease record serializes"));
        let condition = tag.map_or(Condition::Absent, Condition::Matches);
        let written = self
            .bucket
            .upload(key, data, HashMap::new(), condition, lease_id)
            .await;
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        match written {
            Ok(Some(tag)) => {
                known.insert(key.to_owned(), (record.clone(), tag));
                Ok(true)
            }
            // Whatever is there now is not what was known: the answer may have been lost.
            other => {
                known.remove(key);
                other.map(|_| false)
            }
        }
    }

    /// A blob must exist to be leased: one holding a free record, created once (never empty:
    /// reading an empty blob takes two requests, a ranged one refused and a whole one).
    async fn ensure(&self, key: &str) -> Result<()> {
        let free = serde_json::to_vec(&BlobRecord::default()).expect("lease record serializes");
        self.bucket
            .put(key, Bytes::from(free), HashMap::new(), Condition::Absent)
            .await
            .map(|_| ())
    }

    /// Takes the blob lease under `id`, for good.
    async fn take(&self, key: &str, id: &str) -> Result<Took> {
        let options = BlobClientAcquireLeaseOptions {
            proposed_lease_id: Some(id.to_owned()),
            ..Default::default()
        };
        match self.bucket.blob(key).acquire_lease(-1, Some(options)).await {
            Ok(_) => Ok(Took::Taken),
            Err(e) if status(&e) == Some(409) => Ok(Took::Held),
            Err(e) if status(&e) == Some(404) => Ok(Took::Missing),
            Err(e) => Err(client_error(
                &format!("LEASE {}", self.bucket.shown(key)),
                &e,
            )),
        }
    }

    async fn give_back(&self, key: &str, id: &str) {
        if let Err(e) = self
            .bucket
            .blob(key)
            .release_lease(id.to_owned(), None)
            .await
        {
            tracing::debug!(key, error = %scrub(&e.to_string()), "could not release a blob lease (a taker breaks it when the record allows)");
        }
    }

    async fn break_now(&self, key: &str) -> Result<()> {
        let options = BlobClientBreakLeaseOptions {
            break_period: Some(0),
            ..Default::default()
        };
        match self.bucket.blob(key).break_lease(Some(options)).await {
            Ok(_) => Ok(()),
            // Not leased (any more): nothing to break.
            Err(e) if status(&e) == Some(409) => Ok(()),
            Err(e) => Err(client_error(
                &format!("BREAK {}", self.bucket.shown(key)),
                &e,
            )),
        }
    }

    /// Under the blob lease `id`: takes the lease over the record this process last wrote,
    /// without reading it. `Err` when there is no such record, it names a live holder, or it
    /// changed since (then the record must be read), with the lease tried and the version it
    /// said was settled, if a write was tried: its answer may have been lost after it landed.
    async fn over_known(
        &self,
        key: &str,
        id: &str,
        request: &LeaseRequest,
    ) -> Result<std::result::Result<Taken, Option<(Lease, Option<u64>)>>> {
        let Some((mut current, tag)) = self.known(key) else {
            return Ok(Err(None));
        };
        let settled = current.record.settled;
        let Ok(lease) = current.record.acquire(request, OffsetDateTime::now_utc()) else {
            return Ok(Err(None));
        };
        current.blob_lease = Some(id.to_owned());
        if self.write(key, &current, Some(id), Some(&tag)).await? {
            return Ok(Ok(Taken { lease, settled }));
        }
        Ok(Err(Some((lease, settled))))
    }

    /// The blob stays leased by a taker the record does not name: waits a little, and once
    /// it has stayed so [`FREE_BUT_LEASED`] times, breaks that blob lease (its taker died
    /// holding it).
    async fn wait_or_break(&self, key: &str, times: &mut u32, attempt: u32) -> Result<()> {
        *times += 1;
        if *times >= FREE_BUT_LEASED {
            *times = 0;
            self.break_now(key).await
        } else {
            pause(attempt).await;
            Ok(())
        }
    }

    /// Takes the blob lease back under `id` for a holder whose live lease the record names:
    /// another taker holds the blob lease then only to read that record (it may write nothing
    /// under it), or died holding it, so its blob lease is broken. Waiting for it instead could
    /// outlast the lease itself, and stop the job mid-run.
    async fn take_back(&self, key: &str, id: &str) -> Result<()> {
        if self.take(key, id).await? == Took::Held {
            self.break_now(key).await?;
            self.take(key, id).await?;
        }
        Ok(())
    }

    fn contended(key: &str) -> StoreError {
        backend_error(
            format!("the blob lease on {key} stayed contended; try again"),
            true,
        )
    }
}

#[async_trait]
impl LeaseKeeper for BlobLeases {
    async fn record(&self, base: &str) -> Result<LeaseRecord> {
        Ok(self.read(&Self::key(base)).await?.0.record)
    }

    async fn acquire(&self, ws: &WorkspaceId, base: &str, request: &LeaseRequest) -> Result<Taken> {
        let key = Self::key(base);
        let held = |holder: Lease| StoreError::LeaseHeld {
            workspace: ws.clone(),
            holder: Box::new(holder),
        };
        let mut free_but_leased = 0;
        // A `lease.json` this taker made, holding its lease: its blob lease is still to take.
        let mut made: Option<(Lease, String)> = None;
        // One it tried to make and was told it could not: the answer to a first try may have
        // been lost after it landed. Its blob lease id is kept, so that the record it may have
        // made names the blob lease taken next.
        let mut unsure: Option<(Lease, String)> = None;
        for attempt in 0..ATTEMPTS {
            let id = made
                .as_ref()
                .or(unsure.as_ref())
                .map_or_else(new_lease_id, |(_, id)| id.clone());
            match self.take(&key, &id).await? {
                Took::Taken => {}
                Took::Missing if made.is_some() => {
                    return Err(backend_error(
                        format!("{key} was deleted while its lease was being taken; try again"),
                        true,
                    ));
                }
                // The workspace's first lease: made holding it, create-only (another taker
                // that made it first is then taken from as ever).
                Took::Missing => {
                    let mut first = BlobRecord::default();
                    let lease = first
                        .record
                        .acquire(request, OffsetDateTime::now_utc())
                        .map_err(|holder| held(*holder))?;
                    first.blob_lease = Some(id.clone());
                    if self.write(&key, &first, None, None).await? {
                        made = Some((lease, id));
                    } else {
                        unsure = Some((lease, id));
                    }
                    continue;
                }
                // The record made names this taker's live lease: another taker holds the blob
                // lease only to read that (it may write nothing under it), or died holding it.
                // Broken at once: waiting for many contenders to take and give it back in turn
                // can outlast every attempt. Unless the record changed since (broken by hand,
                // and maybe taken by another): then this taker starts again as any other.
                Took::Held if made.is_some() => {
                    let recorded = self.read(&key).await?.0.record.held;
                    if recorded.as_ref() == made.as_ref().map(|(lease, _)| lease) {
                        self.break_now(&key).await?;
                    } else {
                        made = None;
                    }
                    continue;
                }
                Took::Held => {
                    let now = OffsetDateTime::now_utc();
                    match self.read(&key).await?.0.record.held {
                        // The record this taker tried to make, landed with its answer lost:
                        // made after all.
                        Some(holder) if unsure.as_ref().is_some_and(|(l, _)| *l == holder) => {
                            made = unsure.take();
                        }
                        Some(holder) if !holder.is_expired_at(now) => return Err(held(holder)),
                        // Its holder died or stalled past its expiry: the record allows the
                        // break.
                        Some(_) => self.break_now(&key).await?,
                        // Free, yet leased: another taker is between its take and its write,
                        // or died there. Wait a little; break only if it stays so.
                        None => {
                            self.wait_or_break(&key, &mut free_but_leased, attempt)
                                .await?;
                        }
                    }
                    continue;
                }
            }
            if let Some((lease, _)) = made {
                return Ok(Taken {
                    lease,
                    settled: None,
                });
            }
            // The record as this process last wrote it, when it did: written over unread.
            let tried = match self.over_known(&key, &id, request).await? {
                Ok(taken) => return Ok(taken),
                Err(tried) => tried,
            };
            let (mut current, tag) = self.read(&key).await?;
            // That write, or the making of the record, landed with its answer lost (the
            // client sent it again).
            let made_unsure = unsure.take().map(|(lease, _)| (lease, None));
            if let Some((lease, settled)) = tried
                .into_iter()
                .chain(made_unsure)
                .find(|(lease, _)| current.record.held.as_ref() == Some(lease))
            {
                return Ok(Taken { lease, settled });
            }
            let settled = current.record.settled;
            match current.record.acquire(request, OffsetDateTime::now_utc()) {
                Err(holder) => {
                    self.give_back(&key, &id).await;
                    return Err(held(*holder));
                }
                Ok(lease) => {
                    current.blob_lease = Some(id.clone());
                    if self
                        .write(&key, &current, Some(&id), tag.as_deref())
                        .await?
                    {
                        return Ok(Taken { lease, settled });
                    }
                    // The client sent the write again after its answer was lost, and the first
                    // try landed: the record holds this very lease (its time to the
                    // nanosecond), under this blob lease.
                    if self.read(&key).await?.0.record.held.as_ref() == Some(&lease) {
                        return Ok(Taken { lease, settled });
                    }
                    // Broken by another taker between our take and our write.
                    self.give_back(&key, &id).await;
                    pause(attempt).await;
                }
            }
        }
        let holder = self.read(&key).await?.0.record.held;
        // A lease this taker made (or tried to, its answer lost) that the record still holds
        // is its own: nobody else may change the record while it is live. Its renewals take
        // the blob lease (see `take_back`).
        if let Some((lease, _)) = made
            .into_iter()
            .chain(unsure)
            .find(|(lease, _)| holder.as_ref() == Some(lease))
        {
            return Ok(Taken {
                lease,
                settled: None,
            });
        }
        match holder {
            Some(holder) if !holder.is_expired_at(OffsetDateTime::now_utc()) => Err(held(holder)),
            _ => Err(Self::contended(&key)),
        }
    }

    async fn renew(
        &self,
        ws: &WorkspaceId,
        base: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease> {
        let key = Self::key(base);
        let lost = |reason: String| StoreError::LeaseLost {
            workspace: ws.clone(),
            owner: lease.owner.clone(),
            fence: lease.fence,
            reason,
        };
        // Over the record as this process last wrote it, unread; read when that fails.
        if let Some((mut current, tag)) = self.known(&key)
            && let Ok(renewed) = current.record.renew(lease, ttl, OffsetDateTime::now_utc())
            && let Some(id) = current.blob_lease.clone()
            && self.write(&key, &current, Some(&id), Some(&tag)).await?
        {
            return Ok(renewed);
        }
        for attempt in 0..ATTEMPTS / 3 {
            let (mut current, tag) = self.read(&key).await?;
            let renewed = current
                .record
                .renew(lease, ttl, OffsetDateTime::now_utc())
                .map_err(&lost)?;
            let id = current
                .blob_lease
                .clone()
                .ok_or_else(|| lost("the record names no blob lease".into()))?;
            if self
                .write(&key, &current, Some(&id), tag.as_deref())
                .await?
            {
                return Ok(renewed);
            }
            // The record names our live lease, yet the write failed: our blob lease was broken
            // (a break under way, or one that died half-way), or another holds it. Taken back
            // under our id; the ETag keeps any record written since from being overwritten.
            self.take_back(&key, &id).await?;
            pause(attempt).await;
        }
        // Not lost as far as the record says: the renewal is tried again at the next tick.
        Err(backend_error(
            format!("could not renew the lease in {key}: its blob lease is held by another"),
            true,
        ))
    }

    async fn release(
        &self,
        _ws: &WorkspaceId,
        base: &str,
        lease: &Lease,
        settled: Option<u64>,
    ) -> Result<()> {
        let key = Self::key(base);
        // Over the record as this process last wrote it, unread; read when that fails.
        if let Some((mut current, tag)) = self.known(&key)
            && current.record.release(lease, settled)
            && let Some(id) = current.blob_lease.take()
            && self.write(&key, &current, Some(&id), Some(&tag)).await?
        {
            self.give_back(&key, &id).await;
            return Ok(());
        }
        for attempt in 0..ATTEMPTS / 3 {
            let (mut current, tag) = self.read(&key).await?;
            let now = OffsetDateTime::now_utc();
            let live = current
                .record
                .held
                .as_ref()
                .is_some_and(|h| !h.is_expired_at(now));
            if !current.record.release(lease, settled) {
                // Not ours any more: nothing to give back.
                return Ok(());
            }
            let Some(id) = current.blob_lease.take() else {
                return Ok(());
            };
            if self
                .write(&key, &current, Some(&id), tag.as_deref())
                .await?
            {
                self.give_back(&key, &id).await;
                return Ok(());
            }
            // Another's blob lease is broken only while our recorded lease is live: once it
            // expired, a taker may hold the blob lease by right.
            if live {
                self.take_back(&key, &id).await?;
            } else {
                self.take(&key, &id).await?;
            }
            pause(attempt).await;
        }
        Err(Self::contended(&key))
    }

    async fn break_lease(
        &self,
        _ws: &WorkspaceId,
        base: &str,
        only: Option<u64>,
    ) -> Result<Option<Lease>> {
        let key = Self::key(base);
        self.ensure(&key).await?;
        for attempt in 0..ATTEMPTS {
            // Not the lease to break: its holder's blob lease is left alone.
            if let Some(fence) = only
                && self.read(&key).await?.0.record.held.map(|h| h.fence) != Some(fence)
            {
                return Ok(None);
            }
            self.break_now(&key).await?;
            let id = new_lease_id();
            if self.take(&key, &id).await? != Took::Taken {
                pause(attempt).await;
                continue;
            }
            let (mut current, tag) = self.read(&key).await?;
            let broken = current.record.break_lease(only);
            if only.is_some() && broken.is_none() {
                // Taken by another since it was read: left to its holder, who takes its blob
                // lease back at its next renewal.
                self.give_back(&key, &id).await;
                return Ok(None);
            }
            current.blob_lease = None;
            let written = self
                .write(&key, &current, Some(&id), tag.as_deref())
                .await?;
            self.give_back(&key, &id).await;
            if written {
                return Ok(broken);
            }
        }
        Err(Self::contended(&key))
    }
}
