//! A runner whose store stops confirming its lease fences itself: real terraform in the middle
//! of a job, renewals that fail or hang; terraform is interrupted before the lease expires,
//! nothing more is written, no clean-up starts, and the workspace can be taken again.

use std::sync::Arc;
use std::time::Duration;

use shared::runner::{RunOutcome, Runner};
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
