//! One small trait, [`StateStore`], for everything Terrace keeps in a customer's bucket: the
//! current Terraform state of a workspace with its history of versions, the workspace's lease
//! (the lock that recovers by itself), backups, and the artifacts of each run (logs, results).
//!
//! Every backend gives the same guarantees, checked by the shared [`conformance`] suite:
//! - a write is a compare-and-swap on the version the writer last read ([`PutMode`]), so two
//!   writers can never both succeed from the same base;
//! - a write carrying a [`Fence`] is refused once the lease it names has expired, been broken or
//!   been taken over by a newer holder;
//! - every accepted write is a new, immutable, listable version; nothing is ever overwritten;
//! - a lease has an owner, an expiry and a fencing token that grows with every acquisition.
//!
//! The trait knows bytes and keys; what a valid Terraform state is lives in [`tfstate`].

#[cfg(feature = "azure")]
pub mod azure;
#[cfg(feature = "gcp")]
pub mod gcs;
#[cfg(feature = "aws")]
pub mod kms;
pub mod lease;
pub mod memory;
pub mod objects;
pub mod retention;
#[cfg(feature = "aws")]
pub mod s3;
pub mod sealed;
pub mod tfstate;

#[cfg(feature = "fs")]
pub mod fs;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

mod error;
mod workspace;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub use error::{Result, StoreError};

/// How long one attempt of a store call may take by default (`TERRACE_CALL_TIMEOUT`) before
/// its client gives it up and tries again: a request sent and never answered (a stalled
/// connection) must not hold a job, its result or its lease for good.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
pub use workspace::{InvalidName, NAME_RULE, WorkspaceId, check_name};

/// An opaque token naming one version of a workspace's current state, for compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VersionToken(pub String);

impl fmt::Display for VersionToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a state write relates to what the writer last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// The workspace must have no current state.
    Create,
    /// The current state must still be the version the writer read.
    Update(VersionToken),
}

/// How recently a store must have answered for a vouched write to skip reading the lease
/// (see [`StateStore::answering`]): about one round trip's worth of a cloud store under load.
pub const ANSWERING: Duration = Duration::from_secs(1);

/// Proof that a writer holds the workspace's lease: its owner and fencing token.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fence {
    pub owner: String,
    pub token: u64,
    /// Until when the writer itself vouches that the lease is its own: it renewed it and will
    /// stop writing before it could expire (a runner's self-fencing). A fenced write before
    /// then is not preceded by a read of the lease, which costs a store round trip. Such a
    /// writer also calls [`StateStore::settle`] before it lets the lease go, so a store may
    /// finish a state write's follow-ups (a convenience copy, a change mark) after answering
    /// it. `None`: the store reads the lease before every fenced write and finishes each
    /// write before answering. Never stored.
    #[serde(skip)]
    pub confirmed_until: Option<OffsetDateTime>,
}

impl Fence {
    /// This fence, vouched for by its holder until `until` (see [`Fence::confirmed_until`]).
    #[must_use]
    pub fn confirmed_until(mut self, until: OffsetDateTime) -> Self {
        self.confirmed_until = Some(until);
        self
    }

    /// Whether a fenced write at `now` may skip reading the lease: its holder vouches for it.
    pub fn is_confirmed_at(&self, now: OffsetDateTime) -> bool {
        self.confirmed_until.is_some_and(|until| now < until)
    }
}

/// Two fences are the same when they name the same holder and token, whoever vouches for them.
impl PartialEq for Fence {
    fn eq(&self, other: &Self) -> bool {
        self.owner == other.owner && self.token == other.token
    }
}

impl Eq for Fence {}

/// The current state of a workspace and the token to update it.
#[derive(Clone, Debug)]
pub struct CurrentState {
    pub token: VersionToken,
    pub data: Bytes,
    pub version: VersionInfo,
}

/// What a store records about one accepted state version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VersionInfo {
    /// The version's number in this workspace: 1, 2, 3, … in the order they were accepted.
    pub number: u64,
    /// Terraform's serial of the state in this version.
    pub serial: u64,
    /// Terraform's lineage of the state in this version.
    pub lineage: String,
    /// When the store accepted the version.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub created_at: OffsetDateTime,
    /// Size in bytes.
    pub size: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
}

impl VersionInfo {
    /// The token to update the workspace from this version: in every store, its number.
    pub fn token(&self) -> VersionToken {
        VersionToken(self.number.to_string())
    }
}

/// What a new state version is: its content and the facts a store records with it.
#[derive(Clone, Debug)]
pub struct NewState {
    pub data: Bytes,
    pub serial: u64,
    pub lineage: String,
}

impl NewState {
    /// Parses `data` as a Terraform state to learn its serial and lineage.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] when `data` is not a Terraform state of format version 4.
    pub fn parse(data: Bytes) -> Result<Self> {
        let meta = tfstate::StateMeta::parse(&data)?;
        Ok(Self {
            data,
            serial: meta.serial,
            lineage: meta.lineage,
        })
    }
}

/// A request to lease a workspace.
#[derive(Clone, Debug)]
pub struct LeaseRequest {
    /// Who asks: the job id.
    pub owner: String,
    /// How long the lease lasts unless renewed.
    pub ttl: Duration,
    /// Free-form facts shown to whoever finds the lease held (operation, host, who).
    pub info: serde_json::Value,
}

/// A lease on a workspace, as recorded by the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub owner: String,
    /// Grows with every acquisition of this workspace's lease, by anyone.
    pub fence: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub acquired_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    pub info: serde_json::Value,
    /// The expired lease this one took over, if any: its holder stopped without releasing it
    /// (a crash, a kill), so its job may have been interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_over: Option<TakenOver>,
}

/// The expired lease a new lease took over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakenOver {
    pub owner: String,
    pub fence: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub expired_at: OffsetDateTime,
}

impl Lease {
    /// The fence a writer holding this lease presents.
    pub fn fence(&self) -> Fence {
        Fence {
            owner: self.owner.clone(),
            token: self.fence,
            confirmed_until: None,
        }
    }

    /// Whether the lease has run out at `now`.
    pub fn is_expired_at(&self, now: OffsetDateTime) -> bool {
        now >= self.expires_at
    }
}

/// A workspace whose state changed since its change mark was last cleared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    pub ws: WorkspaceId,
    /// Opaque: which writes the marks record.
    pub mark: String,
    /// The versions the marks name, when the listing of marks says which (a bucket store's
    /// marks carry the version and its digest in their names): [`StateStore::back_up`] then
    /// copies that version without reading anything first.
    pub marked: Option<Marked>,
}

/// The versions a workspace's change marks name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marked {
    /// The lowest version number a mark names.
    pub first: u64,
    /// The highest.
    pub last: u64,
    /// The digest of version `last`; `None` when it is a deletion.
    pub sha256: Option<String>,
}

/// A backup copy of a workspace's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BackupInfo {
    /// The backup's label, e.g. the UTC hour `2026-11-21T23`.
    pub label: String,
    /// The state version the backup copies.
    pub version: u64,
    pub sha256: String,
}

/// A backup [`StateStore::snapshot`] made, and the labels retention dropped with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub backup: BackupInfo,
    /// Older backups dropped, newest first.
    pub pruned: Vec<String>,
}

/// The store of Terraform state for many workspaces, in one bucket or folder.
///
/// Implementations must pass [`conformance::run_all`].
#[async_trait]
pub trait StateStore: fmt::Debug + Send + Sync + 'static {
    /// A short name of the backend for logs: `fs`, `memory`, `s3`, …
    fn kind(&self) -> &'static str;

    /// Reads the current state, or `None` when the workspace has none (new, or deleted).
    ///
    /// # Errors
    /// Backend failures.
    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>>;

    /// Whether the store has answered this client very recently (within [`ANSWERING`]). A
    /// vouched fence ([`Fence::confirmed_until`]) spares a write the read of the lease only
    /// then: a store that stops answering gets that read first, which hangs, so no write is
    /// sent to it to land later, after the lease may have passed to another runner. `false`
    /// (the default): every fenced write reads the lease.
    fn answering(&self) -> bool {
        false
    }

    /// Waits for what the store still does after answering the writes of a vouched fence
    /// ([`Fence::confirmed_until`]) to `ws`: none of it is needed to read the state back, but
    /// all of it should be done before the lease is let go. Failures there are logged, never
    /// returned: the versions are already committed.
    async fn settle(&self, _ws: &WorkspaceId) {}

    /// Which version is current, without its content (which a sealing store would have to
    /// open): `None` when the workspace has none.
    ///
    /// # Errors
    /// Backend failures.
    async fn current_version(&self, ws: &WorkspaceId) -> Result<Option<VersionInfo>> {
        Ok(self.current(ws).await?.map(|c| c.version))
    }

    /// Whether the keys this store seals states with (if any) work for `ws` now: checked
    /// before a job changes anything, so that no apply runs whose state could not be saved.
    ///
    /// # Errors
    /// [`StoreError::Sealed`] for a key that cannot seal or open; a retryable backend error
    /// when the key service did not answer.
    async fn check_keys(&self, _ws: &WorkspaceId) -> Result<()> {
        Ok(())
    }

    /// Whether this store seals what holds a state (see [`sealed::seals_artifact`]) with the
    /// workspace's key: `false` for a store that writes them as they are.
    fn seals(&self) -> bool {
        false
    }

    /// A run artifact that this store sealed, opened: one stored plain (which anyone who can
    /// write the bucket could have put there) is refused. A store that does not seal has none.
    ///
    /// # Errors
    /// [`StoreError::Sealed`] for an object that was not sealed (or cannot be opened); backend
    /// failures.
    async fn sealed_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
    ) -> Result<Option<Bytes>> {
        let _ = (job_id, name);
        Err(StoreError::Sealed {
            workspace: ws.clone(),
            what: format!("runs/{job_id}/{name}"),
            reason: "this store has no key to have sealed it".into(),
        })
    }

    /// Accepts `state` as the workspace's new current state and records it as a new version.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when `mode` does not hold; [`StoreError::LeaseLost`] when `fence`
    /// is given and is no longer the live lease. Nothing is written in either case.
    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo>;

    /// Removes the current state (history is kept): the workspace then reads as empty.
    ///
    /// # Errors
    /// As for [`StateStore::put`].
    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()>;

    /// Lists every accepted version, oldest first.
    ///
    /// # Errors
    /// Backend failures.
    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>>;

    /// Reads one version's content.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] when there is no such version.
    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes>;

    /// Takes the workspace's lease if it is free or expired.
    ///
    /// # Errors
    /// [`StoreError::LeaseHeld`] naming the holder when someone else holds a live lease.
    async fn acquire_lease(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease>;

    /// Extends a live lease held by `lease.owner` with `lease.fence` by `ttl` from now.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the lease expired, was broken or was taken over.
    async fn renew_lease(&self, ws: &WorkspaceId, lease: &Lease, ttl: Duration) -> Result<Lease>;

    /// Gives the lease back. Releasing a lease that is already gone is not an error.
    ///
    /// # Errors
    /// Backend failures.
    async fn release_lease(&self, ws: &WorkspaceId, lease: &Lease) -> Result<()>;

    /// Breaks the lease held, live or not, and returns it; with `only`, only if its fence is
    /// that one (a lease taken since it was read stays). For operators only: the broken
    /// holder's writes are refused from then on.
    ///
    /// # Errors
    /// Backend failures.
    async fn break_lease(&self, ws: &WorkspaceId, only: Option<u64>) -> Result<Option<Lease>>;

    /// The lease as recorded (live, expired, or none).
    ///
    /// # Errors
    /// Backend failures.
    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>>;

    /// Copies the current state to the backup `label` unless the latest backup already holds the
    /// same state, and drops the backups `keep` no longer keeps (a backup is never listed
    /// without its copy). Returns the new backup and what was dropped, or `None` when nothing
    /// changed.
    ///
    /// # Errors
    /// Backend failures.
    async fn snapshot(
        &self,
        ws: &WorkspaceId,
        label: &str,
        keep: retention::Retention,
    ) -> Result<Option<Snapshot>>;

    /// Backs up what a change mark says changed ([`StateStore::changed`]): by default the
    /// current state, as [`StateStore::snapshot`] does. A store whose marks name the version
    /// ([`Changed::marked`]) copies that version as it is, without reading first, and applies
    /// retention only now and then, so a sweep costs a copy and the marks' clearing per
    /// changed workspace. `None` when there is nothing to back up (a deletion, or unchanged).
    ///
    /// # Errors
    /// Backend failures.
    async fn back_up(
        &self,
        changed: &Changed,
        label: &str,
        keep: retention::Retention,
    ) -> Result<Option<Snapshot>> {
        self.snapshot(&changed.ws, label, keep).await
    }

    /// Lists backups, oldest first.
    ///
    /// # Errors
    /// Backend failures.
    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>>;

    /// Reads the backup `label` itself (the copy, not the version it was copied from, which
    /// a lifecycle rule or a deletion may have removed since), opened as a version is.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown label; [`StoreError::Corrupt`] for a copy whose
    /// content is not what its name or index says; backend failures.
    async fn backup(&self, ws: &WorkspaceId, label: &str) -> Result<Bytes>;

    /// Writes a run artifact, `runs/<job_id>/<name>`, replacing any previous one.
    ///
    /// # Errors
    /// Backend failures.
    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()>;

    /// Reads a run artifact, or `None` when absent.
    ///
    /// # Errors
    /// Backend failures.
    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>>;

    /// Deletes a run artifact; deleting an absent one is not an error.
    ///
    /// # Errors
    /// Backend failures.
    async fn delete_artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<()>;

    /// Lists the names of a run's artifacts (relative to the run), sorted.
    ///
    /// # Errors
    /// Backend failures.
    async fn artifacts(&self, ws: &WorkspaceId, job_id: &str) -> Result<Vec<String>>;

    /// Lists the ids of the runs that have artifacts in the workspace (`runs/<job_id>/`),
    /// sorted by id; one listing, whatever the runs hold. Includes the workspace's own records
    /// (`_workspace`): callers that want jobs only skip ids starting with `_`.
    ///
    /// # Errors
    /// Backend failures.
    async fn runs(&self, ws: &WorkspaceId) -> Result<Vec<String>>;

    /// The workspaces whose state changed (a write or a deletion) since their change mark was
    /// last cleared: what the backup sweep visits. Costs calls in proportion to the changed
    /// workspaces, not to all of them.
    ///
    /// # Errors
    /// Backend failures.
    async fn changed(&self) -> Result<Vec<Changed>>;

    /// Every workspace that holds anything (a state, history, a lease record or run records),
    /// sorted: what the drift sweep visits. Costs one listing per tenant, not one per object.
    ///
    /// # Errors
    /// Backend failures.
    async fn workspaces(&self) -> Result<Vec<WorkspaceId>>;

    /// Clears a workspace's change mark if it is still the one [`StateStore::changed`]
    /// returned; a write since then keeps it, so the next sweep sees that write.
    ///
    /// # Errors
    /// Backend failures.
    async fn clear_changed(&self, changed: &Changed) -> Result<()>;
}

/// What every [`StateStore`] can do with its required methods alone: operators' restores and
/// the fenced artifact write, written once for every store.
#[async_trait]
pub trait StateStoreExt: StateStore {
    /// Writes a run artifact only while `fence` still holds the workspace's lease, so a runner
    /// that lost its lease cannot overwrite what a later run of the same job wrote (its
    /// `result.json`, its records). Fenced as state writes are on object stores: the lease is
    /// read immediately before the write, unless the fence's holder vouches for it
    /// ([`Fence::confirmed_until`]).
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the lease has expired, been broken or taken over;
    /// backend failures.
    async fn put_artifact_fenced(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
        fence: &Fence,
    ) -> Result<()> {
        let now = OffsetDateTime::now_utc();
        if fence.is_confirmed_at(now) && self.answering() {
            return self.put_artifact(ws, job_id, name, data).await;
        }
        let reason = match self.lease(ws).await? {
            Some(lease) if lease.owner == fence.owner && lease.fence == fence.token => {
                if lease.is_expired_at(now) {
                    Some("the lease has expired".to_owned())
                } else {
                    None
                }
            }
            Some(lease) => Some(format!(
                "the lease is now {}'s (fence {})",
                lease.owner, lease.fence
            )),
            None => Some("the lease was released or broken".to_owned()),
        };
        if let Some(reason) = reason {
            return Err(StoreError::LeaseLost {
                workspace: ws.clone(),
                owner: fence.owner.clone(),
                fence: fence.token,
                reason,
            });
        }
        self.put_artifact(ws, job_id, name, data).await
    }

    /// Rolls the workspace forward to the content of an old version: the old state, with its
    /// serial raised above the current one, becomes a new version. History is untouched.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown version; [`StoreError::OtherLineage`] when the
    /// old version belongs to another lineage than the current state; conflicts as for `put`.
    async fn restore(
        &self,
        ws: &WorkspaceId,
        number: u64,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        let old = self.version(ws, number).await?;
        roll_forward(self, ws, &old, &format!("version {number}"), fence).await
    }

    /// Rolls the workspace forward to the content of the backup `label`, read from the backup
    /// itself ([`StateStore::backup`]), so it brings a state back even when every version is
    /// gone; checked and written as [`StateStoreExt::restore`] writes an old version.
    ///
    /// # Errors
    /// As [`StateStore::backup`] and [`StateStoreExt::restore`].
    async fn restore_backup(
        &self,
        ws: &WorkspaceId,
        label: &str,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        let old = self.backup(ws, label).await?;
        roll_forward(self, ws, &old, &format!("backup {label}"), fence).await
    }
}

impl<S: StateStore + ?Sized> StateStoreExt for S {}

/// Writes `old` (a state, `what` says which) as the workspace's next version: its serial
/// raised above the current one, and refused when it is of another lineage.
async fn roll_forward<S: StateStore + ?Sized>(
    store: &S,
    ws: &WorkspaceId,
    old: &[u8],
    what: &str,
    fence: Option<&Fence>,
) -> Result<VersionInfo> {
    let current = store.current(ws).await?;
    let (mode, next_serial) = match &current {
        Some(cur) => {
            let lineage = tfstate::StateMeta::parse(old)?.lineage;
            if lineage != cur.version.lineage {
                return Err(StoreError::OtherLineage {
                    what: what.to_owned(),
                    lineage,
                    current: cur.version.lineage.clone(),
                });
            }
            (PutMode::Update(cur.token.clone()), cur.version.serial + 1)
        }
        None => (PutMode::Create, 0),
    };
    let data = tfstate::with_serial_at_least(old, next_serial)?;
    store.put(ws, NewState::parse(data)?, mode, fence).await
}

/// A time as people read it in messages: RFC 3339, UTC, whole seconds.
pub fn display_time(t: OffsetDateTime) -> String {
    let t = t
        .to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// Checks that `data` (`what`: a backup, say) is what its recorded digest says it is.
///
/// # Errors
/// [`StoreError::Corrupt`] when it is not.
pub fn check_digest(what: &str, data: &[u8], sha256: &str) -> Result<()> {
    let found = sha256_hex(data);
    if found == sha256 {
        Ok(())
    } else {
        Err(StoreError::Corrupt {
            path: what.to_owned(),
            detail: format!("its content has sha256 {found}, not the {sha256} recorded for it"),
        })
    }
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(64);
    for byte in digest {
        use fmt::Write;
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// Checks a run's id and an artifact name: relative, `/`-separated, no empty, `.` or `..`
/// parts (the id has no `/`).
///
/// # Errors
/// [`StoreError::InvalidKey`] naming the key.
pub fn check_artifact_name(job_id: &str, name: &str) -> Result<()> {
    let bad = |part: &str| part.is_empty() || part == "." || part == ".." || part.contains('\\');
    if bad(job_id) || job_id.contains('/') || name.split('/').any(bad) {
        return Err(StoreError::InvalidKey(format!("runs/{job_id}/{name}")));
    }
    Ok(())
}
