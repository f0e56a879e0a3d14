//! File-backed storage of the fake cloud.
//!
//! Every resource is one pretty-printed JSON file,
//! `<root>/<Record::DIR>/<id>.json` (e.g. `<root>/network/net-3f2a91c0.json`).
//! Files are written atomically (temporary file in the same folder, then rename),
//! so readers never observe a half-written resource.
//!
//! All cloud-side operations go through [`Store`]: this is the single place where
//! cross-cutting behaviour (such as fault injection driven by a file in the root
//! folder) can be added.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::faults::{Fault, Kind, Op};

/// A resource as stored on disk.
pub trait Record: Serialize + DeserializeOwned + Send + Sync {
    /// Terraform type name, used in error messages (e.g. `testcloud_network`).
    const TYPE_NAME: &'static str;
    /// Folder below the root that holds this resource type (e.g. `network`).
    const DIR: &'static str;
    /// Prefix of generated ids (e.g. `net` for `net-3f2a91c0`).
    const ID_PREFIX: &'static str;

    /// Cloud id of the resource.
    fn id(&self) -> &str;
    /// User-facing name, unique per resource type.
    fn name(&self) -> &str;
}

/// Errors of the fake cloud.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A resource of the same type and name already exists.
    #[error("resource already exists: {type_name} \"{name}\" (id {id})")]
    AlreadyExists {
        type_name: &'static str,
        name: String,
        id: String,
    },
    /// The resource to update does not exist (anymore).
    #[error("resource not found: {type_name} {id}")]
    NotFound { type_name: &'static str, id: String },
    /// The id cannot be used as a file name.
    #[error("invalid resource id {id:?}: expected something like \"{prefix}-3f2a91c0\"")]
    InvalidId { id: String, prefix: &'static str },
    /// Filesystem error.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// An injected fault (see [`crate::faults`]): the cloud's error message.
    #[error("{0}")]
    Injected(String),
    /// A stored file is not valid JSON for its resource type.
    #[error("invalid resource file {}: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// Fields shared by all records, used to look resources up by name.
#[derive(serde::Deserialize)]
struct Identity {
    id: String,
    name: String,
}

/// Handle on the folder that holds the fake cloud.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Store rooted at `root` (created lazily on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Generates a fresh id such as `net-3f2a91c0`.
    pub fn new_id<R: Record>() -> String {
        format!("{}-{:08x}", R::ID_PREFIX, rand::random::<u32>())
    }

    /// Stores a new resource, failing if one with the same name already exists.
    #[cfg(test)]
    pub fn create<R: Record>(&self, record: &R) -> Result<(), StoreError> {
        let fault = self.take_fault::<R>(record.name(), Op::Create)?;
        self.create_after(record, fault.map(|f| f.kind))
    }

    /// Stores a new resource once the fault fired for this create (if any) has been taken;
    /// `slow` and `hang` are the caller's to act out before this.
    pub fn create_after<R: Record>(
        &self,
        record: &R,
        fault: Option<Kind>,
    ) -> Result<(), StoreError> {
        let fault = fault.filter(|k| !matches!(k, Kind::Slow | Kind::Hang));
        if let Some(kind) = fault.filter(|k| *k != Kind::FalseFailure) {
            return Err(StoreError::Injected(
                kind.message(R::TYPE_NAME, record.name()),
            ));
        }
        if let Some(existing) = self.find_by_name::<R>(record.name())? {
            return Err(StoreError::AlreadyExists {
                type_name: R::TYPE_NAME,
                name: existing.name,
                id: existing.id,
            });
        }
        self.write(record)?;
        match fault {
            Some(kind) => Err(StoreError::Injected(
                kind.message(R::TYPE_NAME, record.name()),
            )),
            None => Ok(()),
        }
    }

    /// The injected fault for this operation, if one is configured and left.
    pub fn take_fault<R: Record>(&self, name: &str, op: Op) -> Result<Option<Fault>, StoreError> {
        crate::faults::take(&self.root, R::TYPE_NAME, name, op).map_err(|source| {
            io_error(
                "cannot read faults in",
                self.root.join(crate::faults::FILE),
                source,
            )
        })
    }

    /// The kind of the fault fired for an update or delete (`slow` and `hang` apply to creates
    /// only and do nothing here).
    fn fault<R: Record>(&self, name: &str, op: Op) -> Result<Option<Kind>, StoreError> {
        Ok(self.take_fault::<R>(name, op)?.map(|f| f.kind))
    }

    /// Reads a resource; `None` if it does not exist.
    pub fn read<R: Record>(&self, id: &str) -> Result<Option<R>, StoreError> {
        let path = self.path::<R>(id)?;
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io_error("cannot read", path, source)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Json { path, source })
    }

    /// Overwrites an existing resource.
    pub fn update<R: Record>(&self, record: &R) -> Result<(), StoreError> {
        if let Some(kind) = self.fault::<R>(record.name(), Op::Update)?
            && kind.fails_at_once()
        {
            return Err(StoreError::Injected(
                kind.message(R::TYPE_NAME, record.name()),
            ));
        }
        if !self.path::<R>(record.id())?.exists() {
            return Err(StoreError::NotFound {
                type_name: R::TYPE_NAME,
                id: record.id().to_owned(),
            });
        }
        self.write(record)
    }

    /// Deletes a resource; deleting a missing resource is not an error.
    pub fn delete<R: Record>(&self, id: &str) -> Result<(), StoreError> {
        let path = self.path::<R>(id)?;
        if let Some(record) = self.read::<R>(id)?
            && let Some(kind) = self.fault::<R>(record.name(), Op::Delete)?
            && kind.fails_at_once()
        {
            return Err(StoreError::Injected(
                kind.message(R::TYPE_NAME, record.name()),
            ));
        }
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(io_error("cannot delete", path, source)),
        }
    }

    /// Looks a resource up by name (ids and names of the others only).
    fn find_by_name<R: Record>(&self, name: &str) -> Result<Option<Identity>, StoreError> {
        let dir = self.dir::<R>();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io_error("cannot list", dir, source)),
        };
        for entry in entries {
            let path = entry
                .map_err(|source| io_error("cannot list", dir.clone(), source))?
                .path();
            let is_record = path.extension().is_some_and(|ext| ext == "json") && !is_hidden(&path);
            if !is_record {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                // Deleted concurrently.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(io_error("cannot read", path, source)),
            };
            let identity: Identity = serde_json::from_slice(&bytes)
                .map_err(|source| StoreError::Json { path, source })?;
            if identity.name == name {
                return Ok(Some(identity));
            }
        }
        Ok(None)
    }

    /// Atomically writes `record` to its file.
    fn write<R: Record>(&self, record: &R) -> Result<(), StoreError> {
        let path = self.path::<R>(record.id())?;
        let dir = self.dir::<R>();
        fs::create_dir_all(&dir)
            .map_err(|source| io_error("cannot create", dir.clone(), source))?;
        shared_by_all(&dir, 0o777);

        let mut json = serde_json::to_vec_pretty(record).map_err(|source| StoreError::Json {
            path: path.clone(),
            source,
        })?;
        json.push(b'\n');

        let tmp = dir.join(format!(
            ".{}.{}-{:08x}.tmp",
            record.id(),
            std::process::id(),
            rand::random::<u32>()
        ));
        let result = write_file(&tmp, &json)
            .map_err(|source| io_error("cannot write", tmp.clone(), source))
            .and_then(|()| {
                fs::rename(&tmp, &path)
                    .map_err(|source| io_error("cannot rename", tmp.clone(), source))
            });
        if result.is_err() {
            // Best effort: do not leave temporary files behind.
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn dir<R: Record>(&self) -> PathBuf {
        self.root.join(R::DIR)
    }

    fn path<R: Record>(&self, id: &str) -> Result<PathBuf, StoreError> {
        let valid = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(StoreError::InvalidId {
                id: id.to_owned(),
                prefix: R::ID_PREFIX,
            });
        }
        Ok(self.dir::<R>().join(format!("{id}.json")))
    }
}

fn write_file(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut file = fs::File::create(path)?;
    file.write_all(contents)?;
    shared_by_all(path, 0o666);
    file.sync_all()
}

/// The fake cloud is one folder shared by every job's terraform, which may each run as a user
/// of its own (a runner running as root gives each job one): what one creates, the others may
/// change, as in a real cloud. Best effort.
pub(crate) fn shared_by_all(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode));
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with('.'))
}

fn io_error(action: &'static str, path: PathBuf, source: io::Error) -> StoreError {
    StoreError::Io {
        action,
        path,
        source,
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Widget {
        id: String,
        name: String,
        size: i64,
    }

    impl Record for Widget {
        const TYPE_NAME: &'static str = "testcloud_widget";
        const DIR: &'static str = "widget";
        const ID_PREFIX: &'static str = "wdg";

        fn id(&self) -> &str {
            &self.id
        }
        fn name(&self) -> &str {
            &self.name
        }
    }

    fn widget(name: &str, size: i64) -> Widget {
        Widget {
            id: Store::new_id::<Widget>(),
            name: name.to_owned(),
            size,
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path());
        (dir, store)
    }

    #[test]
    fn new_id_has_prefix_and_eight_hex_digits() {
        let id = Store::new_id::<Widget>();
        let hex = id.strip_prefix("wdg-").expect("prefix");
        assert_eq!(hex.len(), 8);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn create_then_read() {
        let (dir, store) = store();
        let w = widget("a", 1);
        store.create(&w).unwrap();

        let path = dir.path().join("widget").join(format!("{}.json", w.id));
        let on_disk: Widget = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
        assert_eq!(on_disk, w);
        assert_eq!(store.read::<Widget>(&w.id).unwrap(), Some(w));
    }

    #[test]
    fn read_missing_is_none() {
        let (_dir, store) = store();
        assert_eq!(store.read::<Widget>("wdg-00000000").unwrap(), None);
    }

    #[test]
    fn create_conflicts_on_same_name() {
        let (_dir, store) = store();
        let first = widget("a", 1);
        store.create(&first).unwrap();
        store.create(&widget("b", 1)).unwrap();

        let err = store.create(&widget("a", 2)).unwrap_err();
        assert!(matches!(err, StoreError::AlreadyExists { .. }));
        assert_eq!(
            err.to_string(),
            format!(
                "resource already exists: testcloud_widget \"a\" (id {})",
                first.id
            )
        );
    }

    #[test]
    fn update_rewrites_file() {
        let (dir, store) = store();
        let mut w = widget("a", 1);
        store.create(&w).unwrap();
        w.size = 5;
        store.update(&w).unwrap();
        assert_eq!(store.read::<Widget>(&w.id).unwrap(), Some(w));

        let leftovers: Vec<_> = fs::read_dir(dir.path().join("widget"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "temporary files left: {leftovers:?}");
    }

    #[test]
    fn update_missing_is_not_found() {
        let (_dir, store) = store();
        let err = store.update(&widget("a", 1)).unwrap_err();
        assert!(matches!(err, StoreError::NotFound { .. }));
    }

    #[test]
    fn delete_removes_file_and_tolerates_missing() {
        let (_dir, store) = store();
        let w = widget("a", 1);
        store.create(&w).unwrap();
        store.delete::<Widget>(&w.id).unwrap();
        assert_eq!(store.read::<Widget>(&w.id).unwrap(), None);
        store.delete::<Widget>(&w.id).unwrap();
        // The name is free again.
        store.create(&widget("a", 1)).unwrap();
    }

    #[test]
    fn rejects_path_like_ids() {
        let (_dir, store) = store();
        for id in ["", "../etc/passwd", "a/b", "a.json"] {
            let err = store.read::<Widget>(id).unwrap_err();
            assert!(matches!(err, StoreError::InvalidId { .. }), "{id}: {err}");
        }
    }

    #[test]
    fn invalid_json_is_reported() {
        let (dir, store) = store();
        let w = widget("a", 1);
        store.create(&w).unwrap();
        let path = dir.path().join("widget").join(format!("{}.json", w.id));
        fs::write(&path, "{ not json").unwrap();
        let err = store.read::<Widget>(&w.id).unwrap_err();
        assert!(matches!(err, StoreError::Json { .. }), "{err}");
    }
}
