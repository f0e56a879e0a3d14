//! The backup checks of the conformance suite: a backup restores with its versions gone,
//! snapshots copy only changes, and the change marks the sweep reads are set and cleared.

use crate::retention::Retention;
use crate::{PutMode, StateStore, StateStoreExt, StoreError, WorkspaceId};

use super::{fresh_workspace, marked, state};

/// A backup brings the state back when the versions it copied are gone (a lifecycle rule, a
/// deletion): `restore_backup` reads the backup itself. `forget` deletes every stored version
/// of a workspace, as the store's own tools would.
pub async fn a_backup_restores_without_its_versions<F, Fut>(store: &dyn StateStore, forget: F)
where
    F: Fn(WorkspaceId) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let ws = fresh_workspace("backup-restore");
    store
        .put(&ws, marked("b", 1), PutMode::Create, None)
        .await
        .unwrap();
    let label = "2026-11-27T01";
    store
        .snapshot(&ws, label, Retention::default())
        .await
        .unwrap()
        .expect("a backup of version 1");
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, marked("b", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    let backup: serde_json::Value =
        serde_json::from_slice(&store.backup(&ws, label).await.unwrap()).unwrap();
    assert_eq!(
        backup["outputs"]["marker"]["value"], 1,
        "the backup's content"
    );

    forget(ws.clone()).await;
    assert!(
        store.version(&ws, 1).await.is_err(),
        "the version the backup copied is gone"
    );
    let restored = store.restore_backup(&ws, label, None).await.unwrap();
    let current = store.current(&ws).await.unwrap().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&current.data).unwrap();
    assert_eq!(
        value["outputs"]["marker"]["value"], 1,
        "the backup's content is back"
    );
    assert_eq!(value["lineage"], "b");
    assert_eq!(current.version.number, restored.number);
    let err = store
        .restore_backup(&ws, "2026-11-27T02", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

/// [`a_backup_restores_without_its_versions`] for a store over a bucket: its versions are
/// deleted from the bucket.
pub async fn a_bucket_backup_restores_without_its_versions<
    B: crate::objects::Bucket + Clone + 'static,
>(
    store: &crate::objects::BucketStore<B>,
) {
    a_backup_restores_without_its_versions(store, |ws| async move {
        let marker = format!("{}/{}/versions/", ws.tenant(), ws.workspace());
        for listed in store.bucket().list("").await.unwrap() {
            if listed.key.contains(&marker) {
                store.bucket().delete(&listed.key).await.unwrap();
            }
        }
    })
    .await;
}

pub async fn snapshot_copies_only_changes(store: &dyn StateStore) {
    let ws = fresh_workspace("snapshot");
    assert!(
        store
            .snapshot(&ws, "2026-11-21T10", Retention::default())
            .await
            .unwrap()
            .is_none(),
        "no state, no backup"
    );
    store
        .put(&ws, state("s", 1), PutMode::Create, None)
        .await
        .unwrap();
    let first = store
        .snapshot(&ws, "2026-11-21T11", Retention::default())
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(first.backup.version, 1);
    assert!(
        store
            .snapshot(&ws, "2026-11-21T12", Retention::default())
            .await
            .unwrap()
            .is_none(),
        "unchanged"
    );
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("s", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    let second = store
        .snapshot(&ws, "2026-11-21T13", Retention::default())
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(second.backup.version, 2);
    assert!(second.pruned.is_empty());
    let labels: Vec<String> = store
        .backups(&ws)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.label)
        .collect();
    assert_eq!(labels, vec!["2026-11-21T11", "2026-11-21T13"]);

    // Retention drops the oldest when the new backup is made.
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("s", 3), PutMode::Update(token), None)
        .await
        .unwrap();
    let keep_two = Retention {
        hourly: 2,
        daily: 0,
    };
    let third = store
        .snapshot(&ws, "2026-11-21T14", keep_two)
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(third.backup.version, 3);
    assert_eq!(third.pruned, ["2026-11-21T11"]);
    let labels: Vec<String> = store
        .backups(&ws)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.label)
        .collect();
    assert_eq!(labels, vec!["2026-11-21T13", "2026-11-21T14"]);
}

/// Every write and deletion marks the workspace as changed until the sweep clears that mark; a
/// write after the sweep listed it keeps the mark. Backups can be deleted.
pub async fn changes_are_marked_until_cleared(store: &dyn StateStore) {
    let ws = fresh_workspace("changes");
    let mine = |all: Vec<crate::Changed>| all.into_iter().find(|c| c.ws == ws);
    assert!(
        mine(store.changed().await.unwrap()).is_none(),
        "a new workspace has no change"
    );
    store
        .put(&ws, state("c", 1), PutMode::Create, None)
        .await
        .unwrap();
    let first = mine(store.changed().await.unwrap()).expect("a write marks the workspace");
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("c", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    store.clear_changed(&first).await.unwrap();
    let second =
        mine(store.changed().await.unwrap()).expect("a write after the listing keeps the mark");
    assert_ne!(second.mark, first.mark);
    store.clear_changed(&second).await.unwrap();
    assert!(
        mine(store.changed().await.unwrap()).is_none(),
        "cleared with the mark it had"
    );

    let token = store.current(&ws).await.unwrap().unwrap().token;
    store.delete_current(&ws, &token, None).await.unwrap();
    let deleted = mine(store.changed().await.unwrap()).expect("a deletion marks too");
    store.clear_changed(&deleted).await.unwrap();

    store
        .put(&ws, state("d", 0), PutMode::Create, None)
        .await
        .unwrap();
    let label = "2026-11-21T10";
    store
        .snapshot(&ws, label, Retention::default())
        .await
        .unwrap()
        .expect("a backup of the new state");
    assert!(
        store
            .backups(&ws)
            .await
            .unwrap()
            .iter()
            .any(|b| b.label == label)
    );
}

/// The sweep's path: what the change marks say changed is backed up as the newest version
/// written, byte for byte; a deletion backs up nothing.
pub async fn marked_changes_are_backed_up(store: &dyn StateStore) {
    let ws = fresh_workspace("marked");
    let mine = |all: Vec<crate::Changed>| all.into_iter().find(|c| c.ws == ws);
    store
        .put(&ws, state("m", 1), PutMode::Create, None)
        .await
        .unwrap();
    let token = store.current(&ws).await.unwrap().unwrap().token;
    store
        .put(&ws, state("m", 2), PutMode::Update(token), None)
        .await
        .unwrap();
    let changed = mine(store.changed().await.unwrap()).expect("two writes mark the workspace");
    let made = store
        .back_up(&changed, "2026-11-21T10", Retention::default())
        .await
        .unwrap()
        .expect("a backup");
    let newest = store
        .versions(&ws)
        .await
        .unwrap()
        .into_iter()
        .max_by_key(|v| v.number)
        .unwrap();
    assert_eq!(made.backup.version, newest.number, "the newest version");
    assert_eq!(made.backup.sha256, newest.sha256);
    assert_eq!(
        store.backups(&ws).await.unwrap(),
        std::slice::from_ref(&made.backup)
    );
    store.clear_changed(&changed).await.unwrap();
    assert!(mine(store.changed().await.unwrap()).is_none(), "cleared");

    let token = store.current(&ws).await.unwrap().unwrap().token;
    store.delete_current(&ws, &token, None).await.unwrap();
    let deleted = mine(store.changed().await.unwrap()).expect("a deletion marks too");
    assert!(
        store
            .back_up(&deleted, "2026-11-21T11", Retention::default())
            .await
            .unwrap()
            .is_none(),
        "nothing to back up after a deletion"
    );
    store.clear_changed(&deleted).await.unwrap();
    assert_eq!(store.backups(&ws).await.unwrap(), [made.backup]);
}
