//! The broker restarted under a running worker (a test binary of its own: the restart would cut
//! every other test's connection to the shared node).

use std::time::Duration;

use state_backends::{StateStore as _, WorkspaceId};
use tests::Sandbox;
use tests::amqp::{self, Names, Worker};

/// The broker's application stops and starts while a job applies: the worker connects again
/// with backoff, the job's message (never acknowledged) comes back, and its stored result is
/// reported; nothing is lost, nothing runs twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_mid_job_loses_nothing_and_the_worker_reconnects() {
    let mut sb = Sandbox::new();
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "3000".into()));
    let names = Names::new("restart").await;
    let (w, said) = Worker::heard(&sb, &names, &[]);
    names.ready().await;
    names
        .publish(&amqp::message("r1", "restarted", "restarted"))
        .await;
    let ws: WorkspaceId = "acme/restarted".parse().unwrap();
    let store = sb.fs_store();
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while store.lease(&ws).await.unwrap().is_none() {
        assert!(std::time::Instant::now() < give_up, "the job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    amqp::ctl(&["stop_app"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    amqp::ctl(&["start_app"]);

    // The queues are durable and the job message persistent: it is still there, and so is the
    // platform's results queue with its binding.
    let names = names.reconnect().await;
    let (result, _) = names.result_of("r1", Duration::from_secs(180)).await;
    assert_eq!(result["status"], "succeeded", "{result:#}");
    assert_eq!(sb.versions("acme/restarted").await.len(), 1);
    drop(w);
    let said = said.join().unwrap();
    assert!(said.contains("connecting again in"), "{said}");
}
