//! Client-side state encryption through real runs of `terrace` with the machine's terraform:
//! every state object a run leaves (versions, the current copy, backups) is sealed, on a
//! folder, on S3 with the customer's KMS key in moto, on GCS in fake-gcs-server and on Azure
//! Blob in Azurite; a runner without the key, or with the wrong one, is refused by name and
//! writes nothing; encryption turned on for an existing workspace, and a key rotated.

use serde_json::Value;
use state_backends::sealed::{is_sealed, split};
use state_backends::{StateStore, WorkspaceId};
use tests::{Sandbox, demo_job};

/// What of the demo's state must never be readable in the store.
const PLAINTEXT: [&str; 3] = ["\"resources\"", "testcloud_cluster", "10.0.0.0/16"];

/// Writes a fresh key file (32 random bytes, base64) in the sandbox; its path.
fn key_file(sb: &Sandbox, name: &str) -> String {
    use base64::Engine as _;
    let bytes: [u8; 32] = rand::random();
    let path = sb.dir.path().join(name);
    std::fs::write(
        &path,
        base64::engine::general_purpose::STANDARD.encode(bytes) + "\n",
    )
    .unwrap();
    // The runner's alone, as it requires.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

/// Runs a demo job in workspace `sealed` with `env` on top of the sandbox's; its exit code
/// and stored result.
async fn run(sb: &Sandbox, env: &[(&str, String)], id: &str, op: &str, nodes: u32) -> (i32, Value) {
    let path = sb.job(
        &format!("{id}.yaml"),
        &demo_job(id, "sealed", op, "vault", nodes),
    );
    let mut cmd = sb.terrace();
    cmd.args(["run", "-q", path.to_str().unwrap()]);
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let out = cmd.output().unwrap();
    let result = sb.artifact_json("acme/sealed", id, "result.json").await;
    (out.status.code().unwrap_or(-1), result)
}

/// The key a sealed object names, after checking it holds none of the state in the clear.
fn sealed_with(what: &str, data: &[u8]) -> String {
    assert!(is_sealed(data), "{what} is not sealed");
    let text = String::from_utf8_lossy(data);
    for word in PLAINTEXT {
        assert!(!text.contains(word), "{what} shows {word} in the clear");
    }
    split(data).unwrap().1.key
}

/// Every state object in a folder store: path → key it is sealed with.
fn folder_states(sb: &Sandbox) -> Vec<(String, String)> {
    sb.store_files()
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "tfstate"))
        .map(|(p, data)| {
            let what = p.display().to_string();
            let key = sealed_with(&what, &data);
            (what, key)
        })
        .collect()
}

fn ws() -> WorkspaceId {
    "acme/sealed".parse().unwrap()
}

#[tokio::test]
async fn a_sealed_folder_workspace_keeps_no_plaintext_state_and_needs_its_key() {
    let sb = Sandbox::new();
    let (k1, k2) = (key_file(&sb, "k1"), key_file(&sb, "k2"));
    let with = |k: &str| vec![("TERRACE_STATE_KEY_FILE", k.to_owned())];
    let key1 = with(&k1);
    let (code, r) = run(&sb, &key1, "s1", "apply", 1).await;
    assert_eq!(code, 0, "{r}");
    let mut backup = sb.terrace();
    backup.arg("backup").envs(key1.clone());
    assert!(backup.status().unwrap().success());
    let states = folder_states(&sb);
    let names: Vec<&str> = states.iter().map(|(p, _)| p.as_str()).collect();
    assert!(
        names.iter().any(|p| p.contains("/versions/"))
            && names.iter().any(|p| p.ends_with("/terraform.tfstate"))
            && names.iter().any(|p| p.contains("/backups/")),
        "{names:?}"
    );
    let id1 = states[0].1.clone();
    assert!(id1.starts_with("file:"), "{id1}");
    assert!(states.iter().all(|(_, k)| *k == id1));

    // An update reads the sealed state and seals the next.
    let (code, r) = run(&sb, &key1, "s2", "apply", 2).await;
    assert_eq!(code, 0, "{r}");
    assert_eq!(sb.versions("acme/sealed").await.len(), 2);

    // No key, or the wrong one: refused by name, nothing written, the lease free again.
    for (id, env, says) in [
        ("s3", vec![], "this runner has no key"),
        ("s4", with(&k2), "TERRACE_STATE_OLD_KEY_FILES"),
    ] {
        let (code, r) = run(&sb, &env, id, "apply", 3).await;
        assert_eq!(code, 1, "{r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("cannot be decrypted")
                && message.contains(&id1)
                && message.contains(says),
            "{message}"
        );
        assert_eq!(sb.versions("acme/sealed").await.len(), 2, "nothing written");
        assert_eq!(r["outputs"], serde_json::json!({}));
    }
    let mut show = sb.terrace();
    show.args(["state", "show", "acme/sealed"]);
    let out = show.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("this runner has no key"), "{said}");
    assert!(said.contains("give the key it was sealed with"), "{said}");
    let lease = sb.run(&["state", "versions", "acme/sealed"]);
    lease.expect_code(0);

    // Rotated: k2 seals, k1 still opens what it sealed.
    let rotated = vec![
        ("TERRACE_STATE_KEY_FILE", k2.clone()),
        ("TERRACE_STATE_OLD_KEY_FILES", k1.clone()),
    ];
    let (code, r) = run(&sb, &rotated, "s5", "apply", 3).await;
    assert_eq!(code, 0, "{r}");
    let raw = state_backends::fs::FsStore::new(&sb.store);
    let v3 = raw.version(&ws(), 3).await.unwrap();
    let id2 = sealed_with("version 3", &v3);
    assert!(id2 != id1 && id2.starts_with("file:"));
    // Without the old key, the versions it sealed no longer open; with it, they restore.
    let mut restore = sb.terrace();
    restore
        .args(["state", "restore", "acme/sealed", "--version", "1"])
        .envs(with(&k2));
    let out = restore.output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(&id1));
    let mut restore = sb.terrace();
    restore
        .args(["state", "restore", "acme/sealed", "--version", "1"])
        .envs(rotated.clone());
    assert!(restore.status().unwrap().success());
    let v4 = raw.version(&ws(), 4).await.unwrap();
    assert_eq!(
        sealed_with("version 4", &v4),
        id2,
        "restored under the current key"
    );
}

#[tokio::test]
async fn encryption_turned_on_for_an_existing_workspace_seals_from_the_next_write() {
    let sb = Sandbox::new();
    let k1 = key_file(&sb, "k1");
    let (code, _) = run(&sb, &[], "p1", "apply", 1).await;
    assert_eq!(code, 0);
    let raw = state_backends::fs::FsStore::new(&sb.store);
    assert!(!is_sealed(&raw.version(&ws(), 1).await.unwrap()));
    let key = [("TERRACE_STATE_KEY_FILE", k1.clone())];
    let (code, r) = run(&sb, &key, "p2", "apply", 2).await;
    assert_eq!(code, 0, "{r}");
    assert!(
        !is_sealed(&raw.version(&ws(), 1).await.unwrap()),
        "history is never rewritten"
    );
    sealed_with("version 2", &raw.version(&ws(), 2).await.unwrap());
    let mut show = sb.terrace();
    show.args(["state", "show", "acme/sealed", "--version", "1"])
        .envs(key.clone());
    let out = show.output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("testcloud_cluster"));
}

#[tokio::test]
async fn on_s3_the_customers_kms_key_seals_every_state_object() {
    let bucket = tests::aws::bucket().await;
    let key = tests::aws::kms_key();
    let mut sb = Sandbox::new();
    sb.env.extend(tests::aws::cli_env());
    let sealed_url = format!("s3://{bucket}/t?client_side_kms_key={key}");
    let store = [("TERRACE_STORE", sealed_url.as_str())];
    let (code, r) = run_in(&sb, &store, "k1", 1).await;
    assert_eq!(code, 0, "{r}");
    let (code, r) = run_in(&sb, &store, "k2", 2).await;
    assert_eq!(code, 0, "{r}");
    let mut backup = sb.terrace();
    backup.arg("backup").envs(store);
    assert!(backup.status().unwrap().success());

    let s3 = tests::aws::s3().await;
    let listed = s3
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("t/acme/sealed/")
        .send()
        .await
        .unwrap();
    let keys: Vec<String> = listed
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_owned))
        .filter(|k| k.ends_with(".tfstate"))
        .collect();
    assert!(
        keys.len() >= 4,
        "versions, the current copy and a backup: {keys:?}"
    );
    for k in &keys {
        let body = s3.get_object().bucket(&bucket).key(k).send().await.unwrap();
        let data = body.body.collect().await.unwrap().into_bytes();
        assert_eq!(sealed_with(k, &data), format!("aws-kms:{key}"));
    }
    // A key that cannot make data keys (none such) stops an apply before anything changes,
    // even in a new workspace, with no state to open yet.
    let missing = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-4000-8000-000000000000";
    let url = format!("s3://{bucket}/t?client_side_kms_key={missing}");
    let path = sb.job("fresh.yaml", &demo_job("f1", "fresh", "apply", "fresh", 1));
    let mut cmd = sb.terrace();
    cmd.args(["run", "-q", "--json", path.to_str().unwrap()])
        .env("TERRACE_STORE", &url);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (r["error"]["category"].as_str(), r["error"]["step"].as_str()),
        (Some("auth"), Some("prepare")),
        "{r}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a trial data key"),
        "{r}"
    );
    assert!(
        !sb.cloud_names().iter().any(|n| n.contains("fresh")),
        "nothing was made"
    );

    // The same bucket read without the KMS key: refused, naming it.
    let plain_url = format!("s3://{bucket}/t");
    let (code, r) = run_in(&sb, &[("TERRACE_STORE", plain_url.as_str())], "k3", 3).await;
    assert_eq!(code, 1, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("aws-kms:{key}")), "{message}");
}

/// Runs a demo apply with the store in `env` and reads its result from that store.
async fn run_in(sb: &Sandbox, env: &[(&str, &str)], id: &str, nodes: u32) -> (i32, Value) {
    let path = sb.job(
        &format!("{id}.yaml"),
        &demo_job(id, "sealed", "apply", "vault", nodes),
    );
    let mut cmd = sb.terrace();
    cmd.args(["run", "-q", path.to_str().unwrap()])
        .envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let mut result = sb.terrace();
    result
        .args(["result", id, "-w", "acme/sealed", "--json"])
        .envs(env.iter().copied());
    let shown = result.output().unwrap();
    let value = serde_json::from_slice(&shown.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}\n{}",
            String::from_utf8_lossy(&shown.stderr),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), value)
}

/// A key file's sealing, checked through the raw store (the backend without the sealing).
async fn key_file_seals(sb: &mut Sandbox, url: &str, env: &[(&str, String)], raw: &dyn StateStore) {
    sb.env
        .extend(env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let k1 = key_file(sb, "k1");
    let with = [
        ("TERRACE_STORE", url),
        ("TERRACE_STATE_KEY_FILE", k1.as_str()),
    ];
    let (code, r) = run_in(sb, &with, "c1", 1).await;
    assert_eq!(code, 0, "{r}");
    let (code, r) = run_in(sb, &with, "c2", 2).await;
    assert_eq!(code, 0, "{r}");
    for v in raw.versions(&ws()).await.unwrap() {
        let data = raw.version(&ws(), v.number).await.unwrap();
        assert!(sealed_with(&format!("version {}", v.number), &data).starts_with("file:"));
    }
    let current = raw.current(&ws()).await.unwrap().unwrap();
    sealed_with("the current state", &current.data);
}

#[tokio::test]
async fn on_gcs_a_key_file_seals_every_state_version() {
    let bucket = tests::gcs::bucket().await;
    let raw = tests::gcs::store(&bucket, "t").await;
    let mut sb = Sandbox::new();
    key_file_seals(
        &mut sb,
        &format!("gs://{bucket}/t"),
        &[
            ("TERRACE_GCS_ENDPOINT", tests::gcs::endpoint()),
            ("TERRACE_GCS_ANONYMOUS", "1".into()),
        ],
        &raw,
    )
    .await;
}

#[tokio::test]
async fn on_azure_blob_a_key_file_seals_every_state_version() {
    let with_sas = tests::azure::container().await;
    let container = with_sas.split('?').next().unwrap().to_owned();
    let raw = tests::azure::store(&with_sas, "t");
    let mut sb = Sandbox::new();
    key_file_seals(
        &mut sb,
        &format!("{container}/t"),
        &[("AZURE_STORAGE_SAS_TOKEN", tests::azure::sas())],
        &raw,
    )
    .await;
}
