//! Leases kept as Azure blob leases: a lease blob per workspace whose content is the
//! [`LeaseRecord`], changed only under the blob's lease, so two runners never both hold it.

use std::collections::HashMap;
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
///   is recorded, writes the new one.
/// - A taker breaks a blob lease only when the record says the lease expired, or when the
///   record stays free while the blob stays leased longer than a take and a write need (its
///   taker died between the two). A live recorded lease makes the taker wait.
/// - Renewing writes the new expiry; releasing clears the record, then gives the blob lease
///   back.
#[derive(Clone, Debug)]
pub struct BlobLeases {
    pub(super) bucket: AzureBucket,
}

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

impl BlobLeases {
    fn key(base: &str) -> String {
        format!("{base}/lease.json")
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

    /// Writes `record` under the blob lease `lease_id` if the blob is still at `tag`;
    /// `Ok(false)` when either condition fails.
    async fn write(
        &self,
        key: &str,
        record: &BlobRecord,
        lease_id: &str,
        tag: Option<&str>,
    ) -> Result<bool> {
        let data = Bytes::from(serde_json::to_vec(record).expect("lease record serializes"));
        let condition = tag.map_or(Condition::Absent, Condition::Matches);
        self.bucket
            .upload(key, data, HashMap::new(), condition, Some(lease_id))
            .await
    }

    /// A blob must exist to be leased: an empty one, created once.
    async fn ensure(&self, key: &str) -> Result<()> {
        self.bucket
            .put(key, Bytes::new(), HashMap::new(), Condition::Absent)
            .await
            .map(|_| ())
    }

    /// Takes the blob lease under `id`, for good; `Ok(false)` when another holds it.
    async fn take(&self, key: &str, id: &str) -> Result<bool> {
        let options = BlobClientAcquireLeaseOptions {
            proposed_lease_id: Some(id.to_owned()),
            ..Default::default()
        };
        match self.bucket.blob(key).acquire_lease(-1, Some(options)).await {
            Ok(_) => Ok(true),
            Err(e) if status(&e) == Some(409) => Ok(false),
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
        self.ensure(&key).await?;
        let held = |holder: Lease| StoreError::LeaseHeld {
            workspace: ws.clone(),
            holder: Box::new(holder),
        };
        let mut free_but_leased = 0;
        for attempt in 0..ATTEMPTS {
            let id = new_lease_id();
            if !self.take(&key, &id).await? {
                let now = OffsetDateTime::now_utc();
                match self.read(&key).await?.0.record.held {
                    Some(holder) if !holder.is_expired_at(now) => return Err(held(holder)),
                    // Its holder died or stalled past its expiry: the record allows the break.
                    Some(_) => self.break_now(&key).await?,
                    // Free, yet leased: another taker is between its take and its write, or
                    // died there. Wait a little; break only if it stays so.
                    None => {
                        free_but_leased += 1;
                        if free_but_leased >= FREE_BUT_LEASED {
                            free_but_leased = 0;
                            self.break_now(&key).await?;
                        } else {
                            pause(attempt).await;
                        }
                    }
                }
                continue;
            }
            let (mut current, tag) = self.read(&key).await?;
            let settled = current.record.settled;
            match current.record.acquire(request, OffsetDateTime::now_utc()) {
                Err(holder) => {
                    self.give_back(&key, &id).await;
                    return Err(held(*holder));
                }
                Ok(lease) => {
                    current.blob_lease = Some(id.clone());
                    if self.write(&key, &current, &id, tag.as_deref()).await? {
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
        match self.read(&key).await?.0.record.held {
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
            if self.write(&key, &current, &id, tag.as_deref()).await? {
                return Ok(renewed);
            }
            // The blob lease was broken while the record still names us (a break under way,
            // or one that died half-way): take it back under our id if it is free. The ETag
            // keeps any record written since from being overwritten.
            self.take(&key, &id).await?;
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
        for attempt in 0..ATTEMPTS / 3 {
            let (mut current, tag) = self.read(&key).await?;
            if !current.record.release(lease, settled) {
                // Not ours any more: nothing to give back.
                return Ok(());
            }
            let Some(id) = current.blob_lease.take() else {
                return Ok(());
            };
            if self.write(&key, &current, &id, tag.as_deref()).await? {
                self.give_back(&key, &id).await;
                return Ok(());
            }
            self.take(&key, &id).await?;
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
            if !self.take(&key, &id).await? {
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
            let written = self.write(&key, &current, &id, tag.as_deref()).await?;
            self.give_back(&key, &id).await;
            if written {
                return Ok(broken);
            }
        }
        Err(Self::contended(&key))
    }
}
