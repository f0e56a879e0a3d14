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
async fn azure_at_the_containers_root_passes_the_conformance_suite() {
    let store = azure::store(&azure::container().await, "");
    state_backends::conformance::run_all(Arc::new(store)).await;
}
