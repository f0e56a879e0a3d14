//! Client-side envelope encryption of what holds a state: every state version (so every backup
//! too, which copies versions), and the state-bearing run artifacts (`*.tfstate`, `*.tfplan`,
//! the staged `request-*.json` messages). They are encrypted before they leave the runner, each
//! under a data key of its own, and that data key is wrapped by a key the customer holds: their
//! KMS key, or a key file.
//!
//! An encrypted ("sealed") object is self-describing:
//!
//! ```text
//! TERRACE-SEALED/1\n
//! {"alg":"AES-256-GCM","key":"file:1f0c…","wrapped":"<base64>","nonce":"<base64>","serial":7,"lineage":"…"}\n
//! <AES-256-GCM ciphertext and tag>
//! ```
//!
//! The header names the algorithm and the key that wraps the data key; it also keeps the
//! state's serial and lineage (not secret, needed to list versions) and is authenticated with
//! the workspace's name: changing the header, or moving the object to another workspace, makes
//! it fail to open. The header travels inside the object rather than in the store's object
//! metadata, so a copy (a backup, a restore, a download with the cloud's own tools) never
//! separates an object from what opens it.
//!
//! [`SealedStore`] wraps any [`StateStore`]. With keys it seals on write and opens on read;
//! without, it writes plain objects and refuses, by name, to hand out a sealed one (a runner
//! that lacks the key never passes ciphertext to terraform as a state). Plain objects always
//! read as they are, so turning encryption on for an existing workspace needs nothing: its
//! history stays readable and every write from then on is sealed.

use std::sync::Arc;
use std::time::Duration;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::retention::Retention;
use crate::{
    BackupInfo, Changed, CurrentState, Fence, Lease, LeaseRequest, NewState, PutMode, Result,
    Snapshot, StateStore, StoreError, VersionInfo, VersionToken, WorkspaceId,
};

mod keys;
pub use keys::{DataKey, KeyError, KeyFile, KeySource, Keyring};

/// The first bytes of every sealed object (format 1).
pub const MAGIC: &[u8] = b"TERRACE-SEALED/1\n";

/// The one algorithm of format 1, for the data and for wrapping with a key file.
pub const ALGORITHM: &str = "AES-256-GCM";

/// Whether `data` is a sealed object.
pub fn is_sealed(data: &[u8]) -> bool {
    data.starts_with(MAGIC)
}

/// Whether a run artifact holds a state or secrets and is sealed: terraform's `*.tfstate`
/// (an unsaved state) and `*.tfplan` files, and the job messages a runner stages for a task.
pub fn seals_artifact(name: &str) -> bool {
    name.ends_with(".tfstate")
        || name.ends_with(".tfplan")
        || (name.starts_with("request") && name.ends_with(".json"))
}

/// The header of a sealed object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub alg: String,
    /// The key that wrapped the data key: `file:<id>` or `aws-kms:<key id or ARN>`.
    pub key: String,
    /// The data key, wrapped (base64).
    pub wrapped: String,
    /// The data's nonce (base64).
    pub nonce: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<String>,
}

/// Splits a sealed object into its header (as stored, and parsed) and ciphertext.
///
/// # Errors
/// Why it is not a sealed object of format 1.
pub fn split(data: &[u8]) -> std::result::Result<(&[u8], Header, &[u8]), String> {
    let rest = data
        .strip_prefix(MAGIC)
        .ok_or("it is not a sealed object")?;
    let end = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("its header is cut off")?;
    let (raw, body) = (&rest[..end], &rest[end + 1..]);
    let header: Header =
        serde_json::from_slice(raw).map_err(|e| format!("its header is not one: {e}"))?;
    Ok((raw, header, body))
}

/// A store whose states are sealed with `keys` (see the module's documentation).
#[derive(Debug)]
pub struct SealedStore {
    inner: Arc<dyn StateStore>,
    keys: Option<Keyring>,
}

impl SealedStore {
    /// `inner`, sealing with `keys`; without keys, plain writes and sealed objects refused.
    pub fn wrap(inner: Arc<dyn StateStore>, keys: Option<Keyring>) -> Arc<dyn StateStore> {
        Arc::new(Self { inner, keys })
    }

    async fn seal(
        &self,
        ws: &WorkspaceId,
        plain: &Bytes,
        meta: Option<(u64, &str)>,
    ) -> Result<Bytes> {
        let Some(keys) = &self.keys else {
            return Ok(plain.clone());
        };
        let fresh = keys
            .current
            .data_key(ws)
            .await
            .map_err(|e| key_error(ws, "a new object", "cannot be encrypted", e))?;
        let (data_key, wrapped) = (fresh.key, fresh.wrapped);
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let header = Header {
            alg: ALGORITHM.to_owned(),
            key: fresh.id,
            wrapped: B64.encode(wrapped),
            nonce: B64.encode(nonce),
            serial: meta.map(|(s, _)| s),
            lineage: meta.map(|(_, l)| l.to_owned()),
        };
        let raw = serde_json::to_vec(&header).expect("a header serializes");
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&data_key));
        let aad = aad(&raw, ws);
        let body = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::Sealed {
                workspace: ws.clone(),
                what: "a new object".into(),
                reason: "cannot be encrypted: the cipher failed".into(),
            })?;
        Ok(Bytes::from([MAGIC, &raw, b"\n", &body].concat()))
    }

    /// The plain content of a stored object: as it is when not sealed.
    async fn open(&self, ws: &WorkspaceId, what: &str, stored: Bytes) -> Result<Bytes> {
        if !is_sealed(&stored) {
            return Ok(stored);
        }
        let refuse = |reason: String| StoreError::Sealed {
            workspace: ws.clone(),
            what: what.to_owned(),
            reason: format!("cannot be decrypted: {reason}"),
        };
        let (raw, header, body) = split(&stored).map_err(&refuse)?;
        if header.alg != ALGORITHM {
            return Err(refuse(format!(
                "it is encrypted with {}, which this runner does not know",
                header.alg
            )));
        }
        // What gives a runner the key the object names.
        let setting = if header.key.starts_with("file:") {
            "TERRACE_STATE_KEY_FILE, or TERRACE_STATE_OLD_KEY_FILES for a key rotated out"
        } else {
            "the target's client_side_kms_key; terrace: ?client_side_kms_key= on an s3:// store"
        };
        let Some(keys) = &self.keys else {
            return Err(refuse(format!(
                "it is encrypted with the key {}, and this runner has no key: give it that key ({setting})",
                header.key
            )));
        };
        let Some(source) = keys.source_for(&header.key) else {
            return Err(refuse(format!(
                "it is encrypted with the key {}, and this runner has {}: give it that key ({setting})",
                header.key,
                keys.current.id()
            )));
        };
        let wrapped = B64
            .decode(&header.wrapped)
            .map_err(|_| refuse("its wrapped data key is not base64".into()))?;
        let nonce = B64
            .decode(&header.nonce)
            .ok()
            .filter(|n| n.len() == 12)
            .ok_or_else(|| refuse("its nonce is not 12 bytes of base64".into()))?;
        let data_key = source
            .unwrap(&header.key, ws, &wrapped)
            .await
            .map_err(|e| key_error(ws, what, "cannot be decrypted", e))?;
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&data_key));
        let plain = cipher
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: body,
                    aad: &aad(raw, ws),
                },
            )
            .map_err(|_| {
                refuse(
                    "it does not decrypt: it was changed, or it belongs to another workspace"
                        .into(),
                )
            })?;
        Ok(Bytes::from(plain))
    }
}

fn aad(header: &[u8], ws: &WorkspaceId) -> Vec<u8> {
    [MAGIC, header, b"\n", ws.to_string().as_bytes()].concat()
}

fn key_error(ws: &WorkspaceId, what: &str, fails: &str, e: KeyError) -> StoreError {
    if e.retryable {
        StoreError::Backend {
            backend: "key",
            message: format!("{what} of {ws} {fails}: {}", e.message),
            retryable: true,
            source: None,
        }
    } else {
        StoreError::Sealed {
            workspace: ws.clone(),
            what: what.to_owned(),
            reason: format!("{fails}: {}", e.message),
        }
    }
}

#[async_trait]
impl StateStore for SealedStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>> {
        let Some(mut current) = self.inner.current(ws).await? else {
            return Ok(None);
        };
        let what = format!("state version {}", current.version.number);
        current.data = self.open(ws, &what, current.data).await?;
        Ok(Some(current))
    }

    async fn current_version(&self, ws: &WorkspaceId) -> Result<Option<VersionInfo>> {
        self.inner.current_version(ws).await
    }

    fn seals(&self) -> bool {
        self.keys.is_some()
    }

    /// A data key made and unwrapped again, for nothing: the key can seal and open.
    async fn check_keys(&self, ws: &WorkspaceId) -> Result<()> {
        let Some(keys) = &self.keys else {
            return Ok(());
        };
        let what = "a trial data key";
        let fresh = keys
            .current
            .data_key(ws)
            .await
            .map_err(|e| key_error(ws, what, "cannot be made", e))?;
        let back = keys
            .current
            .unwrap(&fresh.id, ws, &fresh.wrapped)
            .await
            .map_err(|e| key_error(ws, what, "cannot be unwrapped", e))?;
        if back == fresh.key {
            Ok(())
        } else {
            Err(StoreError::Sealed {
                workspace: ws.clone(),
                what: what.into(),
                reason: "unwraps to another key".into(),
            })
        }
    }

    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        let data = self
            .seal(ws, &state.data, Some((state.serial, &state.lineage)))
            .await?;
        let sealed = NewState { data, ..state };
        self.inner.put(ws, sealed, mode, fence).await
    }

    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()> {
        self.inner.delete_current(ws, expected, fence).await
    }

    async fn settle(&self, ws: &WorkspaceId) {
        self.inner.settle(ws).await;
    }

    fn answering(&self) -> bool {
        self.inner.answering()
    }

    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>> {
        self.inner.versions(ws).await
    }

    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes> {
        let stored = self.inner.version(ws, number).await?;
        self.open(ws, &format!("state version {number}"), stored)
            .await
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
        // A copy of the stored version: sealed as it was.
        self.inner.snapshot(ws, label, keep).await
    }

    async fn back_up(
        &self,
        changed: &crate::Changed,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        self.inner.back_up(changed, label, keep).await
    }

    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        self.inner.backups(ws).await
    }

    async fn backup(&self, ws: &WorkspaceId, label: &str) -> Result<Bytes> {
        let stored = self.inner.backup(ws, label).await?;
        self.open(ws, &format!("backup {label}"), stored).await
    }

    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()> {
        let data = if seals_artifact(name) {
            self.seal(ws, &data, None).await?
        } else {
            data
        };
        self.inner.put_artifact(ws, job_id, name, data).await
    }

    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>> {
        match self.inner.artifact(ws, job_id, name).await? {
            Some(stored) => {
                let what = format!("runs/{job_id}/{name}");
                Ok(Some(self.open(ws, &what, stored).await?))
            }
            None => Ok(None),
        }
    }

    async fn sealed_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
    ) -> Result<Option<Bytes>> {
        let what = format!("runs/{job_id}/{name}");
        match self.inner.artifact(ws, job_id, name).await? {
            Some(stored) if self.keys.is_some() && is_sealed(&stored) => {
                Ok(Some(self.open(ws, &what, stored).await?))
            }
            Some(_) => Err(StoreError::Sealed {
                workspace: ws.clone(),
                what,
                reason: "it is stored plain, and only an object this runner's keys sealed is taken"
                    .into(),
            }),
            None => Ok(None),
        }
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

    // `restore` is the trait's own: it reads and writes through this store, so the old version
    // is opened and the new one sealed with the current key.
}

#[cfg(test)]
mod tests;
