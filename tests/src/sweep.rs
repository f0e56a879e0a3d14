//! The backup sweep's cost check, the same on every object-store cloud: many workspaces, a
//! few of them changed since the last sweep. Used by the store tests (small) and by
//! `benches/sweep.rs` (10 to 10,000 workspaces).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shared::sweeps::backup::{Retention, sweep};
use state_backends::objects::{Bucket, BucketStore};
use state_backends::{NewState, PutMode, StateStore, WorkspaceId, tfstate::empty_state};

use crate::counted::Counted;

/// Store calls a sweep makes per changed workspace with one change mark: the server-side copy
/// of the version the mark names, and the mark's deletion. (Retention lists a workspace's
/// backups once every `PRUNE_EVERY` versions, which a sweep after one write never meets.)
pub const CALLS_PER_CHANGED: usize = 2;

/// What the second sweep cost.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub total: usize,
    pub changed: usize,
    /// Store calls (`Bucket` methods; a listing of all pages is one).
    pub calls: usize,
    /// The SDK's requests (pages and retries included), when counted.
    pub requests: Option<u64>,
    /// The first sweep (every workspace new) and the second.
    pub first: Duration,
    pub second: Duration,
}

/// Sweeps `store` (under the prefix `states`, with `total` workspaces) twice: the second
/// sweep backs up exactly the workspaces written since the first (every `every`-th), each
/// backup a byte-for-byte server-side copy, in [`CALLS_PER_CHANGED`] calls per changed
/// workspace plus the listing. Returns what the second sweep cost. `requests`, when given,
/// counts the SDK's requests too (what the cloud bills: retries and pages included), for the
/// second sweep alone; it is printed and bounded alike.
pub async fn copies_only_what_changed<B: Bucket + Clone + 'static>(
    store: BucketStore<B>,
    cloud: &str,
    total: usize,
    every: usize,
    requests: Option<&crate::aws::CallCounter>,
) -> Figures {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(store.map_bucket(|b| Counted::new(b, calls.clone())));
    let names: Vec<WorkspaceId> = (0..total)
        .map(|i| WorkspaceId::new("acme", &format!("ws-{i:05}")).unwrap())
        .collect();
    let state = |serial| NewState::parse(empty_state("sweep", serial)).unwrap();
    // 32 writes at a time: the emulators serve a few connections well, not thousands.
    let slots = Arc::new(tokio::sync::Semaphore::new(32));
    let mut writes = tokio::task::JoinSet::new();
    for ws in names.clone() {
        let (store, slots) = (store.clone(), slots.clone());
        writes.spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            store.put(&ws, state(1), PutMode::Create, None).await
        });
    }
    while let Some(done) = writes.join_next().await {
        done.unwrap().unwrap();
    }
    let hour = time::macros::datetime!(2026-11-22 01:00 UTC);
    let started = Instant::now();
    let first = sweep(&*store, hour, Retention::default()).await.unwrap();
    let first_took = started.elapsed();
    assert_eq!(first.backed_up.len(), total, "{:?}", first.failed);
    assert!(
        store.changed().await.unwrap().is_empty(),
        "every mark is cleared"
    );

    let changed: Vec<&WorkspaceId> = names.iter().step_by(every).collect();
    for ws in &changed {
        let token = store.current(ws).await.unwrap().unwrap().token;
        store
            .put(ws, state(2), PutMode::Update(token), None)
            .await
            .unwrap();
    }

    calls.store(0, Ordering::Relaxed);
    if let Some(requests) = requests {
        requests.reset();
    }
    let started = Instant::now();
    let second = sweep(
        &*store,
        hour + time::Duration::hours(1),
        Retention::default(),
    )
    .await
    .unwrap();
    let second_took = started.elapsed();
    let calls = calls.load(Ordering::Relaxed);
    let requests = requests.map(crate::aws::CallCounter::get);
    let backed: Vec<String> = second.backed_up.iter().map(|(w, _)| w.clone()).collect();
    let expected: Vec<String> = changed.iter().map(|w| w.to_string()).collect();
    assert_eq!(backed, expected);
    assert!(second.backed_up.iter().all(|(_, b)| b.version == 2));
    println!(
        "{cloud} backup sweep: {total} workspaces, {} changed: {calls} calls in {second_took:.2?}",
        changed.len()
    );
    // One listing, then a fixed number of calls per changed workspace, none per unchanged one.
    assert!(
        calls <= 1 + changed.len() * CALLS_PER_CHANGED,
        "{calls} calls"
    );
    if let Some(requests) = requests {
        println!("{cloud} backup sweep: {requests} requests");
        // A listing page holds 1,000 keys.
        let pages = (changed.len() as u64).div_ceil(1000).max(1);
        assert!(
            requests <= pages + changed.len() as u64 * CALLS_PER_CHANGED as u64,
            "{requests} requests"
        );
    }
    for ws in &changed {
        let backups = store.backups(ws).await.unwrap();
        let labels: Vec<&str> = backups.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["2026-11-22T01", "2026-11-22T02"]);
        // A backup is a server-side copy of the version it names, byte for byte, and its
        // name says which.
        let name = format!(
            "states/{ws}/backups/2026-11-22T02_0000000002_{}.tfstate",
            backups[1].sha256
        );
        let copy = store.bucket().get(&name).await.unwrap().expect("the copy");
        assert_eq!(copy.data, store.version(ws, 2).await.unwrap());
    }
    Figures {
        total,
        changed: changed.len(),
        calls,
        requests,
        first: first_took,
        second: second_took,
    }
}
