//! The Azure store passes the shared conformance suite against Azurite, holds each workspace's
//! lease in a lock object past the blob leases earlier runners left, and its backup sweep
//! copies only what changed.

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

/// A lease request of `owner`'s, for `ttl`.
fn request(owner: &str, ttl: std::time::Duration) -> state_backends::LeaseRequest {
    state_backends::LeaseRequest {
        owner: owner.into(),
        ttl,
        info: serde_json::Value::Null,
    }
}

/// A blob of the container at `url` (with its SAS), reached directly: another taker, say.
fn blob(url: &str, key: &str) -> azure_storage_blob::BlobClient {
    azure_storage_blob::BlobContainerClient::new(
        azure_core::http::Url::parse(url).unwrap(),
        None,
        None,
    )
    .unwrap()
    .blob_client(key)
}

/// The blob lease on a workspace's `lease.json`, as Azure reports it.
async fn blob_lease_state(url: &str, key: &str) -> String {
    use azure_storage_blob::models::BlobClientGetPropertiesResultHeaders;
    let properties = blob(url, key).get_properties(None).await.unwrap();
    format!("{:?}", properties.lease_state().unwrap().unwrap())
}

/// Takes a blob lease on `key` for good, as runners up to 2026-11-29 did to change
/// `lease.json` (and held it for a whole job).
async fn blob_lease_for_good(url: &str, key: &str) {
    blob(url, key).acquire_lease(-1, None).await.unwrap();
    assert_eq!(blob_lease_state(url, key).await, "Leased");
}

/// A lease an earlier runner holds (its record live, its blob lease on `lease.json`) is left
/// alone: another taker is told who holds it, and breaks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_runners_live_lease_and_its_blob_lease_are_left_alone() {
    use state_backends::{StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "states");
    let ws = WorkspaceId::new("acme", "leased").unwrap();
    let key = "states/acme/leased/lease.json";
    let lease = store
        .acquire_lease(&ws, &request("runner-a", Duration::from_secs(60)))
        .await
        .unwrap();
    blob_lease_for_good(&url, key).await;
    let other = azure::store(&url, "states");
    match other
        .acquire_lease(&ws, &request("runner-b", Duration::from_secs(60)))
        .await
    {
        Err(StoreError::LeaseHeld { holder, .. }) => assert_eq!(holder.owner, "runner-a"),
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    assert_eq!(blob_lease_state(&url, key).await, "Leased");
    assert_eq!(store.lease(&ws).await.unwrap().unwrap().fence, lease.fence);
}

/// A blob lease an earlier runner that died mid-job left (for good) on `lease.json` is broken
/// once its recorded lease expires, by the taker that may then write; the dead holder cannot
/// renew, and an operator's break frees the workspace whatever it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_runners_blob_lease_is_broken_once_its_recorded_lease_expires() {
    use state_backends::{StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "");
    let ws = WorkspaceId::new("acme", "crashed").unwrap();
    let key = "acme/crashed/lease.json";
    let dead = store
        .acquire_lease(&ws, &request("runner-a", Duration::from_secs(2)))
        .await
        .unwrap();
    blob_lease_for_good(&url, key).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let taken = store
        .acquire_lease(&ws, &request("runner-b", Duration::from_secs(60)))
        .await
        .expect("the expired lease is taken over");
    assert!(taken.fence > dead.fence);
    assert_eq!(taken.took_over.as_ref().unwrap().owner, "runner-a");
    assert_ne!(blob_lease_state(&url, key).await, "Leased");
    assert!(matches!(
        store.renew_lease(&ws, &dead, Duration::from_secs(60)).await,
        Err(StoreError::LeaseLost { .. })
    ));
    blob_lease_for_good(&url, key).await;
    let broken = store.break_lease(&ws, None).await.unwrap().unwrap();
    assert_eq!(broken.owner, "runner-b");
    store
        .acquire_lease(&ws, &request("runner-c", Duration::from_secs(60)))
        .await
        .expect("free after the break");
}

/// A blob lease left on `lease.json` by an earlier runner's taker (one that died between its
/// blob lease and its write, or while it read another's record) keeps nobody out: a free
/// record is taken, and a holder renews and releases its own lease past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_lease_an_earlier_taker_left_keeps_nobody_out() {
    use state_backends::{StateStore, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "states");
    let ws = WorkspaceId::new("acme", "orphan").unwrap();
    let key = "states/acme/orphan/lease.json";
    let request = request("runner-a", Duration::from_secs(60));
    let first = store.acquire_lease(&ws, &request).await.unwrap();
    store.release_lease(&ws, &first).await.unwrap();
    blob_lease_for_good(&url, key).await;
    let taken = store.acquire_lease(&ws, &request).await.unwrap();
    assert_eq!(taken.fence, first.fence + 1);
    blob_lease_for_good(&url, key).await;
    let renewed = store
        .renew_lease(&ws, &taken, Duration::from_secs(90))
        .await
        .expect("renewed past the blob lease");
    assert!(renewed.expires_at > taken.expires_at);
    blob_lease_for_good(&url, key).await;
    store.release_lease(&ws, &renewed).await.unwrap();
    assert!(store.lease(&ws).await.unwrap().is_none());
    let next = store.acquire_lease(&ws, &request).await.unwrap();
    assert_eq!(next.fence, taken.fence + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_overtaken_while_stalled_can_neither_renew_nor_release_its_way_back() {
    use state_backends::{StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "states");
    let ws = WorkspaceId::new("acme", "stalled").unwrap();
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

/// A fault proxy in front of the container at `url` (with its SAS), drawing no fault of its
/// own, and the container's URL through it.
async fn through_a_proxy(url: &str) -> (tests::fault_proxy::FaultProxy, String) {
    use tests::fault_proxy::{Cloud, FaultProxy};
    let at = url.find("://").unwrap() + 3;
    let (origin, path) = url.split_at(at + url[at..].find('/').unwrap());
    let proxy = FaultProxy::start(origin, Cloud::Azure, 0.0, 1).await;
    let proxied = format!("{}{path}", proxy.url());
    (proxy, proxied)
}

/// Where the proxy logs every request from now on (see [`lease_requests`]), in a folder that
/// lives as long as the guard. Appended to, so that emptying it between steps starts it afresh.
fn request_log(proxy: &tests::fault_proxy::FaultProxy) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log);
    proxy.log_to(appended.unwrap());
    (dir, log)
}

/// The requests a lease costs, from the proxy's log of them: each is `METHOD path?comp=…`.
fn lease_requests(log: &std::path::Path) -> Vec<String> {
    let read = std::fs::read_to_string(log).unwrap();
    let requests: Vec<String> = read
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let what = v["what"].as_str().unwrap().to_owned();
            let (method, rest) = what.split_once(' ').unwrap();
            let comp = if rest.contains("comp=lease") {
                "?lease"
            } else {
                ""
            };
            format!("{method}{comp}")
        })
        .collect();
    std::fs::write(log, "").unwrap();
    requests
}

/// A lease is taken and let go in as few requests as its safety allows: a lock object, as on
/// the other clouds. A workspace's first take reads that there is no `lease.json` and makes it
/// create-only. A renewal, a release, and a take after it by the same store write over the
/// record that store last wrote, unread. A store that did not write it last reads it first,
/// and a guess gone stale (another store wrote since) costs a read and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_taken_and_let_go_in_few_requests() {
    use state_backends::{StateStore, WorkspaceId};
    use std::time::Duration;

    let (proxy, proxied) = through_a_proxy(&azure::container().await).await;
    let (_dir, log) = request_log(&proxy);
    let (one, other) = (azure::store(&proxied, "s"), azure::store(&proxied, "s"));
    let ws = WorkspaceId::new("acme", "counted").unwrap();
    let request = |owner: &str| request(owner, Duration::from_secs(60));

    let first = one.acquire_lease(&ws, &request("a")).await.unwrap();
    assert_eq!(first.fence, 1);
    assert_eq!(lease_requests(&log), ["GET", "PUT"]);
    let renewed = one
        .renew_lease(&ws, &first, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(lease_requests(&log), ["PUT"]);
    one.release_lease(&ws, &renewed).await.unwrap();
    assert_eq!(lease_requests(&log), ["PUT"]);

    let second = one.acquire_lease(&ws, &request("b")).await.unwrap();
    assert_eq!(second.fence, 2);
    assert_eq!(lease_requests(&log), ["PUT"]);
    one.release_lease(&ws, &second).await.unwrap();
    lease_requests(&log);

    // Another store reads the record first; then the first store's guess is stale.
    let third = other.acquire_lease(&ws, &request("c")).await.unwrap();
    assert_eq!(third.fence, 3);
    assert_eq!(lease_requests(&log), ["GET", "PUT"]);
    other.release_lease(&ws, &third).await.unwrap();
    lease_requests(&log);
    let fourth = one.acquire_lease(&ws, &request("d")).await.unwrap();
    assert_eq!(fourth.fence, 4, "the stale guess wrote nothing");
    assert_eq!(lease_requests(&log), ["PUT", "GET", "PUT"]);
    assert_eq!(one.lease(&ws).await.unwrap().unwrap().owner, "d");
}

/// Two stores taking a new workspace's first lease at once: one makes `lease.json` holding
/// its lease; the other, whose create-only write loses, is told who holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_first_takers_one_makes_the_lease_and_the_other_is_told() {
    use state_backends::{StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    for round in 0..5 {
        let (a, b) = (azure::store(&url, "s"), azure::store(&url, "s"));
        let ws = WorkspaceId::new("acme", &format!("raced-{round}")).unwrap();
        let request = |owner: &str| request(owner, Duration::from_secs(60));
        let (for_a, for_b) = (request("a"), request("b"));
        let (ra, rb) = tokio::join!(a.acquire_lease(&ws, &for_a), b.acquire_lease(&ws, &for_b));
        let (won, lost) = match (ra, rb) {
            (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won, lost),
            other => panic!("exactly one should hold the lease: {other:?}"),
        };
        assert_eq!(won.fence, 1);
        match lost {
            StoreError::LeaseHeld { holder, .. } => assert_eq!(holder.owner, won.owner),
            other => panic!("expected LeaseHeld, got {other:?}"),
        }
        let holder = if won.owner == "a" { &a } else { &b };
        holder.release_lease(&ws, &won).await.unwrap();
        assert!(a.lease(&ws).await.unwrap().is_none());
    }
}

/// A first take whose making of `lease.json` landed with its answer lost: the client sends it
/// again and is told the blob exists. The taker then reads the record, finds its own lease
/// there, and holds it, renewable, without waiting for it to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_lease_whose_making_lost_its_answer_is_still_taken() {
    use state_backends::{StateStore, WorkspaceId};
    use std::time::Duration;
    use tests::fault_proxy::Fault;

    let (proxy, proxied) = through_a_proxy(&azure::container().await).await;
    // The create-only write of the record: a PUT of lease.json without `comp`.
    proxy.fail(
        Box::new(|m, path, _| {
            m == hyper::Method::PUT && path.contains("lease.json") && !path.contains("comp=")
        }),
        1,
        Fault::ResetAfter,
    );
    let store = azure::store(&proxied, "s");
    let ws = WorkspaceId::new("acme", "answer-lost").unwrap();
    let request = request("a", Duration::from_secs(60));
    let lease = store.acquire_lease(&ws, &request).await.unwrap();
    assert_eq!(
        proxy.counts().of(Fault::ResetAfter),
        1,
        "the fault was drawn"
    );
    assert_eq!(lease.fence, 1);
    let renewed = store
        .renew_lease(&ws, &lease, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(renewed.fence, 1);
    store.release_lease(&ws, &renewed).await.unwrap();
    assert!(store.lease(&ws).await.unwrap().is_none());
}
