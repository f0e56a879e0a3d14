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
        // Taken before the copy is read: a lease about to lapse is not vouched for after.
        let sure = self.sure_copy(ws);
        // Under a workspace's first lease the copy is most likely absent, and the listing
        // needed then is asked beside it.
        let list_too = sure.is_none() && self.first_lease(ws);
        let (copy, listed) = tokio::join!(
            async {
                Ok::<_, StoreError>(if with_data {
                    self.bucket
                        .get(&copy_key)
                        .await?
                        .map(|o| (number_in(&o.metadata), o.metadata.clone(), Some(o)))
                } else {
                    self.bucket
                        .head(&copy_key)
                        .await?
                        .map(|m| (number_in(&m), m, None))
                })
            },
            async {
                match list_too {
                    true => self.highest_listed(ws).await.map(Some),
                    false => Ok(None),
                }
            }
        );
        let (copy, listed) = (copy?, listed?);
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
                let number = match listed {
                    Some(number) => number,
                    None => self.highest_listed(ws).await?,
                };
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
                self.knew(ws, |held| held.saw(newest.number, newest.deleted, None));
                return Ok(newest);
            }
        };
        let copied = (newest.number > 0).then_some(newest.number);
        // The copy may lag a writer that died between its commit and its copy; not when this
        // store holds the lease and knows the copy is of the newest version, or listed no
        // version after it.
        let known = sure.is_some() && sure == copied;
        if !known && listed.is_none_or(|highest| highest > newest.number) {
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
        }
        self.saw_head(ws, newest.number, newest.deleted);
        self.knew(ws, |held| held.saw(newest.number, newest.deleted, copied));
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
        // This write's own mark, to know it again if its answer is lost. A fenced write's is
        // its fence and its content, so that the same write sent again by its caller
        // (terraform tries a POST again when the first was answered 503) finds the version it
        // made, not a conflict: only the fence's holder writes under it, and the same bytes
        // after the same version by the same holder are the same history. An unfenced
        // write's is random: two writers with the same content are still two.
        let mut metadata = metadata;
        let write_id = match fence {
            // A state's facts carry its hash already; a deletion's content is empty.
            Some(f) => match metadata.get(META_SHA256) {
                Some(sha256) => format!("{}-{sha256}", f.token),
                None => format!("{}-{}", f.token, crate::sha256_hex(&data)),
            },
            None => format!("{:032x}", rand::random::<u128>()),
        };
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
                self.wrote(ws, next, deletion);
                return Ok(next);
            }
        }
        // Two reads, side by side: the conditional write below is what orders writers. A
        // fenced write reads the lease here even when vouched for: it comes here when this
        // store's guess failed (another writer may have written under its lease) or was not
        // there, and these reads may outlast the vouch.
        let (head, record) = tokio::join!(self.head_version(ws), async {
            match fence {
                Some(_) => self.lease_record(ws).await,
                None => Ok(LeaseRecord::default()),
            }
        });
        let (number, deleted) = head?;
        let record = record?;
        let current = (!deleted).then(|| VersionToken(number.to_string()));
        check_put(ws, &record, current.as_ref(), mode, fence)?;
        match self
            .create_next(ws, number, &data, &metadata, &write_id)
            .await?
        {
            Some(next) => {
                self.wrote(ws, next, deletion);
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
        // Until this write is answered it may or may not have landed: an error, or a caller
        // that stops waiting, leaves it in doubt for the rest of the lease, and the release
        // then says nothing is settled (the next taker checks for a version after the copy).
        self.knew(ws, |held| held.unanswered += 1);
        let answered = |held: &mut Held| held.unanswered = held.unanswered.saturating_sub(1);
        if self
            .bucket
            .put(&key, data.clone(), metadata.clone(), Condition::Absent)
            .await?
        {
            self.knew(ws, answered);
            return Ok(Some(next));
        }
        // A client that lost the answer to this very write and sent it again finds the
        // version taken, by itself: the version carries this write's mark, and is its.
        let landed = self.bucket.head(&key).await?;
        self.knew(ws, answered);
        if landed.is_some_and(|facts| facts.get(META_WRITE).map(String::as_str) == Some(write_id)) {
            return Ok(Some(next));
        }
        // Another writer under this store's lease: it knows nothing for sure any more.
        self.forget_head(ws);
        self.forget_held(ws);
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
        match copied {
            Ok(()) => self.knew(ws, |held| held.saw(info.number, false, Some(info.number))),
            Err(e) => {
                tracing::warn!(workspace = %ws, error = %e, "state version committed, but its terraform.tfstate copy failed");
            }
        }
    }

    /// Notes a version this store committed.
    fn wrote(&self, ws: &WorkspaceId, number: u64, deletion: bool) {
        self.saw_head(ws, number, deletion);
        self.knew(ws, |held| held.saw(number, deletion, None));
    }

    /// Starts knowing `ws` for sure under `lease`, just taken: from what the release before
    /// recorded as settled, or from nothing.
    pub(super) fn hold(&self, ws: &WorkspaceId, lease: &Lease, settled: Option<u64>) {
        let held = Held {
            fence: lease.fence,
            sure_until: sure_until(lease),
            head: settled.map(|n| (n, false)),
            copy: settled,
            unanswered: 0,
        };
        self.held().insert(ws.clone(), held);
    }

    /// Moves the time `ws` is known for sure with its lease, renewed.
    pub(super) fn renewed(&self, ws: &WorkspaceId, lease: &Lease) {
        if let Some(held) = self.held().get_mut(ws)
            && held.fence == lease.fence
        {
            held.sure_until = sure_until(lease);
        }
    }

    /// Stops knowing `ws` as `lease` is let go, and says what the next taker may start from:
    /// the newest version, when it is a state and the copy is of it.
    pub(super) fn let_go(&self, ws: &WorkspaceId, lease: &Lease) -> Option<u64> {
        let held = self.held().remove(ws)?;
        held.settled().filter(|_| held.fence == lease.fence)
    }

    /// Whether this store holds the workspace's first lease ever (fence 1), and has not read
    /// it yet: it most likely has no version. Only a hint (versions written under another
    /// lease keeper have no lease here): the listing is asked beside the copy, not after it.
    fn first_lease(&self, ws: &WorkspaceId) -> bool {
        self.held()
            .get(ws)
            .is_some_and(|held| held.fence == 1 && held.head.is_none())
    }

    /// Notes that the copy was deleted (after a deletion).
    pub(super) fn copy_removed(&self, ws: &WorkspaceId) {
        self.knew(ws, |held| held.copy = None);
    }

    pub(super) fn forget_held(&self, ws: &WorkspaceId) {
        self.held().remove(ws);
    }

    /// The version the copy is of, when this store holds the lease, is sure of it (well
    /// before the lease could expire) and knows it is the newest.
    fn sure_copy(&self, ws: &WorkspaceId) -> Option<u64> {
        let held = *self.held().get(ws)?;
        held.settled()
            .filter(|_| OffsetDateTime::now_utc() < held.sure_until)
    }

    /// Changes what this store knows of `ws`, if it holds its lease.
    fn knew(&self, ws: &WorkspaceId, change: impl FnOnce(&mut Held)) {
        if let Some(held) = self.held().get_mut(ws) {
            change(held);
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<WorkspaceId, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
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

/// What a store knows for sure of a workspace while it holds the lease it took: no one else
/// writes then (every write is fenced). It starts from what the release before recorded
/// ([`LeaseRecord::settled`]) and follows this store's own reads and writes. The runner reads
/// and writes a workspace through the one store that took its lease.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    fence: u64,
    /// Until when the lease is surely still this store's: its expiry less a sixth of the time
    /// left when it was taken or renewed (a runner's self-fencing keeps the same margin).
    sure_until: OffsetDateTime,
    /// The newest version and whether it is a deletion (`None`: not known).
    head: Option<(u64, bool)>,
    /// The version the copy (`terraform.tfstate`) is of (`None`: none, or not known).
    copy: Option<u64>,
    /// Version writes sent and not (yet) answered: one whose call failed or was dropped may
    /// have landed, so while any is, the newest version is not known for sure.
    unanswered: u32,
}

impl Held {
    /// Notes version `number` (a deletion or not) as seen or written, and the copy as of
    /// `copy` when it was seen; neither goes back (reads may answer out of order).
    fn saw(&mut self, number: u64, deleted: bool, copy: Option<u64>) {
        if self.head.is_none_or(|(n, _)| number >= n) {
            self.head = Some((number, deleted));
        }
        self.copy = self.copy.max(copy);
    }

    /// The newest version when it is a state, the copy is of it, and no write is in doubt.
    fn settled(&self) -> Option<u64> {
        match self.head {
            Some((n, false)) if self.copy == Some(n) && self.unanswered == 0 => Some(n),
            _ => None,
        }
    }
}

fn sure_until(lease: &Lease) -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    let left = lease.expires_at - now;
    if left <= time::Duration::ZERO {
        now
    } else {
        lease.expires_at - left / 6
    }
}
