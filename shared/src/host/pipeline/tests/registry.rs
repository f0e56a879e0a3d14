//! The tenant registry chooses the target: a message names its tenant, and a target it carries
//! must agree with the registry's.

use super::*;

/// A fake whose registry maps `acme` to bucket `b-acme` (key `k-1`) and `beta` to `b-beta`.
fn registered() -> Fake {
    let mut fake = Fake::new();
    fake.tenants = Some(
        Tenants::parse(
            r#"{"acme": {"bucket": "b-acme", "key": "k-1"}, "beta": {"bucket": "b-beta"}}"#,
            "test",
            |_: &Bucket| Vec::new(),
        )
        .unwrap(),
    );
    fake
}

fn without_target(id: &str, timeout: &str) -> Vec<u8> {
    let mut body: Value = serde_json::from_slice(&message(id, timeout)).unwrap();
    body.as_object_mut().unwrap().remove("target");
    body.to_string().into_bytes()
}

fn with_target(id: &str, target: Value) -> Vec<u8> {
    let mut body: Value = serde_json::from_slice(&message(id, "10m")).unwrap();
    body["target"] = target;
    body.to_string().into_bytes()
}

fn fields(record: &Value) -> Vec<String> {
    record["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect()
}

/// Rejected, reported, and nothing opened or run.
fn refused(fake: &Fake, fate: Fate) -> Value {
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(fake.reported(), vec![record.clone()]);
    assert!(fake.opened.lock().unwrap().is_empty(), "a store was opened");
    assert!(fake.started.lock().unwrap().is_empty());
    record
}

#[tokio::test]
async fn a_message_without_a_target_runs_against_its_tenants_registered_one() {
    let fake = registered();
    let body = without_target("long", "2h");
    let fate = handle(&fake, delivery(&body, Some(Duration::from_secs(600)))).await;
    assert!(matches!(fate, Fate::HandedOff(_)), "{fate:?}");
    assert_eq!(*fake.opened.lock().unwrap(), ["b-acme"]);
    let reference: Value = serde_json::from_str(&fake.started.lock().unwrap()[0]).unwrap();
    // What only the registry gives stays out of the reference; the task has its own registry.
    assert_eq!(reference["target"], json!({ "bucket": "b-acme" }));
    let started = fake.started.lock().unwrap()[0].clone();
    finish(&*fake.store, "long").await;
    let fate = task(&fake, &started, Duration::ZERO, CancellationToken::new()).await;
    assert!(matches!(fate, Fate::Ran(_)), "{fate:?}");
}

#[tokio::test]
async fn a_tenant_the_registry_does_not_know_is_rejected_before_anything_is_opened() {
    let fake = registered();
    let mut body: Value = serde_json::from_slice(&without_target("j1", "10m")).unwrap();
    body["job"]["tenant"] = json!("mallory");
    let body = body.to_string();
    let record = refused(&fake, handle(&fake, delivery(body.as_bytes(), None)).await);
    assert_eq!(fields(&record), ["tenant"]);
}

#[tokio::test]
async fn a_target_pointing_at_another_tenants_bucket_is_rejected() {
    let fake = registered();
    let body = with_target("j1", json!({ "bucket": "b-beta" }));
    let record = refused(&fake, handle(&fake, delivery(&body, None)).await);
    assert_eq!(fields(&record), ["target.bucket"]);
    assert!(
        !record.to_string().contains("b-acme"),
        "the rejection quotes the registry: {record}"
    );
}

#[tokio::test]
async fn a_registry_only_field_in_a_message_is_rejected_even_when_it_matches() {
    let fake = registered();
    let body = with_target("j1", json!({ "bucket": "b-acme", "key": "k-1" }));
    let record = refused(&fake, handle(&fake, delivery(&body, None)).await);
    assert_eq!(fields(&record), ["target.key"]);
}

#[tokio::test]
async fn a_target_that_agrees_with_the_registry_is_accepted() {
    let fake = registered();
    finish(&*fake.store, "j1").await;
    let body = with_target("j1", json!({ "bucket": "b-acme" }));
    let fate = handle(&fake, delivery(&body, None)).await;
    assert!(matches!(fate, Fate::Ran(_)), "{fate:?}");
    assert_eq!(*fake.opened.lock().unwrap(), ["b-acme"]);
}

#[tokio::test]
async fn a_task_reference_whose_target_is_not_the_registrys_is_refused() {
    let fake = registered();
    let body = without_target("j1", "10m");
    let forged = JobRef::stage(
        Bucket {
            bucket: "b-beta".into(),
            key: None,
        },
        &ws(),
        "j1",
        &body,
        fake.store.as_ref(),
    )
    .await
    .unwrap();
    let forged = serde_json::to_string(&forged).unwrap();
    let record = refused(
        &fake,
        task(&fake, &forged, Duration::ZERO, CancellationToken::new()).await,
    );
    assert_eq!(fields(&record), ["target.bucket"]);
}

#[tokio::test]
async fn without_a_registry_a_message_must_carry_its_target() {
    let fake = Fake::new();
    let body = without_target("j1", "10m");
    let record = refused(&fake, handle(&fake, delivery(&body, None)).await);
    assert_eq!(fields(&record), ["target"]);
}
