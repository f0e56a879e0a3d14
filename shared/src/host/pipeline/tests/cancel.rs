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

/// A fake whose registry knows `acme` only (its bucket `b-acme`).
fn registered() -> Fake {
    let mut fake = Fake::new();
    fake.tenants = Some(
        Tenants::parse(r#"{"acme": {"bucket": "b-acme"}}"#, "test", |_: &Bucket| {
            Vec::new()
        })
        .unwrap(),
    );
    fake
}

fn cancel_message(job: &str, tenant: &str, workspace: &str) -> Vec<u8> {
    json!({ "cancel": { "job": job, "tenant": tenant, "workspace": workspace } })
        .to_string()
        .into_bytes()
}

/// A cancel on the queue, for the tenant's own job: recorded where the job's runner looks, so
/// the job, delivered afterwards, never runs.
#[tokio::test]
async fn a_cancel_message_from_the_jobs_tenant_stops_the_queued_job() {
    let fake = registered();
    let fate = handle(&fake, delivery(&cancel_message("j1", "acme", "demo"), None)).await;
    let Fate::Ran(answer) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(answer["status"], "cancel-requested", "{answer}");
    assert_eq!(answer["cancel"]["job_id"], "j1");
    assert_eq!(fake.reported(), vec![answer]);
    assert_eq!(
        *fake.opened.lock().unwrap(),
        ["b-acme"],
        "the tenant's own store"
    );

    let mut body: Value = serde_json::from_slice(&message("j1", "10m")).unwrap();
    body.as_object_mut().unwrap().remove("target");
    let Fate::Ran(record) = handle(&fake, delivery(body.to_string().as_bytes(), None)).await else {
        panic!("the job was not answered")
    };
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_eq!(record["error"]["step"], "start");
    assert!(
        record["error"]["message"]
            .as_str()
            .unwrap()
            .contains("message m1"),
        "{record}"
    );
}

/// A cancel for a tenant the registry does not know, or naming another tenant's bucket, is
/// refused and writes nothing; a cancel that is not one names what is wrong.
#[tokio::test]
async fn a_cancel_message_is_checked_as_a_job_is() {
    let fake = registered();
    let fate = handle(
        &fake,
        delivery(&cancel_message("j1", "mallory", "demo"), None),
    )
    .await;
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["errors"][0]["field"], "tenant", "{record}");
    let mut elsewhere: Value =
        serde_json::from_slice(&cancel_message("j1", "acme", "demo")).unwrap();
    elsewhere["target"] = json!({ "bucket": "someone-elses" });
    let fate = handle(&fake, delivery(elsewhere.to_string().as_bytes(), None)).await;
    assert!(matches!(fate, Fate::Rejected(_)), "{fate:?}");
    assert!(
        fake.opened.lock().unwrap().is_empty(),
        "no store was opened"
    );

    let missing = json!({ "cancel": { "job": "j1", "tenant": "acme" } }).to_string();
    let Fate::Rejected(record) = handle(&fake, delivery(missing.as_bytes(), None)).await else {
        panic!("not rejected")
    };
    assert_eq!(record["errors"][0]["field"], "cancel", "{record}");
    assert!(
        record["errors"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("workspace"),
        "{record}"
    );
    let bad_id = handle(
        &fake,
        delivery(&cancel_message("../x", "acme", "demo"), None),
    )
    .await;
    let Fate::Rejected(record) = bad_id else {
        panic!("{bad_id:?}")
    };
    assert_eq!(record["errors"][0]["field"], "cancel.job", "{record}");
}

/// A cancel for a job that finished changes nothing and says how it ended.
#[tokio::test]
async fn a_cancel_message_for_a_finished_job_changes_nothing() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, false);
    let Fate::Ran(first) = handle(&fake, delivery(&message("j1", "10m"), None)).await else {
        panic!("did not run")
    };
    let mut cancel: Value = serde_json::from_slice(&cancel_message("j1", "acme", "demo")).unwrap();
    cancel["target"] = json!({ "bucket": "b" });
    let Fate::Ran(answer) = handle(&fake, delivery(cancel.to_string().as_bytes(), None)).await
    else {
        panic!("not answered")
    };
    assert_eq!(answer["status"], "already-finished", "{answer}");
    assert_eq!(answer["job_status"], "succeeded");
    assert!(
        fake.store
            .artifact(&ws(), "j1", crate::run::records::CANCEL_FILE)
            .await
            .unwrap()
            .is_none(),
        "nothing written"
    );
    let Fate::Ran(again) = handle(&fake, delivery(&message("j1", "10m"), None)).await else {
        panic!("not the earlier result")
    };
    assert_eq!(again, first);
}
