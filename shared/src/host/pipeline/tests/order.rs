//! Runs in order (`sequence`): a request that comes back after a later one ran never runs.

use super::*;
use crate::run::records::{SEQUENCE_FILE, Started, WORKSPACE_RECORDS};

fn with_sequence(id: &str, sequence: Value) -> Vec<u8> {
    let mut body: Value = serde_json::from_slice(&message(id, "10m")).unwrap();
    body["job"]["sequence"] = sequence;
    body.to_string().into_bytes()
}

async fn started(fake: &Fake) -> Option<Started> {
    fake.store
        .artifact(&ws(), WORKSPACE_RECORDS, SEQUENCE_FILE)
        .await
        .unwrap()
        .map(|b| Started::parse(&b).unwrap())
}

fn ran(fate: Fate) -> Value {
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    record
}

/// The reordering a busy workspace causes: A finds it held and is queued again; B (a later
/// request) gets it first and runs; A's copy comes back and is superseded, naming B.
#[tokio::test]
async fn a_request_that_comes_back_after_a_later_one_ran_is_superseded() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, false);
    hold_lease(&fake.store, "another-job").await;
    let a = with_sequence("job-a", json!(1));
    let fate = handle(&fake, delivery(&a, None)).await;
    assert!(matches!(fate, Fate::Requeued { .. }), "{fate:?}");
    fake.store.break_lease(&ws(), None).await.unwrap();

    let b = ran(handle(&fake, delivery(&with_sequence("job-b", json!(2)), None)).await);
    assert_eq!(b["status"], "succeeded", "{b}");
    assert_eq!(b["sequence"], 2);
    let recorded = started(&fake).await.expect("B's turn is recorded");
    assert_eq!((recorded.job_id.as_str(), recorded.sequence), ("job-b", 2));

    let (copy, _) = fake.requeued()[0].clone();
    let a_again = ran(handle(&fake, delivery(copy.to_string().as_bytes(), None)).await);
    assert_eq!(a_again["status"], "superseded", "{a_again}");
    assert_eq!(a_again["job_id"], "job-a");
    assert_eq!(
        a_again["superseded_by"],
        json!({ "job_id": "job-b", "sequence": 2 })
    );
    assert_eq!(a_again["error"]["category"], "superseded");
    assert!(
        a_again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("job job-b (sequence 2) started"),
        "{a_again}"
    );
    assert_eq!(a_again["steps"], json!([]), "nothing of A ran");
    assert_eq!(fake.reported().last(), Some(&a_again), "reported");
    assert!(fake.store.lease(&ws()).await.unwrap().is_none(), "released");
    // Stored as A's final result: A delivered once more gets the same answer, and B's turn
    // stays the recorded one.
    let stored = fake
        .store
        .artifact(&ws(), "job-a", RESULT_FILE)
        .await
        .unwrap()
        .expect("A's result is stored");
    let stored: Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(stored["status"], "superseded");
    let record = fake
        .store
        .artifact(&ws(), "job-a", crate::run::records::JOB_FILE)
        .await
        .unwrap()
        .expect("A's job record");
    let record = String::from_utf8(record.to_vec()).unwrap();
    assert!(
        !record.contains("hunter2"),
        "a secret in job.json: {record}"
    );
    let twice = ran(handle(&fake, delivery(&a, None)).await);
    assert_eq!(twice, a_again, "the stored result, as it was");
    assert_eq!(started(&fake).await.unwrap().job_id, "job-b");
}

/// Equal is not later: another job with the same sequence never runs after it.
#[tokio::test]
async fn a_job_with_the_same_sequence_as_one_that_started_is_superseded() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, false);
    let first = ran(handle(&fake, delivery(&with_sequence("first", json!(5)), None)).await);
    assert_eq!(first["status"], "succeeded");
    let second = ran(handle(&fake, delivery(&with_sequence("second", json!(5)), None)).await);
    assert_eq!(second["status"], "superseded", "{second}");
    let third = ran(handle(&fake, delivery(&with_sequence("third", json!(6)), None)).await);
    assert_eq!(third["status"], "succeeded", "{third}");
    assert_eq!(started(&fake).await.unwrap().sequence, 6);
}

/// A job whose run never finished (its runner was killed after it took its turn) is not
/// superseded by its own turn when it is delivered again; a job without a sequence runs as
/// before and leaves the recorded turn alone.
#[tokio::test]
async fn a_job_delivered_again_keeps_its_turn_and_a_job_without_a_sequence_runs() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, false);
    let body = with_sequence("j1", json!(3));
    let first = ran(handle(&fake, delivery(&body, None)).await);
    assert_eq!(first["status"], "succeeded");
    // As if its runner had died before writing its result.
    fake.store
        .delete_artifact(&ws(), "j1", RESULT_FILE)
        .await
        .unwrap();
    let again = ran(handle(&fake, delivery(&body, None)).await);
    assert_eq!(again["status"], "succeeded", "{again}");

    let unordered = ran(handle(&fake, delivery(&message("j0", "10m"), None)).await);
    assert_eq!(unordered["status"], "succeeded", "{unordered}");
    assert!(unordered.get("sequence").is_none());
    assert_eq!(started(&fake).await.unwrap().job_id, "j1");
}

#[tokio::test]
async fn a_sequence_that_is_not_a_positive_integer_is_rejected_and_nothing_runs() {
    for bad in [json!(0), json!(-1), json!(1.5), json!("7"), json!(null)] {
        let fake = Fake::new();
        let fate = handle(&fake, delivery(&with_sequence("j1", bad.clone()), None)).await;
        let Fate::Rejected(record) = fate else {
            panic!("{bad}: {fate:?}")
        };
        let error = &record["errors"][0];
        assert_eq!(error["field"], "sequence", "{bad}: {record}");
        assert!(
            error["problem"]
                .as_str()
                .unwrap()
                .starts_with("must be a positive integer"),
            "{record}"
        );
        assert!(
            error["fix"]
                .as_str()
                .unwrap()
                .contains("leave sequence out")
        );
        assert!(fake.store.lease(&ws()).await.unwrap().is_none());
        assert!(started(&fake).await.is_none());
    }
}
