//! Cancel (`runs/<job>/cancel.json`): a queued job never runs, a running one is stopped, a
//! finished one is left as it is.

use std::time::Instant;

use super::*;
use crate::run::records::request_cancel;

#[tokio::test]
async fn a_job_cancelled_before_it_starts_never_runs() {
    // No terraform at all: a job that reached it would fail, not end `cancelled`.
    let fake = Fake::new();
    request_cancel(&*fake.store, &ws(), "j1", "a test")
        .await
        .unwrap();
    let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_eq!(record["error"]["category"], "cancelled");
    assert_eq!(record["error"]["step"], "start");
    let said = record["error"]["message"].as_str().unwrap();
    assert!(
        said.contains("before it started") && said.contains("a test"),
        "{record}"
    );
    assert_eq!(record["steps"], json!([]), "nothing ran");
    assert_eq!(fake.reported(), vec![record.clone()]);
    assert!(fake.store.lease(&ws()).await.unwrap().is_none());
    assert!(fake.store.versions(&ws()).await.unwrap().is_empty());
    // Delivered again: the same answer, from the stored result.
    let again = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Ran(again) = again else {
        panic!("{again:?}")
    };
    assert_eq!(again, record);
}

/// A running job looks for a request every 2 s: terraform (here a plan that would take a
/// minute) is interrupted, and the result is `cancelled` at the step it was in.
#[tokio::test]
async fn a_running_job_is_stopped_soon_after_a_cancel_is_asked() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, true);
    let fake = Arc::new(fake);
    let running = tokio::spawn({
        let fake = fake.clone();
        async move { handle(&*fake, delivery(&message("j1", "10m"), None)).await }
    });
    // Until the job holds the workspace and has started terraform.
    while fake.store.lease(&ws()).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    request_cancel(&*fake.store, &ws(), "j1", "a test")
        .await
        .unwrap();
    let fate = running.await.unwrap();
    let took = asked.elapsed();
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_eq!(record["error"]["category"], "cancelled");
    assert_eq!(record["error"]["step"], "plan", "{record}");
    // Far sooner than the plan's minute: the request was seen and acted on.
    assert!(took < Duration::from_secs(30), "stopped after {took:?}");
    assert!(fake.store.lease(&ws()).await.unwrap().is_none(), "released");
}

/// A request for a job that already finished changes nothing: it is delivered again and gets
/// its result as before.
#[tokio::test]
async fn a_cancel_after_the_end_changes_nothing() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, false);
    let Fate::Ran(first) = handle(&fake, delivery(&message("j1", "10m"), None)).await else {
        panic!("did not run")
    };
    assert_eq!(first["status"], "succeeded");
    request_cancel(&*fake.store, &ws(), "j1", "a test")
        .await
        .unwrap();
    let Fate::Ran(again) = handle(&fake, delivery(&message("j1", "10m"), None)).await else {
        panic!("not the earlier result")
    };
    assert_eq!(again, first);
}
