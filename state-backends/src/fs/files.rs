//! The store's files: written through a temporary file and a rename, fsynced as far as each
//! write needs ([`Durability`]), so a crash leaves the old file or the new one, never a part;
//! and the reads and listings that treat a missing file as nothing.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Result, StoreError};

pub(super) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `data` to `path` atomically and durably: temp file, fsync, rename, fsync of the folder.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_file(path, data, Durability::Durable)
}

/// How much of a write must be on disk before it returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    /// The content and its name: fsync of the file, then of its folder.
    Durable,
    /// The content only; a later `Durable` write into the same folder makes the name durable.
    ContentOnly,
    /// Nothing: for copies that are rebuilt from durable data.
    Lazy,
}

/// Writes `data` to `path` through a temporary file and a rename, fsyncing per `durability`.
pub(super) fn write_file(path: &Path, data: &[u8], durability: Durability) -> Result<()> {
    let parent = path.parent().expect("paths in the store have a parent");
    create_dir_durable(parent)?;
    let tmp = parent.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        // The store's files are its owner's alone (states hold secrets).
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        file.write_all(data).map_err(io_err("write", &tmp))?;
        if durability != Durability::Lazy {
            file.sync_all().map_err(io_err("fsync", &tmp))?;
        }
        fs::rename(&tmp, path).map_err(io_err("rename into place", path))?;
        if durability != Durability::Durable {
            return Ok(());
        }
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync folder", parent))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `dir` and its missing ancestors, fsyncing the parent of each one created, so that a
/// file written into a new folder survives a crash with its folder.
pub(super) fn create_dir_durable(dir: &Path) -> Result<()> {
    // The parent of a relative name (`.terrace`) is the empty path: the working folder.
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_durable(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(io_err("create folder", dir)(e)),
    }
    if let Some(parent) = dir.parent() {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync folder", parent))?;
    }
    Ok(())
}

/// After a version is committed, the convenience copy is refreshed; its failure does not undo
/// the commit, so it is logged, not returned.
pub(super) fn refresh_copy(path: &Path, data: Option<&[u8]>) {
    let result = match data {
        Some(data) => write_file(path, data, Durability::Lazy),
        None => match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
            _ => Ok(()),
        },
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not refresh the copy of the current state");
    }
}

pub(super) fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(data) => Ok(Some(data)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// Whether `dir` or a folder in it holds a file (not a write under way).
pub(super) fn holds_a_file(dir: &Path) -> bool {
    list_names(dir).is_ok_and(|names| {
        names.iter().any(|name| {
            let path = dir.join(name);
            if path.is_dir() {
                holds_a_file(&path)
            } else {
                !name.starts_with(".tmp-")
            }
        })
    })
}

pub(super) fn list_names(dir: &Path) -> Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| {
                e.map(|e| e.file_name().to_string_lossy().into_owned())
                    .map_err(io_err("list", dir))
            })
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err("list", dir)(e)),
    }
}
