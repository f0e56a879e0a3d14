//! Unit tests of the bucket protocol, on an in-memory bucket.

use super::*;
use crate::StateStoreExt;
use crate::memory::MemoryBucket;

#[test]
fn version_keys_parse_back_to_numbers() {
    assert_eq!(
        version_number("p/t/w/versions/0000000042.tfstate"),
        Some(42)
    );
    assert_eq!(version_number("p/t/w/versions/notes.txt"), None);
}

/// A memory bucket with a client's troubles: with `sent_twice`, every version and
/// lock-object write is sent twice, as a client does when the answer to the first is lost
/// (the first lands, the second finds the version taken); deletions of keys containing
/// `refuses` fail, and a batch deletion tries every key and reports any that failed (as
/// S3's `DeleteObjects`).
#[derive(Clone, Debug, Default)]
struct Troubled {
    inner: MemoryBucket,
    sent_twice: bool,
    refuses: Option<&'static str>,
    /// Every copy fails (as for a writer that dies before its convenience copy).
    no_copies: bool,
    /// Reads (get, head, list) so far.
    reads: Arc<std::sync::atomic::AtomicU64>,
    /// Reads under way, and the most that were at once (each read lasts 20 ms when `slow`).
    in_flight: Arc<std::sync::atomic::AtomicU64>,
    most_at_once: Arc<std::sync::atomic::AtomicU64>,
    slow: bool,
    /// A key whose writes are refused whatever their condition until [`Bucket::unlock`] is
    /// asked for it (as an Azure blob lease refuses them), and how many unlocks were asked.
    locked: Arc<std::sync::Mutex<Option<String>>>,
    /// The backend it stands for (`troubled` when none).
    name: Option<&'static str>,
    unlocks: Arc<std::sync::atomic::AtomicU64>,
    /// Lock-object writes still to be beaten by another writer: the object is written again,
    /// unchanged but with a new tag, just before each, whose condition then fails.
    beaten: Arc<std::sync::atomic::AtomicU64>,
    /// Version writes still to land and then have their answer lost: the call fails (a
    /// retryable error), or, with `stall_after_landing`, never returns.
    lost_answers: Arc<std::sync::atomic::AtomicU64>,
    stall_after_landing: bool,
}

impl Troubled {
    fn lock(&self, key: &str) {
        *self.locked.lock().unwrap() = Some(key.to_owned());
    }
    fn unlocks(&self) -> u64 {
        self.unlocks.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn most_at_once(&self) -> u64 {
        self.most_at_once.load(std::sync::atomic::Ordering::SeqCst)
    }
    async fn read<T>(&self, read: impl std::future::Future<Output = T>) -> T {
        use std::sync::atomic::Ordering::SeqCst;
        self.reads.fetch_add(1, SeqCst);
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.most_at_once.fetch_max(now, SeqCst);
        if self.slow {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = read.await;
        self.in_flight.fetch_sub(1, SeqCst);
        out
    }
}

#[async_trait]
impl Bucket for Troubled {
    fn backend(&self) -> &'static str {
        self.name.unwrap_or("troubled")
    }
    async fn get(&self, key: &str) -> Result<Option<Object>> {
        self.read(self.inner.get(key)).await
    }
    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
        self.read(self.inner.head(key)).await
    }
    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<Option<String>>> {
        if self.locked.lock().unwrap().as_deref() == Some(key) {
            return Ok(None);
        }
        use std::sync::atomic::Ordering::SeqCst;
        if key.contains("/versions/")
            && self
                .lost_answers
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            let landed = self.inner.put(key, data, metadata, condition).await?;
            assert!(landed, "the lost write lands");
            if self.stall_after_landing {
                std::future::pending::<()>().await;
            }
            return Err(StoreError::Backend {
                backend: "troubled",
                message: format!("PUT {key}: connection reset after the request was sent"),
                retryable: true,
                source: None,
            });
        }
        if key.ends_with("/lease.json")
            && self
                .beaten
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            && let Some(o) = self.inner.get(key).await?
        {
            let rewritten = self.inner.put(key, o.data, o.metadata, Condition::None);
            assert!(rewritten.await?);
        }
        if self.sent_twice && (key.contains("/versions/") || key.ends_with("/lease.json")) {
            let first = self
                .inner
                .put(key, data.clone(), metadata.clone(), condition)
                .await?;
            assert!(first, "the first try lands");
            // The second try's answer is the one the client sees: no tag of the first.
            return Ok(self
                .inner
                .put(key, data, metadata, condition)
                .await?
                .then_some(None));
        }
        self.inner.put_tagged(key, data, metadata, condition).await
    }
    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        if self.no_copies {
            return Err(StoreError::Backend {
                backend: "troubled",
                message: format!("COPY {from}: refused"),
                retryable: true,
                source: None,
            });
        }
        self.inner.copy(from, to, metadata).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        if self.refuses.is_some_and(|r| key.contains(r)) {
            return Err(StoreError::Backend {
                backend: "troubled",
                message: format!("DELETE {key}: refused"),
                retryable: true,
                source: None,
            });
        }
        self.inner.delete(key).await
    }
    async fn delete_many(&self, keys: &[String]) -> Result<()> {
        let mut failed = Ok(());
        for key in keys {
            if let Err(e) = self.delete(key).await {
                failed = Err(e);
            }
        }
        failed
    }
    fn empty_lock_object_is_unrecorded(&self) -> bool {
        self.name == Some("azure")
    }
    async fn unlock(&self, key: &str) -> Result<()> {
        self.unlocks
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut locked = self.locked.lock().unwrap();
        if locked.as_deref() == Some(key) {
            *locked = None;
        }
        Ok(())
    }
    async fn clear_if(&self, key: &str, tag: &str) -> Result<()> {
        self.inner.clear_if(key, tag).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.read(self.inner.list(prefix)).await
    }
    async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.folders(prefix).await
    }
}

fn state(serial: u64) -> crate::NewState {
    crate::NewState::parse(crate::tfstate::empty_state("l-1", serial)).unwrap()
}

async fn write(store: &BucketStore<MemoryBucket>, ws: &WorkspaceId, serial: u64) -> u64 {
    let mode = match store.current(ws).await.unwrap() {
        Some(current) => PutMode::Update(current.token),
        None => PutMode::Create,
    };
    store
        .put(ws, state(serial), mode, None)
        .await
        .unwrap()
        .number
}

fn label(hour: u64) -> String {
    format!("2026-11-{:02}T{:02}", 1 + hour / 24, hour % 24)
}

/// The sweep's marks name their version: the copy is of that version, named by it, and
/// the marks listed are deleted; a write after the listing keeps its own.
#[tokio::test]
async fn marks_name_the_version_the_sweep_copies_and_deletes_only_those_listed() {
    let store = BucketStore::over(MemoryBucket::new(), "p", None);
    let ws = WorkspaceId::new("acme", "marks").unwrap();
    write(&store, &ws, 1).await;
    write(&store, &ws, 2).await;
    let changed = store.changed().await.unwrap().pop().unwrap();
    let marked = changed.marked.clone().expect("the marks name versions");
    assert_eq!((marked.first, marked.last), (1, 2));
    let third = write(&store, &ws, 3).await;
    let made = store
        .back_up(&changed, "2026-11-24T01", Retention::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(made.backup.version, 2, "the version the listed marks name");
    let key = store.backup_key(&ws, &made.backup);
    assert!(key.starts_with("p/acme/marks/backups/2026-11-24T01_0000000002_"));
    let copy = store.bucket.get(&key).await.unwrap().unwrap();
    assert_eq!(copy.data, store.version(&ws, 2).await.unwrap());
    store.clear_changed(&changed).await.unwrap();
    let left = store
        .changed()
        .await
        .unwrap()
        .pop()
        .expect("the later write's mark stays");
    let marked = left.marked.unwrap();
    assert_eq!((marked.first, marked.last), (third, third));
}

/// Retention lists a workspace's backups only when its marks span a multiple of
/// PRUNE_EVERY versions; between two, at most that many backups pile up.
#[tokio::test]
async fn retention_runs_every_so_many_versions() {
    let store = BucketStore::over(MemoryBucket::new(), "p", None);
    let ws = WorkspaceId::new("acme", "often").unwrap();
    let keep = Retention {
        hourly: 2,
        daily: 0,
    };
    for hour in 1..PRUNE_EVERY {
        write(&store, &ws, hour).await;
        let changed = store.changed().await.unwrap().pop().unwrap();
        let made = store
            .back_up(&changed, &label(hour), keep)
            .await
            .unwrap()
            .unwrap();
        assert!(made.pruned.is_empty());
        store.clear_changed(&changed).await.unwrap();
    }
    assert_eq!(store.backups(&ws).await.unwrap().len(), 23);
    write(&store, &ws, PRUNE_EVERY).await;
    let changed = store.changed().await.unwrap().pop().unwrap();
    let made = store
        .back_up(&changed, &label(PRUNE_EVERY), keep)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(made.pruned.len(), 22);
    assert_eq!(made.pruned[0], label(22), "newest first");
    store.clear_changed(&changed).await.unwrap();
    let kept: Vec<String> = store
        .backups(&ws)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.label)
        .collect();
    assert_eq!(kept, [label(23), label(24)]);
    let copies = store.bucket.list("p/acme/often/backups/").await.unwrap();
    assert_eq!(copies.len(), 2, "the dropped copies are gone");

    // Two sweeps in one hour: the later copy of the label replaces the earlier at the
    // next prune, which a deletion's marks bring too.
    for serial in [PRUNE_EVERY + 1, PRUNE_EVERY + 2] {
        write(&store, &ws, serial).await;
        let changed = store.changed().await.unwrap().pop().unwrap();
        store
            .back_up(&changed, &label(25), keep)
            .await
            .unwrap()
            .unwrap();
        store.clear_changed(&changed).await.unwrap();
    }
    let listed = store.bucket.list("p/acme/often/backups/").await.unwrap();
    assert_eq!(
        listed.len(),
        4,
        "two copies of one label until the next prune: {:?}",
        listed.iter().map(|l| &l.key).collect::<Vec<_>>()
    );
    let newest = store.backups(&ws).await.unwrap().pop().unwrap();
    assert_eq!((newest.label, newest.version), (label(25), PRUNE_EVERY + 2));
    for serial in PRUNE_EVERY + 3..2 * PRUNE_EVERY {
        write(&store, &ws, serial).await;
    }
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store.delete_current(&ws, &token, None).await.unwrap();
    let changed = store.changed().await.unwrap().pop().unwrap();
    assert_eq!(changed.marked.as_ref().unwrap().last, 2 * PRUNE_EVERY);
    assert!(
        store
            .back_up(&changed, &label(26), keep)
            .await
            .unwrap()
            .is_none()
    );
    let listed = store.bucket.list("p/acme/often/backups/").await.unwrap();
    assert_eq!(listed.len(), 2, "pruned at a deletion's turn too");
    let kept: Vec<(String, u64)> = store
        .backups(&ws)
        .await
        .unwrap()
        .into_iter()
        .map(|b| (b.label, b.version))
        .collect();
    assert_eq!(
        kept,
        [(label(24), PRUNE_EVERY), (label(25), PRUNE_EVERY + 2)]
    );
}

/// An older runner's change mark of workspace `acme/old`: one per workspace, its content
/// the version.
async fn older_mark(b: &MemoryBucket) {
    b.put(
        "p/_changes/acme/old",
        Bytes::from("2"),
        HashMap::new(),
        Condition::None,
    )
    .await
    .unwrap();
}

/// A bucket an older runner wrote (one mark per workspace, `backups/<label>.tfstate` and
/// `backups/index.json`): its mark is swept from the current state, its backups are listed
/// beside the new ones, and retention drops them through the index.
#[tokio::test]
async fn an_older_runners_mark_and_backups_are_swept_listed_and_pruned() {
    let store = BucketStore::over(MemoryBucket::new(), "p", None);
    let ws = WorkspaceId::new("acme", "old").unwrap();
    write(&store, &ws, 1).await;
    let changed = store.changed().await.unwrap().pop().unwrap();
    store.clear_changed(&changed).await.unwrap();
    // What an older runner left: the backup of version 1, its index, and its mark for a
    // write whose own mark is lost.
    let v1 = store.versions(&ws).await.unwrap().pop().unwrap();
    let b = &store.bucket;
    b.copy(
        "p/acme/old/versions/0000000001.tfstate",
        "p/acme/old/backups/2026-11-24T01.tfstate",
        None,
    )
    .await
    .unwrap();
    let old = BackupInfo {
        label: "2026-11-24T01".into(),
        version: 1,
        sha256: v1.sha256,
    };
    let index = serde_json::to_vec(&[&old]).unwrap();
    b.put(
        "p/acme/old/backups/index.json",
        index.into(),
        HashMap::new(),
        Condition::None,
    )
    .await
    .unwrap();
    write(&store, &ws, 2).await;
    older_mark(b).await;

    let changed = store.changed().await.unwrap().pop().unwrap();
    assert_eq!(
        changed.marked, None,
        "an older mark sends the sweep to the current state"
    );
    let made = store
        .back_up(&changed, "2026-11-24T02", Retention::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(made.backup.version, 2);
    assert_eq!(
        store.backups(&ws).await.unwrap(),
        [old.clone(), made.backup.clone()]
    );
    store.clear_changed(&changed).await.unwrap();
    assert!(
        store.changed().await.unwrap().is_empty(),
        "both marks cleared"
    );

    // Retention drops the older runner's backup through its index, then its copy.
    let keep_one = Retention {
        hourly: 1,
        daily: 0,
    };
    assert_eq!(store.prune(&ws, keep_one).await.unwrap(), ["2026-11-24T01"]);
    assert_eq!(
        store.backups(&ws).await.unwrap(),
        std::slice::from_ref(&made.backup)
    );
    assert!(
        b.get("p/acme/old/backups/2026-11-24T01.tfstate")
            .await
            .unwrap()
            .is_none()
    );
    let index = b
        .get("p/acme/old/backups/index.json")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&index.data[..], b"[]", "out of the index");

    // An older runner's mark alone: the current state, already backed up, is unchanged.
    older_mark(b).await;
    let changed = store.changed().await.unwrap().pop().unwrap();
    assert_eq!(changed.marked, None);
    assert!(
        store
            .back_up(&changed, "2026-11-24T03", keep_one)
            .await
            .unwrap()
            .is_none()
    );
    store.clear_changed(&changed).await.unwrap();
    assert!(store.changed().await.unwrap().is_empty());
}

/// A marked version that is gone (removed by hand) is not a failure every hour: there is
/// nothing to copy, and no failed copy is left.
#[tokio::test]
async fn a_marked_version_that_is_gone_is_nothing_to_back_up() {
    let store = BucketStore::over(MemoryBucket::new(), "p", None);
    let ws = WorkspaceId::new("acme", "gone").unwrap();
    write(&store, &ws, 1).await;
    write(&store, &ws, 2).await;
    let changed = store.changed().await.unwrap().pop().unwrap();
    store
        .bucket
        .delete("p/acme/gone/versions/0000000002.tfstate")
        .await
        .unwrap();
    let made = store
        .back_up(&changed, "2026-11-24T01", Retention::default())
        .await
        .unwrap();
    assert_eq!(made, None, "nothing to copy");
    let listed = store.bucket.list("p/acme/gone/backups/").await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

/// Clearing several marks that fails midway leaves the highest: the next sweep still copies
/// the newest version, never an older one under a newer label.
#[tokio::test]
async fn a_clearing_that_fails_midway_leaves_the_highest_mark() {
    let bucket = Troubled {
        refuses: Some("/0000000001-"),
        ..Troubled::default()
    };
    let store = BucketStore::over(bucket, "p", None);
    let ws = WorkspaceId::new("acme", "midway").unwrap();
    for serial in 1..=2 {
        let mode = match store.current(&ws).await.unwrap() {
            Some(current) => PutMode::Update(current.token),
            None => PutMode::Create,
        };
        store.put(&ws, state(serial), mode, None).await.unwrap();
    }
    let changed = store.changed().await.unwrap().pop().unwrap();
    let made = store
        .back_up(&changed, "2026-11-24T01", Retention::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(made.backup.version, 2);
    assert!(store.clear_changed(&changed).await.is_err());
    let left = store.changed().await.unwrap().pop().unwrap();
    assert_eq!(
        left.marked.unwrap().last,
        2,
        "the highest mark is still there"
    );
}

#[tokio::test]
async fn writes_sent_twice_are_one_version_and_one_lease_not_a_conflict() {
    let bucket = Troubled {
        sent_twice: true,
        ..Troubled::default()
    };
    let store = BucketStore::over(bucket, "p", None);
    let ws = WorkspaceId::new("acme", "twice").unwrap();
    let state = |serial: u64| {
        crate::NewState::parse(Bytes::from(format!(
            r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"l-1","outputs":{{}},"resources":[]}}"#
        )))
        .unwrap()
    };
    let mut mode = PutMode::Create;
    for serial in 1..=2 {
        let info = store.put(&ws, state(serial), mode, None).await.unwrap();
        assert_eq!(info.number, serial);
        mode = PutMode::Update(store.current(&ws).await.unwrap().unwrap().token);
    }
    assert_eq!(store.versions(&ws).await.unwrap().len(), 2);
    // The lease too: taken, renewed and let go with every write sent twice, never found
    // held by itself.
    let request = crate::LeaseRequest {
        owner: "job-1".into(),
        ttl: Duration::from_secs(60),
        info: serde_json::Value::Null,
    };
    let lease = store.acquire_lease(&ws, &request).await.unwrap();
    assert_eq!(lease.fence, 1);
    let renewed = store
        .renew_lease(&ws, &lease, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(renewed.fence, 1);
    store.release_lease(&ws, &renewed).await.unwrap();
    assert!(store.lease(&ws).await.unwrap().is_none());
    let PutMode::Update(last) = &mode else {
        unreachable!()
    };
    store.delete_current(&ws, last, None).await.unwrap();
    assert!(store.current(&ws).await.unwrap().is_none());
    // Another writer's version at the same number is still a conflict, even with the same
    // content, or when both are deletions.
    let racing = BucketStore::over(crate::memory::MemoryBucket::new(), "p", None);
    racing
        .put(&ws, state(1), PutMode::Create, None)
        .await
        .unwrap();
    let read = racing.current(&ws).await.unwrap().unwrap().token;
    let (first, second) = tokio::join!(
        racing.put(&ws, state(2), PutMode::Update(read.clone()), None),
        racing.put(&ws, state(2), PutMode::Update(read.clone()), None)
    );
    assert!(
        first.is_ok() != second.is_ok(),
        "exactly one of two same writes wins: {first:?} {second:?}"
    );
    let read = racing.current(&ws).await.unwrap().unwrap().token;
    let (first, second) = tokio::join!(
        racing.delete_current(&ws, &read, None),
        racing.delete_current(&ws, &read, None)
    );
    assert!(
        first.is_ok() != second.is_ok(),
        "exactly one of two deletions wins: {first:?} {second:?}"
    );
    let other = BucketStore::over(crate::memory::MemoryBucket::new(), "p", None);
    other
        .put(&ws, state(1), PutMode::Create, None)
        .await
        .unwrap();
    let read = other.current(&ws).await.unwrap().unwrap().token;
    let taken = other.version_key(&ws, 2);
    other
        .bucket
        .put(
            &taken,
            Bytes::from_static(b"{}"),
            HashMap::new(),
            Condition::Absent,
        )
        .await
        .unwrap();
    let refused = other
        .put(&ws, state(2), PutMode::Update(read), None)
        .await
        .unwrap_err();
    assert!(matches!(refused, StoreError::Conflict { .. }), "{refused}");
}

#[test]
fn version_facts_round_trip_through_metadata() {
    let info = VersionInfo {
        number: 3,
        serial: 7,
        lineage: "l-1".into(),
        created_at: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
        size: 0,
        sha256: "ab".into(),
    };
    assert_eq!(info_from_metadata(3, &info_metadata(&info)).unwrap(), info);
    let mut meta = info_metadata(&info);
    meta.remove(META_SERIAL);
    assert!(info_from_metadata(3, &meta).unwrap_err().contains("serial"));
}

/// A lease on `ws` held for a minute, and its fence vouched for by its holder for 10 s.
async fn vouched(store: &BucketStore<Troubled>, ws: &WorkspaceId) -> Fence {
    let lease = store
        .acquire_lease(
            ws,
            &crate::LeaseRequest {
                owner: "job-1".into(),
                ttl: Duration::from_secs(60),
                info: serde_json::Value::Null,
            },
        )
        .await
        .unwrap();
    lease
        .fence()
        .confirmed_until(OffsetDateTime::now_utc() + Duration::from_secs(10))
}

#[tokio::test]
async fn a_vouched_write_with_a_known_head_is_one_conditional_create_and_settles_after() {
    let bucket = Troubled::default();
    let store = BucketStore::over(bucket.clone(), "p", None);
    let ws: WorkspaceId = "acme/fast".parse().unwrap();
    let fence = vouched(&store, &ws).await;
    // The read a run starts from tells the store the newest version (none).
    assert!(store.current(&ws).await.unwrap().is_none());
    let before = bucket.reads();
    let first = store
        .put(&ws, state(1), PutMode::Create, Some(&fence))
        .await
        .unwrap();
    let second = store
        .put(&ws, state(2), PutMode::Update(first.token()), Some(&fence))
        .await
        .unwrap();
    assert_eq!((first.number, second.number), (1, 2));
    assert_eq!(
        bucket.reads(),
        before,
        "a vouched write with a known head read neither the lease nor the newest version"
    );
    // Read back before the follow-ups settle: the copy may lag, the newest version is found.
    let current = store.current(&ws).await.unwrap().unwrap();
    assert_eq!(current.version.number, 2);
    store.settle(&ws).await;
    let copy = bucket
        .inner
        .head("p/acme/fast/terraform.tfstate")
        .await
        .unwrap()
        .expect("the copy is made once settled");
    assert_eq!(copy.get(META_NUMBER).map(String::as_str), Some("2"));
    let marks = bucket.inner.list("p/_changes/acme/fast/").await.unwrap();
    assert_eq!(marks.len(), 2, "each version's change mark: {marks:?}");
}

#[tokio::test]
async fn a_stale_known_head_costs_a_read_never_a_wrong_version() {
    let bucket = Troubled::default();
    let ours = BucketStore::over(bucket.clone(), "p", None);
    let other = BucketStore::over(bucket.clone(), "p", None);
    let ws: WorkspaceId = "acme/stale".parse().unwrap();
    // This store learns "no state"; another writer then makes version 1 behind its back.
    assert!(ours.current(&ws).await.unwrap().is_none());
    let theirs = other
        .put(&ws, state(1), PutMode::Create, None)
        .await
        .unwrap();
    // A create on the stale view is refused: version 1 is taken and the write is no successor.
    let refused = ours.put(&ws, state(1), PutMode::Create, None).await;
    assert!(
        matches!(refused, Err(StoreError::Conflict { .. })),
        "{refused:?}"
    );
    // An update from the version it now knows lands as version 2, though its guess was 0.
    let other_view = BucketStore::over(bucket.clone(), "p", None);
    let stale = BucketStore::over(bucket.clone(), "p", None);
    assert!(stale.current(&ws).await.unwrap().is_some());
    other_view
        .put(&ws, state(2), PutMode::Update(theirs.token()), None)
        .await
        .unwrap();
    let refused = stale
        .put(&ws, state(2), PutMode::Update(theirs.token()), None)
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict { .. })),
        "an update from version 1 after version 2 was written: {refused:?}"
    );
    let numbers: Vec<u64> = ours
        .versions(&ws)
        .await
        .unwrap()
        .iter()
        .map(|v| v.number)
        .collect();
    assert_eq!(numbers, vec![1, 2], "no version written twice or skipped");
}

#[tokio::test]
async fn a_fence_vouched_for_no_longer_reads_the_lease_again_and_a_broken_lease_refuses() {
    let bucket = Troubled::default();
    let store = BucketStore::over(bucket.clone(), "p", None);
    let ws: WorkspaceId = "acme/broken".parse().unwrap();
    let fence = vouched(&store, &ws).await;
    store
        .put(&ws, state(1), PutMode::Create, Some(&fence))
        .await
        .unwrap();
    store.break_lease(&ws, None).await.unwrap();
    // The holder no longer vouches (its watchdog found the lease lost, or the time passed).
    let mut expired = fence.clone();
    expired.confirmed_until = Some(OffsetDateTime::now_utc() - Duration::from_secs(1));
    let current = store.current(&ws).await.unwrap().unwrap();
    let refused = store
        .put(
            &ws,
            state(2),
            PutMode::Update(current.token.clone()),
            Some(&expired),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "{refused:?}"
    );
    let refused = store
        .put_artifact_fenced(
            &ws,
            "job-1",
            "result.json",
            Bytes::from_static(b"{}"),
            &expired,
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "{refused:?}"
    );
    assert_eq!(store.versions(&ws).await.unwrap().len(), 1);
}

/// A state version whose write landed but was never answered (the call failed, or its caller
/// stopped waiting) may be the newest: the release says nothing is settled, and the next
/// taker finds it. Before, the release said the version before it was, and the next taker
/// was served that older state.
#[tokio::test]
async fn a_version_write_never_answered_leaves_nothing_settled() {
    for stall in [false, true] {
        let bucket = Troubled {
            stall_after_landing: stall,
            ..Troubled::default()
        };
        let store = BucketStore::over(bucket.clone(), "p", None);
        let ws: WorkspaceId = "acme/doubt".parse().unwrap();
        let fence = vouched(&store, &ws).await;
        assert!(store.current(&ws).await.unwrap().is_none());
        let first = store
            .put(&ws, state(1), PutMode::Create, Some(&fence))
            .await
            .unwrap();
        store.settle(&ws).await;
        bucket
            .lost_answers
            .store(1, std::sync::atomic::Ordering::SeqCst);
        let put = store.put(&ws, state(2), PutMode::Update(first.token()), Some(&fence));
        let lost = tokio::time::timeout(Duration::from_millis(200), put).await;
        match stall {
            false => assert!(matches!(lost, Ok(Err(_))), "{lost:?}"),
            true => assert!(lost.is_err(), "the call was given up"),
        }
        let lease = store.lease(&ws).await.unwrap().unwrap();
        store.release_lease(&ws, &lease).await.unwrap();
        assert_eq!(
            lock_record(&bucket.inner, "acme/doubt").await.settled,
            None,
            "stalled: {stall}"
        );
        // The next runner, another process, reads version 2.
        let next = BucketStore::over(bucket.clone(), "p", None);
        next.acquire_lease(&ws, &request("job-2")).await.unwrap();
        let current = next.current(&ws).await.unwrap().unwrap();
        assert_eq!(current.version.number, 2, "stalled: {stall}");
        assert_eq!(current.version.serial, 2, "stalled: {stall}");
    }
}

/// A state write whose answer was lost, sent again by its caller with the same content and
/// fence (terraform tries a POST again after a 503), is answered with the version it made.
/// Before, each try carried a random mark: the second found the version taken by "another
/// writer", and the job failed with a conflict although its state was stored.
#[tokio::test]
async fn a_version_write_sent_again_after_its_answer_was_lost_is_its_own_version() {
    let bucket = Troubled::default();
    let store = BucketStore::over(bucket.clone(), "p", None);
    let ws: WorkspaceId = "acme/again".parse().unwrap();
    let fence = vouched(&store, &ws).await;
    assert!(store.current(&ws).await.unwrap().is_none());
    let first = store
        .put(&ws, state(1), PutMode::Create, Some(&fence))
        .await
        .unwrap();
    bucket
        .lost_answers
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let update = PutMode::Update(first.token());
    let lost = store.put(&ws, state(2), update.clone(), Some(&fence)).await;
    assert!(lost.is_err(), "{lost:?}");
    let again = store.put(&ws, state(2), update.clone(), Some(&fence)).await;
    assert_eq!(again.unwrap().number, 2);
    assert_eq!(store.versions(&ws).await.unwrap().len(), 2);
    // Other content after the same version is another write: refused, not taken as its own.
    let other = store.put(&ws, state(3), update, Some(&fence)).await;
    assert!(
        matches!(other, Err(StoreError::Conflict { .. })),
        "{other:?}"
    );
}

/// A vouched write that cannot be the single conditional create (this store does not know the
/// newest version, or its guess failed) reads the lease beside its other reads: a lease broken
/// and taken by another meanwhile refuses it, and nothing is written.
#[tokio::test]
async fn a_vouched_write_that_must_read_the_newest_version_reads_the_lease_too() {
    let bucket = Troubled::default();
    let (ours, theirs) = (
        BucketStore::over(bucket.clone(), "p", None),
        BucketStore::over(bucket.clone(), "p", None),
    );
    let ws: WorkspaceId = "acme/taken".parse().unwrap();
    let fence = vouched(&ours, &ws).await;
    // Broken and taken by another before this store read anything.
    theirs.break_lease(&ws, None).await.unwrap();
    theirs.acquire_lease(&ws, &request("job-2")).await.unwrap();
    let refused = ours.put(&ws, state(1), PutMode::Create, Some(&fence)).await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "{refused:?}"
    );
    assert!(ours.versions(&ws).await.unwrap().is_empty());
}

fn request(owner: &str) -> crate::LeaseRequest {
    crate::LeaseRequest {
        owner: owner.into(),
        ttl: Duration::from_secs(60),
        info: serde_json::Value::Null,
    }
}

#[tokio::test]
async fn a_lock_object_is_changed_from_the_tag_last_written_and_a_stale_tag_costs_a_read() {
    let bucket = Troubled::default();
    let ours = BucketStore::over(bucket.clone(), "p", None);
    let ws: WorkspaceId = "acme/locked".parse().unwrap();
    let lease = ours.acquire_lease(&ws, &request("job-1")).await.unwrap();
    let before = bucket.reads();
    let renewed = ours
        .renew_lease(&ws, &lease, Duration::from_secs(60))
        .await
        .unwrap();
    ours.release_lease(&ws, &renewed).await.unwrap();
    assert_eq!(
        bucket.reads(),
        before,
        "a renewal and a release from the tag this keeper wrote read nothing"
    );
    // Another runner takes the workspace behind this keeper's back: its remembered tag is
    // stale, the conditional write fails, and the object itself says who holds it.
    let theirs = BucketStore::over(bucket.clone(), "p", None);
    let held = theirs.acquire_lease(&ws, &request("job-2")).await.unwrap();
    let refused = ours.acquire_lease(&ws, &request("job-3")).await;
    let Err(StoreError::LeaseHeld { holder, .. }) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(holder.owner, "job-2");
    assert!(held.fence > lease.fence);
    assert_eq!(ours.lease(&ws).await.unwrap().unwrap().owner, "job-2");
}

/// A lock object whose write is refused although its tag still matches (on Azure, a blob
/// lease an earlier runner left on `lease.json`) asks the bucket to unlock it, and only to
/// write what its record allows: never over another's live lease.
#[tokio::test]
async fn a_lock_object_kept_out_by_more_than_its_tag_is_unlocked_only_for_a_write_its_record_allows()
 {
    let bucket = Troubled::default();
    let (ours, theirs) = (
        BucketStore::over(bucket.clone(), "p", None),
        BucketStore::over(bucket.clone(), "p", None),
    );
    let ws: WorkspaceId = "acme/kept-out".parse().unwrap();
    let object = "p/acme/kept-out/lease.json";
    let first = ours.acquire_lease(&ws, &request("job-1")).await.unwrap();
    ours.release_lease(&ws, &first).await.unwrap();
    // Free, yet kept out: unlocked, then taken.
    bucket.lock(object);
    let second = theirs.acquire_lease(&ws, &request("job-2")).await.unwrap();
    assert_eq!(second.fence, first.fence + 1);
    assert_eq!(bucket.unlocks(), 1);
    // Held by job-2 and kept out again: a taker is told who holds it, and unlocks nothing.
    bucket.lock(object);
    let refused = ours.acquire_lease(&ws, &request("job-3")).await;
    let Err(StoreError::LeaseHeld { holder, .. }) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(holder.owner, "job-2");
    assert_eq!(bucket.unlocks(), 1, "another's live lease is not unlocked");
    // Its holder renews it all the same.
    let renewed = theirs
        .renew_lease(&ws, &second, Duration::from_secs(90))
        .await
        .unwrap();
    assert!(renewed.expires_at > second.expires_at);
    assert_eq!(bucket.unlocks(), 2);
    theirs.release_lease(&ws, &renewed).await.unwrap();
    // A write refused by its condition alone (this keeper's tag is stale: the record changed
    // since it wrote it) reads again and unlocks nothing.
    let third = ours.acquire_lease(&ws, &request("job-4")).await.unwrap();
    ours.release_lease(&ws, &third).await.unwrap();
    let fourth = theirs.acquire_lease(&ws, &request("job-5")).await.unwrap();
    theirs.release_lease(&ws, &fourth).await.unwrap();
    let fifth = ours.acquire_lease(&ws, &request("job-6")).await.unwrap();
    assert_eq!(fifth.fence, fourth.fence + 1);
    assert_eq!(bucket.unlocks(), 2, "a stale tag is not a lock");
}

/// A lock-object write beaten by another writer's change reads again only after a pause that
/// grows (drawn at random, so that racers part), not at once; a guess from memory that proved
/// stale is read again at once. One that always loses gives up after its 20 attempts, over
/// about a second rather than in one burst.
#[tokio::test(start_paused = true)]
async fn a_lock_object_write_beaten_by_another_pauses_before_trying_again() {
    use std::sync::atomic::Ordering::SeqCst;
    let bucket = Troubled::default();
    let store = BucketStore::over(bucket.clone(), "p", None);
    let ws: WorkspaceId = "acme/raced".parse().unwrap();
    let first = store.acquire_lease(&ws, &request("job-1")).await.unwrap();
    store.release_lease(&ws, &first).await.unwrap();
    // The guess from memory is beaten (no pause), then two writes after reads (5-10 ms, then
    // 10-20 ms); the fourth lands.
    bucket.beaten.store(3, SeqCst);
    let reads = bucket.reads();
    let started = tokio::time::Instant::now();
    let second = store.acquire_lease(&ws, &request("job-2")).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(second.fence, first.fence + 1);
    assert_eq!(
        bucket.reads(),
        reads + 3,
        "a read before each try after the guess"
    );
    assert!(
        (Duration::from_millis(15)..=Duration::from_millis(30)).contains(&waited),
        "{waited:?}"
    );
    store.release_lease(&ws, &second).await.unwrap();

    bucket.beaten.store(u64::MAX, SeqCst);
    let started = tokio::time::Instant::now();
    let lost = store.acquire_lease(&ws, &request("job-3")).await;
    let waited = started.elapsed();
    let Err(StoreError::Backend {
        message, retryable, ..
    }) = lost
    else {
        panic!("{lost:?}")
    };
    assert!(
        message.contains("kept changing under 20 attempts"),
        "{message}"
    );
    assert!(retryable);
    assert!(
        (Duration::from_millis(675)..=Duration::from_millis(1350)).contains(&waited),
        "{waited:?}"
    );
    bucket.beaten.store(0, SeqCst);
    let third = store.acquire_lease(&ws, &request("job-3")).await.unwrap();
    assert_eq!(third.fence, second.fence + 1, "a lost race took nothing");
}

/// A keeper that read the lease held by another remembers that record, but does not answer
/// from it again: the holder may have let it go since. Before, a taker that found a workspace
/// busy kept being told so until the holder's lease would have expired.
#[tokio::test]
async fn a_remembered_holder_is_asked_of_the_object_again() {
    let bucket = Troubled::default();
    let (ours, theirs) = (
        BucketStore::over(bucket.clone(), "p", None),
        BucketStore::over(bucket.clone(), "p", None),
    );
    let ws: WorkspaceId = "acme/let-go".parse().unwrap();
    let held = theirs.acquire_lease(&ws, &request("job-1")).await.unwrap();
    let busy = ours.acquire_lease(&ws, &request("job-2")).await;
    assert!(
        matches!(busy, Err(StoreError::LeaseHeld { .. })),
        "{busy:?}"
    );
    theirs.release_lease(&ws, &held).await.unwrap();
    let reads = bucket.reads();
    let taken = ours.acquire_lease(&ws, &request("job-2")).await.unwrap();
    assert_eq!(taken.fence, held.fence + 1);
    assert_eq!(bucket.reads(), reads + 1, "one read, then the write");
}

/// A lease object as an earlier Azure runner left it (empty, or with its blob lease's id
/// beside the record) is a record like any other: fences go on from it. Elsewhere an empty
/// lease object is no record (fences would start again): it is reported.
#[tokio::test]
async fn an_earlier_azure_runners_lease_object_is_read_as_a_record() {
    async fn put(bucket: &Troubled, key: &str, data: &'static [u8]) {
        let data = Bytes::from_static(data);
        let put = bucket.put(key, data, HashMap::new(), Condition::Absent);
        assert!(put.await.unwrap());
    }
    let azure = Troubled {
        name: Some("azure"),
        ..Troubled::default()
    };
    let store = BucketStore::over(azure.clone(), "p", None);
    let empty: WorkspaceId = "acme/empty".parse().unwrap();
    put(&azure, "p/acme/empty/lease.json", b"").await;
    let first = store.acquire_lease(&empty, &request("a")).await.unwrap();
    assert_eq!(first.fence, 1);
    let leased: WorkspaceId = "acme/leased".parse().unwrap();
    let record = br#"{"last_fence":5,"held":null,"settled":null,"blob_lease":"0b1c"}"#;
    put(&azure, "p/acme/leased/lease.json", record).await;
    let next = store.acquire_lease(&leased, &request("b")).await.unwrap();
    assert_eq!(next.fence, 6);
    let written = azure.get("p/acme/leased/lease.json").await.unwrap();
    assert!(!String::from_utf8_lossy(&written.unwrap().data).contains("blob_lease"));

    let elsewhere = Troubled::default();
    put(&elsewhere, "p/acme/empty/lease.json", b"").await;
    let store = BucketStore::over(elsewhere, "p", None);
    let refused = store.acquire_lease(&empty, &request("a")).await;
    assert!(
        matches!(refused, Err(StoreError::Corrupt { .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_vouched_write_to_a_store_that_has_not_answered_lately_reads_the_lease_first() {
    let bucket = Troubled::default();
    let store = BucketStore::over(bucket.clone(), "p", None);
    let ws: WorkspaceId = "acme/quiet".parse().unwrap();
    let fence = vouched(&store, &ws).await;
    assert!(store.current(&ws).await.unwrap().is_none());
    assert!(store.answering(), "it just answered");
    tokio::time::sleep(crate::ANSWERING + Duration::from_millis(100)).await;
    assert!(!store.answering(), "nothing answered for a while");
    let before = bucket.reads();
    store
        .put(&ws, state(1), PutMode::Create, Some(&fence))
        .await
        .unwrap();
    assert!(
        bucket.reads() > before,
        "the lease (and the newest version) were read before the write"
    );
    // It answered again: the next vouched write is the conditional create alone.
    let before = bucket.reads();
    store
        .put(
            &ws,
            state(2),
            PutMode::Update(VersionToken("1".into())),
            Some(&fence),
        )
        .await
        .unwrap();
    assert_eq!(bucket.reads(), before);
}

/// The lease record of `ws` in bucket `b` under prefix `p`, as the lock object holds it.
async fn lock_record(b: &MemoryBucket, ws: &str) -> LeaseRecord {
    let obj = b.get(&format!("p/{ws}/lease.json")).await.unwrap().unwrap();
    serde_json::from_slice(&obj.data).unwrap()
}

#[tokio::test]
async fn a_clean_release_lets_the_next_taker_read_the_copy_alone() {
    let bucket = Troubled::default();
    let ws: WorkspaceId = "acme/settled".parse().unwrap();
    // One runner: two vouched writes, then the release once its copies are made.
    let first = BucketStore::over(bucket.clone(), "p", None);
    let fence = vouched(&first, &ws).await;
    assert!(first.current(&ws).await.unwrap().is_none());
    let one = first
        .put(&ws, state(1), PutMode::Create, Some(&fence))
        .await
        .unwrap();
    first
        .put(&ws, state(2), PutMode::Update(one.token()), Some(&fence))
        .await
        .unwrap();
    let lease = first.lease(&ws).await.unwrap().unwrap();
    first.release_lease(&ws, &lease).await.unwrap();
    assert_eq!(
        lock_record(&bucket.inner, "acme/settled").await.settled,
        Some(2)
    );

    // The next runner, another process: the lease says version 2 is settled, so the state is
    // one read (the copy), with no probe for a version 3.
    let next = BucketStore::over(bucket.clone(), "p", None);
    next.acquire_lease(&ws, &request("job-2")).await.unwrap();
    assert_eq!(
        lock_record(&bucket.inner, "acme/settled").await.settled,
        None,
        "taking the lease clears what the release before said"
    );
    let before = bucket.reads();
    let current = next.current(&ws).await.unwrap().unwrap();
    assert_eq!(current.version.number, 2);
    assert_eq!(bucket.reads(), before + 1, "the copy alone was read");

    // Without a settled version (a store that never held the lease), the probe is made.
    let other = BucketStore::over(bucket.clone(), "p", None);
    let before = bucket.reads();
    assert_eq!(other.current(&ws).await.unwrap().unwrap().version.number, 2);
    assert_eq!(
        bucket.reads(),
        before + 2,
        "the copy, then the probe for version 3"
    );
}

#[tokio::test]
async fn a_copy_that_failed_or_a_lease_taken_over_settles_nothing_and_the_newest_is_found() {
    let ws: WorkspaceId = "acme/unsettled".parse().unwrap();
    let good = Troubled::default();
    let first = BucketStore::over(good.clone(), "p", None);
    let fence = vouched(&first, &ws).await;
    let one = first
        .put(&ws, state(1), PutMode::Create, Some(&fence))
        .await
        .unwrap();
    let lease = first.lease(&ws).await.unwrap().unwrap();
    first.release_lease(&ws, &lease).await.unwrap();
    assert_eq!(
        lock_record(&good.inner, "acme/unsettled").await.settled,
        Some(1)
    );

    // A writer whose copy fails: version 2 is committed, the copy stays of version 1. Its
    // release may not say "settled", or the next taker would read version 1.
    let failing = Troubled {
        inner: good.inner.clone(),
        no_copies: true,
        ..Troubled::default()
    };
    let second = BucketStore::over(failing.clone(), "p", None);
    let fence = vouched(&second, &ws).await;
    assert_eq!(
        second.current(&ws).await.unwrap().unwrap().version.number,
        1
    );
    second
        .put(&ws, state(2), PutMode::Update(one.token()), Some(&fence))
        .await
        .unwrap();
    let lease = second.lease(&ws).await.unwrap().unwrap();
    second.release_lease(&ws, &lease).await.unwrap();
    assert_eq!(
        lock_record(&good.inner, "acme/unsettled").await.settled,
        None
    );
    let third = BucketStore::over(good.clone(), "p", None);
    let lease = third.acquire_lease(&ws, &request("job-3")).await.unwrap();
    assert_eq!(third.current(&ws).await.unwrap().unwrap().version.number, 2);
    // A reader that found the copy lagging knows it is not of the newest version either.
    third.release_lease(&ws, &lease).await.unwrap();
    assert_eq!(
        lock_record(&good.inner, "acme/unsettled").await.settled,
        None
    );

    // A writer with working copies settles version 3.
    let good_writer = BucketStore::over(good.clone(), "p", None);
    let fence = vouched(&good_writer, &ws).await;
    let token = good_writer.current(&ws).await.unwrap().unwrap().token;
    good_writer
        .put(&ws, state(3), PutMode::Update(token), Some(&fence))
        .await
        .unwrap();
    let lease = good_writer.lease(&ws).await.unwrap().unwrap();
    good_writer.release_lease(&ws, &lease).await.unwrap();
    assert_eq!(
        lock_record(&good.inner, "acme/unsettled").await.settled,
        Some(3)
    );

    // A writer that dies after its commit, before its copy and its release: the lease is
    // taken over once expired, and a take-over says nothing settled.
    let dying = BucketStore::over(failing, "p", None);
    let short = crate::LeaseRequest {
        ttl: Duration::from_millis(300),
        ..request("job-4")
    };
    let lease = dying.acquire_lease(&ws, &short).await.unwrap();
    let fence = lease
        .fence()
        .confirmed_until(OffsetDateTime::now_utc() + Duration::from_millis(200));
    let token = dying.current(&ws).await.unwrap().unwrap().token;
    dying
        .put(&ws, state(4), PutMode::Update(token), Some(&fence))
        .await
        .unwrap();
    dying.settle(&ws).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let last = BucketStore::over(good.clone(), "p", None);
    let taken = last.acquire_lease(&ws, &request("job-5")).await.unwrap();
    assert!(taken.took_over.is_some());
    assert_eq!(last.current(&ws).await.unwrap().unwrap().version.number, 4);
}

#[tokio::test]
async fn under_a_workspaces_first_lease_the_listing_is_asked_beside_the_copy() {
    let bucket = Troubled {
        slow: true,
        ..Troubled::default()
    };
    let ws: WorkspaceId = "acme/first".parse().unwrap();
    let store = BucketStore::over(bucket.clone(), "p", None);
    let lease = store.acquire_lease(&ws, &request("job-1")).await.unwrap();
    assert_eq!(lease.fence, 1);
    assert_eq!(bucket.most_at_once(), 1, "the lease alone so far");
    let before = bucket.reads();
    assert!(store.current(&ws).await.unwrap().is_none());
    assert_eq!(
        bucket.reads(),
        before + 2,
        "the copy and the listing, once each"
    );
    assert_eq!(bucket.most_at_once(), 2, "side by side");
    store.release_lease(&ws, &lease).await.unwrap();

    // Versions written with no lease here (another lease keeper before): the listing finds
    // them beside a copy that lags, and the version after the copy is the one read.
    let ws: WorkspaceId = "acme/moved".parse().unwrap();
    let other = BucketStore::over(bucket.clone(), "p", None);
    let one = other
        .put(&ws, state(1), PutMode::Create, None)
        .await
        .unwrap();
    let failing = Troubled {
        inner: bucket.inner.clone(),
        no_copies: true,
        ..Troubled::default()
    };
    BucketStore::over(failing, "p", None)
        .put(&ws, state(2), PutMode::Update(one.token()), None)
        .await
        .unwrap();
    let store = BucketStore::over(bucket.clone(), "p", None);
    let lease = store.acquire_lease(&ws, &request("job-2")).await.unwrap();
    assert_eq!(lease.fence, 1, "the workspace's first lease");
    assert_eq!(store.current(&ws).await.unwrap().unwrap().version.number, 2);
}
