//! The local folder store, Terrace's embedded default.
//!
//! Layout under the root, per workspace `<tenant>/<workspace>/`:
//! - `versions/<number>.tfstate`: every accepted state, immutable; the highest number is the
//!   current state. A `<number>.deleted` marker records a deletion of the current state.
//!   `versions/<number>.json` beside it caches the version's facts.
//! - `terraform.tfstate`: a copy of the current state, for people and tools.
//! - `lease.json`: the lease record; `backups/<label>.tfstate`; `runs/<job-id>/…`.
//! - `.lock`: an advisory file lock (`flock`) serialising writers across processes.
//!
//! Every file is written to a temporary name in the same folder and renamed into place, so a
//! crash leaves either the old file or the new one, never a torn one. A version is fsynced, then
//! its folder: that rename is the commit point of a write. Its facts (`<n>.json`) are fsynced
//! before it and made durable by the same folder fsync; the `terraform.tfstate` copy is not
//! fsynced at all (nothing reads it back; after a crash it may lag until the next write). Folders are fsynced when created.

use std::fs::{self};
use std::io::{self};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use time::OffsetDateTime;

use crate::retention::Retention;
use crate::{
    BackupInfo, Changed, CurrentState, Fence, Lease, LeaseRequest, NewState, PutMode, Result,
    Snapshot, StateStore, StoreError, VersionInfo, VersionToken, WorkspaceId, sha256_hex,
};

mod dir;
use dir::{Dir, Head};

mod files;
use files::{
    Durability, holds_a_file, io_err, list_names, read_optional, refresh_copy, write_atomic,
    write_file,
};

/// A [`StateStore`] in a local folder.
#[derive(Debug, Clone)]
pub struct FsStore {
    root: PathBuf,
}

impl FsStore {
    /// A store rooted at `root`, created on first write.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of a workspace.
    pub fn workspace_dir(&self, ws: &WorkspaceId) -> PathBuf {
        self.root.join(ws.tenant()).join(ws.workspace())
    }

    /// Runs `f` on a blocking thread with the workspace's folder.
    async fn blocking<T: Send + 'static>(
        &self,
        ws: &WorkspaceId,
        f: impl FnOnce(&Dir) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let dir = Dir {
            path: self.workspace_dir(ws),
            ws: ws.clone(),
        };
        tokio::task::spawn_blocking(move || f(&dir))
            .await
            .map_err(join_error)?
    }
}

fn join_error(e: tokio::task::JoinError) -> StoreError {
    StoreError::Backend {
        backend: "fs",
        message: format!("blocking task failed: {e}"),
        retryable: false,
        source: None,
    }
}

/// The folder of change marks, beside the tenants.
const CHANGES: &str = "_changes";

fn lease_lost(ws: &WorkspaceId, lease: &Lease, reason: String) -> StoreError {
    StoreError::LeaseLost {
        workspace: ws.clone(),
        owner: lease.owner.clone(),
        fence: lease.fence,
        reason,
    }
}

#[async_trait]
impl StateStore for FsStore {
    fn kind(&self) -> &'static str {
        "fs"
    }

    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>> {
        self.blocking(ws, |dir| {
            let Head::State(number) = dir.head()? else {
                return Ok(None);
            };
            Ok(Some(CurrentState {
                token: VersionToken(number.to_string()),
                data: dir.read_version(number)?,
                version: dir.version_info(number)?,
            }))
        })
        .await
    }

    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        let fence = fence.cloned();
        self.blocking(ws, move |dir| {
            let _lock = dir.lock()?;
            let head = dir.check_write(&mode, fence.as_ref())?;
            let number = head.number() + 1;
            let info = VersionInfo {
                number,
                serial: state.serial,
                lineage: state.lineage,
                created_at: OffsetDateTime::now_utc(),
                size: state.data.len() as u64,
                sha256: sha256_hex(&state.data),
            };
            let meta = serde_json::to_vec_pretty(&info).expect("version info serializes");
            // The facts first; the version's own durable write (same folder) commits both.
            write_file(
                &dir.version_path(number, "json"),
                &meta,
                Durability::ContentOnly,
            )?;
            write_atomic(&dir.version_path(number, "tfstate"), &state.data)?;
            // The version is committed; the plain copy is a convenience and may lag on a crash.
            refresh_copy(&dir.path.join("terraform.tfstate"), Some(&state.data));
            dir.mark_changed(number)?;
            Ok(info)
        })
        .await
    }

    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()> {
        let (expected, fence) = (expected.clone(), fence.cloned());
        self.blocking(ws, move |dir| {
            let _lock = dir.lock()?;
            let head = dir.check_write(&PutMode::Update(expected), fence.as_ref())?;
            write_atomic(&dir.version_path(head.number() + 1, "deleted"), b"")?;
            refresh_copy(&dir.path.join("terraform.tfstate"), None);
            dir.mark_changed(head.number() + 1)?;
            Ok(())
        })
        .await
    }

    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>> {
        self.blocking(ws, |dir| {
            dir.entries()?
                .into_iter()
                .filter(|(_, deleted)| !deleted)
                .map(|(n, _)| dir.version_info(n))
                .collect()
        })
        .await
    }

    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes> {
        self.blocking(ws, move |dir| dir.read_version(number)).await
    }

    async fn acquire_lease(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease> {
        let request = request.clone();
        self.blocking(ws, move |dir| {
            let _lock = dir.lock()?;
            let mut record = dir.lease_record()?;
            let lease = record
                .acquire(&request, OffsetDateTime::now_utc())
                .map_err(|holder| StoreError::LeaseHeld {
                    workspace: dir.ws.clone(),
                    holder,
                })?;
            dir.save_lease_record(&record)?;
            Ok(lease)
        })
        .await
    }

    async fn renew_lease(&self, ws: &WorkspaceId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let lease = lease.clone();
        self.blocking(ws, move |dir| {
            let _lock = dir.lock()?;
            let mut record = dir.lease_record()?;
            let renewed = record
                .renew(&lease, ttl, OffsetDateTime::now_utc())
                .map_err(|reason| lease_lost(&dir.ws, &lease, reason))?;
            dir.save_lease_record(&record)?;
            Ok(renewed)
        })
        .await
    }

    async fn release_lease(&self, ws: &WorkspaceId, lease: &Lease) -> Result<()> {
        let lease = lease.clone();
        self.blocking(ws, move |dir| {
            let _lock = dir.lock()?;
            let mut record = dir.lease_record()?;
            if record.release(&lease, None) {
                dir.save_lease_record(&record)?;
            }
            Ok(())
        })
        .await
    }

    async fn break_lease(&self, ws: &WorkspaceId, only: Option<u64>) -> Result<Option<Lease>> {
        self.blocking(ws, move |dir| {
            let _lock = dir.lock()?;
            let mut record = dir.lease_record()?;
            let broken = record.break_lease(only);
            if broken.is_some() {
                dir.save_lease_record(&record)?;
            }
            Ok(broken)
        })
        .await
    }

    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        self.blocking(ws, |dir| Ok(dir.lease_record()?.held)).await
    }

    async fn snapshot(
        &self,
        ws: &WorkspaceId,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        crate::check_artifact_name("backups", label)?;
        let label = label.to_owned();
        self.blocking(ws, move |dir| {
            let _lock = dir.lock()?;
            let Head::State(number) = dir.head()? else {
                return Ok(None);
            };
            let info = dir.version_info(number)?;
            let index_path = dir.path.join("backups").join("index.json");
            let mut index: Vec<BackupInfo> = match read_optional(&index_path)? {
                Some(raw) => serde_json::from_slice(&raw).map_err(|e| StoreError::Corrupt {
                    path: index_path.display().to_string(),
                    detail: e.to_string(),
                })?,
                None => Vec::new(),
            };
            if index.last().is_some_and(|b| b.sha256 == info.sha256) {
                return Ok(None);
            }
            let data = dir.read_version(number)?;
            write_atomic(
                &dir.path.join("backups").join(format!("{label}.tfstate")),
                &data,
            )?;
            let backup = BackupInfo {
                label: label.clone(),
                version: number,
                sha256: info.sha256,
            };
            let pruned = crate::retention::record(&mut index, backup.clone(), keep);
            write_atomic(
                &index_path,
                &serde_json::to_vec_pretty(&index).expect("backup index serializes"),
            )?;
            // Out of the index first: a copy left by a failure here is only space.
            for old in &pruned {
                let path = dir.path.join("backups").join(format!("{old}.tfstate"));
                if let Err(e) = std::fs::remove_file(&path)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(path = %path.display(), error = %e, "a dropped backup's copy was not deleted");
                }
            }
            Ok(Some(Snapshot { backup, pruned }))
        })
        .await
    }

    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        self.blocking(ws, |dir| {
            let path = dir.path.join("backups").join("index.json");
            match read_optional(&path)? {
                Some(raw) => serde_json::from_slice(&raw).map_err(|e| StoreError::Corrupt {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                }),
                None => Ok(Vec::new()),
            }
        })
        .await
    }

    async fn backup(&self, ws: &WorkspaceId, label: &str) -> Result<Bytes> {
        crate::check_artifact_name("backups", label)?;
        let listed = self.backups(ws).await?;
        let not_found = || StoreError::NotFound {
            workspace: ws.clone(),
            what: format!("backup {label}"),
        };
        let info = listed
            .into_iter()
            .find(|b| b.label == label)
            .ok_or_else(not_found)?;
        let label = label.to_owned();
        let data = self
            .blocking(ws, move |dir| {
                read_optional(&dir.path.join("backups").join(format!("{label}.tfstate")))
            })
            .await?
            .ok_or_else(not_found)?;
        crate::check_digest(&format!("backup {}", info.label), &data, &info.sha256)?;
        Ok(Bytes::from(data))
    }

    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()> {
        let (job_id, name) = (job_id.to_owned(), name.to_owned());
        self.blocking(ws, move |dir| {
            write_atomic(&dir.artifact_path(&job_id, &name)?, &data)
        })
        .await
    }

    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>> {
        let (job_id, name) = (job_id.to_owned(), name.to_owned());
        self.blocking(ws, move |dir| {
            Ok(read_optional(&dir.artifact_path(&job_id, &name)?)?.map(Bytes::from))
        })
        .await
    }

    async fn delete_artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<()> {
        let (job_id, name) = (job_id.to_owned(), name.to_owned());
        self.blocking(ws, move |dir| {
            let path = dir.artifact_path(&job_id, &name)?;
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", &path)(e)),
                _ => Ok(()),
            }
        })
        .await
    }

    async fn artifacts(&self, ws: &WorkspaceId, job_id: &str) -> Result<Vec<String>> {
        crate::check_artifact_name(job_id, "x")?;
        let job_id = job_id.to_owned();
        self.blocking(ws, move |dir| {
            let run = dir.path.join("runs").join(&job_id);
            let mut out = Vec::new();
            let mut stack = vec![(run, String::new())];
            while let Some((path, prefix)) = stack.pop() {
                for name in list_names(&path)? {
                    if name.starts_with(".tmp-") {
                        continue;
                    }
                    let child = path.join(&name);
                    let rel = format!("{prefix}{name}");
                    if child.is_dir() {
                        stack.push((child, format!("{rel}/")));
                    } else {
                        out.push(rel);
                    }
                }
            }
            out.sort();
            Ok(out)
        })
        .await
    }

    async fn changed(&self) -> Result<Vec<Changed>> {
        let root = self.root.join(CHANGES);
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for tenant in list_names(&root)? {
                for workspace in list_names(&root.join(&tenant))? {
                    if workspace.starts_with(".tmp-") {
                        continue;
                    }
                    let Ok(ws) = WorkspaceId::new(&tenant, &workspace) else {
                        continue;
                    };
                    let path = root.join(&tenant).join(&workspace);
                    if let Some(mark) = read_optional(&path)? {
                        out.push(Changed {
                            ws,
                            mark: String::from_utf8_lossy(&mark).into_owned(),
                            marked: None,
                        });
                    }
                }
            }
            out.sort_by_key(|a| a.ws.to_string());
            Ok(out)
        })
        .await
        .map_err(join_error)?
    }

    async fn runs(&self, ws: &WorkspaceId) -> Result<Vec<String>> {
        self.blocking(ws, |dir| {
            let runs = dir.path.join("runs");
            let mut ids: Vec<String> = list_names(&runs)?
                .into_iter()
                // An emptied run folder (its staged message deleted) holds no run, as on a
                // bucket, where a "folder" is only its objects' common prefix.
                .filter(|name| {
                    let run = runs.join(name);
                    !name.starts_with(".tmp-") && run.is_dir() && holds_a_file(&run)
                })
                .collect();
            ids.sort();
            Ok(ids)
        })
        .await
    }

    async fn workspaces(&self) -> Result<Vec<WorkspaceId>> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for tenant in list_names(&root)? {
                // `_changes` and the like: `_` cannot start a tenant name.
                if tenant.starts_with('_') || !root.join(&tenant).is_dir() {
                    continue;
                }
                for workspace in list_names(&root.join(&tenant))? {
                    if let Ok(ws) = WorkspaceId::new(&tenant, &workspace) {
                        out.push(ws);
                    }
                }
            }
            out.sort_by_key(ToString::to_string);
            Ok(out)
        })
        .await
        .map_err(join_error)?
    }

    async fn clear_changed(&self, changed: &Changed) -> Result<()> {
        let mark = changed.mark.clone();
        self.blocking(&changed.ws, move |dir| {
            let _lock = dir.lock()?;
            let path = dir.change_mark();
            if read_optional(&path)?.is_some_and(|m| m == mark.as_bytes()) {
                fs::remove_file(&path).map_err(io_err("remove", &path))?;
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use crate::tfstate;
    use std::sync::Arc;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        crate::conformance::run_all(Arc::new(FsStore::new(dir.path()))).await;
    }

    #[tokio::test]
    async fn a_version_written_without_its_cached_facts_is_still_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let ws = WorkspaceId::new("t", "w").unwrap();
        let state = NewState::parse(tfstate::empty_state("lin", 3)).unwrap();
        store.put(&ws, state, PutMode::Create, None).await.unwrap();
        fs::remove_file(store.workspace_dir(&ws).join("versions/0000000001.json")).unwrap();
        let versions = store.versions(&ws).await.unwrap();
        assert_eq!((versions[0].number, versions[0].serial), (1, 3));
        assert_eq!(versions[0].lineage, "lin");
    }

    #[tokio::test]
    async fn leftover_temporary_files_of_a_crashed_writer_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let ws = WorkspaceId::new("t", "w").unwrap();
        let versions = store.workspace_dir(&ws).join("versions");
        fs::create_dir_all(&versions).unwrap();
        fs::write(versions.join(".tmp-1-1"), b"{torn").unwrap();
        assert!(store.current(&ws).await.unwrap().is_none());
        let state = NewState::parse(tfstate::empty_state("lin", 1)).unwrap();
        let info = store.put(&ws, state, PutMode::Create, None).await.unwrap();
        assert_eq!(info.number, 1);
    }

    #[tokio::test]
    async fn a_backup_restores_without_its_versions() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        crate::conformance::a_backup_restores_without_its_versions(&store, |ws| {
            let versions = store.workspace_dir(&ws).join("versions");
            async move { fs::remove_dir_all(versions).unwrap() }
        })
        .await;
    }

    /// States hold secrets: every file and folder the store makes is its owner's alone, whatever
    /// the umask.
    #[tokio::test]
    async fn what_the_store_writes_only_its_owner_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = FsStore::new(&root);
        let ws = WorkspaceId::new("t", "w").unwrap();
        let state = NewState::parse(tfstate::empty_state("lin", 1)).unwrap();
        store.put(&ws, state, PutMode::Create, None).await.unwrap();
        store
            .put_artifact(&ws, "j1", "log/1.ndjson", bytes::Bytes::from_static(b"{}"))
            .await
            .unwrap();
        let mut seen = 0;
        let mut todo = vec![root];
        while let Some(path) = todo.pop() {
            let meta = fs::symlink_metadata(&path).unwrap();
            assert_eq!(
                meta.permissions().mode() & 0o077,
                0,
                "{} is open to others: {:o}",
                path.display(),
                meta.permissions().mode()
            );
            seen += 1;
            if meta.is_dir() {
                todo.extend(fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            }
        }
        assert!(seen > 6, "{seen}");
    }
}
