//! Where a workspace's data keys come from: a [`KeySource`] (a key file here, a KMS in
//! [`crate::kms`]), and the [`Keyring`] that says which key seals and which keys still open.

use std::fmt;
use std::sync::Arc;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use crate::WorkspaceId;

/// Why a key could not be used.
#[derive(Debug)]
pub struct KeyError {
    pub message: String,
    /// A key service that may answer later (throttled, unreachable).
    pub retryable: bool,
}

impl KeyError {
    fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }
}

/// A fresh data key: the key, the key wrapped, and the id of the key that wrapped it (as a
/// header names it).
pub struct DataKey {
    pub key: [u8; 32],
    pub wrapped: Vec<u8>,
    pub id: String,
}

/// A key that wraps data keys: a key file, or a KMS key.
#[async_trait]
pub trait KeySource: fmt::Debug + Send + Sync + 'static {
    /// The key's id as headers name it: `file:<id>`, `aws-kms:<key>`.
    fn id(&self) -> String;

    /// Whether this source can unwrap a data key wrapped by the key `id`.
    fn opens(&self, id: &str) -> bool {
        id == self.id()
    }

    /// A fresh data key for one object of `ws`.
    ///
    /// # Errors
    /// The key service failed.
    async fn data_key(&self, ws: &WorkspaceId) -> std::result::Result<DataKey, KeyError>;

    /// Unwraps a data key of an object of `ws` wrapped by the key `id`.
    ///
    /// # Errors
    /// The wrong key, a tampered wrapping, the key service failed.
    async fn unwrap(
        &self,
        id: &str,
        ws: &WorkspaceId,
        wrapped: &[u8],
    ) -> std::result::Result<[u8; 32], KeyError>;
}

/// The keys of a runner: the one new objects are sealed with, and older ones that still open
/// what they sealed (after a rotation).
#[derive(Clone, Debug)]
pub struct Keyring {
    pub current: Arc<dyn KeySource>,
    pub older: Vec<Arc<dyn KeySource>>,
}

impl Keyring {
    pub fn new(current: Arc<dyn KeySource>) -> Self {
        Self {
            current,
            older: Vec::new(),
        }
    }

    /// This keyring, with `older`'s keys (all of them) kept to open what they sealed.
    #[must_use]
    pub fn then(mut self, older: Option<Keyring>) -> Self {
        if let Some(older) = older {
            self.older.push(older.current);
            self.older.extend(older.older);
        }
        self
    }

    pub(super) fn source_for(&self, id: &str) -> Option<&Arc<dyn KeySource>> {
        std::iter::once(&self.current)
            .chain(&self.older)
            .find(|k| k.opens(id))
    }
}

/// A 256-bit key read from a file (32 bytes, base64, as `openssl rand -base64 32` writes
/// them): it wraps each data key with AES-256-GCM.
pub struct KeyFile {
    id: String,
    cipher: Aes256Gcm,
}

impl fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFile").field("id", &self.id).finish()
    }
}

impl KeyFile {
    /// Reads the key from `path`.
    ///
    /// # Errors
    /// A file that cannot be read or does not hold a base64 key of 32 bytes; the message names
    /// the file, never its content.
    pub fn read(path: &std::path::Path) -> std::result::Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        // Terraform runs as other users than the runner: a key they could read would open
        // every state it seals.
        let mode = std::fs::metadata(path)
            .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "the key file {} can be read by others (mode {:o}): make it the runner's alone (chmod 600)",
                path.display(),
                mode & 0o777
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?;
        Self::from_base64(text.trim()).map_err(|e| format!("the key file {}: {e}", path.display()))
    }

    /// A key from its base64 text.
    ///
    /// # Errors
    /// Not base64 of 32 bytes.
    pub fn from_base64(text: &str) -> std::result::Result<Self, String> {
        let bytes = B64
            .decode(text)
            .map_err(|_| "it is not base64 (make one with `openssl rand -base64 32`)".to_owned())?;
        let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
            format!(
                "it holds {} bytes, not 32 (make one with `openssl rand -base64 32`)",
                bytes.len()
            )
        })?;
        Ok(Self::from_bytes(&key))
    }

    pub fn from_bytes(key: &[u8; 32]) -> Self {
        use sha2::Digest as _;
        // The id says which key, without saying anything about it.
        let digest = sha2::Sha256::new()
            .chain_update(b"terrace key id\n")
            .chain_update(key)
            .finalize();
        let id: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Self {
            id: format!("file:{id}"),
            cipher: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key)),
        }
    }
}

#[async_trait]
impl KeySource for KeyFile {
    fn id(&self) -> String {
        self.id.clone()
    }

    async fn data_key(&self, ws: &WorkspaceId) -> std::result::Result<DataKey, KeyError> {
        let key: [u8; 32] = Aes256Gcm::generate_key(&mut OsRng).into();
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = format!("terrace data key\n{ws}");
        let wrapped = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &key,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| KeyError::fatal("wrapping the data key failed"))?;
        Ok(DataKey {
            key,
            wrapped: [nonce.as_slice(), &wrapped].concat(),
            id: self.id.clone(),
        })
    }

    async fn unwrap(
        &self,
        _id: &str,
        ws: &WorkspaceId,
        wrapped: &[u8],
    ) -> std::result::Result<[u8; 32], KeyError> {
        if wrapped.len() < 12 {
            return Err(KeyError::fatal("its wrapped data key is cut off"));
        }
        let (nonce, sealed) = wrapped.split_at(12);
        let aad = format!("terrace data key\n{ws}");
        let key = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: aad.as_bytes() })
            .map_err(|_| {
                KeyError::fatal(
                    "its data key does not unwrap with that key (a different key under the same id, or a changed object)",
                )
            })?;
        key.as_slice()
            .try_into()
            .map_err(|_| KeyError::fatal("its data key is not 32 bytes"))
    }
}
