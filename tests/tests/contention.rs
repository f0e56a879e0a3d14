//! Contention on every store, against the real emulators: 32 jobs on one workspace at once, and
//! 32 workspaces at once. Each job takes the workspace's lease (waiting while another holds
//! it), reads the current state, writes its successor fenced by the lease, and lets go.
//! Afterwards: never two holders at one instant, and no update lost (32 successors, each job's
//! exactly once, serials 1 to 32). Attempts and time are printed (`--nocapture`) for
//! docs/RELIABILITY.md. `TERRACE_CONTENTION_JOBS` sets the number (32).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use state_backends::{LeaseRequest, NewState, PutMode, StateStore, StoreError, WorkspaceId};

fn jobs() -> usize {
    std::env::var("TERRACE_CONTENTION_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(32)
}

fn state(lineage: &str, serial: u64, by: &str) -> NewState {
    NewState::parse(Bytes::from(format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{"by":{{"value":"{by}","type":"string"}}}},"resources":[]}}"#
    )))
    .unwrap()
}

/// What a contended run cost.
#[derive(Debug, Default)]
struct Report {
    attempts: usize,
    busy: usize,
    /// Calls that failed with an error that may pass (tried again, as the runners do).
    retried: usize,
    /// The serial this job last tried to write.
    wrote: Option<u64>,
}

/// One job: the lease (waiting while held, at most 5 minutes), read, write the successor,
/// let go.
async fn one_job(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    i: usize,
    inside: &AtomicUsize,
    overlaps: &AtomicUsize,
) -> Report {
    let who = &format!("job-{i}");
    let give_up = Instant::now() + Duration::from_secs(300);
    let mut report = Report::default();
    let request = LeaseRequest {
        owner: who.to_owned(),
        ttl: Duration::from_secs(60),
        info: serde_json::Value::Null,
    };
    loop {
        report.attempts += 1;
        let lease = match store.acquire_lease(ws, &request).await {
            Ok(lease) => lease,
            Err(StoreError::LeaseHeld { .. }) => {
                report.busy += 1;
                assert!(Instant::now() < give_up, "{who}: the lease never came free");
                // Jittered per job and attempt, as the runners wait.
                let jitter = 20 + (report.attempts * 37 + i * 101) % 60;
                tokio::time::sleep(Duration::from_millis(jitter as u64)).await;
                continue;
            }
            Err(e) if e.is_retryable() => {
                report.retried += 1;
                assert!(Instant::now() < give_up, "{who}: acquiring: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => panic!("{who}: acquiring: {e}"),
        };
        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
            overlaps.fetch_add(1, Ordering::SeqCst);
        }
        // Read, write the successor; an error that may pass is tried again, as terraform
        // tries its write again through the state server. A write that landed before its
        // answer was lost is found on the next read (the lease keeps every other writer out).
        let mut wrote = None;
        while wrote.is_none() {
            let current = match store.current(ws).await {
                Ok(current) => current,
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    report.retried += 1;
                    continue;
                }
                Err(e) => panic!("{who}: reading: {e}"),
            };
            if let (Some(c), Some(serial)) = (&current, report.wrote)
                && c.version.serial == serial
            {
                wrote = Some(serial);
                continue;
            }
            let (mode, serial) = match current {
                Some(c) => (PutMode::Update(c.token), c.version.serial + 1),
                None => (PutMode::Create, 1),
            };
            report.wrote = Some(serial);
            match store
                .put(
                    ws,
                    state("contended", serial, who),
                    mode,
                    Some(&lease.fence()),
                )
                .await
            {
                Ok(_) => wrote = Some(serial),
                Err(e) if e.is_retryable() && Instant::now() < give_up => report.retried += 1,
                Err(e) => panic!("{who}: the holder's write was refused: {e}"),
            }
        }
        inside.fetch_sub(1, Ordering::SeqCst);
        loop {
            match store.release_lease(ws, &lease).await {
                Ok(()) => return report,
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    report.retried += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{who}: releasing: {e}"),
            }
        }
    }
}

/// `jobs` jobs on one workspace at once, then `jobs` workspaces at once.
async fn contend(name: &str, store: Arc<dyn StateStore>) {
    let n = jobs();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let ws = WorkspaceId::new("contention", &format!("one-{stamp}")).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (store, ws, inside, overlaps) =
                (store.clone(), ws.clone(), inside.clone(), overlaps.clone());
            tokio::spawn(async move { one_job(&*store, &ws, i, &inside, &overlaps).await })
        })
        .collect();
    let (mut attempts, mut busy, mut retried) = (0, 0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        attempts += r.attempts;
        busy += r.busy;
        retried += r.retried;
    }
    let one = started.elapsed();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let versions = store.versions(&ws).await.unwrap();
    let serials: Vec<u64> = versions.iter().map(|v| v.serial).collect();
    assert_eq!(
        serials,
        (1..=n as u64).collect::<Vec<_>>(),
        "every job's update is a version"
    );
    let mut writers = Vec::new();
    for v in &versions {
        let data = store.version(&ws, v.number).await.unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&data).unwrap();
        writers.push(doc["outputs"]["by"]["value"].as_str().unwrap().to_owned());
    }
    writers.sort();
    writers.dedup();
    assert_eq!(writers.len(), n, "each job wrote exactly once");
    assert!(store.lease(&ws).await.unwrap().is_none(), "no lease left");

    // `n` workspaces at once, each with its own job: none finds its lease held, all land.
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            let ws = WorkspaceId::new("contention", &format!("many-{stamp}-{i}")).unwrap();
            tokio::spawn(async move {
                let (inside, overlaps) = (AtomicUsize::new(0), AtomicUsize::new(0));
                let r = one_job(&*store, &ws, i, &inside, &overlaps).await;
                assert_eq!(store.versions(&ws).await.unwrap().len(), 1);
                assert!(store.lease(&ws).await.unwrap().is_none());
                r.busy
            })
        })
        .collect();
    let mut waited = 0;
    for t in tasks {
        waited += t.await.unwrap();
    }
    assert_eq!(waited, 0, "no workspace waited for another's lease");
    println!(
        "contention {name}: {n} jobs on one workspace in {:.2} s ({attempts} lease attempts, {busy} found it held, {retried} calls tried again), 0 overlaps, 0 lost; {n} workspaces at once in {:.2} s",
        one.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_on_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    contend("fs", Arc::new(state_backends::fs::FsStore::new(dir.path()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_on_s3_with_a_dynamodb_lease() {
    use state_backends::s3::{LeaseMode, S3Config, S3Store};
    let config = S3Config {
        bucket: tests::aws::bucket().await,
        prefix: "c".into(),
        lease: LeaseMode::DynamoDb {
            table: tests::aws::lease_table().await,
        },
        kms_key_id: None,
    };
    let store = S3Store::new(
        tests::aws::s3().await,
        Some(tests::aws::dynamodb().await),
        config,
    )
    .unwrap();
    contend("s3+dynamodb", Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_on_s3_with_a_lock_object() {
    use state_backends::s3::{LeaseMode, S3Config, S3Store};
    let config = S3Config {
        bucket: tests::aws::bucket().await,
        prefix: "c".into(),
        lease: LeaseMode::LockObject,
        kms_key_id: None,
    };
    let store = S3Store::new(tests::aws::s3().await, None, config).unwrap();
    contend("s3 lock object", Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_on_gcs() {
    let bucket = tests::gcs::bucket().await;
    contend("gcs", Arc::new(tests::gcs::store(&bucket, "c").await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_on_azure_blob() {
    let container = tests::azure::container().await;
    contend("azure", Arc::new(tests::azure::store(&container, "c"))).await;
}
