//! A job longer than the broker's consumer timeout (a test binary of its own: the timeout is
//! the node's, and would cut other tests' channels on the shared node).

use std::time::Duration;

use serde_json::Value;
use state_backends::{StateStore as _, WorkspaceId};
use tests::Sandbox;
use tests::amqp::{self, Names, Worker};

/// The node's consumer timeout and the period it is checked at, for the test's length; put back
/// to RabbitMQ's defaults (30 min, checked each minute) however the test ends.
struct ShortConsumerTimeout;

impl ShortConsumerTimeout {
    fn set(timeout: Duration, tick: Duration) -> Self {
        let set = |key: &str, ms: u128| {
            amqp::ctl(&[
                "eval",
                &format!("application:set_env(rabbit, {key}, {ms})."),
            ]);
        };
        set("channel_tick_interval", tick.as_millis());
        set("consumer_timeout", timeout.as_millis());
        Self
    }
}

impl Drop for ShortConsumerTimeout {
    fn drop(&mut self) {
        amqp::ctl(&[
            "eval",
            "application:set_env(rabbit, consumer_timeout, 1800000).",
        ]);
        amqp::ctl(&[
            "eval",
            "application:set_env(rabbit, channel_tick_interval, 60000).",
        ]);
    }
}

/// A job that runs past the broker's consumer timeout: the broker closes the worker's channel
/// and delivers the unacknowledged message again, to the other worker or the same one, which
/// finds the workspace leased by the running job and puts the message on the delay queue;
/// once the run's result is stored, the next delivery reports it. The job ran once, nothing ran
/// beside it, every queue ends empty and every record published for it is the run's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_the_consumer_timeout_runs_once_and_is_reported() {
    let _timeout = ShortConsumerTimeout::set(Duration::from_secs(2), Duration::from_millis(500));
    let mut sb = Sandbox::new();
    // Two creates of 5 s each: the job outlives the 2 s timeout several times over.
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "5000".into()));
    let names = Names::new("timeout").await;
    let (first, first_said) = Worker::heard(&sb, &names, &[]);
    let (second, second_said) = Worker::heard(&sb, &names, &[]);
    names.ready().await;
    names.collect().await;
    names.publish(&amqp::message("t1", "long", "long")).await;
    let (result, records) = names.result_of("t1", Duration::from_secs(180)).await;
    assert_eq!(result["status"], "succeeded", "{result:#}");

    // Every queue drains: the redelivery is answered from the stored result and acknowledged.
    names.drained(Duration::from_secs(60)).await;
    assert_eq!(names.depth(&format!("{}.dead", names.jobs)).await, 0);

    // Once: one state version, each resource created once, one lease fence ever taken, and
    // every record published for the job is that run's result.
    let ws: WorkspaceId = "acme/long".parse().unwrap();
    assert_eq!(sb.fs_store().versions(&ws).await.unwrap().len(), 1);
    assert_eq!(sb.cloud_names(), ["long", "long-net"]);
    let stored: Value = serde_json::from_slice(
        &sb.fs_store()
            .artifact(&ws, "t1", "result.json")
            .await
            .unwrap()
            .expect("the stored result"),
    )
    .unwrap();
    // What was published after the first record came (the redelivery's report), too.
    let more = names.depth(&names.collected).await as usize;
    let mut all = records.clone();
    all.extend(
        names
            .results_until(Duration::from_secs(10), |got| got.len() >= more)
            .await,
    );
    let published: Vec<&Value> = all.iter().filter(|r| r["job_id"] == "t1").collect();
    // The run's own report, and the redelivery's of the stored result.
    assert!(published.len() >= 2, "{published:#?}");
    for r in published {
        assert_eq!(r["status"], "succeeded", "{r:#}");
        assert_eq!(r["started_at"], stored["started_at"], "{r:#}");
        assert_eq!(r["fence"], stored["fence"], "{r:#}");
    }
    first.stop();
    second.stop();
    let said = format!(
        "{}{}",
        first_said.join().unwrap(),
        second_said.join().unwrap()
    );
    // The timeout did close a channel (else this test proves nothing), and a worker connected
    // again.
    assert!(said.contains("timed out"), "{said}");
    assert!(said.contains("connecting again in"), "{said}");
}
