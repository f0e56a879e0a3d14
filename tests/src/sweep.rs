//! The backup sweep's cost check, the same on every object-store cloud: many workspaces, a
//! few of them changed since the last sweep.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use shared::backup::{Retention, sweep};
use state_backends::objects::{Bucket, BucketStore};
use state_backends::{NewState, PutMode, StateStore, WorkspaceId, tfstate::empty_state};

use crate::counted::Counted;

/// Sweeps `store` (under the prefix `states`, with `total` workspaces) twice: the second
/// sweep backs up exactly the workspaces written since the first (every `every`-th), each
/// backup a byte-for-byte server-side copy, in a bounded number of calls. Returns those calls.
/// `requests`, when given, counts the SDK's requests too (what the cloud bills: retries and
/// pages included), for the second sweep alone; it is printed and bounded alike.
pub async fn copies_only_what_changed<B: Bucket + Clone + 'static>(
    store: BucketStore<B>,
    cloud: &str,
    total: usize,
    every: usize,
    requests: Option<&crate::aws::CallCounter>,
) -> usize {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(store.map_bucket(|b| Counted::new(b, calls.clone())));
    let names: Vec<WorkspaceId> = (0..total)
        .map(|i| WorkspaceId::new("acme", &format!("ws-{i:03}")).unwrap())
        .collect();
    let state = |serial| NewState::parse(empty_state("sweep", serial)).unwrap();
    let mut writes = tokio::task::JoinSet::new();
    for ws in names.clone() {
        let store = store.clone();
        writes.spawn(async move { store.put(&ws, state(1), PutMode::Create, None).await });
    }
    while let Some(done) = writes.join_next().await {
        done.unwrap().unwrap();
    }
    let hour = time::macros::datetime!(2026-11-22 01:00 UTC);
    let first = sweep(&*store, hour, Retention::default()).await.unwrap();
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
    let second = sweep(
        &*store,
        hour + time::Duration::hours(1),
        Retention::default(),
    )
    .await
    .unwrap();
    let calls = calls.load(Ordering::Relaxed);
    let requests = requests.map(crate::aws::CallCounter::get);
    let backed: Vec<String> = second.backed_up.iter().map(|(w, _)| w.clone()).collect();
    let expected: Vec<String> = changed.iter().map(|w| w.to_string()).collect();
    assert_eq!(backed, expected);
    assert!(second.backed_up.iter().all(|(_, b)| b.version == 2));
    println!(
        "{cloud} backup sweep: {total} workspaces, {} changed: {calls} calls",
        changed.len()
    );
    // One listing, then a bounded number of calls per changed workspace.
    assert!(calls <= 1 + changed.len() * 12, "{calls} calls");
    if let Some(requests) = requests {
        println!("{cloud} backup sweep: {requests} requests");
        assert!(
            requests <= 1 + changed.len() as u64 * 12,
            "{requests} requests"
        );
    }
    for ws in &changed {
        let backups = store.backups(ws).await.unwrap();
        let labels: Vec<&str> = backups.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["2026-11-22T01", "2026-11-22T02"]);
        // A backup is a server-side copy of the version it names, byte for byte.
        let key = format!("states/{ws}/backups/2026-11-22T02.tfstate");
        let copy = store.bucket().get(&key).await.unwrap().expect("the copy");
        assert_eq!(copy.data, store.version(ws, 2).await.unwrap());
    }
    calls
}
