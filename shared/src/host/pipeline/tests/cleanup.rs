//! The clean-up after a failed apply (`on_failure: destroy-created`), with a stand-in terraform
//! that writes its states through the runner's state server as terraform does: what the run
//! created is destroyed, and nothing that existed before it.

use state_backends::{NewState, PutMode};

use super::*;

/// Terraform as the clean-up sees it: `apply` of the job's plan saves a state with `t.created`
/// beside the older `t.old` and fails; `plan -destroy -target=…` plans deleting the targets
/// (and `t.old` too when the file `beyond` exists, as a dependency would); `apply` of that
/// plan saves the state without `t.created`. States go to the address and with the
/// credentials terraform's environment gives its `http` backend (`TF_HTTP_*`).
const CLEANUP_TERRAFORM: &str = r#"#!/bin/sh
here="$(dirname "$0")"
save() { curl -sf -u "$TF_HTTP_USERNAME:$TF_HTTP_PASSWORD" --data-binary @"$here/$1" "$TF_HTTP_ADDRESS" >/dev/null || exit 3; }
case "$1" in
  version) echo '{"terraform_version":"1.11.4","platform":"linux_amd64","provider_selections":{}}' ;;
  init) ;;
  plan)
    mode=apply
    for a in "$@"; do [ "$a" = -destroy ] && mode=destroy; done
    echo "$mode" > .mode
    if [ "$mode" = destroy ]; then
      for a in "$@"; do case "$a" in -target=*)
        echo "{\"type\":\"planned_change\",\"change\":{\"resource\":{\"addr\":\"${a#-target=}\"},\"action\":\"delete\"}}" ;; esac; done
      [ -e "$here/beyond" ] && echo '{"type":"planned_change","change":{"resource":{"addr":"t.old"},"action":"delete"}}'
      echo '{"type":"change_summary","changes":{"add":0,"change":0,"import":0,"remove":1,"operation":"plan"}}'
    else
      echo '{"type":"planned_change","change":{"resource":{"addr":"t.created"},"action":"create"}}'
      echo '{"type":"change_summary","changes":{"add":1,"change":0,"import":0,"remove":0,"operation":"plan"}}'
    fi ;;
  apply)
    if [ "$(cat .mode)" = destroy ]; then
      save destroyed.json
      echo '{"type":"change_summary","changes":{"add":0,"change":0,"import":0,"remove":1,"operation":"apply"}}'
    else
      save created.json
      echo '{"type":"diagnostic","@level":"error","@message":"Error: the cloud refused","diagnostic":{"severity":"error","summary":"the cloud refused","detail":""}}'
      exit 1
    fi ;;
  show) echo '{}' ;;
  output) echo '{}' ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"#;

fn state(serial: u64, names: &[&str]) -> String {
    let resources: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({
                "mode": "managed", "type": "t", "name": name,
                "provider": "provider[\"registry.terraform.io/hashicorp/t\"]",
                "instances": [{ "schema_version": 0, "attributes": {} }],
            })
        })
        .collect();
    json!({
        "version": 4, "terraform_version": "1.11.4", "serial": serial, "lineage": "cleanup",
        "outputs": {}, "resources": resources,
    })
    .to_string()
}

/// A fake trigger whose terraform is [`CLEANUP_TERRAFORM`], over a workspace that holds `t.old`.
async fn failing_apply(beyond: bool) -> (Fake, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    let mut fake = Fake::new();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("terraform");
    std::fs::write(&bin, CLEANUP_TERRAFORM).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.path().join("created.json"),
        state(2, &["old", "created"]),
    )
    .unwrap();
    std::fs::write(dir.path().join("destroyed.json"), state(3, &["old"])).unwrap();
    if beyond {
        std::fs::write(dir.path().join("beyond"), "").unwrap();
    }
    fake.runtime.terraform.binary = bin;
    fake.runtime.terraform.grace = Duration::from_secs(5);
    let before = NewState::parse(Bytes::from(state(1, &["old"]))).unwrap();
    fake.store
        .put(&ws(), before, PutMode::Create, None)
        .await
        .unwrap();
    (fake, dir)
}

fn destroy_created(id: &str) -> Vec<u8> {
    let mut message: Value = serde_json::from_slice(&message(id, "10m")).unwrap();
    message["job"]["on_failure"] = json!("destroy-created");
    message.to_string().into_bytes()
}

async fn addresses(fake: &Fake) -> Vec<String> {
    let current = fake.store.current(&ws()).await.unwrap().unwrap();
    state_backends::tfstate::resource_addresses(&current.data)
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn a_failed_apply_destroys_what_it_created_and_keeps_what_was_there() {
    let (fake, _bin) = failing_apply(false).await;
    let fate = handle(&fake, delivery(&destroy_created("j1"), None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "failed", "{record}");
    let cleanup = &record["cleanup"];
    assert_eq!(cleanup["policy"], "destroy-created", "{record}");
    assert_eq!(cleanup["created"], json!(["t.created"]), "{record}");
    assert_eq!(cleanup["destroyed"], json!(["t.created"]), "{record}");
    assert_eq!(cleanup["left"], json!([]), "{record}");
    assert_eq!(cleanup["attempts"], 1, "{record}");
    assert!(cleanup["error"].is_null(), "{record}");
    assert_eq!(addresses(&fake).await, ["t.old"]);
    assert_eq!(
        fake.store
            .current(&ws())
            .await
            .unwrap()
            .unwrap()
            .version
            .serial,
        3,
        "the clean-up's state is the current one"
    );
}

/// A destroy that would reach beyond what the run created (something older depends on it) is
/// never applied: what the run created is left, and the result says why.
#[tokio::test]
async fn a_cleanup_that_would_destroy_something_older_destroys_nothing() {
    let (fake, _bin) = failing_apply(true).await;
    let fate = handle(&fake, delivery(&destroy_created("j1"), None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "failed", "{record}");
    let cleanup = &record["cleanup"];
    assert_eq!(cleanup["destroyed"], json!([]), "{record}");
    assert_eq!(cleanup["left"], json!(["t.created"]), "{record}");
    let error = cleanup["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("would also change t.old") && error.contains("nothing was destroyed"),
        "{record}"
    );
    assert_eq!(
        cleanup["attempts"], 1,
        "an internal refusal is not tried again"
    );
    assert_eq!(addresses(&fake).await, ["t.created", "t.old"]);
}
