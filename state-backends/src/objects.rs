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
//! successor of the version it read.

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
    /// Writes `data`; `Ok(false)` when the condition failed (412, or 409 for a concurrent
    /// conditional write).
    async fn put(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<bool>;
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
    /// Clears a change mark only if its tag is still `tag`: deleted, or emptied where the
    /// cloud (or its emulator) honours conditions on writes but not on deletes. A mark written
    /// again since it was listed stays. Listings skip empty marks.
    async fn clear_if(&self, key: &str, tag: &str) -> Result<()>;
    /// Every object under `prefix`, all pages.
    async fn list(&self, prefix: &str) -> Result<Vec<Listed>>;
    /// The names of the "folders" right under `prefix` (which ends with `/`).
    async fn folders(&self, prefix: &str) -> Result<Vec<String>>;
}

/// A lease kept outside the bucket (a DynamoDB item, a blob lease). `key` names the workspace
/// (`<prefix>/<tenant>/<workspace>`).
#[async_trait]
pub trait LeaseKeeper: Send + Sync + Debug {
    async fn record(&self, key: &str) -> Result<LeaseRecord>;
    async fn acquire(&self, ws: &WorkspaceId, key: &str, request: &LeaseRequest) -> Result<Lease>;
    async fn renew(
        &self,
        ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease>;
    async fn release(&self, ws: &WorkspaceId, key: &str, lease: &Lease) -> Result<()>;
    /// Breaks the lease held, or only the one with fence `only` when given.
    async fn break_lease(
        &self,
        ws: &WorkspaceId,
        key: &str,
        only: Option<u64>,
    ) -> Result<Option<Lease>>;
}

/// The store over a [`Bucket`]; the lease in a lock object unless a [`LeaseKeeper`] is given.
#[derive(Clone, Debug)]
pub struct BucketStore<B> {
    bucket: B,
    prefix: String,
    leases: Option<Arc<dyn LeaseKeeper>>,
}

impl<B: Bucket> BucketStore<B> {
    /// A store under `prefix` (empty for the bucket's root).
    pub fn over(bucket: B, prefix: &str, leases: Option<Arc<dyn LeaseKeeper>>) -> Self {
        Self {
            bucket,
            prefix: prefix.trim_matches('/').to_owned(),
            leases,
        }
    }

    pub fn bucket(&self) -> &B {
        &self.bucket
    }

    /// The bucket alone (to read other things in it: published templates, say).
    pub fn into_bucket(self) -> B {
        self.bucket
    }

    /// The same store over a wrapped bucket (one that counts calls, say).
    pub fn map_bucket<C: Bucket>(self, wrap: impl FnOnce(B) -> C) -> BucketStore<C> {
        BucketStore {
            bucket: wrap(self.bucket),
            prefix: self.prefix,
            leases: self.leases,
        }
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

    fn version_key(&self, ws: &WorkspaceId, number: u64) -> String {
        self.key(ws, &format!("versions/{number:010}.tfstate"))
    }

    fn corrupt(&self, key: &str, detail: &str) -> StoreError {
        StoreError::Corrupt {
            path: format!("{} {key}", self.bucket.backend()),
            detail: detail.to_owned(),
        }
    }

    fn gave_up(&self, key: &str) -> StoreError {
        StoreError::Backend {
            backend: self.bucket.backend(),
            message: format!("{key} kept changing under 20 attempts to update it"),
            retryable: true,
            source: None,
        }
    }

    /// After a commit: version `number` (with digest `sha256`; `None`: a deletion) is a change
    /// for the backup sweep. A lost mark (the writer died right after its commit) only delays a
    /// backup until the next write.
    async fn mark_changed(
        &self,
        ws: &WorkspaceId,
        number: u64,
        sha256: Option<&str>,
    ) -> Result<()> {
        let key = format!(
            "{}/{number:010}-{}",
            self.change_key(ws),
            sha256.unwrap_or(DELETED_MARK)
        );
        self.bucket
            .put(
                &key,
                Bytes::from(number.to_string()),
                HashMap::new(),
                Condition::None,
            )
            .await
            .map(|_| ())
    }

    fn backup_key(&self, ws: &WorkspaceId, backup: &BackupInfo) -> String {
        self.key(
            ws,
            &format!(
                "backups/{}_{:010}_{}.tfstate",
                backup.label, backup.version, backup.sha256
            ),
        )
    }

    /// A workspace's backups as stored: the copies named by what they hold, and what an older
    /// runner's index records.
    async fn stored_backups(&self, ws: &WorkspaceId) -> Result<Stored> {
        let prefix = self.key(ws, "backups/");
        let mut stored = Stored::default();
        let mut indexed = false;
        for key in self.keys(&prefix).await? {
            let Some(name) = key.strip_prefix(&prefix) else {
                continue;
            };
            if name == INDEX {
                indexed = true;
            } else if let Some(backup) = backup_from_name(name) {
                stored.copies.push((backup, key));
            }
        }
        if indexed {
            stored.index = self
                .backup_index(&self.key(ws, &format!("backups/{INDEX}")))
                .await?
                .0;
        }
        Ok(stored)
    }

    /// Drops the backups `keep` no longer keeps, and copies a later one of the same label
    /// replaced; returns the dropped labels, newest first. An older runner's backups leave its
    /// index first, then go.
    async fn prune(&self, ws: &WorkspaceId, keep: Retention) -> Result<Vec<String>> {
        self.prune_stored(ws, keep, self.stored_backups(ws).await?)
            .await
    }

    /// [`BucketStore::prune`] over backups already listed.
    async fn prune_stored(
        &self,
        ws: &WorkspaceId,
        keep: Retention,
        stored: Stored,
    ) -> Result<Vec<String>> {
        let labels: Vec<String> = stored
            .copies
            .iter()
            .map(|(b, _)| &b.label)
            .chain(stored.index.iter().map(|b| &b.label))
            .cloned()
            .collect();
        let pruned = crate::retention::to_prune(&labels, keep);
        let mut newest: HashMap<&str, u64> = HashMap::new();
        for (b, _) in &stored.copies {
            let n = newest.entry(&b.label).or_default();
            *n = (*n).max(b.version);
        }
        let doomed: Vec<String> = stored
            .copies
            .iter()
            .filter(|(b, _)| pruned.contains(&b.label) || newest[b.label.as_str()] > b.version)
            .map(|(_, key)| key.clone())
            .collect();
        for label in &pruned {
            if stored.index.iter().any(|b| &b.label == label) {
                self.drop_indexed(ws, label).await?;
            }
        }
        self.bucket.delete_many(&doomed).await?;
        Ok(pruned)
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

    // ----- versions -----

    /// The number of the newest committed version (0: none), and whether it is a deletion.
    async fn head_version(&self, ws: &WorkspaceId) -> Result<(u64, bool)> {
        let newest = self.newest(ws, false).await?;
        Ok((newest.number, newest.deleted))
    }

    /// The newest committed version: its number (0: none), whether it is a deletion, its facts
    /// (object metadata) when it is a state, and, when `with_data` and the copy is of that
    /// version, the copy itself (its content and facts, so a reader needs nothing more).
    /// Copies are only ever made of states, and the copy is removed by a deletion, so an
    /// existing copy is never of a marker.
    async fn newest(&self, ws: &WorkspaceId, with_data: bool) -> Result<Newest> {
        let copy_key = self.key(ws, "terraform.tfstate");
        let number_in = |meta: &HashMap<String, String>| {
            meta.get(META_NUMBER)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let copy = if with_data {
            self.bucket
                .get(&copy_key)
                .await?
                .map(|o| (number_in(&o.metadata), o.metadata.clone(), Some(o)))
        } else {
            self.bucket
                .head(&copy_key)
                .await?
                .map(|m| (number_in(&m), m, None))
        };
        let mut newest = match copy {
            Some((number, facts, obj)) => Newest {
                number,
                deleted: number == 0,
                facts: Some(facts),
                copy: obj.filter(|_| number > 0),
            },
            // No copy: a new or deleted workspace. The listing (strongly consistent) says
            // which, and needs no probe after it.
            None => {
                let number = self.highest_listed(ws).await?;
                let mut newest = Newest {
                    number,
                    deleted: true,
                    facts: None,
                    copy: None,
                };
                if number > 0 {
                    let key = self.version_key(ws, number);
                    let meta = self
                        .bucket
                        .head(&key)
                        .await?
                        .ok_or_else(|| self.corrupt(&key, "a listed version does not exist"))?;
                    newest.deleted = is_deleted(&meta);
                    newest.facts = (!newest.deleted).then_some(meta);
                }
                return Ok(newest);
            }
        };
        // The copy may lag a writer that died between its commit and its copy.
        while let Some(meta) = self
            .bucket
            .head(&self.version_key(ws, self.successor(ws, newest.number)?))
            .await?
        {
            newest.number += 1;
            newest.deleted = is_deleted(&meta);
            newest.facts = (!newest.deleted).then_some(meta);
            newest.copy = None;
        }
        Ok(newest)
    }

    async fn highest_listed(&self, ws: &WorkspaceId) -> Result<u64> {
        Ok(self
            .keys(&self.key(ws, "versions/"))
            .await?
            .iter()
            .filter_map(|k| version_number(k))
            .max()
            .unwrap_or(0))
    }

    async fn version_info(&self, ws: &WorkspaceId, number: u64) -> Result<Option<VersionInfo>> {
        let key = self.version_key(ws, number);
        let Some(meta) = self.bucket.head(&key).await? else {
            return Ok(None);
        };
        if is_deleted(&meta) {
            return Ok(None);
        }
        info_from_metadata(number, &meta)
            .map(Some)
            .map_err(|detail| self.corrupt(&key, &detail))
    }

    /// Checks a write (fence and expected version) and commits `data` as the next version.
    async fn commit(
        &self,
        ws: &WorkspaceId,
        mode: &PutMode,
        fence: Option<&Fence>,
        data: Bytes,
        metadata: HashMap<String, String>,
    ) -> Result<u64> {
        // Two reads, side by side: the conditional write below is what orders writers.
        let (head, record) = tokio::join!(self.head_version(ws), async {
            match fence {
                Some(_) => self.lease_record(ws).await,
                None => Ok(LeaseRecord::default()),
            }
        });
        let (number, deleted) = head?;
        let record = record?;
        let current = (!deleted).then(|| VersionToken(number.to_string()));
        check_put(ws, &record, current.as_ref(), mode, fence)?;
        let next = self.successor(ws, number)?;
        let key = self.version_key(ws, next);
        // This write's own mark, to know it again below.
        let mut metadata = metadata;
        let write_id = format!("{:032x}", rand::random::<u128>());
        metadata.insert(META_WRITE.to_owned(), write_id.clone());
        if !self
            .bucket
            .put(&key, data, metadata, Condition::Absent)
            .await?
        {
            // A client that lost the answer to this very write and sent it again finds the
            // version taken, by itself: the version carries this write's mark, and is its.
            let landed = self.bucket.head(&key).await?;
            if landed.is_some_and(|facts| facts.get(META_WRITE) == Some(&write_id)) {
                return Ok(next);
            }
            return Err(StoreError::Conflict {
                workspace: ws.clone(),
                detail: format!("version {next} was written by another writer first"),
            });
        }
        Ok(next)
    }

    // ----- leases -----

    async fn lease_record(&self, ws: &WorkspaceId) -> Result<LeaseRecord> {
        match &self.leases {
            Some(keeper) => keeper.record(&self.base(ws)).await,
            None => Ok(self.lock_object(ws).await?.0),
        }
    }

    async fn lock_object(&self, ws: &WorkspaceId) -> Result<(LeaseRecord, Option<String>)> {
        let key = self.key(ws, "lease.json");
        match self.bucket.get(&key).await? {
            None => Ok((LeaseRecord::default(), None)),
            Some(obj) => {
                let record = serde_json::from_slice(&obj.data)
                    .map_err(|e| self.corrupt(&key, &e.to_string()))?;
                Ok((record, Some(obj.tag)))
            }
        }
    }

    /// Reads the lock object, applies `change`, and writes it back if its tag still matches,
    /// retrying on a concurrent change. `change` returns what to answer and whether to write.
    async fn with_lock_object<T>(
        &self,
        ws: &WorkspaceId,
        mut change: impl FnMut(&mut LeaseRecord) -> Result<(T, bool)> + Send,
    ) -> Result<T> {
        let key = self.key(ws, "lease.json");
        // The record last written and its answer, when the write's condition failed.
        let mut tried: Option<(LeaseRecord, T)> = None;
        for _ in 0..20 {
            let (mut record, tag) = self.lock_object(ws).await?;
            // A client that lost the answer to a write and sent it again finds the object
            // changed, by that very write: the record it wrote is there (a lease carries its
            // time to the nanosecond, so no other writer's record is the same).
            if let Some((wrote, answer)) = tried.take()
                && record == wrote
            {
                return Ok(answer);
            }
            let (answer, write) = change(&mut record)?;
            if !write {
                return Ok(answer);
            }
            let data = Bytes::from(serde_json::to_vec(&record).expect("lease record serializes"));
            let condition = match &tag {
                Some(tag) => Condition::Matches(tag),
                None => Condition::Absent,
            };
            if self
                .bucket
                .put(&key, data, HashMap::new(), condition)
                .await?
            {
                return Ok(answer);
            }
            tried = Some((record, answer));
        }
        Err(self.gave_up(&key))
    }

    /// Copies version `backup.version` as the backup `backup.label`. A copy that failed is
    /// deleted (as far as it can be): a backup is found by listing, so a copy whose name is
    /// there must hold what the name says (an Azure copy can end `failed` with its blob left).
    async fn copy_backup(&self, ws: &WorkspaceId, backup: &BackupInfo) -> Result<()> {
        let to = self.backup_key(ws, backup);
        let copied = self
            .bucket
            .copy(&self.version_key(ws, backup.version), &to, None)
            .await;
        if copied.is_err()
            && let Err(e) = self.bucket.delete(&to).await
        {
            tracing::warn!(workspace = %ws, backup = %backup.label, error = %e, "a failed backup copy was not deleted");
        }
        copied
    }

    /// Applies `keep` to the backups `stored` (listed when `None`); a failure is only logged
    /// (the backup is made, and the next prune drops what this one did not).
    async fn prune_logged(
        &self,
        ws: &WorkspaceId,
        keep: Retention,
        stored: Option<Stored>,
    ) -> Vec<String> {
        let pruned = match stored {
            Some(stored) => self.prune_stored(ws, keep, stored).await,
            None => self.prune(ws, keep).await,
        };
        pruned.unwrap_or_else(|e| {
            tracing::warn!(workspace = %ws, error = %e, "old backups were not pruned; the next prune drops them");
            Vec::new()
        })
    }

    /// Drops an older runner's backup `label`: out of its index (only if the index is still
    /// the one read), then its copy, so an index entry never names a missing copy.
    async fn drop_indexed(&self, ws: &WorkspaceId, label: &str) -> Result<()> {
        let index_key = self.key(ws, &format!("backups/{INDEX}"));
        for _ in 0..20 {
            let (mut index, tag) = self.backup_index(&index_key).await?;
            let before = index.len();
            index.retain(|b| b.label != label);
            if index.len() == before
                || self
                    .put_backup_index(&index_key, &index, tag.as_deref())
                    .await?
            {
                return self
                    .bucket
                    .delete(&self.key(ws, &format!("backups/{label}.tfstate")))
                    .await;
            }
        }
        Err(self.gave_up(&index_key))
    }

    async fn backup_index(&self, key: &str) -> Result<(Vec<BackupInfo>, Option<String>)> {
        match self.bucket.get(key).await? {
            Some(obj) => Ok((
                serde_json::from_slice(&obj.data).map_err(|e| self.corrupt(key, &e.to_string()))?,
                Some(obj.tag),
            )),
            None => Ok((Vec::new(), None)),
        }
    }

    /// Writes the index if it is still the one read (`tag`; `None`: there was none).
    async fn put_backup_index(
        &self,
        key: &str,
        index: &[BackupInfo],
        tag: Option<&str>,
    ) -> Result<bool> {
        let data = Bytes::from(serde_json::to_vec_pretty(index).expect("index serializes"));
        let condition = match tag {
            Some(tag) => Condition::Matches(tag),
            None => Condition::Absent,
        };
        self.bucket.put(key, data, HashMap::new(), condition).await
    }
}

/// A workspace's backups as stored.
#[derive(Default)]
struct Stored {
    /// Copies named by what they hold, with their keys.
    copies: Vec<(BackupInfo, String)>,
    /// What an older runner's `backups/index.json` records.
    index: Vec<BackupInfo>,
}

impl Stored {
    /// One backup per label, oldest first: a copy named by what it holds over an older
    /// runner's index entry, and of those the highest version (a later sweep in the same hour).
    fn merged(&self) -> Vec<BackupInfo> {
        let mut by_label: std::collections::BTreeMap<&str, &BackupInfo> =
            self.index.iter().map(|b| (b.label.as_str(), b)).collect();
        let mut copies: Vec<&BackupInfo> = self.copies.iter().map(|(b, _)| b).collect();
        copies.sort_by_key(|b| b.version);
        for b in copies {
            by_label.insert(&b.label, b);
        }
        by_label.into_values().cloned().collect()
    }
}

/// An older runner's backup index, under `backups/`.
const INDEX: &str = "index.json";
/// A mark's name for a deletion, where a state's has its digest.
const DELETED_MARK: &str = "deleted";
/// The backup sweep applies retention to a workspace when its marks span a multiple of this
/// many versions: a listing of its backups every so often, not one per backup.
pub const PRUNE_EVERY: u64 = 24;

/// The version a mark's name (`<n:010>-<sha256>`, `<n:010>-deleted`) names, and its digest.
fn mark_from_name(name: &str) -> Option<(u64, Option<String>)> {
    let (number, what) = name.split_once('-')?;
    let number = number.parse().ok().filter(|n| *n > 0)?;
    match what {
        DELETED_MARK => Some((number, None)),
        sha if is_sha256(sha) => Some((number, Some(sha.to_owned()))),
        _ => None,
    }
}

/// The backup a copy's name (`<label>_<n:010>_<sha256>.tfstate`) says it is.
fn backup_from_name(name: &str) -> Option<BackupInfo> {
    let mut parts = name.strip_suffix(".tfstate")?.rsplitn(3, '_');
    let (sha256, version, label) = (parts.next()?, parts.next()?, parts.next()?);
    if !is_sha256(sha256) || label.is_empty() || label.contains('/') {
        return None;
    }
    Some(BackupInfo {
        label: label.to_owned(),
        version: version.parse().ok()?,
        sha256: sha256.to_owned(),
    })
}

/// A backup's label is one name: no `/` (it is part of the copy's name).
fn check_label(label: &str) -> Result<()> {
    crate::check_artifact_name("backups", label)?;
    if label.contains('/') {
        return Err(StoreError::InvalidKey(format!("backups/{label}")));
    }
    Ok(())
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What [`BucketStore::newest`] found.
struct Newest {
    number: u64,
    deleted: bool,
    /// The version's facts (its metadata, or the copy's), when it is a state.
    facts: Option<HashMap<String, String>>,
    copy: Option<Object>,
}

const META_NUMBER: &str = "terrace-number";
const META_KIND: &str = "terrace-kind";
const META_SERIAL: &str = "terrace-serial";
const META_LINEAGE: &str = "terrace-lineage";
const META_SHA256: &str = "terrace-sha256";
const META_CREATED: &str = "terrace-created";
/// A random mark of the write that made a version (state or deletion), unique to it.
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

#[async_trait]
impl<B: Bucket + Clone + 'static> StateStore for BucketStore<B> {
    fn kind(&self) -> &'static str {
        self.bucket.backend()
    }

    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>> {
        let Newest {
            number,
            deleted,
            copy,
            ..
        } = self.newest(ws, true).await?;
        if deleted {
            return Ok(None);
        }
        let key = self.version_key(ws, number);
        let obj = match copy {
            Some(copy) => copy,
            None => self
                .bucket
                .get(&key)
                .await?
                .ok_or_else(|| self.corrupt(&key, "the version vanished"))?,
        };
        let mut version =
            info_from_metadata(number, &obj.metadata).map_err(|d| self.corrupt(&key, &d))?;
        version.size = obj.data.len() as u64;
        if sha256_hex(&obj.data) != version.sha256 {
            return Err(self.corrupt(&key, "the content does not match its sha256"));
        }
        Ok(Some(CurrentState {
            token: VersionToken(number.to_string()),
            data: obj.data,
            version,
        }))
    }

    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        let mut info = VersionInfo {
            number: 0,
            serial: state.serial,
            lineage: state.lineage,
            created_at: OffsetDateTime::now_utc(),
            size: state.data.len() as u64,
            sha256: sha256_hex(&state.data),
        };
        // The number is only known at commit; metadata carries it for the copy, so it is
        // filled in by a retry-free two-step: commit with the facts, then copy with the number.
        let mut meta = info_metadata(&info);
        meta.remove(META_NUMBER);
        let number = self.commit(ws, &mode, fence, state.data, meta).await?;
        info.number = number;
        // The version is committed. Then, side by side: its change mark, and the convenience
        // copy with the number a reader starts from (it may lag on a crash).
        let (version_key, copy_key) = (
            self.version_key(ws, number),
            self.key(ws, "terraform.tfstate"),
        );
        let (marked, copied) = tokio::join!(
            self.mark_changed(ws, number, Some(&info.sha256)),
            self.bucket
                .copy(&version_key, &copy_key, Some(info_metadata(&info)))
        );
        if let Err(e) = marked {
            tracing::warn!(workspace = %ws, error = %e, "state version committed, but its change mark failed");
        }
        if let Err(e) = copied {
            tracing::warn!(workspace = %ws, error = %e, "state version committed, but its terraform.tfstate copy failed");
        }
        Ok(info)
    }

    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()> {
        let meta = HashMap::from([(META_KIND.to_owned(), "deleted".to_owned())]);
        let number = self
            .commit(
                ws,
                &PutMode::Update(expected.clone()),
                fence,
                Bytes::new(),
                meta,
            )
            .await?;
        if let Err(e) = self.mark_changed(ws, number, None).await {
            tracing::warn!(workspace = %ws, error = %e, "deletion committed, but its change mark failed");
        }
        self.bucket.delete(&self.key(ws, "terraform.tfstate")).await
    }

    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>> {
        let mut listed: Vec<(u64, u64)> = self
            .bucket
            .list(&self.key(ws, "versions/"))
            .await?
            .iter()
            .filter_map(|o| Some((version_number(&o.key)?, o.size)))
            .collect();
        listed.sort_unstable();
        let mut out = Vec::with_capacity(listed.len());
        for (number, size) in listed {
            if let Some(mut info) = self.version_info(ws, number).await? {
                info.size = size;
                out.push(info);
            }
        }
        Ok(out)
    }

    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes> {
        let key = self.version_key(ws, number);
        match self.bucket.get(&key).await? {
            Some(obj) if !is_deleted(&obj.metadata) => Ok(obj.data),
            _ => Err(StoreError::NotFound {
                workspace: ws.clone(),
                what: format!("state version {number}"),
            }),
        }
    }

    async fn acquire_lease(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease> {
        if let Some(keeper) = &self.leases {
            return keeper.acquire(ws, &self.base(ws), request).await;
        }
        let now = OffsetDateTime::now_utc();
        self.with_lock_object(ws, |record| match record.acquire(request, now) {
            Ok(lease) => Ok((lease, true)),
            Err(holder) => Err(StoreError::LeaseHeld {
                workspace: ws.clone(),
                holder,
            }),
        })
        .await
    }

    async fn renew_lease(&self, ws: &WorkspaceId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if let Some(keeper) = &self.leases {
            return keeper.renew(ws, &self.base(ws), lease, ttl).await;
        }
        let now = OffsetDateTime::now_utc();
        self.with_lock_object(ws, |record| {
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

    async fn release_lease(&self, ws: &WorkspaceId, lease: &Lease) -> Result<()> {
        if let Some(keeper) = &self.leases {
            return keeper.release(ws, &self.base(ws), lease).await;
        }
        self.with_lock_object(ws, |record| Ok(((), record.release(lease))))
            .await
    }

    async fn break_lease(&self, ws: &WorkspaceId, only: Option<u64>) -> Result<Option<Lease>> {
        if let Some(keeper) = &self.leases {
            return keeper.break_lease(ws, &self.base(ws), only).await;
        }
        self.with_lock_object(ws, |record| {
            let broken = record.break_lease(only);
            let write = broken.is_some();
            Ok((broken, write))
        })
        .await
    }

    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        Ok(self.lease_record(ws).await?.held)
    }

    async fn snapshot(
        &self,
        ws: &WorkspaceId,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        check_label(label)?;
        let (newest, stored) = tokio::join!(self.newest(ws, false), self.stored_backups(ws));
        let newest = newest?;
        let Some(facts) = newest.facts.filter(|_| !newest.deleted) else {
            return Ok(None);
        };
        let version_key = self.version_key(ws, newest.number);
        let info = info_from_metadata(newest.number, &facts)
            .map_err(|detail| self.corrupt(&version_key, &detail))?;
        let mut stored = stored?;
        // Unchanged since the latest backup (of the highest version).
        if stored
            .merged()
            .iter()
            .max_by_key(|b| b.version)
            .is_some_and(|b| b.sha256 == info.sha256)
        {
            return Ok(None);
        }
        let backup = BackupInfo {
            label: label.to_owned(),
            version: newest.number,
            sha256: info.sha256,
        };
        self.copy_backup(ws, &backup).await?;
        // Retention over the listing read above, with the new copy.
        stored
            .copies
            .push((backup.clone(), self.backup_key(ws, &backup)));
        let pruned = self.prune_logged(ws, keep, Some(stored)).await;
        Ok(Some(Snapshot { backup, pruned }))
    }

    async fn back_up(
        &self,
        changed: &Changed,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        let Some(marked) = &changed.marked else {
            return self.snapshot(&changed.ws, label, keep).await;
        };
        check_label(label)?;
        let ws = &changed.ws;
        // Retention lists the backups, so it runs when the marks span a multiple of
        // PRUNE_EVERY versions (a deletion's too).
        let prune = marked.last / PRUNE_EVERY > marked.first.saturating_sub(1) / PRUNE_EVERY;
        // The newest mark's version, copied as it is: a deletion has nothing to copy.
        let Some(sha256) = &marked.sha256 else {
            if prune {
                self.prune_logged(ws, keep, None).await;
            }
            return Ok(None);
        };
        let backup = BackupInfo {
            label: label.to_owned(),
            version: marked.last,
            sha256: sha256.clone(),
        };
        if let Err(e) = self.copy_backup(ws, &backup).await {
            // A version that is not there (removed by hand, say) would fail every sweep:
            // there is nothing to copy.
            if self
                .bucket
                .head(&self.version_key(ws, marked.last))
                .await?
                .is_none()
            {
                tracing::warn!(workspace = %ws, version = marked.last, "the marked version does not exist: nothing to back up");
                return Ok(None);
            }
            return Err(e);
        }
        let pruned = if prune {
            self.prune_logged(ws, keep, None).await
        } else {
            Vec::new()
        };
        Ok(Some(Snapshot { backup, pruned }))
    }

    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        Ok(self.stored_backups(ws).await?.merged())
    }

    async fn backup(&self, ws: &WorkspaceId, label: &str) -> Result<Bytes> {
        crate::check_artifact_name("backups", label)?;
        let stored = self.stored_backups(ws).await?;
        // A copy named by what it holds (the highest version of that label), else an older
        // runner's indexed copy.
        let copy = stored
            .copies
            .iter()
            .filter(|(b, _)| b.label == label)
            .max_by_key(|(b, _)| b.version)
            .map(|(b, key)| (b.sha256.clone(), key.clone()));
        let indexed = || {
            stored.index.iter().find(|b| b.label == label).map(|b| {
                let key = self.key(ws, &format!("backups/{label}.tfstate"));
                (b.sha256.clone(), key)
            })
        };
        let not_found = || StoreError::NotFound {
            workspace: ws.clone(),
            what: format!("backup {label}"),
        };
        let (sha256, key) = copy.or_else(indexed).ok_or_else(not_found)?;
        let object = self.bucket.get(&key).await?.ok_or_else(not_found)?;
        crate::check_digest(&format!("backup {label}"), &object.data, &sha256)?;
        Ok(object.data)
    }

    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        self.bucket
            .put(&key, data, HashMap::new(), Condition::None)
            .await?;
        Ok(())
    }

    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        Ok(self.bucket.get(&key).await?.map(|o| o.data))
    }

    async fn delete_artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<()> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        self.bucket.delete(&key).await
    }

    async fn artifacts(&self, ws: &WorkspaceId, job_id: &str) -> Result<Vec<String>> {
        crate::check_artifact_name(job_id, "x")?;
        let prefix = self.key(ws, &format!("runs/{job_id}/"));
        let mut names: Vec<String> = self
            .keys(&prefix)
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    async fn runs(&self, ws: &WorkspaceId) -> Result<Vec<String>> {
        let mut ids = self.bucket.folders(&self.key(ws, "runs/")).await?;
        ids.sort();
        Ok(ids)
    }

    async fn changed(&self) -> Result<Vec<Changed>> {
        /// One workspace's marks as listed.
        #[derive(Default)]
        struct Marks {
            entries: Vec<String>,
            old: bool,
            versions: Vec<(u64, Option<String>)>,
        }
        let prefix = self.changes_prefix();
        let mut found: std::collections::BTreeMap<String, (WorkspaceId, Marks)> =
            std::collections::BTreeMap::new();
        // An emptied mark is a cleared one of an older runner (see `Bucket::clear_if`).
        for o in self
            .bucket
            .list(&prefix)
            .await?
            .into_iter()
            .filter(|o| o.size > 0)
        {
            let Some(rest) = o.key.strip_prefix(&prefix) else {
                continue;
            };
            let parts: Vec<&str> = rest.split('/').collect();
            let Some(Ok(ws)) = parts.get(..2).map(|p| WorkspaceId::new(p[0], p[1])) else {
                continue;
            };
            let marks = &mut found
                .entry(ws.to_string())
                .or_insert_with(|| (ws, Marks::default()))
                .1;
            match parts[2..] {
                // An older runner's one mark per workspace: cleared only if its tag is still
                // this one; it does not say which version, so the sweep reads the current one.
                [] => {
                    marks.entries.push(o.tag);
                    marks.old = true;
                }
                [name] => {
                    if let Some(version) = mark_from_name(name) {
                        marks.entries.push(o.key.clone());
                        marks.versions.push(version);
                    }
                }
                _ => {}
            }
        }
        Ok(found
            .into_values()
            .filter(|(_, marks)| !marks.entries.is_empty())
            .map(|(ws, marks)| {
                let first = marks.versions.iter().map(|(n, _)| *n).min();
                let last = marks.versions.into_iter().max_by_key(|(n, _)| *n);
                let marked = match (first, last) {
                    (Some(first), Some((last, sha256))) if !marks.old => Some(Marked {
                        first,
                        last,
                        sha256,
                    }),
                    _ => None,
                };
                Changed {
                    ws,
                    mark: marks.entries.join("\n"),
                    marked,
                }
            })
            .collect())
    }

    async fn workspaces(&self) -> Result<Vec<WorkspaceId>> {
        let root = self.root();
        let mut out = Vec::new();
        for tenant in self.bucket.folders(&root).await? {
            // `_changes/` and the like: `_` cannot start a tenant name.
            if tenant.starts_with('_') {
                continue;
            }
            for workspace in self.bucket.folders(&format!("{root}{tenant}/")).await? {
                if let Ok(ws) = WorkspaceId::new(&tenant, &workspace) {
                    out.push(ws);
                }
            }
        }
        out.sort_by_key(ToString::to_string);
        Ok(out)
    }

    async fn clear_changed(&self, changed: &Changed) -> Result<()> {
        // Entries are the listed marks' keys, or an older runner's mark's tag (no key's).
        let prefix = self.changes_prefix();
        let (mut keys, tags): (Vec<&str>, Vec<&str>) =
            changed.mark.lines().partition(|e| e.starts_with(&prefix));
        for tag in tags {
            self.bucket
                .clear_if(&self.change_key(&changed.ws), tag)
                .await?;
        }
        // The highest mark goes last: if deleting the others fails midway, the one left still
        // names the newest version, so the next sweep never backs up an older one under a
        // newer label.
        keys.sort_unstable();
        let Some(highest) = keys.pop() else {
            return Ok(());
        };
        let rest: Vec<String> = keys.into_iter().map(str::to_owned).collect();
        self.bucket.delete_many(&rest).await?;
        self.bucket.delete(highest).await
    }

    async fn delete_backup(&self, ws: &WorkspaceId, label: &str) -> Result<()> {
        crate::check_artifact_name("backups", label)?;
        let stored = self.stored_backups(ws).await?;
        if stored.index.iter().any(|b| b.label == label) {
            self.drop_indexed(ws, label).await?;
        }
        let keys: Vec<String> = stored
            .copies
            .into_iter()
            .filter(|(b, _)| b.label == label)
            .map(|(_, key)| key)
            .collect();
        self.bucket.delete_many(&keys).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBucket;

    #[test]
    fn version_keys_parse_back_to_numbers() {
        assert_eq!(
            version_number("p/t/w/versions/0000000042.tfstate"),
            Some(42)
        );
        assert_eq!(version_number("p/t/w/versions/notes.txt"), None);
    }

    /// A memory bucket with a client's troubles: with `sent_twice`, every version and
    /// lock-object write is sent twice, as a client does when the answer to the first is lost
    /// (the first lands, the second finds the version taken); deletions of keys containing
    /// `refuses` fail, and a batch deletion tries every key and reports any that failed (as
    /// S3's `DeleteObjects`).
    #[derive(Clone, Debug, Default)]
    struct Troubled {
        inner: MemoryBucket,
        sent_twice: bool,
        refuses: Option<&'static str>,
    }

    #[async_trait]
    impl Bucket for Troubled {
        fn backend(&self) -> &'static str {
            "troubled"
        }
        async fn get(&self, key: &str) -> Result<Option<Object>> {
            self.inner.get(key).await
        }
        async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
            self.inner.head(key).await
        }
        async fn put(
            &self,
            key: &str,
            data: Bytes,
            metadata: HashMap<String, String>,
            condition: Condition<'_>,
        ) -> Result<bool> {
            if self.sent_twice && (key.contains("/versions/") || key.ends_with("/lease.json")) {
                let first = self
                    .inner
                    .put(key, data.clone(), metadata.clone(), condition)
                    .await?;
                assert!(first, "the first try lands");
            }
            self.inner.put(key, data, metadata, condition).await
        }
        async fn copy(
            &self,
            from: &str,
            to: &str,
            metadata: Option<HashMap<String, String>>,
        ) -> Result<()> {
            self.inner.copy(from, to, metadata).await
        }
        async fn delete(&self, key: &str) -> Result<()> {
            if self.refuses.is_some_and(|r| key.contains(r)) {
                return Err(StoreError::Backend {
                    backend: "troubled",
                    message: format!("DELETE {key}: refused"),
                    retryable: true,
                    source: None,
                });
            }
            self.inner.delete(key).await
        }
        async fn delete_many(&self, keys: &[String]) -> Result<()> {
            let mut failed = Ok(());
            for key in keys {
                if let Err(e) = self.delete(key).await {
                    failed = Err(e);
                }
            }
            failed
        }
        async fn clear_if(&self, key: &str, tag: &str) -> Result<()> {
            self.inner.clear_if(key, tag).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
            self.inner.list(prefix).await
        }
        async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
            self.inner.folders(prefix).await
        }
    }

    fn state(serial: u64) -> crate::NewState {
        crate::NewState::parse(crate::tfstate::empty_state("l-1", serial)).unwrap()
    }

    async fn write(store: &BucketStore<MemoryBucket>, ws: &WorkspaceId, serial: u64) -> u64 {
        let mode = match store.current(ws).await.unwrap() {
            Some(current) => PutMode::Update(current.token),
            None => PutMode::Create,
        };
        store
            .put(ws, state(serial), mode, None)
            .await
            .unwrap()
            .number
    }

    fn label(hour: u64) -> String {
        format!("2026-11-{:02}T{:02}", 1 + hour / 24, hour % 24)
    }

    /// The sweep's marks name their version: the copy is of that version, named by it, and
    /// the marks listed are deleted; a write after the listing keeps its own.
    #[tokio::test]
    async fn marks_name_the_version_the_sweep_copies_and_deletes_only_those_listed() {
        let store = BucketStore::over(MemoryBucket::new(), "p", None);
        let ws = WorkspaceId::new("acme", "marks").unwrap();
        write(&store, &ws, 1).await;
        write(&store, &ws, 2).await;
        let changed = store.changed().await.unwrap().pop().unwrap();
        let marked = changed.marked.clone().expect("the marks name versions");
        assert_eq!((marked.first, marked.last), (1, 2));
        let third = write(&store, &ws, 3).await;
        let made = store
            .back_up(&changed, "2026-11-24T01", Retention::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(made.backup.version, 2, "the version the listed marks name");
        let key = store.backup_key(&ws, &made.backup);
        assert!(key.starts_with("p/acme/marks/backups/2026-11-24T01_0000000002_"));
        let copy = store.bucket.get(&key).await.unwrap().unwrap();
        assert_eq!(copy.data, store.version(&ws, 2).await.unwrap());
        store.clear_changed(&changed).await.unwrap();
        let left = store
            .changed()
            .await
            .unwrap()
            .pop()
            .expect("the later write's mark stays");
        let marked = left.marked.unwrap();
        assert_eq!((marked.first, marked.last), (third, third));
    }

    /// Retention lists a workspace's backups only when its marks span a multiple of
    /// PRUNE_EVERY versions; between two, at most that many backups pile up.
    #[tokio::test]
    async fn retention_runs_every_so_many_versions() {
        let store = BucketStore::over(MemoryBucket::new(), "p", None);
        let ws = WorkspaceId::new("acme", "often").unwrap();
        let keep = Retention {
            hourly: 2,
            daily: 0,
        };
        for hour in 1..PRUNE_EVERY {
            write(&store, &ws, hour).await;
            let changed = store.changed().await.unwrap().pop().unwrap();
            let made = store
                .back_up(&changed, &label(hour), keep)
                .await
                .unwrap()
                .unwrap();
            assert!(made.pruned.is_empty());
            store.clear_changed(&changed).await.unwrap();
        }
        assert_eq!(store.backups(&ws).await.unwrap().len(), 23);
        write(&store, &ws, PRUNE_EVERY).await;
        let changed = store.changed().await.unwrap().pop().unwrap();
        let made = store
            .back_up(&changed, &label(PRUNE_EVERY), keep)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(made.pruned.len(), 22);
        assert_eq!(made.pruned[0], label(22), "newest first");
        store.clear_changed(&changed).await.unwrap();
        let kept: Vec<String> = store
            .backups(&ws)
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.label)
            .collect();
        assert_eq!(kept, [label(23), label(24)]);
        let copies = store.bucket.list("p/acme/often/backups/").await.unwrap();
        assert_eq!(copies.len(), 2, "the dropped copies are gone");

        // Two sweeps in one hour: the later copy of the label replaces the earlier at the
        // next prune, which a deletion's marks bring too.
        for serial in [PRUNE_EVERY + 1, PRUNE_EVERY + 2] {
            write(&store, &ws, serial).await;
            let changed = store.changed().await.unwrap().pop().unwrap();
            store
                .back_up(&changed, &label(25), keep)
                .await
                .unwrap()
                .unwrap();
            store.clear_changed(&changed).await.unwrap();
        }
        let listed = store.bucket.list("p/acme/often/backups/").await.unwrap();
        assert_eq!(
            listed.len(),
            4,
            "two copies of one label until the next prune: {:?}",
            listed.iter().map(|l| &l.key).collect::<Vec<_>>()
        );
        let newest = store.backups(&ws).await.unwrap().pop().unwrap();
        assert_eq!((newest.label, newest.version), (label(25), PRUNE_EVERY + 2));
        for serial in PRUNE_EVERY + 3..2 * PRUNE_EVERY {
            write(&store, &ws, serial).await;
        }
        let token = store.current(&ws).await.unwrap().unwrap().token;
        store.delete_current(&ws, &token, None).await.unwrap();
        let changed = store.changed().await.unwrap().pop().unwrap();
        assert_eq!(changed.marked.as_ref().unwrap().last, 2 * PRUNE_EVERY);
        assert!(
            store
                .back_up(&changed, &label(26), keep)
                .await
                .unwrap()
                .is_none()
        );
        let listed = store.bucket.list("p/acme/often/backups/").await.unwrap();
        assert_eq!(listed.len(), 2, "pruned at a deletion's turn too");
        let kept: Vec<(String, u64)> = store
            .backups(&ws)
            .await
            .unwrap()
            .into_iter()
            .map(|b| (b.label, b.version))
            .collect();
        assert_eq!(
            kept,
            [(label(24), PRUNE_EVERY), (label(25), PRUNE_EVERY + 2)]
        );
    }

    /// An older runner's change mark of workspace `acme/old`: one per workspace, its content
    /// the version.
    async fn older_mark(b: &MemoryBucket) {
        b.put(
            "p/_changes/acme/old",
            Bytes::from("2"),
            HashMap::new(),
            Condition::None,
        )
        .await
        .unwrap();
    }

    /// A bucket an older runner wrote (one mark per workspace, `backups/<label>.tfstate` and
    /// `backups/index.json`): its mark is swept from the current state, its backups are listed
    /// beside the new ones, and retention drops them through the index.
    #[tokio::test]
    async fn an_older_runners_mark_and_backups_are_swept_listed_and_pruned() {
        let store = BucketStore::over(MemoryBucket::new(), "p", None);
        let ws = WorkspaceId::new("acme", "old").unwrap();
        write(&store, &ws, 1).await;
        let changed = store.changed().await.unwrap().pop().unwrap();
        store.clear_changed(&changed).await.unwrap();
        // What an older runner left: the backup of version 1, its index, and its mark for a
        // write whose own mark is lost.
        let v1 = store.versions(&ws).await.unwrap().pop().unwrap();
        let b = &store.bucket;
        b.copy(
            "p/acme/old/versions/0000000001.tfstate",
            "p/acme/old/backups/2026-11-24T01.tfstate",
            None,
        )
        .await
        .unwrap();
        let old = BackupInfo {
            label: "2026-11-24T01".into(),
            version: 1,
            sha256: v1.sha256,
        };
        let index = serde_json::to_vec(&[&old]).unwrap();
        b.put(
            "p/acme/old/backups/index.json",
            index.into(),
            HashMap::new(),
            Condition::None,
        )
        .await
        .unwrap();
        write(&store, &ws, 2).await;
        older_mark(b).await;

        let changed = store.changed().await.unwrap().pop().unwrap();
        assert_eq!(
            changed.marked, None,
            "an older mark sends the sweep to the current state"
        );
        let made = store
            .back_up(&changed, "2026-11-24T02", Retention::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(made.backup.version, 2);
        assert_eq!(
            store.backups(&ws).await.unwrap(),
            [old.clone(), made.backup.clone()]
        );
        store.clear_changed(&changed).await.unwrap();
        assert!(
            store.changed().await.unwrap().is_empty(),
            "both marks cleared"
        );

        // Retention drops the older runner's backup through its index, then its copy.
        let keep_one = Retention {
            hourly: 1,
            daily: 0,
        };
        assert_eq!(store.prune(&ws, keep_one).await.unwrap(), ["2026-11-24T01"]);
        assert_eq!(
            store.backups(&ws).await.unwrap(),
            std::slice::from_ref(&made.backup)
        );
        assert!(
            b.get("p/acme/old/backups/2026-11-24T01.tfstate")
                .await
                .unwrap()
                .is_none()
        );
        let index = b
            .get("p/acme/old/backups/index.json")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&index.data[..], b"[]", "out of the index");

        // An older runner's mark alone: the current state, already backed up, is unchanged.
        older_mark(b).await;
        let changed = store.changed().await.unwrap().pop().unwrap();
        assert_eq!(changed.marked, None);
        assert!(
            store
                .back_up(&changed, "2026-11-24T03", keep_one)
                .await
                .unwrap()
                .is_none()
        );
        store.clear_changed(&changed).await.unwrap();
        assert!(store.changed().await.unwrap().is_empty());
        store.delete_backup(&ws, "2026-11-24T02").await.unwrap();
        assert!(store.backups(&ws).await.unwrap().is_empty());
        assert!(b.list("p/acme/old/backups/2026").await.unwrap().is_empty());
    }

    /// A marked version that is gone (removed by hand) is not a failure every hour: there is
    /// nothing to copy, and no failed copy is left.
    #[tokio::test]
    async fn a_marked_version_that_is_gone_is_nothing_to_back_up() {
        let store = BucketStore::over(MemoryBucket::new(), "p", None);
        let ws = WorkspaceId::new("acme", "gone").unwrap();
        write(&store, &ws, 1).await;
        write(&store, &ws, 2).await;
        let changed = store.changed().await.unwrap().pop().unwrap();
        store
            .bucket
            .delete("p/acme/gone/versions/0000000002.tfstate")
            .await
            .unwrap();
        let made = store
            .back_up(&changed, "2026-11-24T01", Retention::default())
            .await
            .unwrap();
        assert_eq!(made, None, "nothing to copy");
        let listed = store.bucket.list("p/acme/gone/backups/").await.unwrap();
        assert!(listed.is_empty(), "{listed:?}");
    }

    /// Clearing several marks that fails midway leaves the highest: the next sweep still copies
    /// the newest version, never an older one under a newer label.
    #[tokio::test]
    async fn a_clearing_that_fails_midway_leaves_the_highest_mark() {
        let bucket = Troubled {
            refuses: Some("/0000000001-"),
            ..Troubled::default()
        };
        let store = BucketStore::over(bucket, "p", None);
        let ws = WorkspaceId::new("acme", "midway").unwrap();
        for serial in 1..=2 {
            let mode = match store.current(&ws).await.unwrap() {
                Some(current) => PutMode::Update(current.token),
                None => PutMode::Create,
            };
            store.put(&ws, state(serial), mode, None).await.unwrap();
        }
        let changed = store.changed().await.unwrap().pop().unwrap();
        let made = store
            .back_up(&changed, "2026-11-24T01", Retention::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(made.backup.version, 2);
        assert!(store.clear_changed(&changed).await.is_err());
        let left = store.changed().await.unwrap().pop().unwrap();
        assert_eq!(
            left.marked.unwrap().last,
            2,
            "the highest mark is still there"
        );
    }

    #[tokio::test]
    async fn writes_sent_twice_are_one_version_and_one_lease_not_a_conflict() {
        let bucket = Troubled {
            sent_twice: true,
            ..Troubled::default()
        };
        let store = BucketStore::over(bucket, "p", None);
        let ws = WorkspaceId::new("acme", "twice").unwrap();
        let state = |serial: u64| {
            crate::NewState::parse(Bytes::from(format!(
                r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"l-1","outputs":{{}},"resources":[]}}"#
            )))
            .unwrap()
        };
        let mut mode = PutMode::Create;
        for serial in 1..=2 {
            let info = store.put(&ws, state(serial), mode, None).await.unwrap();
            assert_eq!(info.number, serial);
            mode = PutMode::Update(store.current(&ws).await.unwrap().unwrap().token);
        }
        assert_eq!(store.versions(&ws).await.unwrap().len(), 2);
        // The lease too: taken, renewed and let go with every write sent twice, never found
        // held by itself.
        let request = crate::LeaseRequest {
            owner: "job-1".into(),
            ttl: Duration::from_secs(60),
            info: serde_json::Value::Null,
        };
        let lease = store.acquire_lease(&ws, &request).await.unwrap();
        assert_eq!(lease.fence, 1);
        let renewed = store
            .renew_lease(&ws, &lease, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(renewed.fence, 1);
        store.release_lease(&ws, &renewed).await.unwrap();
        assert!(store.lease(&ws).await.unwrap().is_none());
        let PutMode::Update(last) = &mode else {
            unreachable!()
        };
        store.delete_current(&ws, last, None).await.unwrap();
        assert!(store.current(&ws).await.unwrap().is_none());
        // Another writer's version at the same number is still a conflict, even with the same
        // content, or when both are deletions.
        let racing = BucketStore::over(crate::memory::MemoryBucket::new(), "p", None);
        racing
            .put(&ws, state(1), PutMode::Create, None)
            .await
            .unwrap();
        let read = racing.current(&ws).await.unwrap().unwrap().token;
        let (first, second) = tokio::join!(
            racing.put(&ws, state(2), PutMode::Update(read.clone()), None),
            racing.put(&ws, state(2), PutMode::Update(read.clone()), None)
        );
        assert!(
            first.is_ok() != second.is_ok(),
            "exactly one of two same writes wins: {first:?} {second:?}"
        );
        let read = racing.current(&ws).await.unwrap().unwrap().token;
        let (first, second) = tokio::join!(
            racing.delete_current(&ws, &read, None),
            racing.delete_current(&ws, &read, None)
        );
        assert!(
            first.is_ok() != second.is_ok(),
            "exactly one of two deletions wins: {first:?} {second:?}"
        );
        let other = BucketStore::over(crate::memory::MemoryBucket::new(), "p", None);
        other
            .put(&ws, state(1), PutMode::Create, None)
            .await
            .unwrap();
        let read = other.current(&ws).await.unwrap().unwrap().token;
        let taken = other.version_key(&ws, 2);
        other
            .bucket
            .put(
                &taken,
                Bytes::from_static(b"{}"),
                HashMap::new(),
                Condition::Absent,
            )
            .await
            .unwrap();
        let refused = other
            .put(&ws, state(2), PutMode::Update(read), None)
            .await
            .unwrap_err();
        assert!(matches!(refused, StoreError::Conflict { .. }), "{refused}");
    }

    #[test]
    fn version_facts_round_trip_through_metadata() {
        let info = VersionInfo {
            number: 3,
            serial: 7,
            lineage: "l-1".into(),
            created_at: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            size: 0,
            sha256: "ab".into(),
        };
        assert_eq!(info_from_metadata(3, &info_metadata(&info)).unwrap(), info);
        let mut meta = info_metadata(&info);
        meta.remove(META_SERIAL);
        assert!(info_from_metadata(3, &meta).unwrap_err().contains("serial"));
    }
}
