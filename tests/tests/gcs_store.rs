//! The GCS store passes the shared conformance suite against fake-gcs-server, and its backup
//! sweep copies only what changed.

use std::sync::Arc;
use tests::gcs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_passes_the_conformance_suite() {
    let store = gcs::store(&gcs::bucket().await, "states").await;
    state_backends::conformance::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcs_backup_restores_without_its_versions() {
    let store = gcs::store(&gcs::bucket().await, "states").await;
    state_backends::conformance::a_bucket_backup_restores_without_its_versions(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_at_the_buckets_root_passes_the_conformance_suite() {
    let store = gcs::store(&gcs::bucket().await, "").await;
    state_backends::conformance::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backup_sweep_over_100_workspaces_copies_only_the_4_that_changed() {
    let store = gcs::store(&gcs::bucket().await, "states").await;
    tests::sweep::copies_only_what_changed(store, "GCS", 100, 25, None).await;
}
