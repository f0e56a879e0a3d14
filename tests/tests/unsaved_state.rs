//! Terraform finishes an apply but cannot save its state (the customer's bucket is briefly
//! unreachable): it writes `errored.tfstate`. The runner keeps that file as a run artifact and
//! pushes it as a new version through the same checks as any write. Real terraform and the
//! test cloud; the store underneath is the real fs store, with state writes failing on demand.

use std::sync::Arc;

use shared::run::runner::RunOutcome;
use state_backends::{StateStore, WorkspaceId};
use tests::failing::FailingPuts;
use tests::{Sandbox, demo_job};
use tokio_util::sync::CancellationToken;

async fn run(sb: &Sandbox, store: Arc<dyn StateStore>, id: &str) -> shared::run::result::JobResult {
    let runner = sb.runner(store);
    let job = sb.validated(&demo_job(id, "unsaved", "apply", "cl1", 1));
    match runner.run(&job, CancellationToken::new()).await.unwrap() {
        RunOutcome::Finished(result) => *result,
        other => panic!("the job did not run: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_terraform_could_not_save_is_pushed_and_the_apply_succeeds() {
    let sb = Sandbox::new();
    let ws: WorkspaceId = "acme/unsaved".parse().unwrap();
    // Terraform's http backend tries a write 3 times (1 + retry_max 2): all three fail.
    let store = Arc::new(FailingPuts::new(Arc::new(sb.fs_store()), 3));
    let result = run(&sb, store.clone(), "u1").await;
    assert_eq!(store.failed(), 3, "terraform's own writes all failed");
    assert_eq!(result.status.as_str(), "succeeded", "{result:?}");

    let unsaved = result
        .unsaved_state
        .as_ref()
        .expect("unsaved state reported");
    assert_eq!(unsaved.artifact, "runs/u1/errored.tfstate");
    assert!(unsaved.error.is_none(), "{unsaved:?}");
    let pushed = unsaved.pushed_as.expect("pushed as a version");
    assert_eq!(result.state_versions, [pushed]);

    // The pushed version is terraform's own file, byte for byte, and knows both resources.
    let fs = sb.fs_store();
    let kept = fs
        .artifact(&ws, "u1", "errored.tfstate")
        .await
        .unwrap()
        .expect("errored.tfstate kept");
    assert_eq!(fs.version(&ws, pushed).await.unwrap(), kept);
    let state = sb.current_state("acme/unsaved");
    assert_eq!(state["resources"].as_array().unwrap().len(), 2, "{state}");
    assert_eq!(sb.cloud_names(), ["cl1", "cl1-net"]);
    // The outputs were read from the saved state.
    assert!(result.outputs.contains_key("cluster_id"), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_that_cannot_be_pushed_is_kept_and_the_result_says_where() {
    let sb = Sandbox::new();
    let ws: WorkspaceId = "acme/unsaved".parse().unwrap();
    let store = Arc::new(FailingPuts::new(Arc::new(sb.fs_store()), u32::MAX));
    let result = run(&sb, store.clone(), "u2").await;
    assert_eq!(result.status.as_str(), "failed");
    let error = result.error.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(error.category).unwrap(),
        "state-conflict",
        "{error:?}"
    );
    let unsaved = result
        .unsaved_state
        .as_ref()
        .expect("unsaved state reported");
    assert_eq!(unsaved.pushed_as, None);
    assert!(
        unsaved.error.as_deref().unwrap().contains("cannot push it"),
        "{unsaved:?}"
    );
    // Nothing terraform knew is lost: the artifact has both resources the cloud now has.
    let kept = sb
        .fs_store()
        .artifact(&ws, "u2", "errored.tfstate")
        .await
        .unwrap()
        .expect("errored.tfstate kept");
    let state: serde_json::Value = serde_json::from_slice(&kept).unwrap();
    assert_eq!(state["resources"].as_array().unwrap().len(), 2, "{state}");
    assert_eq!(sb.cloud_names(), ["cl1", "cl1-net"]);
    assert!(sb.versions("acme/unsaved").await.is_empty());
    assert!(
        error
            .hint
            .contains("terrace state push acme/unsaved --from-run u2"),
        "{error:?}"
    );
    assert!(
        sb.fs_store().lease(&ws).await.unwrap().is_none(),
        "the lease was released"
    );

    // Once the store is reachable, the kept state is pushed as the workspace's first version.
    let file = sb.job("errored.tfstate", std::str::from_utf8(&kept).unwrap());
    let push = sb.run(&["state", "push", "acme/unsaved", file.to_str().unwrap()]);
    push.expect_code(0);
    assert!(
        push.stdout().contains("pushed as version 1"),
        "{}",
        push.stdout()
    );
    assert_eq!(sb.fs_store().version(&ws, 1).await.unwrap(), kept);
    // A second push of the same file changes nothing; an older lineage is refused.
    sb.run(&["state", "push", "acme/unsaved", file.to_str().unwrap()])
        .expect_code(0);
    let other = sb.job(
        "other.tfstate",
        r#"{"version":4,"terraform_version":"0.15.0","serial":9,"lineage":"another-workspace","outputs":{},"resources":[]}"#,
    );
    let refused = sb.run(&["state", "push", "acme/unsaved", other.to_str().unwrap()]);
    refused.expect_code(1);
    assert!(refused.stderr().contains("lineage"), "{}", refused.stderr());
    assert_eq!(sb.versions("acme/unsaved").await.len(), 1);
}

/// With states sealed, the kept `errored.tfstate` is sealed too, and `state push --from-run`
/// opens it with the runner's key to push it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_state_that_cannot_be_pushed_is_kept_sealed_and_pushed_from_the_run() {
    use base64::Engine as _;
    use state_backends::sealed::{KeyFile, Keyring, SealedStore, is_sealed};
    let sb = Sandbox::new();
    let ws: WorkspaceId = "acme/unsaved".parse().unwrap();
    let key: [u8; 32] = rand::random();
    let key_file = sb.job(
        "state.key",
        &base64::engine::general_purpose::STANDARD.encode(key),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let keys = Keyring::new(Arc::new(KeyFile::from_bytes(&key)));
    // The bucket fails the state writes; what reaches it is sealed.
    let sealed = SealedStore::wrap(Arc::new(sb.fs_store()), Some(keys));
    let result = run(&sb, Arc::new(FailingPuts::new(sealed, u32::MAX)), "u3").await;
    assert_eq!(result.status.as_str(), "failed");
    let hint = &result.error.as_ref().unwrap().hint;
    assert!(
        hint.contains("terrace state push acme/unsaved --from-run u3"),
        "{hint}"
    );
    let raw = sb
        .fs_store()
        .artifact(&ws, "u3", "errored.tfstate")
        .await
        .unwrap()
        .expect("kept");
    assert!(is_sealed(&raw), "kept sealed");
    assert!(!String::from_utf8_lossy(&raw).contains("testcloud_cluster"));

    // Without the key, the push is refused; with it, the kept state becomes version 1, sealed.
    let refused = sb.run(&["state", "push", "acme/unsaved", "--from-run", "u3"]);
    assert_ne!(refused.code(), 0);
    assert!(
        refused.stderr().contains("has no key"),
        "{}",
        refused.stderr()
    );
    let file = sb.job("sealed.tfstate", &String::from_utf8_lossy(&raw));
    let sealed_file = sb.run(&["state", "push", "acme/unsaved", file.to_str().unwrap()]);
    sealed_file.expect_code(1);
    assert!(
        sealed_file.stderr().contains("--from-run"),
        "{}",
        sealed_file.stderr()
    );
    let mut push = sb.terrace();
    push.args(["state", "push", "acme/unsaved", "--from-run", "u3"])
        .env("TERRACE_STATE_KEY_FILE", &key_file);
    let out = push.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_sealed(&sb.fs_store().version(&ws, 1).await.unwrap()));
    let missing = sb.run(&["state", "push", "acme/unsaved", "--from-run", "nope"]);
    missing.expect_code(66);
}

/// The job's record is written while terraform initialises and plans (it is off the job's
/// critical path), but nothing is applied before it is: a record that cannot be written stops
/// the job before any change, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_record_cannot_be_written_changes_nothing() {
    let sb = Sandbox::new();
    let ws: WorkspaceId = "acme/unsaved".parse().unwrap();
    let store = Arc::new(FailingPuts::records(Arc::new(sb.fs_store()), "job.json"));
    let result = run(&sb, store.clone(), "u4").await;
    assert!(store.failed() >= 1, "the record's write was tried");
    assert_eq!(result.status.as_str(), "failed", "{result:?}");
    let error = result.error.as_ref().unwrap();
    assert!(
        error.message.contains("cannot record the job in the store"),
        "{error:?}"
    );
    assert!(error.retryable, "{error:?}");
    let steps: Vec<&str> = result.steps.iter().map(|s| s.step.as_str()).collect();
    assert!(!steps.contains(&"apply"), "nothing was applied: {steps:?}");
    assert!(
        result.cleanup.is_none(),
        "nothing to clean up: {:?}",
        result.cleanup
    );
    assert!(sb.cloud_names().is_empty(), "the cloud is untouched");
    let fs = sb.fs_store();
    assert!(
        fs.versions(&ws).await.unwrap().is_empty(),
        "no state version"
    );
    assert!(
        fs.lease(&ws).await.unwrap().is_none(),
        "the lease is released"
    );
}
