use super::*;
use crate::StateStoreExt;
use crate::memory::MemoryStore;
use crate::tfstate::empty_state;

fn ws() -> WorkspaceId {
    WorkspaceId::new("acme", "demo").unwrap()
}

fn key(byte: u8) -> Arc<dyn KeySource> {
    Arc::new(KeyFile::from_bytes(&[byte; 32]))
}

fn sealed(inner: &Arc<MemoryStore>, keys: Option<Keyring>) -> Arc<dyn StateStore> {
    SealedStore::wrap(inner.clone(), keys)
}

async fn first_put(store: &dyn StateStore, serial: u64) {
    let mode = match store.current(&ws()).await.unwrap() {
        Some(c) => PutMode::Update(c.token),
        None => PutMode::Create,
    };
    let state = NewState::parse(empty_state("lin-1", serial)).unwrap();
    store.put(&ws(), state, mode, None).await.unwrap();
}

#[tokio::test]
async fn a_state_is_stored_sealed_and_reads_back_plain() {
    let inner = Arc::new(MemoryStore::new());
    let store = sealed(&inner, Some(Keyring::new(key(1))));
    first_put(&*store, 1).await;
    let stored = inner.version(&ws(), 1).await.unwrap();
    assert!(is_sealed(&stored));
    assert!(
        !String::from_utf8_lossy(&stored).contains("\"resources\""),
        "no plaintext state in the stored object"
    );
    let (_, header, _) = split(&stored).unwrap();
    assert_eq!(header.alg, ALGORITHM);
    assert_eq!(header.key, key(1).id());
    assert_eq!(
        (header.serial, header.lineage.as_deref()),
        (Some(1), Some("lin-1"))
    );
    assert_eq!(
        store.version(&ws(), 1).await.unwrap(),
        empty_state("lin-1", 1)
    );
    assert_eq!(
        store.current(&ws()).await.unwrap().unwrap().data,
        empty_state("lin-1", 1)
    );
    // Every object has a data key of its own.
    first_put(&*store, 2).await;
    let second = inner.version(&ws(), 2).await.unwrap();
    assert_ne!(split(&second).unwrap().1.wrapped, header.wrapped);
}

#[tokio::test]
async fn without_the_key_a_sealed_state_is_refused_by_name_and_nothing_is_written() {
    let inner = Arc::new(MemoryStore::new());
    first_put(&*sealed(&inner, Some(Keyring::new(key(1)))), 1).await;
    for (keys, says) in [
        (None, "this runner has no key"),
        (
            Some(Keyring::new(key(2))),
            "give it that key (TERRACE_STATE_KEY_FILE, or TERRACE_STATE_OLD_KEY_FILES",
        ),
    ] {
        let store = sealed(&inner, keys);
        let err = store.current(&ws()).await.unwrap_err();
        assert!(matches!(err, StoreError::Sealed { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("state version 1") && text.contains(&key(1).id()) && text.contains(says),
            "{text}"
        );
        assert!(!err.is_retryable());
        assert!(store.version(&ws(), 1).await.is_err());
    }
    assert_eq!(
        inner.versions(&ws()).await.unwrap().len(),
        1,
        "nothing written"
    );
}

#[tokio::test]
async fn a_key_of_the_same_id_that_differs_or_a_changed_object_does_not_open() {
    let inner = Arc::new(MemoryStore::new());
    first_put(&*sealed(&inner, Some(Keyring::new(key(1)))), 1).await;

    // A source claiming the id but holding another key.
    #[derive(Debug)]
    struct Impostor(KeyFile, String);
    #[async_trait]
    impl KeySource for Impostor {
        fn id(&self) -> String {
            self.1.clone()
        }
        async fn data_key(&self, ws: &WorkspaceId) -> std::result::Result<DataKey, KeyError> {
            self.0.data_key(ws).await
        }
        async fn unwrap(
            &self,
            id: &str,
            ws: &WorkspaceId,
            w: &[u8],
        ) -> std::result::Result<[u8; 32], KeyError> {
            self.0.unwrap(id, ws, w).await
        }
    }
    let impostor = Arc::new(Impostor(KeyFile::from_bytes(&[9; 32]), key(1).id()));
    let err = sealed(&inner, Some(Keyring::new(impostor)))
        .current(&ws())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not unwrap"), "{err}");

    // The same object under another workspace's name.
    let stored = inner.version(&ws(), 1).await.unwrap();
    let other = WorkspaceId::new("acme", "other").unwrap();
    let store = SealedStore {
        inner: inner.clone(),
        keys: Some(Keyring::new(key(1))),
    };
    let err = store
        .open(&other, "state", stored.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not unwrap"), "{err}");

    // A flipped byte of the ciphertext, or a header changed.
    let mut flipped = stored.to_vec();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let err = store
        .open(&ws(), "state", Bytes::from(flipped))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("it was changed"), "{err}");
    let text = String::from_utf8_lossy(&stored).replace("\"serial\":1", "\"serial\":9");
    let err = store
        .open(&ws(), "state", Bytes::from(text.into_bytes()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("it was changed"), "{err}");
}

#[tokio::test]
async fn turning_it_on_keeps_the_plain_history_readable_and_a_rotation_keeps_the_old_key_for_reads()
{
    let inner = Arc::new(MemoryStore::new());
    first_put(&*sealed(&inner, None), 1).await;
    assert!(!is_sealed(&inner.version(&ws(), 1).await.unwrap()));

    let on = sealed(&inner, Some(Keyring::new(key(1))));
    assert_eq!(on.version(&ws(), 1).await.unwrap(), empty_state("lin-1", 1));
    first_put(&*on, 2).await;
    assert!(is_sealed(&inner.version(&ws(), 2).await.unwrap()));

    // Rotated: key 2 seals, key 1 still opens what it sealed.
    let rotated = sealed(
        &inner,
        Some(Keyring {
            current: key(2),
            older: vec![key(1)],
        }),
    );
    assert_eq!(
        rotated.version(&ws(), 2).await.unwrap(),
        empty_state("lin-1", 2)
    );
    first_put(&*rotated, 3).await;
    let (_, header, _) = split(&inner.version(&ws(), 3).await.unwrap()).unwrap();
    assert_eq!(header.key, key(2).id());
    // A restore reads the old version with its key and seals the new one with the current.
    let restored = rotated.restore(&ws(), 2, None).await.unwrap();
    let (_, header, _) = split(&inner.version(&ws(), restored.number).await.unwrap()).unwrap();
    assert_eq!(header.key, key(2).id());
    assert_eq!(
        crate::tfstate::StateMeta::parse(&rotated.current(&ws()).await.unwrap().unwrap().data)
            .unwrap()
            .serial,
        4
    );
}

#[tokio::test]
async fn state_artifacts_are_sealed_and_records_are_not() {
    let inner = Arc::new(MemoryStore::new());
    let store = sealed(&inner, Some(Keyring::new(key(1))));
    let state = empty_state("lin-1", 3);
    // Fenced writes (the runner's records) seal alike.
    let lease = store
        .acquire_lease(
            &ws(),
            &LeaseRequest {
                owner: "j1".into(),
                ttl: Duration::from_secs(60),
                info: serde_json::Value::Null,
            },
        )
        .await
        .unwrap();
    store
        .put_artifact_fenced(&ws(), "j1", "kept.tfplan", state.clone(), &lease.fence())
        .await
        .unwrap();
    let stored = inner
        .artifact(&ws(), "j1", "kept.tfplan")
        .await
        .unwrap()
        .unwrap();
    assert!(is_sealed(&stored));
    for name in [
        "errored.tfstate",
        "request-0123456789abcdef.json",
        "result.json",
    ] {
        store
            .put_artifact(&ws(), "j1", name, state.clone())
            .await
            .unwrap();
        let stored = inner.artifact(&ws(), "j1", name).await.unwrap().unwrap();
        assert_eq!(is_sealed(&stored), name != "result.json", "{name}");
        assert_eq!(
            store.artifact(&ws(), "j1", name).await.unwrap().unwrap(),
            state
        );
    }
}

#[test]
fn a_key_file_must_hold_32_bytes_of_base64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key");
    std::fs::write(&path, "not base64!\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(KeyFile::read(&path).unwrap_err().contains("chmod 600"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(KeyFile::read(&path).unwrap_err().contains("not base64"));
    std::fs::write(&path, format!("{}\n", B64.encode([1u8; 16]))).unwrap();
    assert!(
        KeyFile::read(&path)
            .unwrap_err()
            .contains("16 bytes, not 32")
    );
    std::fs::write(&path, format!("{}\n", B64.encode([1u8; 32]))).unwrap();
    assert_eq!(KeyFile::read(&path).unwrap().id(), key(1).id());
    assert!(key(1).id().starts_with("file:") && key(1).id() != key(2).id());
}

#[tokio::test]
async fn the_conformance_suite_passes_through_the_sealing() {
    let inner = Arc::new(MemoryStore::new());
    crate::conformance::run_all_sealed(sealed(&inner, Some(Keyring::new(key(1))))).await;
}

/// What must have been sealed is taken only sealed: a plain object put beside it (by anyone
/// who can write the bucket) is refused, and a store without keys has nothing sealed to give.
#[tokio::test]
async fn a_sealed_artifact_is_taken_only_as_this_stores_keys_sealed_it() {
    let inner = Arc::new(MemoryStore::new());
    let store = sealed(&inner, Some(Keyring::new(key(1))));
    let plan = Bytes::from_static(b"a plan with secret values");
    store
        .put_artifact(&ws(), "p1", "plan.tfplan", plan.clone())
        .await
        .unwrap();
    assert_eq!(
        store
            .sealed_artifact(&ws(), "p1", "plan.tfplan")
            .await
            .unwrap(),
        Some(plan.clone())
    );
    assert_eq!(
        store
            .sealed_artifact(&ws(), "p2", "plan.tfplan")
            .await
            .unwrap(),
        None
    );
    // Put plain behind the runner's back: refused by name.
    inner
        .put_artifact(&ws(), "p3", "plan.tfplan", plan.clone())
        .await
        .unwrap();
    let e = store
        .sealed_artifact(&ws(), "p3", "plan.tfplan")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("runs/p3/plan.tfplan") && e.contains("stored plain"),
        "{e}"
    );
    // The plain read still takes it as it is (what every other artifact read does).
    assert_eq!(
        store.artifact(&ws(), "p3", "plan.tfplan").await.unwrap(),
        Some(plan.clone())
    );
    let keyless = sealed(&inner, None);
    assert!(
        keyless
            .sealed_artifact(&ws(), "p1", "plan.tfplan")
            .await
            .is_err()
    );
    assert!(
        inner
            .sealed_artifact(&ws(), "p1", "plan.tfplan")
            .await
            .is_err()
    );
}
