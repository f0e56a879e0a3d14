//! The lease checks of the conformance suite: one winner, takeover of an expired lease, and
//! fencing of a holder that lost it (state writes and run records alike).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::{PutMode, StateStore, StateStoreExt, StoreError};

use super::{fresh_workspace, lease_request, state};

pub async fn lease_contention_has_one_winner(store: Arc<dyn StateStore>) {
    let ws = fresh_workspace("contention");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (store, ws) = (store.clone(), ws.clone());
            tokio::spawn(async move {
                store
                    .acquire_lease(
                        &ws,
                        &lease_request(&format!("job-{i}"), Duration::from_secs(30)),
                    )
                    .await
            })
        })
        .collect();
    let mut winner = None;
    for task in tasks {
        match task.await.expect("task") {
            Ok(lease) => assert!(winner.replace(lease).is_none(), "two holders at once"),
            Err(StoreError::LeaseHeld { .. }) => {}
            Err(other) => panic!("unexpected error in lease contention: {other}"),
        }
    }
    let winner = winner.expect("one contender wins");
    let err = store
        .acquire_lease(&ws, &lease_request("late", Duration::from_secs(30)))
        .await
        .unwrap_err();
    let StoreError::LeaseHeld { holder, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(holder.owner, winner.owner, "the error names the holder");
    assert!(err.is_retryable());
    assert_eq!(store.lease(&ws).await.unwrap().unwrap().owner, winner.owner);

    let renewed = store
        .renew_lease(&ws, &winner, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        renewed.expires_at > winner.expires_at,
        "renewal extends the lease"
    );
    assert_eq!(renewed.fence, winner.fence, "renewal keeps the fence");
    store.release_lease(&ws, &renewed).await.unwrap();
    assert!(store.lease(&ws).await.unwrap().is_none());
    let next = store
        .acquire_lease(&ws, &lease_request("next", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        next.fence > winner.fence,
        "the fence grows with each acquisition"
    );
    store.release_lease(&ws, &next).await.unwrap();
}

pub async fn expired_lease_is_taken_over_and_the_old_holder_is_fenced(store: &dyn StateStore) {
    let ws = fresh_workspace("expiry");
    let old = store
        // Long enough for a write through a remote store on a loaded machine.
        .acquire_lease(&ws, &lease_request("crashed", Duration::from_millis(1500)))
        .await
        .unwrap();
    store
        .put(&ws, state("e", 1), PutMode::Create, Some(&old.fence()))
        .await
        .expect("a live lease may write");
    tokio::time::sleep(Duration::from_millis(1700)).await;

    let token = store.current(&ws).await.unwrap().unwrap().token;
    let err = store
        .put(
            &ws,
            state("e", 2),
            PutMode::Update(token.clone()),
            Some(&old.fence()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "expired writer: {err}"
    );
    let err = store
        .renew_lease(&ws, &old, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "expired renewal: {err}"
    );

    let new = store
        .acquire_lease(&ws, &lease_request("successor", Duration::from_secs(30)))
        .await
        .expect("an expired lease is free");
    assert!(new.fence > old.fence);
    let took_over = new
        .took_over
        .as_ref()
        .expect("the successor learns whose lease expired");
    assert_eq!(
        (took_over.owner.as_str(), took_over.fence),
        ("crashed", old.fence)
    );
    store.release_lease(&ws, &old).await.unwrap();
    assert_eq!(
        store.lease(&ws).await.unwrap().map(|l| l.owner),
        Some("successor".to_owned()),
        "a stale holder's release leaves the new lease alone"
    );
    store
        .put(
            &ws,
            state("e", 2),
            PutMode::Update(token),
            Some(&new.fence()),
        )
        .await
        .expect("the successor writes");
    assert_eq!(store.versions(&ws).await.unwrap().len(), 2);
    store.release_lease(&ws, &new).await.unwrap();
}

pub async fn fenced_artifacts_are_written_only_by_the_lease_holder(store: &dyn StateStore) {
    let ws = fresh_workspace("fenced-artifacts");
    let write = |data: &'static [u8], fence: crate::Fence| {
        let ws = ws.clone();
        async move {
            store
                .put_artifact_fenced(
                    &ws,
                    "job-1",
                    "result.json",
                    Bytes::from_static(data),
                    &fence,
                )
                .await
        }
    };
    let old = store
        .acquire_lease(&ws, &lease_request("run-1", Duration::from_millis(1500)))
        .await
        .unwrap();
    write(b"one", old.fence()).await.expect("the holder writes");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let err = write(b"late", old.fence()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "expired writer: {err}"
    );

    // The same job runs again under a new lease; the old runner's result cannot replace its.
    let new = store
        .acquire_lease(&ws, &lease_request("run-2", Duration::from_secs(30)))
        .await
        .unwrap();
    write(b"two", new.fence())
        .await
        .expect("the new holder writes");
    let err = write(b"stale", old.fence()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "stale writer: {err}"
    );
    assert_eq!(
        store
            .artifact(&ws, "job-1", "result.json")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"two"[..])
    );
    store.release_lease(&ws, &new).await.unwrap();
    let err = write(b"x", new.fence()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "released: {err}"
    );
}

pub async fn broken_lease_fences_its_holder(store: &dyn StateStore) {
    let ws = fresh_workspace("break");
    let lease = store
        .acquire_lease(&ws, &lease_request("stuck", Duration::from_secs(300)))
        .await
        .unwrap();
    // A break meant for another lease (one read before this was taken) breaks nothing.
    assert!(
        store
            .break_lease(&ws, Some(lease.fence + 1))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store.lease(&ws).await.unwrap().map(|l| l.fence),
        Some(lease.fence),
        "the lease held stays"
    );
    store
        .renew_lease(&ws, &lease, Duration::from_secs(300))
        .await
        .expect("its holder still renews it");
    let broken = store
        .break_lease(&ws, Some(lease.fence))
        .await
        .unwrap()
        .expect("a lease was held");
    assert_eq!(broken.owner, "stuck");
    let err = store
        .put(&ws, state("b", 1), PutMode::Create, Some(&lease.fence()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { .. }),
        "broken holder writes: {err}"
    );
    assert!(
        store.current(&ws).await.unwrap().is_none(),
        "nothing was written"
    );
    assert!(store.break_lease(&ws, None).await.unwrap().is_none());
}
