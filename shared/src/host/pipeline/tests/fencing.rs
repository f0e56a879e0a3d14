//! A runner that lost its lease writes nothing over a later run's records.

use super::*;

#[tokio::test]
async fn a_runner_whose_lease_was_taken_over_never_replaces_the_later_runs_result() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, true);
    // Renewed every second: the takeover is seen within one.
    fake.runtime.lease_ttl = Duration::from_secs(3);
    let fake = Arc::new(fake);
    let body = message("j1", "10m");
    let running = tokio::spawn({
        let fake = fake.clone();
        async move { handle(&*fake, delivery(&body, None)).await }
    });
    // While its terraform plans, the lease is broken and the same job runs again elsewhere,
    // which writes its result.
    let held = loop {
        if let Some(lease) = fake.store.lease(&ws()).await.unwrap() {
            break lease;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    fake.store.break_lease(&ws(), None).await.unwrap();
    let later = fake
        .store
        .acquire_lease(
            &ws(),
            &LeaseRequest {
                owner: "j1".into(),
                ttl: Duration::from_secs(60),
                info: json!({}),
            },
        )
        .await
        .unwrap();
    assert!(later.fence > held.fence);
    let theirs = Bytes::from(serde_json::to_vec(&result_of("j1")).unwrap());
    fake.store
        .put_artifact_fenced(&ws(), "j1", RESULT_FILE, theirs.clone(), &later.fence())
        .await
        .unwrap();

    let fate = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the stale runner stops")
        .unwrap();
    // Its own end is not final (it never recorded it): the message is delivered again, and
    // then finds the later run's result.
    assert!(matches!(fate, Fate::Again { .. }), "{fate:?}");
    let stored = fake
        .store
        .artifact(&ws(), "j1", RESULT_FILE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, theirs, "the later run's result stands");
    assert!(fake.reported().is_empty(), "the stale run reported nothing");
}
