//! The S3 store passes the shared conformance suite against moto, in both lease modes.

use std::sync::Arc;

use state_backends::s3::{LeaseMode, S3Config, S3Store};
use tests::aws;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_with_a_dynamodb_lease_passes_the_conformance_suite() {
    let config = S3Config {
        bucket: aws::bucket().await,
        prefix: "states".into(),
        lease: LeaseMode::DynamoDb {
            table: aws::lease_table().await,
        },
        kms_key_id: None,
    };
    let store = S3Store::new(aws::s3().await, Some(aws::dynamodb().await), config).unwrap();
    state_backends::conformance::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_with_a_lock_object_passes_the_conformance_suite() {
    let config = S3Config {
        bucket: aws::bucket().await,
        prefix: String::new(),
        lease: LeaseMode::LockObject,
        kms_key_id: None,
    };
    let store = S3Store::new(aws::s3().await, None, config).unwrap();
    state_backends::conformance::run_all(Arc::new(store)).await;
}
