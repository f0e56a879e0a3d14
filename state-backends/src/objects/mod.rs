//! A [`StateStore`] over any object bucket with conditional writes: S3, GCS and Azure Blob
//! differ only in their [`Bucket`] (how an object is read, written under a condition, copied,
//! listed) and, where the cloud offers a better lock than an object, in their [`LeaseKeeper`].
//! The commit protocol, the fencing, the backups and the change marks are written once, here.
//!
//! Layout under `<prefix>/<tenant>/<workspace>/`:
//! - `versions/<n:010>.tfstate`: every accepted state, created once with a create-only
//!   condition (`If-None-Match: *`, `ifGenerationMatch=0`). That conditional create **is** the
//!   commit: of two writers that read version `n`, exactly one creates `n + 1`, the other gets
//!   412 (a conflict). The version's facts (serial, lineage, sha256, time) are its object
//!   metadata. A deletion is a marker version (empty, `terrace-kind: deleted`), so numbering
//!   goes on and history stays.
//! - `terraform.tfstate`: a server-side copy of the current version, carrying its number in
//!   its metadata. It is where a reader starts; a reader then checks that version `n + 1` does
//!   not exist (a writer may have died between its commit and its copy), so the copy is a hint
//!   that can lag, never a source of truth.
//! - `lease.json` (lock-object mode): the [`LeaseRecord`], changed only when its tag (ETag,
//!   generation) still matches, or created only if absent the first time.
//! - `backups/<label>_<n:010>_<sha256>.tfstate`: server-side copies of version `n`, named by
//!   what they hold, so a listing says every backup's label, version and digest. (Runners
//!   before 2026-11-25 wrote `backups/<label>.tfstate` and recorded them in
//!   `backups/index.json`; those are still listed, restored from and pruned.)
//! - `runs/<job-id>/…`: run artifacts.
//!
//! and `<prefix>/_changes/<tenant>/<workspace>/<n:010>-<sha256>` (`-deleted` for a deletion),
//! written after every commit and deleted by the backup sweep once it has copied version `n`
//! or a later one: the sweep lists only these, and the names say which version to copy, so it
//! costs a copy and the marks' deletion per changed workspace. A mark is never rewritten, so
//! deleting the ones listed never drops a later write's. (Older runners wrote one mark per
//! workspace, `_changes/<tenant>/<workspace>`, cleared only if its tag was still the listed
//! one; such a mark sends the sweep to the current state, as before.)
//!
//! Writes are fenced by reading the lease immediately before the conditional create: an object
//! store has no condition across two objects, so a writer whose lease runs out in the
//! milliseconds between the two can still land one write, and that write is still a checked
//! successor of the version it read. A writer that vouches for its own lease
//! ([`Fence::confirmed_until`]: a runner that renewed it and fences itself before it could
//! expire) skips that read, and one that knows the newest version (it read or wrote it last)
//! skips reading that too: the conditional create alone is then the write, one round trip.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use time::OffsetDateTime;

use crate::lease::{LeaseRecord, check_put};
use crate::retention::Retention;
use crate::{
    BackupInfo, Changed, CurrentState, Fence, Lease, LeaseRequest, Marked, NewState, PutMode,
    Result, Snapshot, StateStore, StoreError, VersionInfo, VersionToken, WorkspaceId, sha256_hex,
};

/// How a write is conditioned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition<'a> {
    None,
    /// Only if the key does not exist.
    Absent,
    /// Only if the object's tag (ETag, generation) is this one.
    Matches(&'a str),
}

/// One object from a listing.
#[derive(Clone, Debug)]
pub struct Listed {
    pub key: String,
    /// What a [`Condition::Matches`] compares with (ETag, generation).
    pub tag: String,
    pub size: u64,
}

/// One object, read whole.
#[derive(Clone, Debug)]
pub struct Object {
    pub data: Bytes,
    pub tag: String,
    pub metadata: HashMap<String, String>,
}

/// What a cloud's object storage must offer. Keys are full object names.
#[async_trait]
pub trait Bucket: Send + Sync + Debug {
    /// The backend's name in errors and [`StateStore::kind`] (`s3`, `gcs`).
    fn backend(&self) -> &'static str;
    async fn get(&self, key: &str) -> Result<Option<Object>>;
    /// The object's custom metadata, without its content.
    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>>;
    /// Writes `data`: the written object's tag where the bucket answers with it
    /// (`Ok(Some(None))` where it does not), `Ok(None)` when the condition failed (412, or
    /// 409 for a concurrent conditional write).
    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<Option<String>>>;
    /// Writes `data`; `Ok(false)` when the condition failed.
    async fn put(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<bool> {
        Ok(self
            .put_tagged(key, data, metadata, condition)
            .await?
            .is_some())
    }
    /// A server-side copy; `metadata` replaces the source's when given.
    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()>;
    /// Deletes; a missing object is not an error.
    async fn delete(&self, key: &str) -> Result<()>;
    /// How many keys [`Bucket::delete_many`] deletes in one request (S3's `DeleteObjects`:
    /// 1,000); 1 where each key is its own request.
    fn deletes_per_request(&self) -> usize {
        1
    }
    /// Deletes every key; a missing object is not an error.
    async fn delete_many(&self, keys: &[String]) -> Result<()> {
        for key in keys {
            self.delete(key).await?;
        }
        Ok(())
    }
    /// Clears what keeps a write of the lock object `key` out although its condition holds,
    /// where the bucket has such a thing: on Azure, a blob lease on `lease.json` that runners
    /// up to 2026-11-29 took to change it (one that died holding it held it for good).
    /// [`LockObject`] asks only when a write was refused at the tag the object still has, and
    /// only before a write its record allows; that write's condition still decides.
    async fn unlock(&self, _key: &str) -> Result<()> {
        Ok(())
    }
    /// Whether an empty lock object is a lease never recorded (fences start at 1) rather than
    /// a damaged record: on Azure, where runners up to 2026-11-29 made it empty only to
    /// blob-lease it. Elsewhere an empty lock object is reported as corrupt, since reading it
    /// as free would start fences again.
    fn empty_lock_object_is_unrecorded(&self) -> bool {
        false
    }
    /// Clears a change mark only if its tag is still `tag`: deleted, or emptied where the
    /// cloud (or its emulator) honours conditions on writes but not on deletes. A mark written
    /// again since it was listed stays. Listings skip empty marks.
    async fn clear_if(&self, key: &str, tag: &str) -> Result<()>;
    /// Every object under `prefix`, all pages.
    async fn list(&self, prefix: &str) -> Result<Vec<Listed>>;
    /// The names of the "folders" right under `prefix` (which ends with `/`).
    async fn folders(&self, prefix: &str) -> Result<Vec<String>>;
}

/// A lease kept outside the bucket (a DynamoDB item). `key` names the workspace
/// (`<prefix>/<tenant>/<workspace>`).
#[async_trait]
pub trait LeaseKeeper: Send + Sync + Debug {
    async fn record(&self, key: &str) -> Result<LeaseRecord>;
    /// Takes the lease, and says what its last release recorded as settled
    /// ([`LeaseRecord::settled`]; `None` when in doubt, as after a lost answer).
    async fn acquire(&self, ws: &WorkspaceId, key: &str, request: &LeaseRequest) -> Result<Taken>;
    async fn renew(
        &self,
        ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease>;
    /// Lets `lease` go, if it is still the recorded one, recording `settled`.
    async fn release(
        &self,
        ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        settled: Option<u64>,
    ) -> Result<()>;
    /// Breaks the lease held, or only the one with fence `only` when given.
    async fn break_lease(
        &self,
        ws: &WorkspaceId,
        key: &str,
        only: Option<u64>,
    ) -> Result<Option<Lease>>;
}

/// A lease just taken, with the newest version its last release knew for sure.
#[derive(Clone, Debug)]
pub struct Taken {
    pub lease: Lease,
    pub settled: Option<u64>,
}

/// The store over a [`Bucket`]; the lease in a lock object ([`LockObject`]) unless another
/// [`LeaseKeeper`] is given.
#[derive(Clone, Debug)]
pub struct BucketStore<B> {
    bucket: B,
    prefix: String,
    leases: Arc<dyn LeaseKeeper>,
    /// Whether `leases` is the lock object over `bucket` (made again over a mapped bucket).
    lock_object: bool,
    /// Each workspace's newest version as this store last read or wrote it: its number and
    /// whether it is a deletion. Only a guess for the next write, which its create-only
    /// condition checks (see `commit`).
    heads: Arc<std::sync::Mutex<HashMap<WorkspaceId, (u64, bool)>>>,
    /// Per workspace, the follow-ups of its last vouched write still under way (see `put`).
    tails: Arc<std::sync::Mutex<HashMap<WorkspaceId, tokio::task::JoinHandle<()>>>>,
    /// When the bucket (or the lease keeper) last answered a call of this store.
    answered: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// Per workspace whose lease this store took: what it knows for sure of the newest
    /// version and of the copy while that lease is its own (see [`versions::Held`]).
    held: Arc<std::sync::Mutex<HashMap<WorkspaceId, versions::Held>>>,
}

impl<B: Bucket + Clone + 'static> BucketStore<B> {
    /// A store under `prefix` (empty for the bucket's root).
    pub fn over(bucket: B, prefix: &str, leases: Option<Arc<dyn LeaseKeeper>>) -> Self {
        let lock_object = leases.is_none();
        let leases = leases.unwrap_or_else(|| Arc::new(LockObject::new(bucket.clone())));
        Self {
            bucket,
            prefix: prefix.trim_matches('/').to_owned(),
            leases,
            lock_object,
            heads: Arc::default(),
            tails: Arc::default(),
            answered: Arc::default(),
            held: Arc::default(),
        }
    }

    /// The same store over a wrapped bucket (one that counts calls, say); a lock object is
    /// then read and written through the wrapped bucket too.
    pub fn map_bucket<C: Bucket + Clone + 'static>(
        self,
        wrap: impl FnOnce(B) -> C,
    ) -> BucketStore<C> {
        let bucket = wrap(self.bucket);
        let leases: Arc<dyn LeaseKeeper> = if self.lock_object {
            Arc::new(LockObject::new(bucket.clone()))
        } else {
            self.leases
        };
        BucketStore {
            bucket,
            prefix: self.prefix,
            leases,
            lock_object: self.lock_object,
            heads: self.heads,
            tails: self.tails,
            answered: self.answered,
            held: self.held,
        }
    }
}

impl<B: Bucket> BucketStore<B> {
    pub fn bucket(&self) -> &B {
        &self.bucket
    }

    /// The bucket alone (to read other things in it: published templates, say).
    pub fn into_bucket(self) -> B {
        self.bucket
    }

    fn root(&self) -> String {
        if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        }
    }

    fn base(&self, ws: &WorkspaceId) -> String {
        format!("{}{}/{}", self.root(), ws.tenant(), ws.workspace())
    }

    fn key(&self, ws: &WorkspaceId, rest: &str) -> String {
        format!("{}/{rest}", self.base(ws))
    }

    fn changes_prefix(&self) -> String {
        format!("{}_changes/", self.root())
    }

    fn change_key(&self, ws: &WorkspaceId) -> String {
        format!(
            "{}{}/{}",
            self.changes_prefix(),
            ws.tenant(),
            ws.workspace()
        )
    }

    /// The number after `number`; the numbers come from the bucket (metadata, key names).
    fn successor(&self, ws: &WorkspaceId, number: u64) -> Result<u64> {
        number.checked_add(1).ok_or_else(|| {
            self.corrupt(
                &self.key(ws, "terraform.tfstate"),
                "a version number at the end of its range",
            )
        })
    }

    /// Notes that the store answered (a call returned without a transport error).
    fn heard<T>(&self, outcome: Result<T>) -> Result<T> {
        if outcome.is_ok() {
            *self.answered.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(std::time::Instant::now());
        }
        outcome
    }

    /// Whether the store answered within [`crate::ANSWERING`].
    fn live(&self) -> bool {
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() <= crate::ANSWERING)
    }

    fn version_key(&self, ws: &WorkspaceId, number: u64) -> String {
        self.key(ws, &format!("versions/{number:010}.tfstate"))
    }

    fn corrupt(&self, key: &str, detail: &str) -> StoreError {
        corrupt(self.bucket.backend(), key, detail)
    }

    fn gave_up(&self, key: &str) -> StoreError {
        gave_up(self.bucket.backend(), key)
    }

    async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .bucket
            .list(prefix)
            .await?
            .into_iter()
            .map(|o| o.key)
            .collect())
    }

    async fn lease_record(&self, ws: &WorkspaceId) -> Result<LeaseRecord> {
        self.leases.record(&self.base(ws)).await
    }
}

fn corrupt(backend: &str, key: &str, detail: &str) -> StoreError {
    StoreError::Corrupt {
        path: format!("{backend} {key}"),
        detail: detail.to_owned(),
    }
}

fn gave_up(backend: &'static str, key: &str) -> StoreError {
    StoreError::Backend {
        backend,
        message: format!("{key} kept changing under 20 attempts to update it"),
        retryable: true,
        source: None,
    }
}

const META_NUMBER: &str = "terrace-number";
const META_KIND: &str = "terrace-kind";
const META_SERIAL: &str = "terrace-serial";
const META_LINEAGE: &str = "terrace-lineage";
const META_SHA256: &str = "terrace-sha256";
const META_CREATED: &str = "terrace-created";
/// The mark of the write that made a version (state or deletion): a fenced write's token and
/// content's SHA-256, so that the same write sent again after its answer was lost knows the
/// version as its own; an unfenced write's a random one, unique to it.
const META_WRITE: &str = "terrace-write";

fn is_deleted(meta: &HashMap<String, String>) -> bool {
    meta.get(META_KIND).is_some_and(|k| k == "deleted")
}

fn version_number(key: &str) -> Option<u64> {
    key.rsplit('/')
        .next()?
        .strip_suffix(".tfstate")?
        .parse()
        .ok()
}

fn info_metadata(info: &VersionInfo) -> HashMap<String, String> {
    HashMap::from([
        (META_KIND.to_owned(), "state".to_owned()),
        (META_NUMBER.to_owned(), info.number.to_string()),
        (META_SERIAL.to_owned(), info.serial.to_string()),
        (META_LINEAGE.to_owned(), info.lineage.clone()),
        (META_SHA256.to_owned(), info.sha256.clone()),
        (
            META_CREATED.to_owned(),
            info.created_at
                .format(&time::format_description::well_known::Rfc3339)
                .expect("a UTC time formats"),
        ),
    ])
}

fn info_from_metadata(
    number: u64,
    meta: &HashMap<String, String>,
) -> std::result::Result<VersionInfo, String> {
    let get = |k: &str| {
        meta.get(k)
            .ok_or_else(|| format!("metadata {k} is missing"))
    };
    Ok(VersionInfo {
        number,
        serial: get(META_SERIAL)?
            .parse()
            .map_err(|e| format!("serial: {e}"))?,
        lineage: get(META_LINEAGE)?.clone(),
        created_at: OffsetDateTime::parse(
            get(META_CREATED)?,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|e| format!("created: {e}"))?,
        size: 0,
        sha256: get(META_SHA256)?.clone(),
    })
}

mod backups;
mod lease;
mod legacy;
mod store;
mod versions;

pub use backups::PRUNE_EVERY;
use backups::{check_label, mark_from_name};
pub use lease::LockObject;
use legacy::INDEX;
use versions::Newest;

#[cfg(test)]
mod tests;
