//! A workspace's folder: its lock file, its versions and current state, its lease record.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::lease::LeaseRecord;
use crate::{
    Fence, PutMode, Result, StoreError, VersionInfo, VersionToken, WorkspaceId, sha256_hex, tfstate,
};

use super::CHANGES;
use super::files::{
    Durability, create_dir_durable, io_err, list_names, read_optional, write_atomic, write_file,
};

/// One workspace's folder, with the operations on it.
pub(super) struct Dir {
    pub(super) path: PathBuf,
    pub(super) ws: WorkspaceId,
}

/// The exclusive file lock of a workspace, held while it lives.
pub(super) struct Locked(File);

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// What the last entry of the version folder is.
pub(super) enum Head {
    Empty,
    State(u64),
    Deleted(u64),
}

impl Head {
    pub(super) fn number(&self) -> u64 {
        match self {
            Head::Empty => 0,
            Head::State(n) | Head::Deleted(n) => *n,
        }
    }

    pub(super) fn token(&self) -> Option<VersionToken> {
        match self {
            Head::State(n) => Some(VersionToken(n.to_string())),
            _ => None,
        }
    }
}

impl Dir {
    pub(super) fn versions_dir(&self) -> PathBuf {
        self.path.join("versions")
    }

    pub(super) fn version_path(&self, number: u64, ext: &str) -> PathBuf {
        self.versions_dir().join(format!("{number:010}.{ext}"))
    }

    pub(super) fn lock(&self) -> Result<Locked> {
        create_dir_durable(&self.path)?;
        let path = self.path.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_err("open", &path))?;
        file.lock().map_err(io_err("lock", &path))?;
        Ok(Locked(file))
    }

    /// Numbers of committed entries, ascending, with whether each is a deletion marker.
    pub(super) fn entries(&self) -> Result<Vec<(u64, bool)>> {
        let mut out: Vec<(u64, bool)> = list_names(&self.versions_dir())?
            .iter()
            .filter_map(|name| {
                let (stem, ext) = name.split_once('.')?;
                let deleted = match ext {
                    "tfstate" => false,
                    "deleted" => true,
                    _ => return None,
                };
                Some((stem.parse().ok()?, deleted))
            })
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    pub(super) fn head(&self) -> Result<Head> {
        Ok(match self.entries()?.last() {
            None => Head::Empty,
            Some(&(n, false)) => Head::State(n),
            Some(&(n, true)) => Head::Deleted(n),
        })
    }

    pub(super) fn read_version(&self, number: u64) -> Result<Bytes> {
        let path = self.version_path(number, "tfstate");
        read_optional(&path)?
            .map(Bytes::from)
            .ok_or_else(|| StoreError::NotFound {
                workspace: self.ws.clone(),
                what: format!("state version {number}"),
            })
    }

    pub(super) fn version_info(&self, number: u64) -> Result<VersionInfo> {
        let meta_path = self.version_path(number, "json");
        if let Some(raw) = read_optional(&meta_path)?
            && let Ok(info) = serde_json::from_slice::<VersionInfo>(&raw)
        {
            return Ok(info);
        }
        // The cache is missing (a crash between the two renames): derive it from the content.
        let data = self.read_version(number)?;
        let meta = tfstate::StateMeta::parse_stored(&data).map_err(|e| StoreError::Corrupt {
            path: self.version_path(number, "tfstate").display().to_string(),
            detail: e.to_string(),
        })?;
        let path = self.version_path(number, "tfstate");
        let modified = fs::metadata(&path)
            .and_then(|m| m.modified())
            .map_err(io_err("stat", &path))?;
        Ok(VersionInfo {
            number,
            serial: meta.serial,
            lineage: meta.lineage,
            created_at: modified.into(),
            size: data.len() as u64,
            sha256: sha256_hex(&data),
        })
    }

    pub(super) fn lease_record(&self) -> Result<LeaseRecord> {
        let path = self.path.join("lease.json");
        match read_optional(&path)? {
            None => Ok(LeaseRecord::default()),
            Some(raw) => serde_json::from_slice(&raw).map_err(|e| StoreError::Corrupt {
                path: path.display().to_string(),
                detail: e.to_string(),
            }),
        }
    }

    pub(super) fn save_lease_record(&self, record: &LeaseRecord) -> Result<()> {
        let data = serde_json::to_vec_pretty(record).expect("lease records serialize");
        write_atomic(&self.path.join("lease.json"), &data)
    }

    /// Checks the write preconditions under the lock; returns the current head.
    pub(super) fn check_write(&self, mode: &PutMode, fence: Option<&Fence>) -> Result<Head> {
        let head = self.head()?;
        let record = match fence {
            Some(_) => self.lease_record()?,
            None => LeaseRecord::default(),
        };
        crate::lease::check_put(&self.ws, &record, head.token().as_ref(), mode, fence)?;
        Ok(head)
    }

    /// `<root>/_changes/<tenant>/<workspace>`: holds the number of the latest write until the
    /// backup sweep clears it (`_` cannot start a tenant name).
    pub(super) fn change_mark(&self) -> PathBuf {
        let root = self
            .path
            .parent()
            .and_then(Path::parent)
            .expect("a workspace folder is <root>/<tenant>/<workspace>");
        root.join(CHANGES)
            .join(self.ws.tenant())
            .join(self.ws.workspace())
    }

    /// Called under the workspace's lock after a commit. A lost mark only delays a backup.
    pub(super) fn mark_changed(&self, number: u64) -> Result<()> {
        write_file(
            &self.change_mark(),
            number.to_string().as_bytes(),
            Durability::ContentOnly,
        )
    }

    pub(super) fn artifact_path(&self, job_id: &str, name: &str) -> Result<PathBuf> {
        crate::check_artifact_name(job_id, name)?;
        Ok(self.path.join("runs").join(job_id).join(name))
    }
}
