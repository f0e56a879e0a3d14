//! The broker restarted under a running worker (a test binary of its own: the restart would cut
//! every other test's connection to the shared node).

use std::time::Duration;

use state_backends::{StateStore as _, WorkspaceId};
use tests::Sandbox;
use tests::amqp::{self, Names, Worker};

/// The broker restarts while a job applies, first its application, then the whole node (the
/// Erlang VM stopped and started again from its data folder): each time the worker connects
/// again with backoff, the job's message (never acknowledged) comes back, and its stored result
/// is reported; nothing is lost, nothing runs twice at once. One test, so that the two restarts
/// never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_mid_job_loses_nothing_and_the_worker_reconnects() {
    let mut sb = Sandbox::new();
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "3000".into()));
    let mut names = Names::new("restart").await;
    let (w, said) = Worker::heard(&sb, &names, &[]);
    names.ready().await;
    let store = sb.fs_store();
    let mut node = None;
    for (id, workspace, whole_node) in [("r1", "restarted", false), ("r2", "restarted-node", true)]
    {
        names
            .publish(&amqp::message(id, workspace, workspace))
            .await;
        let ws: WorkspaceId = format!("acme/{workspace}").parse().unwrap();
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while store.lease(&ws).await.unwrap().is_none() {
            assert!(std::time::Instant::now() < give_up, "{id} never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if whole_node {
            amqp::ctl(&["stop"]);
            tokio::time::sleep(Duration::from_secs(1)).await;
            node = Some(amqp::start_node().await);
        } else {
            amqp::ctl(&["stop_app"]);
            tokio::time::sleep(Duration::from_secs(2)).await;
            amqp::ctl(&["start_app"]);
        }

        // The queues are durable and the job message persistent: it is still there, and so is
        // the platform's results queue with its binding.
        names = names.reconnect().await;
        let (result, _) = names.result_of(id, Duration::from_secs(180)).await;
        assert_eq!(result["status"], "succeeded", "{id}: {result:#}");
        assert_eq!(
            store.versions(&ws).await.unwrap().len(),
            1,
            "{id}: one run, one version"
        );
        names.drained(Duration::from_secs(60)).await;
    }
    drop(w);
    let said = said.join().unwrap();
    assert_eq!(
        said.matches("serving queue").count(),
        3,
        "connected at start and after each restart: {said}"
    );
    assert!(said.contains("connecting again in"), "{said}");
    drop(node);
}
