//! What runners before 2026-11-25 left in a bucket, still read, restored from and pruned:
//! their backups' index (`backups/index.json`). Delete this file (and its callers' uses) once
//! no bucket holds one.

use super::*;

impl<B: Bucket> BucketStore<B> {
    /// Drops an older runner's backup `label`: out of its index (only if the index is still
    /// the one read), then its copy, so an index entry never names a missing copy.
    pub(super) async fn drop_indexed(&self, ws: &WorkspaceId, label: &str) -> Result<()> {
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

    pub(super) async fn backup_index(
        &self,
        key: &str,
    ) -> Result<(Vec<BackupInfo>, Option<String>)> {
        match self.bucket.get(key).await? {
            Some(obj) => Ok((
                serde_json::from_slice(&obj.data).map_err(|e| self.corrupt(key, &e.to_string()))?,
                Some(obj.tag),
            )),
            None => Ok((Vec::new(), None)),
        }
    }

    /// Writes the index if it is still the one read (`tag`; `None`: there was none).
    pub(super) async fn put_backup_index(
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

/// An older runner's backup index, under `backups/`.
pub(super) const INDEX: &str = "index.json";
