//! The version protocol: reading the newest version (the copy is a hint, `n + 1` is checked),
//! and committing the next one with a create-only condition.

use super::*;

impl<B: Bucket> BucketStore<B> {
    /// The number of the newest committed version (0: none), and whether it is a deletion.
    pub(super) async fn head_version(&self, ws: &WorkspaceId) -> Result<(u64, bool)> {
        let newest = self.newest(ws, false).await?;
        Ok((newest.number, newest.deleted))
    }

    /// The newest committed version: its number (0: none), whether it is a deletion, its facts
    /// (object metadata) when it is a state, and, when `with_data` and the copy is of that
    /// version, the copy itself (its content and facts, so a reader needs nothing more).
    /// Copies are only ever made of states, and the copy is removed by a deletion, so an
    /// existing copy is never of a marker.
    pub(super) async fn newest(&self, ws: &WorkspaceId, with_data: bool) -> Result<Newest> {
        let copy_key = self.key(ws, "terraform.tfstate");
        let number_in = |meta: &HashMap<String, String>| {
            meta.get(META_NUMBER)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let copy = if with_data {
            self.bucket
                .get(&copy_key)
                .await?
                .map(|o| (number_in(&o.metadata), o.metadata.clone(), Some(o)))
        } else {
            self.bucket
                .head(&copy_key)
                .await?
                .map(|m| (number_in(&m), m, None))
        };
        let mut newest = match copy {
            Some((number, facts, obj)) => Newest {
                number,
                deleted: number == 0,
                facts: Some(facts),
                copy: obj.filter(|_| number > 0),
            },
            // No copy: a new or deleted workspace. The listing (strongly consistent) says
            // which, and needs no probe after it.
            None => {
                let number = self.highest_listed(ws).await?;
                let mut newest = Newest {
                    number,
                    deleted: true,
                    facts: None,
                    copy: None,
                };
                if number > 0 {
                    let key = self.version_key(ws, number);
                    let meta = self
                        .bucket
                        .head(&key)
                        .await?
                        .ok_or_else(|| self.corrupt(&key, "a listed version does not exist"))?;
                    newest.deleted = is_deleted(&meta);
                    newest.facts = (!newest.deleted).then_some(meta);
                }
                self.saw_head(ws, newest.number, newest.deleted);
                return Ok(newest);
            }
        };
        // The copy may lag a writer that died between its commit and its copy.
        while let Some(meta) = self
            .bucket
            .head(&self.version_key(ws, self.successor(ws, newest.number)?))
            .await?
        {
            newest.number += 1;
            newest.deleted = is_deleted(&meta);
            newest.facts = (!newest.deleted).then_some(meta);
            newest.copy = None;
        }
        self.saw_head(ws, newest.number, newest.deleted);
        Ok(newest)
    }

    pub(super) async fn highest_listed(&self, ws: &WorkspaceId) -> Result<u64> {
        Ok(self
            .keys(&self.key(ws, "versions/"))
            .await?
            .iter()
            .filter_map(|k| version_number(k))
            .max()
            .unwrap_or(0))
    }

    pub(super) async fn version_info(
        &self,
        ws: &WorkspaceId,
        number: u64,
    ) -> Result<Option<VersionInfo>> {
        let key = self.version_key(ws, number);
        let Some(meta) = self.bucket.head(&key).await? else {
            return Ok(None);
        };
        if is_deleted(&meta) {
            return Ok(None);
        }
        info_from_metadata(number, &meta)
            .map(Some)
            .map_err(|detail| self.corrupt(&key, &detail))
    }

    /// Checks a write (fence and expected version) and commits `data` as the next version.
    ///
    /// When the fence's holder vouches for its lease (or there is no fence) and this store
    /// knows the workspace's newest version, the write is the conditional create alone: a guess
    /// that the create-only condition checks, so a stale guess costs a second try with the
    /// reads, never a wrong version.
    pub(super) async fn commit(
        &self,
        ws: &WorkspaceId,
        mode: &PutMode,
        fence: Option<&Fence>,
        data: Bytes,
        metadata: HashMap<String, String>,
    ) -> Result<u64> {
        let deletion = is_deleted(&metadata);
        // This write's own mark, to know it again if its answer is lost.
        let mut metadata = metadata;
        let write_id = format!("{:032x}", rand::random::<u128>());
        metadata.insert(META_WRITE.to_owned(), write_id.clone());
        // A vouched fence spares the read of the lease only while the store answers: one that
        // stopped gets the read, which hangs, rather than a write that lands later.
        let read_lease =
            fence.filter(|f| !(f.is_confirmed_at(OffsetDateTime::now_utc()) && self.live()));
        if read_lease.is_none()
            && let Some((number, deleted)) = self.known_head(ws)
        {
            let current = (!deleted).then(|| VersionToken(number.to_string()));
            if check_put(ws, &LeaseRecord::default(), current.as_ref(), mode, None).is_ok()
                && let Some(next) = self
                    .create_next(ws, number, &data, &metadata, &write_id)
                    .await?
            {
                self.saw_head(ws, next, deletion);
                return Ok(next);
            }
        }
        // Two reads, side by side: the conditional write below is what orders writers.
        let (head, record) = tokio::join!(self.head_version(ws), async {
            match read_lease {
                Some(_) => self.lease_record(ws).await,
                None => Ok(LeaseRecord::default()),
            }
        });
        let (number, deleted) = head?;
        let record = record?;
        let current = (!deleted).then(|| VersionToken(number.to_string()));
        check_put(ws, &record, current.as_ref(), mode, read_lease)?;
        match self
            .create_next(ws, number, &data, &metadata, &write_id)
            .await?
        {
            Some(next) => {
                self.saw_head(ws, next, deletion);
                Ok(next)
            }
            None => Err(StoreError::Conflict {
                workspace: ws.clone(),
                detail: format!(
                    "version {} was written by another writer first",
                    self.successor(ws, number)?
                ),
            }),
        }
    }

    /// Creates version `number + 1` only if it does not exist: `None` when another writer
    /// took it first.
    async fn create_next(
        &self,
        ws: &WorkspaceId,
        number: u64,
        data: &Bytes,
        metadata: &HashMap<String, String>,
        write_id: &str,
    ) -> Result<Option<u64>> {
        let next = self.successor(ws, number)?;
        let key = self.version_key(ws, next);
        if self
            .bucket
            .put(&key, data.clone(), metadata.clone(), Condition::Absent)
            .await?
        {
            return Ok(Some(next));
        }
        // A client that lost the answer to this very write and sent it again finds the
        // version taken, by itself: the version carries this write's mark, and is its.
        let landed = self.bucket.head(&key).await?;
        if landed.is_some_and(|facts| facts.get(META_WRITE).map(String::as_str) == Some(write_id)) {
            return Ok(Some(next));
        }
        self.forget_head(ws);
        Ok(None)
    }

    /// What follows a committed state version, side by side: its change mark (for the backup
    /// sweep) and the convenience copy with the number a reader starts from. Failures are
    /// logged: the version is committed, the copy is a hint, and a missing mark only delays
    /// the version's backup until the workspace's next write.
    pub(super) async fn follow_up(&self, ws: &WorkspaceId, info: &VersionInfo) {
        let (version_key, copy_key) = (
            self.version_key(ws, info.number),
            self.key(ws, "terraform.tfstate"),
        );
        let (marked, copied) = tokio::join!(
            self.mark_changed(ws, info.number, Some(&info.sha256)),
            self.bucket
                .copy(&version_key, &copy_key, Some(info_metadata(info)))
        );
        if let Err(e) = marked {
            tracing::warn!(workspace = %ws, error = %e, "state version committed, but its change mark failed");
        }
        if let Err(e) = copied {
            tracing::warn!(workspace = %ws, error = %e, "state version committed, but its terraform.tfstate copy failed");
        }
    }

    /// The workspace's newest version as this store last saw it, if it did.
    fn known_head(&self, ws: &WorkspaceId) -> Option<(u64, bool)> {
        self.heads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(ws)
            .copied()
    }

    /// Remembers the newest version read or written (never an older one).
    pub(super) fn saw_head(&self, ws: &WorkspaceId, number: u64, deleted: bool) {
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        let head = heads.entry(ws.clone()).or_insert((number, deleted));
        if number >= head.0 {
            *head = (number, deleted);
        }
    }

    fn forget_head(&self, ws: &WorkspaceId) {
        self.heads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(ws);
    }
}

/// What [`BucketStore::newest`] found.
pub(super) struct Newest {
    pub(super) number: u64,
    pub(super) deleted: bool,
    /// The version's facts (its metadata, or the copy's), when it is a state.
    pub(super) facts: Option<HashMap<String, String>>,
    pub(super) copy: Option<Object>,
}
