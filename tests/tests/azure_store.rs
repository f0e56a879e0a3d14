//! The Azure store passes the shared conformance suite against Azurite, holds each workspace's
//! lease as a blob lease, and its backup sweep copies only what changed.

use std::sync::Arc;

use tests::azure;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_passes_the_conformance_suite() {
    let store = azure::store(&azure::container().await, "states");
    state_backends::conformance::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_backup_restores_without_its_versions() {
    let store = azure::store(&azure::container().await, "states");
    state_backends::conformance::a_bucket_backup_restores_without_its_versions(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_at_the_containers_root_passes_the_conformance_suite() {
    let store = azure::store(&azure::container().await, "");
    state_backends::conformance::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backup_sweep_over_100_workspaces_copies_only_the_4_that_changed() {
    let store = azure::store(&azure::container().await, "states");
    tests::sweep::copies_only_what_changed(store, "Azure", 100, 25, None).await;
}

/// The blob lease on a workspace's `lease.json`, as Azure reports it.
async fn blob_lease_state(url: &str, key: &str) -> String {
    use azure_storage_blob::models::BlobClientGetPropertiesResultHeaders;
    let container = azure_storage_blob::BlobContainerClient::new(
        azure_core::http::Url::parse(url).unwrap(),
        None,
        None,
    )
    .unwrap();
    let properties = container
        .blob_client(key)
        .get_properties(None)
        .await
        .unwrap();
    format!("{:?}", properties.lease_state().unwrap().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_is_a_blob_lease_that_only_its_holder_can_change() {
    use state_backends::objects::{Bucket, Condition};
    use state_backends::{LeaseRequest, StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "states");
    let ws = WorkspaceId::new("acme", "leased").unwrap();
    let key = "states/acme/leased/lease.json";
    let request = |owner: &str, ttl| LeaseRequest {
        owner: owner.into(),
        ttl,
        info: serde_json::Value::Null,
    };
    let lease = store
        .acquire_lease(&ws, &request("runner-a", Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(blob_lease_state(&url, key).await, "Leased");
    // The record cannot be changed without the blob lease's id, whatever its ETag.
    let before = store.bucket().get(key).await.unwrap().unwrap();
    let tampered = store
        .bucket()
        .put(
            key,
            bytes::Bytes::from_static(b"{}"),
            Default::default(),
            Condition::Matches(&before.tag),
        )
        .await;
    assert!(
        !matches!(tampered, Ok(true)),
        "a write without the lease id was accepted: {tampered:?}"
    );
    assert_eq!(store.lease(&ws).await.unwrap().unwrap().fence, lease.fence);
    // A second runner is told who holds it.
    match store
        .acquire_lease(&ws, &request("runner-b", Duration::from_secs(60)))
        .await
    {
        Err(StoreError::LeaseHeld { holder, .. }) => assert_eq!(holder.owner, "runner-a"),
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    // Renewed: the record's expiry moves and the blob lease stays.
    let renewed = store
        .renew_lease(&ws, &lease, Duration::from_secs(120))
        .await
        .unwrap();
    assert!(renewed.expires_at > lease.expires_at);
    assert_eq!(blob_lease_state(&url, key).await, "Leased");
    // Released: the blob lease is given back at once, not left to lapse.
    store.release_lease(&ws, &renewed).await.unwrap();
    assert_eq!(blob_lease_state(&url, key).await, "Available");
    assert!(store.lease(&ws).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_blob_lease_is_broken_once_its_recorded_lease_expires() {
    use state_backends::{LeaseRequest, StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "");
    let ws = WorkspaceId::new("acme", "crashed").unwrap();
    let request = |owner: &str, ttl| LeaseRequest {
        owner: owner.into(),
        ttl,
        info: serde_json::Value::Null,
    };
    // runner-a takes a 2 s lease and dies: it never renews or releases, and its blob lease
    // (60 s) outlives its recorded lease.
    let dead = store
        .acquire_lease(&ws, &request("runner-a", Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(matches!(
        store
            .acquire_lease(&ws, &request("runner-b", Duration::from_secs(60)))
            .await,
        Err(StoreError::LeaseHeld { .. })
    ));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        blob_lease_state(&url, "acme/crashed/lease.json").await,
        "Leased",
        "the dead holder's blob lease is still there"
    );
    let taken = store
        .acquire_lease(&ws, &request("runner-b", Duration::from_secs(60)))
        .await
        .expect("the expired lease is taken over");
    assert!(taken.fence > dead.fence);
    assert_eq!(taken.took_over.as_ref().unwrap().owner, "runner-a");
    // The dead holder, back, can neither renew nor write.
    assert!(matches!(
        store.renew_lease(&ws, &dead, Duration::from_secs(60)).await,
        Err(StoreError::LeaseLost { .. })
    ));
    // An operator's break frees it whatever the record says.
    let broken = store.break_lease(&ws, None).await.unwrap().unwrap();
    assert_eq!(broken.owner, "runner-b");
    assert_eq!(
        blob_lease_state(&url, "acme/crashed/lease.json").await,
        "Available"
    );
    store
        .acquire_lease(&ws, &request("runner-c", Duration::from_secs(60)))
        .await
        .expect("free after the break");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_overtaken_while_stalled_can_neither_renew_nor_release_its_way_back() {
    use state_backends::{LeaseRequest, StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "states");
    let ws = WorkspaceId::new("acme", "stalled").unwrap();
    let request = |owner: &str, ttl| LeaseRequest {
        owner: owner.into(),
        ttl,
        info: serde_json::Value::Null,
    };
    let stalled = store
        .acquire_lease(&ws, &request("runner-a", Duration::from_secs(1)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = store
        .acquire_lease(&ws, &request("runner-b", Duration::from_secs(60)))
        .await
        .unwrap();
    store.release_lease(&ws, &b).await.unwrap();
    // runner-a wakes up: the workspace is free, its blob lease long broken.
    assert!(matches!(
        store
            .renew_lease(&ws, &stalled, Duration::from_secs(60))
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
    store.release_lease(&ws, &stalled).await.unwrap();
    assert!(store.lease(&ws).await.unwrap().is_none(), "still free");
    // Fences only grow.
    let c = store
        .acquire_lease(&ws, &request("runner-c", Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(c.fence > b.fence && b.fence > stalled.fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_lease_left_by_a_taker_that_died_before_writing_is_broken() {
    use state_backends::{LeaseRequest, StateStore, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "states");
    let ws = WorkspaceId::new("acme", "orphan").unwrap();
    let request = LeaseRequest {
        owner: "runner-a".into(),
        ttl: Duration::from_secs(60),
        info: serde_json::Value::Null,
    };
    let first = store.acquire_lease(&ws, &request).await.unwrap();
    store.release_lease(&ws, &first).await.unwrap();
    // A taker takes the blob lease for good, then dies before writing the record.
    let container = azure_storage_blob::BlobContainerClient::new(
        azure_core::http::Url::parse(&url).unwrap(),
        None,
        None,
    )
    .unwrap();
    container
        .blob_client("states/acme/orphan/lease.json")
        .acquire_lease(-1, None)
        .await
        .unwrap();
    assert_eq!(
        blob_lease_state(&url, "states/acme/orphan/lease.json").await,
        "Leased"
    );
    // The record is free, so the next taker breaks that orphan after a short wait.
    let taken = store.acquire_lease(&ws, &request).await.unwrap();
    assert!(taken.fence > first.fence);
}
