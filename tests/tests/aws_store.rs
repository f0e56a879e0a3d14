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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backup_sweep_over_200_workspaces_copies_only_the_5_that_changed() {
    use shared::backup::{Retention, sweep};
    use state_backends::{NewState, PutMode, StateStore, WorkspaceId, tfstate::empty_state};

    let counter = aws::CallCounter::default();
    let config = S3Config {
        bucket: aws::bucket().await,
        prefix: "states".into(),
        lease: LeaseMode::LockObject,
        kms_key_id: None,
    };
    let store = Arc::new(S3Store::new(aws::s3_counted(&counter).await, None, config).unwrap());
    let names: Vec<WorkspaceId> = (0..200)
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
    assert_eq!(first.backed_up.len(), 200, "{:?}", first.failed);

    let changed: Vec<&WorkspaceId> = names.iter().step_by(40).collect();
    assert_eq!(changed.len(), 5);
    for ws in &changed {
        let token = store.current(ws).await.unwrap().unwrap().token;
        store
            .put(ws, state(2), PutMode::Update(token), None)
            .await
            .unwrap();
    }

    counter.reset();
    let second = sweep(
        &*store,
        hour + time::Duration::hours(1),
        Retention::default(),
    )
    .await
    .unwrap();
    let calls = counter.get();
    let backed: Vec<String> = second.backed_up.iter().map(|(w, _)| w.clone()).collect();
    let expected: Vec<String> = changed.iter().map(|w| w.to_string()).collect();
    assert_eq!(backed, expected);
    assert!(second.backed_up.iter().all(|(_, b)| b.version == 2));
    assert!(second.failed.is_empty() && second.unchanged.is_empty());
    println!("backup sweep: 200 workspaces, 5 changed: {calls} S3 calls, 0 DynamoDB calls");
    // One listing, then a bounded number of calls per changed workspace: nothing per
    // unchanged workspace.
    assert!(calls <= 1 + 5 * 12, "{calls} calls");
    for ws in &changed {
        let labels: Vec<String> = store
            .backups(ws)
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.label)
            .collect();
        assert_eq!(labels, ["2026-11-22T01", "2026-11-22T02"]);
    }
    assert!(store.changed().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_object_is_encrypted_with_the_customers_kms_key() {
    use state_backends::{NewState, PutMode, StateStore, WorkspaceId, tfstate::empty_state};
    let key = aws::kms_key();
    let bucket = aws::bucket().await;
    let config = S3Config {
        bucket: bucket.clone(),
        prefix: "kms".into(),
        lease: LeaseMode::LockObject,
        kms_key_id: Some(key.clone()),
    };
    let store = S3Store::new(aws::s3().await, None, config).unwrap();
    let ws: WorkspaceId = "acme/secret".parse().unwrap();
    store
        .put(
            &ws,
            NewState::parse(empty_state("k", 1)).unwrap(),
            PutMode::Create,
            None,
        )
        .await
        .unwrap();
    store.snapshot(&ws, "2026-11-22T03").await.unwrap().unwrap();
    let s3 = aws::s3().await;
    for key_name in [
        "kms/acme/secret/versions/0000000001.tfstate",
        "kms/acme/secret/terraform.tfstate",
        "kms/acme/secret/backups/2026-11-22T03.tfstate",
    ] {
        let head = s3
            .head_object()
            .bucket(&bucket)
            .key(key_name)
            .send()
            .await
            .unwrap();
        assert_eq!(
            head.server_side_encryption(),
            Some(&aws_sdk_s3::types::ServerSideEncryption::AwsKms),
            "{key_name}"
        );
        assert_eq!(head.ssekms_key_id(), Some(key.as_str()), "{key_name}");
    }
}

/// A writer that dies between its commit and its `terraform.tfstate` copy leaves a copy that
/// lags; readers and writers still find the newest version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_or_missing_copy_never_hides_the_newest_version() {
    use state_backends::{NewState, PutMode, StateStore, WorkspaceId, tfstate::empty_state};
    let bucket = aws::bucket().await;
    let config = S3Config {
        bucket: bucket.clone(),
        prefix: String::new(),
        lease: LeaseMode::LockObject,
        kms_key_id: None,
    };
    let store = S3Store::new(aws::s3().await, None, config).unwrap();
    let ws: WorkspaceId = "acme/lag".parse().unwrap();
    let state = |serial| NewState::parse(empty_state("lag", serial)).unwrap();
    store
        .put(&ws, state(1), PutMode::Create, None)
        .await
        .unwrap();
    let first_copy = aws::s3()
        .await
        .get_object()
        .bucket(&bucket)
        .key("acme/lag/terraform.tfstate")
        .send()
        .await
        .unwrap();
    let first_meta = first_copy.metadata().cloned().unwrap();
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state(2), PutMode::Update(token), None)
        .await
        .unwrap();

    // Put the first version's copy back, as if the second writer had died before copying.
    aws::s3()
        .await
        .copy_object()
        .bucket(&bucket)
        .copy_source(format!("{bucket}/acme/lag/versions/0000000001.tfstate"))
        .key("acme/lag/terraform.tfstate")
        .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
        .set_metadata(Some(first_meta))
        .send()
        .await
        .unwrap();
    let current = store.current(&ws).await.unwrap().unwrap();
    assert_eq!(current.token.0, "2");
    assert_eq!(current.version.serial, 2);
    // A writer that read version 1 from the stale copy still cannot overwrite version 2.
    let stale = store
        .put(
            &ws,
            state(3),
            PutMode::Update(state_backends::VersionToken("1".into())),
            None,
        )
        .await;
    assert!(
        matches!(stale, Err(state_backends::StoreError::Conflict { .. })),
        "{stale:?}"
    );

    // No copy at all: the versions themselves say what is current.
    aws::s3()
        .await
        .delete_object()
        .bucket(&bucket)
        .key("acme/lag/terraform.tfstate")
        .send()
        .await
        .unwrap();
    assert_eq!(store.current(&ws).await.unwrap().unwrap().token.0, "2");
}
