//! [`StateStore`] for [`BucketStore`]: every store over a bucket, written once.

use super::*;

#[async_trait]
impl<B: Bucket + Clone + 'static> StateStore for BucketStore<B> {
    fn kind(&self) -> &'static str {
        self.bucket.backend()
    }

    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>> {
        let Newest {
            number,
            deleted,
            copy,
            ..
        } = self.heard(self.newest(ws, true).await)?;
        if deleted {
            return Ok(None);
        }
        let key = self.version_key(ws, number);
        let obj = match copy {
            Some(copy) => copy,
            None => self
                .bucket
                .get(&key)
                .await?
                .ok_or_else(|| self.corrupt(&key, "the version vanished"))?,
        };
        let mut version =
            info_from_metadata(number, &obj.metadata).map_err(|d| self.corrupt(&key, &d))?;
        version.size = obj.data.len() as u64;
        if sha256_hex(&obj.data) != version.sha256 {
            return Err(self.corrupt(&key, "the content does not match its sha256"));
        }
        Ok(Some(CurrentState {
            token: VersionToken(number.to_string()),
            data: obj.data,
            version,
        }))
    }

    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        let mut info = VersionInfo {
            number: 0,
            serial: state.serial,
            lineage: state.lineage,
            created_at: OffsetDateTime::now_utc(),
            size: state.data.len() as u64,
            sha256: sha256_hex(&state.data),
        };
        // The number is only known at commit; metadata carries it for the copy, so it is
        // filled in by a retry-free two-step: commit with the facts, then copy with the number.
        let mut meta = info_metadata(&info);
        meta.remove(META_NUMBER);
        let number = self.heard(self.commit(ws, &mode, fence, state.data, meta).await)?;
        info.number = number;
        // The version is committed. Then its change mark and the convenience copy with the
        // number a reader starts from. Neither is needed to read the version back (a reader
        // checks the copy's successor, so the copy may lag), so a writer that vouches for
        // its lease, and settles before it lets it go, is answered now: they run on, after
        // the previous write's, in order.
        if fence.is_some_and(|f| f.is_confirmed_at(OffsetDateTime::now_utc())) && self.live() {
            let store = self.clone();
            let (key, info) = (ws.clone(), info.clone());
            let mut tails = self.tails.lock().unwrap_or_else(|e| e.into_inner());
            let previous = tails.remove(ws);
            let tail = tokio::spawn(async move {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                store.follow_up(&key, &info).await;
            });
            tails.insert(ws.clone(), tail);
        } else {
            self.follow_up(ws, &info).await;
        }
        Ok(info)
    }

    async fn settle(&self, ws: &WorkspaceId) {
        let tail = self
            .tails
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(ws);
        if let Some(tail) = tail
            && let Err(e) = tail.await
        {
            tracing::warn!(workspace = %ws, error = %e, "a state version's follow-ups did not finish");
        }
    }

    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()> {
        // A copy still to be made must not outlive the deletion.
        self.settle(ws).await;
        let meta = HashMap::from([(META_KIND.to_owned(), "deleted".to_owned())]);
        let number = self
            .commit(
                ws,
                &PutMode::Update(expected.clone()),
                fence,
                Bytes::new(),
                meta,
            )
            .await?;
        if let Err(e) = self.mark_changed(ws, number, None).await {
            tracing::warn!(workspace = %ws, error = %e, "deletion committed, but its change mark failed");
        }
        self.bucket
            .delete(&self.key(ws, "terraform.tfstate"))
            .await?;
        self.copy_removed(ws);
        Ok(())
    }

    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>> {
        let mut listed: Vec<(u64, u64)> = self
            .bucket
            .list(&self.key(ws, "versions/"))
            .await?
            .iter()
            .filter_map(|o| Some((version_number(&o.key)?, o.size)))
            .collect();
        listed.sort_unstable();
        let mut out = Vec::with_capacity(listed.len());
        for (number, size) in listed {
            if let Some(mut info) = self.version_info(ws, number).await? {
                info.size = size;
                out.push(info);
            }
        }
        Ok(out)
    }

    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes> {
        let key = self.version_key(ws, number);
        match self.bucket.get(&key).await? {
            Some(obj) if !is_deleted(&obj.metadata) => Ok(obj.data),
            _ => Err(StoreError::NotFound {
                workspace: ws.clone(),
                what: format!("state version {number}"),
            }),
        }
    }

    async fn acquire_lease(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease> {
        let taken = self.heard(self.leases.acquire(ws, &self.base(ws), request).await)?;
        self.hold(ws, &taken.lease, taken.settled);
        Ok(taken.lease)
    }

    async fn renew_lease(&self, ws: &WorkspaceId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let renewed = self.heard(self.leases.renew(ws, &self.base(ws), lease, ttl).await)?;
        self.renewed(ws, &renewed);
        Ok(renewed)
    }

    async fn release_lease(&self, ws: &WorkspaceId, lease: &Lease) -> Result<()> {
        // What the next taker may start from: known only once this lease's writes are done.
        self.settle(ws).await;
        let settled = self.let_go(ws, lease);
        self.heard(
            self.leases
                .release(ws, &self.base(ws), lease, settled)
                .await,
        )
    }

    async fn break_lease(&self, ws: &WorkspaceId, only: Option<u64>) -> Result<Option<Lease>> {
        self.forget_held(ws);
        self.leases.break_lease(ws, &self.base(ws), only).await
    }

    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        Ok(self.lease_record(ws).await?.held)
    }

    async fn snapshot(
        &self,
        ws: &WorkspaceId,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        check_label(label)?;
        let (newest, stored) = tokio::join!(self.newest(ws, false), self.stored_backups(ws));
        let newest = newest?;
        let Some(facts) = newest.facts.filter(|_| !newest.deleted) else {
            return Ok(None);
        };
        let version_key = self.version_key(ws, newest.number);
        let info = info_from_metadata(newest.number, &facts)
            .map_err(|detail| self.corrupt(&version_key, &detail))?;
        let mut stored = stored?;
        // Unchanged since the latest backup (of the highest version).
        if stored
            .merged()
            .iter()
            .max_by_key(|b| b.version)
            .is_some_and(|b| b.sha256 == info.sha256)
        {
            return Ok(None);
        }
        let backup = BackupInfo {
            label: label.to_owned(),
            version: newest.number,
            sha256: info.sha256,
        };
        self.copy_backup(ws, &backup).await?;
        // Retention over the listing read above, with the new copy.
        stored
            .copies
            .push((backup.clone(), self.backup_key(ws, &backup)));
        let pruned = self.prune_logged(ws, keep, Some(stored)).await;
        Ok(Some(Snapshot { backup, pruned }))
    }

    async fn back_up(
        &self,
        changed: &Changed,
        label: &str,
        keep: Retention,
    ) -> Result<Option<Snapshot>> {
        let Some(marked) = &changed.marked else {
            return self.snapshot(&changed.ws, label, keep).await;
        };
        check_label(label)?;
        let ws = &changed.ws;
        // Retention lists the backups, so it runs when the marks span a multiple of
        // PRUNE_EVERY versions (a deletion's too).
        let prune = marked.last / PRUNE_EVERY > marked.first.saturating_sub(1) / PRUNE_EVERY;
        // The newest mark's version, copied as it is: a deletion has nothing to copy.
        let Some(sha256) = &marked.sha256 else {
            if prune {
                self.prune_logged(ws, keep, None).await;
            }
            return Ok(None);
        };
        let backup = BackupInfo {
            label: label.to_owned(),
            version: marked.last,
            sha256: sha256.clone(),
        };
        if let Err(e) = self.copy_backup(ws, &backup).await {
            // A version that is not there (removed by hand, say) would fail every sweep:
            // there is nothing to copy.
            if self
                .bucket
                .head(&self.version_key(ws, marked.last))
                .await?
                .is_none()
            {
                tracing::warn!(workspace = %ws, version = marked.last, "the marked version does not exist: nothing to back up");
                return Ok(None);
            }
            return Err(e);
        }
        let pruned = if prune {
            self.prune_logged(ws, keep, None).await
        } else {
            Vec::new()
        };
        Ok(Some(Snapshot { backup, pruned }))
    }

    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        Ok(self.stored_backups(ws).await?.merged())
    }

    async fn backup(&self, ws: &WorkspaceId, label: &str) -> Result<Bytes> {
        crate::check_artifact_name("backups", label)?;
        let stored = self.stored_backups(ws).await?;
        // A copy named by what it holds (the highest version of that label), else an older
        // runner's indexed copy.
        let copy = stored
            .copies
            .iter()
            .filter(|(b, _)| b.label == label)
            .max_by_key(|(b, _)| b.version)
            .map(|(b, key)| (b.sha256.clone(), key.clone()));
        let indexed = || {
            stored.index.iter().find(|b| b.label == label).map(|b| {
                let key = self.key(ws, &format!("backups/{label}.tfstate"));
                (b.sha256.clone(), key)
            })
        };
        let not_found = || StoreError::NotFound {
            workspace: ws.clone(),
            what: format!("backup {label}"),
        };
        let (sha256, key) = copy.or_else(indexed).ok_or_else(not_found)?;
        let object = self.bucket.get(&key).await?.ok_or_else(not_found)?;
        crate::check_digest(&format!("backup {label}"), &object.data, &sha256)?;
        Ok(object.data)
    }

    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        self.heard(
            self.bucket
                .put(&key, data, HashMap::new(), Condition::None)
                .await,
        )?;
        Ok(())
    }

    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        Ok(self.heard(self.bucket.get(&key).await)?.map(|o| o.data))
    }

    fn answering(&self) -> bool {
        self.live()
    }

    async fn delete_artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<()> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        self.bucket.delete(&key).await
    }

    async fn artifacts(&self, ws: &WorkspaceId, job_id: &str) -> Result<Vec<String>> {
        crate::check_artifact_name(job_id, "x")?;
        let prefix = self.key(ws, &format!("runs/{job_id}/"));
        let mut names: Vec<String> = self
            .keys(&prefix)
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    async fn runs(&self, ws: &WorkspaceId) -> Result<Vec<String>> {
        let mut ids = self.bucket.folders(&self.key(ws, "runs/")).await?;
        ids.sort();
        Ok(ids)
    }

    async fn changed(&self) -> Result<Vec<Changed>> {
        /// One workspace's marks as listed.
        #[derive(Default)]
        struct Marks {
            entries: Vec<String>,
            old: bool,
            versions: Vec<(u64, Option<String>)>,
        }
        let prefix = self.changes_prefix();
        let mut found: std::collections::BTreeMap<String, (WorkspaceId, Marks)> =
            std::collections::BTreeMap::new();
        // An emptied mark is a cleared one of an older runner (see `Bucket::clear_if`).
        for o in self
            .bucket
            .list(&prefix)
            .await?
            .into_iter()
            .filter(|o| o.size > 0)
        {
            let Some(rest) = o.key.strip_prefix(&prefix) else {
                continue;
            };
            let parts: Vec<&str> = rest.split('/').collect();
            let Some(Ok(ws)) = parts.get(..2).map(|p| WorkspaceId::new(p[0], p[1])) else {
                continue;
            };
            let marks = &mut found
                .entry(ws.to_string())
                .or_insert_with(|| (ws, Marks::default()))
                .1;
            match parts[2..] {
                // An older runner's one mark per workspace: cleared only if its tag is still
                // this one; it does not say which version, so the sweep reads the current one.
                [] => {
                    marks.entries.push(o.tag);
                    marks.old = true;
                }
                [name] => {
                    if let Some(version) = mark_from_name(name) {
                        marks.entries.push(o.key.clone());
                        marks.versions.push(version);
                    }
                }
                _ => {}
            }
        }
        Ok(found
            .into_values()
            .filter(|(_, marks)| !marks.entries.is_empty())
            .map(|(ws, marks)| {
                let first = marks.versions.iter().map(|(n, _)| *n).min();
                let last = marks.versions.into_iter().max_by_key(|(n, _)| *n);
                let marked = match (first, last) {
                    (Some(first), Some((last, sha256))) if !marks.old => Some(Marked {
                        first,
                        last,
                        sha256,
                    }),
                    _ => None,
                };
                Changed {
                    ws,
                    mark: marks.entries.join("\n"),
                    marked,
                }
            })
            .collect())
    }

    async fn workspaces(&self) -> Result<Vec<WorkspaceId>> {
        let root = self.root();
        let mut out = Vec::new();
        for tenant in self.bucket.folders(&root).await? {
            // `_changes/` and the like: `_` cannot start a tenant name.
            if tenant.starts_with('_') {
                continue;
            }
            for workspace in self.bucket.folders(&format!("{root}{tenant}/")).await? {
                if let Ok(ws) = WorkspaceId::new(&tenant, &workspace) {
                    out.push(ws);
                }
            }
        }
        out.sort_by_key(ToString::to_string);
        Ok(out)
    }

    async fn clear_changed(&self, changed: &Changed) -> Result<()> {
        // Entries are the listed marks' keys, or an older runner's mark's tag (no key's).
        let prefix = self.changes_prefix();
        let (mut keys, tags): (Vec<&str>, Vec<&str>) =
            changed.mark.lines().partition(|e| e.starts_with(&prefix));
        for tag in tags {
            self.bucket
                .clear_if(&self.change_key(&changed.ws), tag)
                .await?;
        }
        // The highest mark goes last: if deleting the others fails midway, the one left still
        // names the newest version, so the next sweep never backs up an older one under a
        // newer label.
        keys.sort_unstable();
        let Some(highest) = keys.pop() else {
            return Ok(());
        };
        let rest: Vec<String> = keys.into_iter().map(str::to_owned).collect();
        self.bucket.delete_many(&rest).await?;
        self.bucket.delete(highest).await
    }
}
