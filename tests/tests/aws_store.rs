//! The S3 store passes the shared conformance suite against moto, in both lease modes.

use std::sync::Arc;

use state_backends::retention::Retention;
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
async fn an_s3_backup_restores_without_its_versions() {
    let config = S3Config {
        bucket: aws::bucket().await,
        prefix: "states".into(),
        lease: LeaseMode::LockObject,
        kms_key_id: None,
    };
    let store = S3Store::new(aws::s3().await, None, config).unwrap();
    state_backends::conformance::a_bucket_backup_restores_without_its_versions(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backup_sweep_over_200_workspaces_copies_only_the_5_that_changed() {
    let counter = aws::CallCounter::default();
    let config = S3Config {
        bucket: aws::bucket().await,
        prefix: "states".into(),
        lease: LeaseMode::LockObject,
        kms_key_id: None,
    };
    // The lock-object mode: no DynamoDB client at all, so the sweep makes no DynamoDB calls.
    let store = S3Store::new(aws::s3_counted(&counter).await, None, config).unwrap();
    tests::sweep::copies_only_what_changed(store, "S3", 200, 40, Some(&counter)).await;
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
    let made = store
        .snapshot(&ws, "2026-11-22T03", Retention::default())
        .await
        .unwrap()
        .unwrap();
    let s3 = aws::s3().await;
    let backup = format!(
        "kms/acme/secret/backups/2026-11-22T03_0000000001_{}.tfstate",
        made.backup.sha256
    );
    for key_name in [
        "kms/acme/secret/versions/0000000001.tfstate",
        "kms/acme/secret/terraform.tfstate",
        &backup,
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

/// Loses the answer to the first UpdateItem that succeeds: the item has changed, the client sees
/// a 500 and sends the same request again, as after a connection dropped on the way back.
#[derive(Clone, Debug, Default)]
struct LoseFirstUpdate {
    /// The request being sent is an UpdateItem.
    update: Arc<std::sync::atomic::AtomicBool>,
    lost: Arc<std::sync::atomic::AtomicBool>,
}

impl aws_sdk_dynamodb::config::Intercept for LoseFirstUpdate {
    fn name(&self) -> &'static str {
        "LoseFirstUpdate"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_sdk_dynamodb::config::RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let target = context.request().headers().get("x-amz-target");
        self.update.store(
            target.is_some_and(|t| t.ends_with(".UpdateItem")),
            std::sync::atomic::Ordering::SeqCst,
        );
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextMut<'_>,
        _components: &aws_sdk_dynamodb::config::RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        use std::sync::atomic::Ordering::SeqCst;
        let response = context.response_mut();
        if self.update.load(SeqCst)
            && response.status().is_success()
            && !self.lost.swap(true, SeqCst)
        {
            *response.status_mut() = 500u16.try_into()?;
        }
        Ok(())
    }
}

/// A lease taken over an expired one by a request whose answer was lost, and which the SDK sent
/// again, is recognised as this request's, and still knows whose lease it took over (so that
/// job is recorded as interrupted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamodb_lease_taken_by_a_request_whose_answer_was_lost_knows_whom_it_took_over() {
    use state_backends::{LeaseRequest, StateStore, WorkspaceId};
    let config = S3Config {
        bucket: aws::bucket().await,
        prefix: "states".into(),
        lease: LeaseMode::DynamoDb {
            table: aws::lease_table().await,
        },
        kms_key_id: None,
    };
    let plain = S3Store::new(aws::s3().await, Some(aws::dynamodb().await), config.clone()).unwrap();
    let lose = LoseFirstUpdate::default();
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&aws::sdk_config().await)
            .interceptor(lose.clone())
            .build(),
    );
    let flaky = S3Store::new(aws::s3().await, Some(dynamodb), config).unwrap();
    let ws = WorkspaceId::new("acme", "lost-answer").unwrap();
    let dead = plain
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "dead-job".into(),
                ttl: std::time::Duration::from_millis(1),
                info: serde_json::Value::Null,
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let lease = flaky
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "next-job".into(),
                ttl: std::time::Duration::from_secs(60),
                info: serde_json::json!({ "request": "r-1" }),
            },
        )
        .await
        .expect("its own lease, not held by another");
    assert!(
        lose.lost.load(std::sync::atomic::Ordering::SeqCst),
        "the first answer was lost"
    );
    assert_eq!(lease.owner, "next-job");
    assert_eq!(lease.fence, dead.fence + 1);
    let took = lease.took_over.expect("it knows whose lease it took over");
    assert_eq!((took.owner.as_str(), took.fence), ("dead-job", dead.fence));
}

/// A clean release records the newest version in the DynamoDB item (`settled`), so the next
/// taker reads the copy alone; taking the lease clears it; a taker of an expired lease, whose
/// holder died after committing a version and before copying it, still finds that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamodb_lease_carries_the_settled_version_of_a_clean_release_only() {
    use state_backends::{LeaseRequest, NewState, PutMode, StateStore, WorkspaceId};
    use time::OffsetDateTime;
    let bucket = aws::bucket().await;
    let table = aws::lease_table().await;
    let config = S3Config {
        bucket: bucket.clone(),
        prefix: "states".into(),
        lease: LeaseMode::DynamoDb {
            table: table.clone(),
        },
        kms_key_id: None,
    };
    let store = || async {
        S3Store::new(aws::s3().await, Some(aws::dynamodb().await), config.clone()).unwrap()
    };
    let ws = WorkspaceId::new("acme", "settled").unwrap();
    let state =
        |serial| NewState::parse(state_backends::tfstate::empty_state("s", serial)).unwrap();
    let request = |owner: &str, ttl_ms: u64| LeaseRequest {
        owner: owner.into(),
        ttl: std::time::Duration::from_millis(ttl_ms),
        info: serde_json::Value::Null,
    };
    let settled = || async {
        let item = aws::dynamodb()
            .await
            .get_item()
            .table_name(&table)
            .key(
                "pk",
                aws_sdk_dynamodb::types::AttributeValue::S("states/acme/settled".into()),
            )
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        item.item()
            .and_then(|i| i.get("settled"))
            .map(|v| v.as_n().unwrap().parse::<u64>().unwrap())
    };

    let first = store().await;
    let lease = first
        .acquire_lease(&ws, &request("a", 60_000))
        .await
        .unwrap();
    let fence = lease
        .fence()
        .confirmed_until(OffsetDateTime::now_utc() + std::time::Duration::from_secs(10));
    assert!(first.current(&ws).await.unwrap().is_none());
    first
        .put(&ws, state(1), PutMode::Create, Some(&fence))
        .await
        .unwrap();
    first.release_lease(&ws, &lease).await.unwrap();
    assert_eq!(settled().await, Some(1), "a clean release says version 1");

    let dying = store().await;
    let lease = dying
        .acquire_lease(&ws, &request("b", 1_000))
        .await
        .unwrap();
    assert_eq!(settled().await, None, "taking the lease clears it");
    let current = dying.current(&ws).await.unwrap().unwrap();
    assert_eq!(current.version.number, 1);
    let fence = lease
        .fence()
        .confirmed_until(OffsetDateTime::now_utc() + std::time::Duration::from_millis(500));
    dying
        .put(&ws, state(2), PutMode::Update(current.token), Some(&fence))
        .await
        .unwrap();
    dying.settle(&ws).await;
    // It died before its copy: version 1's copy is put back. Then its lease expires.
    let s3 = aws::s3().await;
    let copy_key = "states/acme/settled/terraform.tfstate";
    let first_meta = s3
        .head_object()
        .bucket(&bucket)
        .key("states/acme/settled/versions/0000000001.tfstate")
        .send()
        .await
        .unwrap()
        .metadata()
        .cloned()
        .unwrap();
    let mut meta = first_meta;
    meta.insert("terrace-number".into(), "1".into());
    s3.copy_object()
        .bucket(&bucket)
        .copy_source(format!(
            "{bucket}/states/acme/settled/versions/0000000001.tfstate"
        ))
        .key(copy_key)
        .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
        .set_metadata(Some(meta))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;

    let last = store().await;
    let lease = last
        .acquire_lease(&ws, &request("c", 60_000))
        .await
        .unwrap();
    assert!(lease.took_over.is_some(), "an expired lease, taken over");
    let current = last.current(&ws).await.unwrap().unwrap();
    assert_eq!(
        current.version.number, 2,
        "the version after the lagging copy"
    );
    last.release_lease(&ws, &lease).await.unwrap();
    assert_eq!(
        settled().await,
        None,
        "the copy lags version 2: nothing settled"
    );
}
