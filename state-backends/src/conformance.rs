//! The behaviour every [`StateStore`] must show, as one suite each backend's tests run against
//! a live instance (the local folder, the in-memory store, and each cloud's emulator).
//!
//! Each check uses its own fresh workspace, so the suite can run against a shared bucket.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::retention::Retention;
use crate::tfstate::empty_state;
use crate::{LeaseRequest, NewState, PutMode, StateStore, StateStoreExt, StoreError, WorkspaceId};

/// Runs every check against `store`, panicking on the first broken guarantee.
pub async fn run_all(store: Arc<dyn StateStore>) {
    run(store, true).await;
}

/// [`run_all`] for a store that seals what it keeps ([`crate::sealed::SealedStore`]): a
/// version's `sha256` is then the stored object's, not the state's.
pub async fn run_all_sealed(store: Arc<dyn StateStore>) {
    run(store, false).await;
}

async fn run(store: Arc<dyn StateStore>, plain: bool) {
    compare_and_swap(&*store).await;
    concurrent_writers_never_both_win(store.clone()).await;
    version_history_is_complete_and_readable(&*store, plain).await;
    lease_contention_has_one_winner(store.clone()).await;
    expired_lease_is_taken_over_and_the_old_holder_is_fenced(&*store).await;
    broken_lease_fences_its_holder(&*store).await;
    delete_keeps_history(&*store).await;
    restore_rolls_forward(&*store).await;
    snapshot_copies_only_changes(&*store).await;
    artifacts_round_trip(&*store).await;
    fenced_artifacts_are_written_only_by_the_lease_holder(&*store).await;
    changes_are_marked_until_cleared(&*store).await;
    marked_changes_are_backed_up(&*store).await;
    workspaces_are_listed(&*store).await;
}

/// A workspace no other check (or earlier run against the same bucket) has used.
pub fn fresh_workspace(check: &str) -> WorkspaceId {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    WorkspaceId::new("conformance", &format!("{check}-{nanos:x}-{n}")).expect("valid name")
}

fn state(lineage: &str, serial: u64) -> NewState {
    NewState::parse(empty_state(lineage, serial)).expect("fixture is a valid state")
}

/// A state of `lineage` whose output `marker` is its `serial`: which one a read gives back.
fn marked(lineage: &str, serial: u64) -> NewState {
    let mut data: serde_json::Value =
        serde_json::from_slice(&empty_state(lineage, serial)).expect("a fixture");
    data["outputs"] = serde_json::json!({ "marker": { "value": serial, "type": "number" } });
    NewState::parse(Bytes::from(serde_json::to_vec(&data).expect("JSON"))).expect("a state")
}

fn lease_request(owner: &str, ttl: Duration) -> LeaseRequest {
    LeaseRequest {
        owner: owner.to_owned(),
        ttl,
        info: serde_json::json!({ "operation": "conformance" }),
    }
}

pub async fn compare_and_swap(store: &dyn StateStore) {
    let ws = fresh_workspace("cas");
    assert!(
        store.current(&ws).await.unwrap().is_none(),
        "a new workspace has no state"
    );
    assert!(store.versions(&ws).await.unwrap().is_empty());

    let v1 = store
        .put(&ws, state("l", 1), PutMode::Create, None)
        .await
        .unwrap();
    assert_eq!(v1.number, 1);
    let err = store
        .put(&ws, state("l", 2), PutMode::Create, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { .. }),
        "create over a state: {err}"
    );

    let cur = store.current(&ws).await.unwrap().expect("state after put");
    assert_eq!(cur.data, empty_state("l", 1));
    assert_eq!(cur.version, v1);
    let v2 = store
        .put(&ws, state("l", 2), PutMode::Update(cur.token.clone()), None)
        .await
        .unwrap();
    assert_eq!(v2.number, 2);
    let err = store
        .put(&ws, state("l", 3), PutMode::Update(cur.token), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { .. }),
        "stale token: {err}"
    );
    assert_eq!(
        store.versions(&ws).await.unwrap().len(),
        2,
        "a refused write adds no version"
    );
    assert_eq!(store.current(&ws).await.unwrap().unwrap().version.serial, 2);
}

pub async fn concurrent_writers_never_both_win(store: Arc<dyn StateStore>) {
    let ws = fresh_workspace("race");
    store
        .put(&ws, state("l", 0), PutMode::Create, None)
        .await
        .unwrap();
    let mut accepted = 0;
    for round in 1..=5u64 {
        let base = store.current(&ws).await.unwrap().unwrap().token;
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let (store, ws, base) = (store.clone(), ws.clone(), base.clone());
                tokio::spawn(async move {
                    store
                        .put(&ws, state("l", round), PutMode::Update(base), None)
                        .await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await.expect("task") {
                Ok(_) => winners += 1,
                Err(StoreError::Conflict { .. }) => {}
                Err(other) => panic!("unexpected error in a write race: {other}"),
            }
        }
        assert_eq!(
            winners, 1,
            "round {round}: exactly one writer from the same base wins"
        );
        accepted += winners;
    }
    let versions = store.versions(&ws).await.unwrap();
    assert_eq!(
        versions.len(),
        1 + accepted,
        "every accepted write is a version"
    );
    let numbers: Vec<u64> = versions.iter().map(|v| v.number).collect();
    assert_eq!(numbers, (1..=6).collect::<Vec<_>>());
}

pub async fn version_history_is_complete_and_readable(store: &dyn StateStore, plain: bool) {
    let ws = fresh_workspace("history");
    let mut mode = PutMode::Create;
    for serial in 1..=5 {
        store
            .put(&ws, state("h", serial), mode, None)
            .await
            .unwrap();
        mode = PutMode::Update(store.current(&ws).await.unwrap().unwrap().token);
    }
    let versions = store.versions(&ws).await.unwrap();
    let serials: Vec<u64> = versions.iter().map(|v| v.serial).collect();
    assert_eq!(serials, vec![1, 2, 3, 4, 5]);
    for v in &versions {
        let data = store.version(&ws, v.number).await.unwrap();
        assert_eq!(data, empty_state("h", v.serial));
        if plain {
            assert_eq!(v.sha256, crate::sha256_hex(&data));
        } else {
            assert_ne!(
                v.sha256,
                crate::sha256_hex(&data),
                "the stored object is sealed"
            );
        }
        assert_eq!(v.lineage, "h");
    }
    let err = store.version(&ws, 99).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

pub async fn lease_contention_has_one_winner(store: Arc<dyn StateStore>) {
    let ws = fresh_workspace("contention");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (store, ws) = (store.clone(), ws.clone());
            tokio::spawn(async move {
                store
                    .acquire_lease(
                        &ws,
                        &lease_request(&format!("job-{i}"), Duration::from_secs(30)),
                    )
                    .await
            })
        })
        .collect();
    let mut winner = None;
    for task in tasks {
        match task.await.expect("task") {
            Ok(lease) => assert!(winner.replace(lease).is_none(), "two holders at once"),
            Err(StoreError::LeaseHeld { .. }) => {}
            Err(other) => panic!("unexpected error in lease contention: {other}"),
        }
    }
    let winner = winner.expect("one contender wins");
    let err = store
        .acquire_lease(&ws, &lease_request("late", Duration::from_secs(30)))
        .await
        .unwrap_err();
    let StoreError::LeaseHeld { holder, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(holder.owner, winner.owner, "the error names the holder");
    assert!(err.is_retryable());
    assert_eq!(store.lease(&ws).await.unwrap().unwrap().owner, winner.owner);

    let renewed = store
        .renew_lease(&ws, &winner, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        renewed.expires_at > winner.expires_at,
        "renewal extends the lease"
    );
    assert_eq!(renewed.fence, winner.fence, "renewal keeps the fence");
    store.release_lease(&ws, &renewed).await.unwrap();
    assert!(store.lease(&ws).await.unwrap().is_none());
    let next = store
        .acquire_lease(&ws, &lease_request("next", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        next.fence > winner.fence,
        "the fence grows with each acquisition"
    );
    store.release_lease(&ws, &next).await.unwrap();
}

pub async fn expired_lease_is_taken_over_and_the_old_holder_is_fenced(store: &dyn StateStore) {
    let ws = fresh_workspace("expiry");
    let old = store
        // Long enough for a write through a remote store on a loaded machine.
        .acquire_lease(&ws, &lease_request("crashed", Duration::from_millis(1500)))
        .await
        .unwrap();
    store
        .put(&ws, state("e", 1), PutMode::Create, Some(&old.fence()))
        .await
        .expect("a live lease may write");
    tokio::time::sleep(Duration::from_millis(1700)).await;

    let token = store.current(&ws).await.unwrap().unwrap().token;
    let err = store
        .put(
            &ws,
            state("e", 2),
            PutMode::Update(token.clone()),
            Some(&old.fence()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "expired writer: {err}"
    );
    let err = store
        .renew_lease(&ws, &old, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "expired renewal: {err}"
    );

    let new = store
        .acquire_lease(&ws, &lease_request("successor", Duration::from_secs(30)))
        .await
        .expect("an expired lease is free");
    assert!(new.fence > old.fence);
    let took_over = new
        .took_over
        .as_ref()
        .expect("the successor learns whose lease expired");
    assert_eq!(
        (took_over.owner.as_str(), took_over.fence),
        ("crashed", old.fence)
    );
    store.release_lease(&ws, &old).await.unwrap();
    assert_eq!(
        store.lease(&ws).await.unwrap().map(|l| l.owner),
        Some("successor".to_owned()),
        "a stale holder's release leaves the new lease alone"
    );
    store
        .put(
            &ws,
            state("e", 2),
            PutMode::Update(token),
            Some(&new.fence()),
        )
        .await
        .expect("the successor writes");
    assert_eq!(store.versions(&ws).await.unwrap().len(), 2);
    store.release_lease(&ws, &new).await.unwrap();
}

pub async fn fenced_artifacts_are_written_only_by_the_lease_holder(store: &dyn StateStore) {
    let ws = fresh_workspace("fenced-artifacts");
    let write = |data: &'static [u8], fence: crate::Fence| {
        let ws = ws.clone();
        async move {
            store
                .put_artifact_fenced(
                    &ws,
                    "job-1",
                    "result.json",
                    Bytes::from_static(data),
                    &fence,
                )
                .await
        }
    };
    let old = store
        .acquire_lease(&ws, &lease_request("run-1", Duration::from_millis(1500)))
        .await
        .unwrap();
    write(b"one", old.fence()).await.expect("the holder writes");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let err = write(b"late", old.fence()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "expired writer: {err}"
    );

    // The same job runs again under a new lease; the old runner's result cannot replace its.
    let new = store
        .acquire_lease(&ws, &lease_request("run-2", Duration::from_secs(30)))
        .await
        .unwrap();
    write(b"two", new.fence())
        .await
        .expect("the new holder writes");
    let err = write(b"stale", old.fence()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "stale writer: {err}"
    );
    assert_eq!(
        store
            .artifact(&ws, "job-1", "result.json")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"two"[..])
    );
    store.release_lease(&ws, &new).await.unwrap();
    let err = write(b"x", new.fence()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "released: {err}"
    );
}

pub async fn broken_lease_fences_its_holder(store: &dyn StateStore) {
    let ws = fresh_workspace("break");
    let lease = store
        .acquire_lease(&ws, &lease_request("stuck", Duration::from_secs(300)))
        .await
        .unwrap();
    // A break meant for another lease (one read before this was taken) breaks nothing.
    assert!(
        store
            .break_lease(&ws, Some(lease.fence + 1))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store.lease(&ws).await.unwrap().map(|l| l.fence),
        Some(lease.fence),
        "the lease held stays"
    );
    store
        .renew_lease(&ws, &lease, Duration::from_secs(300))
        .await
        .expect("its holder still renews it");
    let broken = store
        .break_lease(&ws, Some(lease.fence))
        .await
        .unwrap()
        .expect("a lease was held");
    assert_eq!(broken.owner, "stuck");
    let err = store
        .put(&ws, state("b", 1), PutMode::Create, Some(&lease.fence()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "broken holder writes: {err}"
    );
    assert!(
        store.current(&ws).await.unwrap().is_none(),
        "nothing was written"
    );
    assert!(store.break_lease(&ws, None).await.unwrap().is_none());
}

pub async fn delete_keeps_history(store: &dyn StateStore) {
    let ws = fresh_workspace("delete");
    store
        .put(&ws, state("d", 1), PutMode::Create, None)
        .await
        .unwrap();
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store.delete_current(&ws, &token, None).await.unwrap();
    assert!(store.current(&ws).await.unwrap().is_none());
    assert_eq!(
        store.versions(&ws).await.unwrap().len(),
        1,
        "history survives a delete"
    );
    let v = store
        .put(&ws, state("d2", 1), PutMode::Create, None)
        .await
        .unwrap();
    assert!(v.number > 1, "numbers keep growing after a delete");
}

pub async fn restore_rolls_forward(store: &dyn StateStore) {
    let ws = fresh_workspace("restore");
    let mut mode = PutMode::Create;
    for serial in [1, 2, 3] {
        store
            .put(&ws, marked("r", serial), mode, None)
            .await
            .unwrap();
        mode = PutMode::Update(store.current(&ws).await.unwrap().unwrap().token);
    }
    let restored = store.restore(&ws, 1, None).await.unwrap();
    assert_eq!(restored.number, 4, "a restore is a new version");
    assert_eq!(
        restored.serial, 4,
        "the serial moves forward past the current one"
    );
    let current = store.current(&ws).await.unwrap().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&current.data).unwrap();
    assert_eq!(
        value["outputs"]["marker"]["value"], 1,
        "the old content is back"
    );
    assert_eq!(
        store.versions(&ws).await.unwrap().len(),
        4,
        "history untouched"
    );

    let other = fresh_workspace("restore-other");
    store
        .put(&other, state("x", 9), PutMode::Create, None)
        .await
        .unwrap();
    let err = store.restore(&other, 5, None).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

/// A backup brings the state back when the versions it copied are gone (a lifecycle rule, a
/// deletion): `restore_backup` reads the backup itself. `forget` deletes every stored version
/// of a workspace, as the store's own tools would.
pub async fn a_backup_restores_without_its_versions<F, Fut>(store: &dyn StateStore, forget: F)
where
    F: Fn(WorkspaceId) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let ws = fresh_workspace("backup-restore");
    store
        .put(&ws, marked("b", 1), PutMode::Create, None)
        .await
        .unwrap();
    let label = "2026-11-27T01";
    store
        .snapshot(&ws, label, Retention::default())
        .await
        .unwrap()
        .expect("a backup of version 1");
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, marked("b", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    let backup: serde_json::Value =
        serde_json::from_slice(&store.backup(&ws, label).await.unwrap()).unwrap();
    assert_eq!(
        backup["outputs"]["marker"]["value"], 1,
        "the backup's content"
    );

    forget(ws.clone()).await;
    assert!(
        store.version(&ws, 1).await.is_err(),
        "the version the backup copied is gone"
    );
    let restored = store.restore_backup(&ws, label, None).await.unwrap();
    let current = store.current(&ws).await.unwrap().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&current.data).unwrap();
    assert_eq!(
        value["outputs"]["marker"]["value"], 1,
        "the backup's content is back"
    );
    assert_eq!(value["lineage"], "b");
    assert_eq!(current.version.number, restored.number);
    let err = store
        .restore_backup(&ws, "2026-11-27T02", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

/// [`a_backup_restores_without_its_versions`] for a store over a bucket: its versions are
/// deleted from the bucket.
pub async fn a_bucket_backup_restores_without_its_versions<
    B: crate::objects::Bucket + Clone + 'static,
>(
    store: &crate::objects::BucketStore<B>,
) {
    a_backup_restores_without_its_versions(store, |ws| async move {
        let marker = format!("{}/{}/versions/", ws.tenant(), ws.workspace());
        for listed in store.bucket().list("").await.unwrap() {
            if listed.key.contains(&marker) {
                store.bucket().delete(&listed.key).await.unwrap();
            }
        }
    })
    .await;
}

pub async fn snapshot_copies_only_changes(store: &dyn StateStore) {
    let ws = fresh_workspace("snapshot");
    assert!(
        store
            .snapshot(&ws, "2026-11-21T10", Retention::default())
            .await
            .unwrap()
            .is_none(),
        "no state, no backup"
    );
    store
        .put(&ws, state("s", 1), PutMode::Create, None)
        .await
        .unwrap();
    let first = store
        .snapshot(&ws, "2026-11-21T11", Retention::default())
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(first.backup.version, 1);
    assert!(
        store
            .snapshot(&ws, "2026-11-21T12", Retention::default())
            .await
            .unwrap()
            .is_none(),
        "unchanged"
    );
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("s", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    let second = store
        .snapshot(&ws, "2026-11-21T13", Retention::default())
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(second.backup.version, 2);
    assert!(second.pruned.is_empty());
    let labels: Vec<String> = store
        .backups(&ws)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.label)
        .collect();
    assert_eq!(labels, vec!["2026-11-21T11", "2026-11-21T13"]);

    // Retention drops the oldest when the new backup is made.
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("s", 3), PutMode::Update(token), None)
        .await
        .unwrap();
    let keep_two = Retention {
        hourly: 2,
        daily: 0,
    };
    let third = store
        .snapshot(&ws, "2026-11-21T14", keep_two)
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(third.backup.version, 3);
    assert_eq!(third.pruned, ["2026-11-21T11"]);
    let labels: Vec<String> = store
        .backups(&ws)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.label)
        .collect();
    assert_eq!(labels, vec!["2026-11-21T13", "2026-11-21T14"]);
}

pub async fn artifacts_round_trip(store: &dyn StateStore) {
    let ws = fresh_workspace("artifacts");
    assert!(
        store
            .artifact(&ws, "job-1", "result.json")
            .await
            .unwrap()
            .is_none()
    );
    store
        .put_artifact(&ws, "job-1", "result.json", Bytes::from_static(b"{}"))
        .await
        .unwrap();
    store
        .put_artifact(
            &ws,
            "job-1",
            "log/000001.ndjson",
            Bytes::from_static(b"a\n"),
        )
        .await
        .unwrap();
    store
        .put_artifact(
            &ws,
            "job-1",
            "result.json",
            Bytes::from_static(b"{\"v\":2}"),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .artifact(&ws, "job-1", "result.json")
            .await
            .unwrap()
            .unwrap(),
        Bytes::from_static(b"{\"v\":2}")
    );
    assert_eq!(
        store.artifacts(&ws, "job-1").await.unwrap(),
        vec!["log/000001.ndjson".to_owned(), "result.json".to_owned()]
    );
    assert!(store.artifacts(&ws, "job-2").await.unwrap().is_empty());
    store
        .put_artifact(&ws, "job-0", "log/a/b.ndjson", Bytes::from_static(b"{}"))
        .await
        .unwrap();
    assert_eq!(
        store.runs(&ws).await.unwrap(),
        vec!["job-0".to_owned(), "job-1".to_owned()],
        "every run with an artifact is listed once, sorted, however deep its artifacts"
    );
    store
        .delete_artifact(&ws, "job-0", "log/a/b.ndjson")
        .await
        .unwrap();
    assert_eq!(
        store.runs(&ws).await.unwrap(),
        vec!["job-1".to_owned()],
        "a run whose artifacts are all deleted is not listed"
    );
    assert!(
        store
            .runs(&fresh_workspace("no-runs"))
            .await
            .unwrap()
            .is_empty()
    );
    store
        .delete_artifact(&ws, "job-1", "result.json")
        .await
        .unwrap();
    assert!(
        store
            .artifact(&ws, "job-1", "result.json")
            .await
            .unwrap()
            .is_none(),
        "a deleted artifact is gone"
    );
    assert_eq!(
        store.artifacts(&ws, "job-1").await.unwrap(),
        vec!["log/000001.ndjson".to_owned()],
        "deleting one artifact keeps the others"
    );
    store
        .delete_artifact(&ws, "job-1", "result.json")
        .await
        .expect("deleting an absent artifact is not an error");
    for bad in ["../escape", "", "a//b", "./x"] {
        let err = store
            .put_artifact(&ws, "job-1", bad, Bytes::new())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidKey(_)), "{bad:?}: {err}");
    }
}

/// Every write and deletion marks the workspace as changed until the sweep clears that mark; a
/// write after the sweep listed it keeps the mark. Backups can be deleted.
pub async fn changes_are_marked_until_cleared(store: &dyn StateStore) {
    let ws = fresh_workspace("changes");
    let mine = |all: Vec<crate::Changed>| all.into_iter().find(|c| c.ws == ws);
    assert!(
        mine(store.changed().await.unwrap()).is_none(),
        "a new workspace has no change"
    );
    store
        .put(&ws, state("c", 1), PutMode::Create, None)
        .await
        .unwrap();
    let first = mine(store.changed().await.unwrap()).expect("a write marks the workspace");
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("c", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    store.clear_changed(&first).await.unwrap();
    let second =
        mine(store.changed().await.unwrap()).expect("a write after the listing keeps the mark");
    assert_ne!(second.mark, first.mark);
    store.clear_changed(&second).await.unwrap();
    assert!(
        mine(store.changed().await.unwrap()).is_none(),
        "cleared with the mark it had"
    );

    let token = store.current(&ws).await.unwrap().unwrap().token;
    store.delete_current(&ws, &token, None).await.unwrap();
    let deleted = mine(store.changed().await.unwrap()).expect("a deletion marks too");
    store.clear_changed(&deleted).await.unwrap();

    store
        .put(&ws, state("d", 0), PutMode::Create, None)
        .await
        .unwrap();
    let label = "2026-11-21T10";
    store
        .snapshot(&ws, label, Retention::default())
        .await
        .unwrap()
        .expect("a backup of the new state");
    assert!(
        store
            .backups(&ws)
            .await
            .unwrap()
            .iter()
            .any(|b| b.label == label)
    );
}

/// The sweep's path: what the change marks say changed is backed up as the newest version
/// written, byte for byte; a deletion backs up nothing.
pub async fn marked_changes_are_backed_up(store: &dyn StateStore) {
    let ws = fresh_workspace("marked");
    let mine = |all: Vec<crate::Changed>| all.into_iter().find(|c| c.ws == ws);
    store
        .put(&ws, state("m", 1), PutMode::Create, None)
        .await
        .unwrap();
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("m", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    let changed = mine(store.changed().await.unwrap()).expect("two writes mark the workspace");
    let made = store
        .back_up(&changed, "2026-11-21T10", Retention::default())
        .await
        .unwrap()
        .expect("a backup");
    let newest = store
        .versions(&ws)
        .await
        .unwrap()
        .into_iter()
        .max_by_key(|v| v.number)
        .unwrap();
    assert_eq!(made.backup.version, newest.number, "the newest version");
    assert_eq!(made.backup.sha256, newest.sha256);
    assert_eq!(
        store.backups(&ws).await.unwrap(),
        std::slice::from_ref(&made.backup)
    );
    store.clear_changed(&changed).await.unwrap();
    assert!(mine(store.changed().await.unwrap()).is_none(), "cleared");

    let token = store.current(&ws).await.unwrap().unwrap().token;
    store.delete_current(&ws, &token, None).await.unwrap();
    let deleted = mine(store.changed().await.unwrap()).expect("a deletion marks too");
    assert!(
        store
            .back_up(&deleted, "2026-11-21T11", Retention::default())
            .await
            .unwrap()
            .is_none(),
        "nothing to back up after a deletion"
    );
    store.clear_changed(&deleted).await.unwrap();
    assert_eq!(store.backups(&ws).await.unwrap(), [made.backup]);
}

pub async fn workspaces_are_listed(store: &dyn StateStore) {
    let with_state = fresh_workspace("listed");
    let with_runs = WorkspaceId::new(
        &format!("t{}", with_state.workspace().replace('.', "-")),
        "runs-only",
    )
    .expect("valid name");
    let untouched = fresh_workspace("untouched");
    store
        .put(&with_state, state("l", 0), PutMode::Create, None)
        .await
        .unwrap();
    store
        .put_artifact(&with_runs, "j1", "log.txt", Bytes::from_static(b"x"))
        .await
        .unwrap();
    // A read alone makes nothing.
    assert!(store.current(&untouched).await.unwrap().is_none());
    let all = store.workspaces().await.unwrap();
    assert!(all.contains(&with_state), "{with_state} is listed");
    assert!(
        all.contains(&with_runs),
        "{with_runs} (run records only) is listed"
    );
    assert!(!all.contains(&untouched), "{untouched} holds nothing");
    assert!(
        all.windows(2).all(|w| w[0].to_string() < w[1].to_string()),
        "sorted, without duplicates"
    );
}
