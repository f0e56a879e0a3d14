//! The behaviour every [`StateStore`] must show, as one suite each backend's tests run against
//! a live instance (the local folder, the in-memory store, and each cloud's emulator).
//!
//! Each check uses its own fresh workspace, so the suite can run against a shared bucket.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::tfstate::empty_state;
use crate::{LeaseRequest, NewState, PutMode, StateStore, StateStoreExt, StoreError, WorkspaceId};

mod leases;
pub use leases::{
    broken_lease_fences_its_holder, expired_lease_is_taken_over_and_the_old_holder_is_fenced,
    fenced_artifacts_are_written_only_by_the_lease_holder, lease_contention_has_one_winner,
};

mod backups;
pub use backups::{
    a_backup_restores_without_its_versions, a_bucket_backup_restores_without_its_versions,
    changes_are_marked_until_cleared, marked_changes_are_backed_up, snapshot_copies_only_changes,
};

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
