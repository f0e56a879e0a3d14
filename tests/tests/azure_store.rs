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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_is_a_blob_lease_that_only_its_holder_can_change() {
    use state_backends::objects::{Bucket, Condition};
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
    use state_backends::{StateStore, StoreError, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "");
    let ws = WorkspaceId::new("acme", "crashed").unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_lease_left_by_a_taker_that_died_before_writing_is_broken() {
    use state_backends::{StateStore, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "states");
    let ws = WorkspaceId::new("acme", "orphan").unwrap();
    let request = request("runner-a", Duration::from_secs(60));
    let first = store.acquire_lease(&ws, &request).await.unwrap();
    store.release_lease(&ws, &first).await.unwrap();
    // A taker takes the blob lease for good, then dies before writing the record.
    blob(&url, "states/acme/orphan/lease.json")
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

/// A lease is taken and let go in as few requests as its safety allows. A workspace's first
/// take makes its `lease.json` holding the lease (a blob lease refused for want of a blob, the
/// create-only write, the blob lease). A release, and a take after it by the same store, write
/// over the record that store last wrote, unread. A store that did not write it last reads it
/// first, and a guess gone stale (another store wrote since) costs a read and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_taken_and_let_go_in_few_requests() {
    use state_backends::{StateStore, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let (proxy, proxied) = through_a_proxy(&url).await;
    let (_dir, log) = request_log(&proxy);
    let (one, other) = (azure::store(&proxied, "s"), azure::store(&proxied, "s"));
    let ws = WorkspaceId::new("acme", "counted").unwrap();
    let request = |owner: &str| request(owner, Duration::from_secs(60));

    let first = one.acquire_lease(&ws, &request("a")).await.unwrap();
    assert_eq!(first.fence, 1);
    assert_eq!(lease_requests(&log), ["PUT?lease", "PUT", "PUT?lease"]);
    assert_eq!(
        blob_lease_state(&url, "s/acme/counted/lease.json").await,
        "Leased"
    );
    let renewed = one
        .renew_lease(&ws, &first, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(lease_requests(&log), ["PUT"]);
    one.release_lease(&ws, &renewed).await.unwrap();
    assert_eq!(lease_requests(&log), ["PUT", "PUT?lease"]);
    assert_eq!(
        blob_lease_state(&url, "s/acme/counted/lease.json").await,
        "Available"
    );

    let second = one.acquire_lease(&ws, &request("b")).await.unwrap();
    assert_eq!(second.fence, 2);
    assert_eq!(lease_requests(&log), ["PUT?lease", "PUT"]);
    one.release_lease(&ws, &second).await.unwrap();
    lease_requests(&log);

    // Another store reads the record first; then the first store's guess is stale.
    let third = other.acquire_lease(&ws, &request("c")).await.unwrap();
    assert_eq!(third.fence, 3);
    assert_eq!(lease_requests(&log), ["PUT?lease", "GET", "PUT"]);
    other.release_lease(&ws, &third).await.unwrap();
    lease_requests(&log);
    let fourth = one.acquire_lease(&ws, &request("d")).await.unwrap();
    assert_eq!(fourth.fence, 4, "the stale guess wrote nothing");
    assert_eq!(lease_requests(&log), ["PUT?lease", "PUT", "GET", "PUT"]);
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
        assert_eq!(
            blob_lease_state(&url, &format!("s/acme/raced-{round}/lease.json")).await,
            "Leased"
        );
        let holder = if won.owner == "a" { &a } else { &b };
        holder.release_lease(&ws, &won).await.unwrap();
        assert!(a.lease(&ws).await.unwrap().is_none());
    }
}

/// A first take whose making of `lease.json` landed with its answer lost: the client sends it
/// again and is told the blob exists. The taker then takes the blob lease under the id the
/// record it made names, finds its own lease there, and holds it, renewable, without waiting
/// for it to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_lease_whose_making_lost_its_answer_is_still_taken() {
    use state_backends::{StateStore, WorkspaceId};
    use std::time::Duration;
    use tests::fault_proxy::Fault;

    let url = azure::container().await;
    let (proxy, proxied) = through_a_proxy(&url).await;
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
    assert_eq!(
        blob_lease_state(&url, "s/acme/answer-lost/lease.json").await,
        "Leased"
    );
    let renewed = store
        .renew_lease(&ws, &lease, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(renewed.fence, 1);
    store.release_lease(&ws, &renewed).await.unwrap();
    assert_eq!(
        blob_lease_state(&url, "s/acme/answer-lost/lease.json").await,
        "Available"
    );
}

/// The taker that made a workspace's first `lease.json` finds the blob leased by another (a
/// contender reading the record, or one that died holding it): its lease is live in the record
/// nobody else may change, so it breaks that blob lease at once instead of waiting for it.
/// Waiting could outlast every attempt while many contenders take and give it back in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maker_of_a_first_lease_breaks_a_contenders_blob_lease_at_once() {
    let requests = first_take_with_a_contender("contended-first", false).await;
    // The refused take, the create, the take refused (the contender's), the record read (still
    // its own), the break, the take.
    assert_eq!(
        requests,
        [
            "PUT?lease",
            "PUT",
            "PUT?lease",
            "GET",
            "PUT?lease",
            "PUT?lease"
        ]
    );
}

/// As above, when the create's answer was lost (it landed; the client sent it again and was
/// told it exists): the maker finds its own lease in the record and takes it, instead of
/// reporting it held by another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maker_whose_answer_was_lost_finds_its_lease_under_a_contenders_blob_lease() {
    let requests = first_take_with_a_contender("contended-lost", true).await;
    // The refused take, the create and its second try, the take refused, the read that finds
    // its own lease, the take refused again, the record read again, the break, the take.
    let expected = [
        "PUT?lease",
        "PUT",
        "PUT",
        "PUT?lease",
        "GET",
        "PUT?lease",
        "GET",
        "PUT?lease",
        "PUT?lease",
    ];
    assert_eq!(requests, expected);
}

/// A workspace's first lease, taken while a contender takes the blob lease between the
/// maker's create (whose answer is lost when `lost`) and its take, and keeps it. Checks the
/// lease is the first and the blob leased; the requests the maker made.
async fn first_take_with_a_contender(workspace: &str, lost: bool) -> Vec<String> {
    use state_backends::{StateStore, WorkspaceId};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;
    use tests::fault_proxy::Fault;

    let url = azure::container().await;
    let (proxy, proxied) = through_a_proxy(&url).await;
    let (_dir, log) = request_log(&proxy);
    if lost {
        proxy.fail(
            Box::new(|m, path, _| {
                m == hyper::Method::PUT && path.contains("lease.json") && !path.contains("comp=")
            }),
            1,
            Fault::ResetAfter,
        );
    }
    // The maker's second blob-lease request (the take after its create) waits, and a
    // contender takes the blob lease meanwhile, for good, and never gives it back.
    let leases = Arc::new(AtomicU32::new(0));
    proxy.slow(
        Some(Box::new(move |m, path, _| {
            m == hyper::Method::PUT
                && path.contains("comp=lease")
                && leases.fetch_add(1, Ordering::SeqCst) == 1
        })),
        Duration::from_millis(500),
    );
    let store = azure::store(&proxied, "s");
    let ws = WorkspaceId::new("acme", workspace).unwrap();
    let request = request("maker", Duration::from_secs(60));
    let taking = tokio::spawn({
        let (store, ws) = (store.clone(), ws.clone());
        async move { store.acquire_lease(&ws, &request).await }
    });
    let key = format!("s/acme/{workspace}/lease.json");
    let contender = blob(&url, &key);
    let contended = async {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < until {
            if contender.acquire_lease(-1, None).await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    };
    assert!(contended.await, "the contender never took the blob lease");
    let lease = taking.await.unwrap().unwrap();
    assert_eq!(lease.fence, 1);
    assert_eq!(lease.owner, "maker");
    if lost {
        assert_eq!(
            proxy.counts().of(Fault::ResetAfter),
            1,
            "the fault was drawn"
        );
    }
    let taken = lease_requests(&log);
    // The maker holds the blob lease: its renewal is a write under it, without taking it (after
    // a lost answer the store knows no ETag for the record, so it reads it first), and its
    // release gives it back.
    let renewed = store
        .renew_lease(&ws, &lease, Duration::from_secs(90))
        .await
        .unwrap();
    let renewal: &[&str] = if lost { &["GET", "PUT"] } else { &["PUT"] };
    assert_eq!(lease_requests(&log), renewal);
    store.release_lease(&ws, &renewed).await.unwrap();
    assert_eq!(blob_lease_state(&url, &key).await, "Available");
    taken
}

/// A holder whose blob lease was broken and taken by another taker that died holding it (its
/// record still names the holder's live lease) takes it back at its next renewal. Waiting for
/// it would last until the lease expired and the job stopped mid-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_takes_its_blob_lease_back_from_a_taker_that_died_holding_it() {
    use state_backends::{StateStore, WorkspaceId};
    use std::time::Duration;

    let url = azure::container().await;
    let store = azure::store(&url, "s");
    let ws = WorkspaceId::new("acme", "taken-back").unwrap();
    let request = request("holder", Duration::from_secs(60));
    let lease = store.acquire_lease(&ws, &request).await.unwrap();
    let other = blob(&url, "s/acme/taken-back/lease.json");
    let options = azure_storage_blob::models::BlobClientBreakLeaseOptions {
        break_period: Some(0),
        ..Default::default()
    };
    other.break_lease(Some(options)).await.unwrap();
    other.acquire_lease(-1, None).await.unwrap();
    let renewed = store
        .renew_lease(&ws, &lease, Duration::from_secs(90))
        .await
        .expect("the renewal takes the blob lease back");
    assert_eq!(renewed.fence, lease.fence);
    // Its own again: released, the blob is free, and the next taker gets the next fence.
    store.release_lease(&ws, &renewed).await.unwrap();
    assert_eq!(
        blob_lease_state(&url, "s/acme/taken-back/lease.json").await,
        "Available"
    );
    let next = store.acquire_lease(&ws, &request).await.unwrap();
    assert_eq!(next.fence, lease.fence + 1);
}
