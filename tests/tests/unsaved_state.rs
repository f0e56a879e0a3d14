//! Terraform finishes an apply but cannot save its state (the customer's bucket is briefly
//! unreachable): it writes `errored.tfstate`. The runner keeps that file as a run artifact and
//! pushes it as a new version through the same checks as any write. Real terraform and the
//! test cloud; the store underneath is the real fs store, with state writes failing on demand.

use std::sync::Arc;

use shared::runner::RunOutcome;
use state_backends::{StateStore, WorkspaceId};
use tests::failing::FailingPuts;
use tests::{Sandbox, demo_job};
use tokio_util::sync::CancellationToken;

async fn run(sb: &Sandbox, store: Arc<FailingPuts>, id: &str) -> shared::result::JobResult {
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
        error.hint.contains("terrace state push acme/unsaved"),
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
