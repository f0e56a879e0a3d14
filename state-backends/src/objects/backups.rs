//! Backups and change marks: the marks a commit leaves for the sweep, the copies named by
//! what they hold, and retention.

use super::*;

impl<B: Bucket> BucketStore<B> {
    /// After a commit: version `number` (with digest `sha256`; `None`: a deletion) is a change
    /// for the backup sweep. A lost mark (the writer died right after its commit) only delays a
    /// backup until the next write.
    pub(super) async fn mark_changed(
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

    pub(super) fn backup_key(&self, ws: &WorkspaceId, backup: &BackupInfo) -> String {
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
    pub(super) async fn stored_backups(&self, ws: &WorkspaceId) -> Result<Stored> {
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
    pub(super) async fn prune(&self, ws: &WorkspaceId, keep: Retention) -> Result<Vec<String>> {
        self.prune_stored(ws, keep, self.stored_backups(ws).await?)
            .await
    }

    /// [`BucketStore::prune`] over backups already listed.
    pub(super) async fn prune_stored(
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

    /// Copies version `backup.version` as the backup `backup.label`. A copy that failed is
    /// deleted (as far as it can be): a backup is found by listing, so a copy whose name is
    /// there must hold what the name says (an Azure copy can end `failed` with its blob left).
    pub(super) async fn copy_backup(&self, ws: &WorkspaceId, backup: &BackupInfo) -> Result<()> {
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
    pub(super) async fn prune_logged(
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
}

/// A workspace's backups as stored.
#[derive(Default)]
pub(super) struct Stored {
    /// Copies named by what they hold, with their keys.
    pub(super) copies: Vec<(BackupInfo, String)>,
    /// What an older runner's `backups/index.json` records.
    pub(super) index: Vec<BackupInfo>,
}

impl Stored {
    /// One backup per label, oldest first: a copy named by what it holds over an older
    /// runner's index entry, and of those the highest version (a later sweep in the same hour).
    pub(super) fn merged(&self) -> Vec<BackupInfo> {
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

/// A mark's name for a deletion, where a state's has its digest.
pub(super) const DELETED_MARK: &str = "deleted";

/// The backup sweep applies retention to a workspace when its marks span a multiple of this
/// many versions: a listing of its backups every so often, not one per backup.
pub const PRUNE_EVERY: u64 = 24;

/// The version a mark's name (`<n:010>-<sha256>`, `<n:010>-deleted`) names, and its digest.
pub(super) fn mark_from_name(name: &str) -> Option<(u64, Option<String>)> {
    let (number, what) = name.split_once('-')?;
    let number = number.parse().ok().filter(|n| *n > 0)?;
    match what {
        DELETED_MARK => Some((number, None)),
        sha if is_sha256(sha) => Some((number, Some(sha.to_owned()))),
        _ => None,
    }
}

/// The backup a copy's name (`<label>_<n:010>_<sha256>.tfstate`) says it is.
pub(super) fn backup_from_name(name: &str) -> Option<BackupInfo> {
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
pub(super) fn check_label(label: &str) -> Result<()> {
    crate::check_artifact_name("backups", label)?;
    if label.contains('/') {
        return Err(StoreError::InvalidKey(format!("backups/{label}")));
    }
    Ok(())
}

pub(super) fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}
