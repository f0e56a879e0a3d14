//! A runner whose store stops confirming its lease fences itself: real terraform in the middle
//! of a job, renewals that fail or hang; terraform is interrupted before the lease expires,
//! nothing more is written, no clean-up starts, and the workspace can be taken again.

use std::sync::Arc;
use std::time::Duration;

use shared::run::runner::{RunOutcome, Runner};
use state_backends::memory::{MemoryStore, Renewals};
use state_backends::{LeaseRequest, StateStore, WorkspaceId};
use tests::{Sandbox, demo_job};
use tokio_util::sync::CancellationToken;

async fn fenced_mid_job(mode: Renewals) {
    let mut sb = Sandbox::new();
    // Each create takes 3 s: the job is still applying when its lease can no longer be renewed.
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "3000".into()));
    let store = Arc::new(MemoryStore::new());
    let mut config = sb.runner_config();
    config.lease_ttl = Duration::from_secs(3);
    let runner = Runner::new(store.clone(), config);
    // A failed apply would destroy what it created: it must not, without a live lease.
    let job = demo_job("f1", "fenced", "apply", "cl1", 1) + "on_failure: destroy-created\n";
    let job = sb.validated(&job);
    let ws: WorkspaceId = "acme/fenced".parse().unwrap();

    let breaker = {
        let (store, ws) = (store.clone(), ws.clone());
        tokio::spawn(async move {
            while store.lease(&ws).await.unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            store.set_renewals(mode);
        })
    };
    let outcome = runner.run(&job, CancellationToken::new()).await;
    breaker.await.unwrap();
    let result = match outcome {
        Ok(RunOutcome::Finished(result)) => result,
        other => panic!("{other:?}"),
    };
    assert_eq!(result.status.as_str(), "failed", "{result:?}");
    let error = result.error.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(error.category).unwrap(),
        "state-conflict",
        "{error:?}"
    );
    assert!(
        error.message.contains("could not be confirmed"),
        "{error:?}"
    );
    // Nothing was written once the lease could not be confirmed, and no clean-up ran.
    assert!(store.versions(&ws).await.unwrap().is_empty(), "no version");
    assert!(result.state_versions.is_empty());
    assert!(result.cleanup.is_none(), "{:?}", result.cleanup);
    // What terraform could not save is kept, not lost.
    if let Some(unsaved) = &result.unsaved_state {
        assert_eq!(unsaved.pushed_as, None, "{unsaved:?}");
    }

    // The workspace is not wedged: another job takes it once the lease is gone.
    store.set_renewals(Renewals::Answer);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let next = store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "f2".into(),
                ttl: Duration::from_secs(30),
                info: serde_json::Value::Null,
            },
        )
        .await
        .expect("the workspace can be taken again");
    assert_eq!(next.owner, "f2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_renewals_fail_mid_job_stops_terraform_and_writes_nothing_more() {
    fenced_mid_job(Renewals::Fail).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_renewals_hang_mid_job_stops_terraform_and_writes_nothing_more() {
    fenced_mid_job(Renewals::Hang).await;
}

/// A bucket and a lease table in the moto at `endpoint`.
async fn bucket_and_table(endpoint: &str) -> (aws_sdk_s3::Client, aws_sdk_dynamodb::Client) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let config = tests::aws::sdk_config_at(endpoint).await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&config)
            .force_path_style(true)
            .build(),
    );
    s3.create_bucket().bucket("fenced").send().await.unwrap();
    let dynamodb = aws_sdk_dynamodb::Client::new(&config);
    dynamodb
        .create_table()
        .table_name("leases")
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    (s3, dynamodb)
}

/// The AWS function's task, its store an emulator that stops answering (SIGSTOP: every call
/// hangs) in the middle of the job's apply: the runner fences itself before its lease expires,
/// gives up on the calls in time instead of hanging, and the workspace can be taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_whose_store_stops_answering_mid_job_fences_itself_and_gives_up_in_time() {
    use state_backends::s3::{LeaseMode, S3Config, S3Store};
    let moto = tests::aws::PrivateMoto::start().await;
    let (s3, dynamodb) = bucket_and_table(&moto.endpoint).await;
    let store = S3Store::new(
        s3,
        Some(dynamodb),
        S3Config {
            bucket: "fenced".into(),
            prefix: "states".into(),
            lease: LeaseMode::DynamoDb {
                table: "leases".into(),
            },
            kms_key_id: None,
        },
    )
    .unwrap();
    let ws: WorkspaceId = "acme/stopped".parse().unwrap();
    let sb = Sandbox::new();
    let target = serde_json::json!({
        "role_arn": "arn:aws:iam::123456789012:role/terrace", "external_id": "ext-1",
        "bucket": "fenced", "prefix": "states", "lease_table": "leases", "region": "us-east-1",
    });
    let job = serde_json::json!({ "job": {
        "id": "s-1", "tenant": "acme", "workspace": "stopped", "operation": "apply",
        "template": { "name": "fleet", "version": "1.0.0" },
        "variables": { "networks": ["a", "b"] }, "timeout": "5m",
    }});
    let ttl = Duration::from_secs(6);
    let child = std::process::Command::new(tests::workspace_bin("terrace-aws"))
        .arg("task")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_ENDPOINT_URL", &moto.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("TERRACE_S3_FORCE_PATH_STYLE", "1")
        .env(
            "TERRACE_TENANTS",
            serde_json::json!({ "acme": target }).to_string(),
        )
        .env("TERRACE_JOB", job.to_string())
        .env("TERRACE_TEMPLATES", &sb.templates)
        .env("TERRACE_TERRAFORM", tests::terraform())
        .env("TERRACE_TF_CLI_CONFIG", &sb.cli_config)
        .env(
            "TERRACE_PASS_ENV",
            "TESTCLOUD_ROOT,TESTCLOUD_CREATE_DELAY_MS",
        )
        .env("TESTCLOUD_ROOT", &sb.cloud)
        // Each create takes 4 s: the store stops answering while terraform applies.
        .env("TESTCLOUD_CREATE_DELAY_MS", "4000")
        .env("TERRACE_LEASE_TTL", ttl.as_secs().to_string())
        .env("TERRACE_GRACE", "3")
        .env("TERRACE_CALL_TIMEOUT", "2")
        .env("TERRACE_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("terrace-aws starts");
    let held = loop {
        if let Some(lease) = store.lease(&ws).await.unwrap() {
            break lease;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    moto.freeze();
    let frozen = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .expect("the task gives up rather than hanging on a store that does not answer")
    .unwrap()
    .unwrap();
    let took = frozen.elapsed();
    moto.resume();
    let log = String::from_utf8_lossy(&out.stderr);
    // It could neither record an end nor put the job back: a retry of the task may.
    assert_eq!(out.status.code(), Some(75), "{log}");
    assert!(
        log.contains("the lease could not be confirmed before it would expire"),
        "fenced itself, and says so in the host's log: {log}"
    );
    assert!(took < Duration::from_secs(100), "gave up after {took:?}");
    // Nothing was written once the store stopped (no version at all: the apply never ended),
    // and the workspace can be taken again within a lease's time (the calls the frozen store
    // queued run when it resumes: a late renewal finds the lease expired, a late release frees
    // it).
    assert!(store.versions(&ws).await.unwrap().is_empty());
    let request = LeaseRequest {
        owner: "next".into(),
        ttl: Duration::from_secs(30),
        info: serde_json::Value::Null,
    };
    let deadline = std::time::Instant::now() + ttl + Duration::from_secs(10);
    let next = loop {
        match store.acquire_lease(&ws, &request).await {
            Ok(lease) => break lease,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(
                    matches!(e, state_backends::StoreError::LeaseHeld { .. }),
                    "{e}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the workspace was never free again: {e}"),
        }
    };
    assert!(next.fence > held.fence);
}
