//! The one error type of the state stores, with the kinds callers branch on.

use time::OffsetDateTime;

use crate::{Lease, WorkspaceId};

/// A `Result` with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What can go wrong in a [`crate::StateStore`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The thing asked for does not exist.
    #[error("{what} not found in workspace {workspace}")]
    NotFound {
        workspace: WorkspaceId,
        what: String,
    },

    /// A compare-and-swap failed: the state changed since the writer read it.
    #[error("state of workspace {workspace} changed since it was read: {detail}")]
    Conflict {
        workspace: WorkspaceId,
        detail: String,
    },

    /// Someone else holds a live lease on the workspace.
    #[error(
        "workspace {workspace} is leased by {} (fence {}) until {}",
        holder.owner, holder.fence, crate::display_time(holder.expires_at)
    )]
    LeaseHeld {
        workspace: WorkspaceId,
        holder: Box<Lease>,
    },

    /// The writer's lease expired, was broken, or was taken over: its writes are refused.
    #[error(
        "lease of {owner} (fence {fence}) on workspace {workspace} is no longer held: {reason}"
    )]
    LeaseLost {
        workspace: WorkspaceId,
        owner: String,
        fence: u64,
        reason: String,
    },

    /// The bytes are not a state this store accepts.
    #[error("invalid state: {0}")]
    InvalidState(#[from] crate::tfstate::StateFileError),

    /// A restore that would replace the workspace's state with another workspace's.
    #[error(
        "invalid state: {what} has lineage {lineage}, the current state has {current}; restoring it would replace the workspace with another one"
    )]
    OtherLineage {
        what: String,
        lineage: String,
        current: String,
    },

    /// A key or name that would escape its folder or is empty.
    #[error("invalid key {0:?}")]
    InvalidKey(String),

    /// A local file operation failed.
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A sealed (encrypted) object that cannot be opened: no key, the wrong key, or changed.
    #[error("{what} of workspace {workspace} {reason}")]
    Sealed {
        workspace: WorkspaceId,
        what: String,
        reason: String,
    },

    /// A stored record could not be read back.
    #[error("corrupt record {path}: {detail}")]
    Corrupt { path: String, detail: String },

    /// A remote backend failed; `retryable` says whether trying again may help.
    #[error("{backend} backend: {message}")]
    Backend {
        backend: &'static str,
        message: String,
        retryable: bool,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl StoreError {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Backend { retryable, .. } => *retryable,
            StoreError::LeaseHeld { .. } => true,
            StoreError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut
            ),
            _ => false,
        }
    }

    /// When a held lease runs out, for [`StoreError::LeaseHeld`].
    pub fn lease_expires_at(&self) -> Option<OffsetDateTime> {
        match self {
            StoreError::LeaseHeld { holder, .. } => Some(holder.expires_at),
            _ => None,
        }
    }
}
