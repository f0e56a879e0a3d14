//! The state server under real terraform: `terraform state push -force` of a state that would
//! corrupt the workspace's history is refused by the server, and history stays intact.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;

use state_backends::fs::FsStore;
use state_backends::{StateStore, WorkspaceId};

fn terraform(
    dir: &Path,
    args: &[&str],
    ep: &shared::run::state_server::Endpoint,
) -> std::process::Output {
    Command::new(tests::terraform())
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(ep.backend_env())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .output()
        .expect("terraform starts")
}

fn state(lineage: &str, serial: u64, marker: &str) -> String {
    serde_json::json!({
        "version": 4, "terraform_version": "0.15.0", "serial": serial, "lineage": lineage,
        "outputs": { "marker": { "value": marker, "type": "string" } }, "resources": []
    })
    .to_string()
}

// terraform is run with blocking calls while the state server answers on the runtime's other thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_with_an_older_serial_or_another_lineage_are_refused_and_history_is_intact() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn StateStore> = Arc::new(FsStore::new(dir.path().join("store")));
    let ws = WorkspaceId::new("acme", "guarded").unwrap();
    let server = tests::leased_state_server(store.clone(), &ws, "job-guard").await;
    let ep = server.endpoint().clone();

    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        work.join("main.tf"),
        "terraform {\n  backend \"http\" {}\n}\n",
    )
    .unwrap();
    let init = terraform(&work, &["init", "-input=false", "-no-color"], &ep);
    assert!(
        init.status.success(),
        "init: {}",
        String::from_utf8_lossy(&init.stderr)
    );

    let push = |name: &str, content: String| {
        std::fs::write(work.join(name), content).unwrap();
        terraform(&work, &["state", "push", "-force", name], &ep)
    };
    // Into an empty workspace terraform pushes under a lineage of its own choosing.
    let first = push("first.tfstate", state("lin-first", 1, "one"));
    assert!(
        first.status.success(),
        "first push: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    let lineage = store.current(&ws).await.unwrap().unwrap().version.lineage;
    let lineage = lineage.as_str();
    for (serial, marker) in [(2, "two"), (5, "five")] {
        let out = push("ok.tfstate", state(lineage, serial, marker));
        assert!(
            out.status.success(),
            "push serial {serial}: {}{} {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            server.activity()
        );
    }
    let history = store.versions(&ws).await.unwrap();
    assert_eq!(history.len(), 3);
    // Terraform may add one to the serial it pushes (0.15 does); learn by how much.
    let current_serial = history[2].serial;
    let bump = current_serial - 5;
    assert!(bump <= 1 && history[1].serial == 2 + bump, "{history:?}");

    // Older serial, same lineage: refused by the server, even though terraform was told -force.
    let stale = push("stale.tfstate", state(lineage, 3, "stale"));
    assert!(!stale.status.success(), "a stale write was accepted");
    // Another lineage: another workspace's state.
    let foreign = push("foreign.tfstate", state("lin-b", 9, "foreign"));
    assert!(!foreign.status.success(), "a foreign lineage was accepted");
    // Same serial, other content: a lost update.
    let clash = push(
        "clash.tfstate",
        state(lineage, current_serial - bump, "clash"),
    );
    assert!(
        !clash.status.success(),
        "a conflicting write with the same serial was accepted"
    );

    let activity = server.activity();
    assert_eq!(activity.refused.len(), 3, "{:?}", activity.refused);
    assert!(
        activity.refused[0].contains(&format!("older than the current serial {current_serial}")),
        "{:?}",
        activity.refused
    );
    assert!(
        activity.refused[1].contains("lineage"),
        "{:?}",
        activity.refused
    );
    assert!(
        activity.refused[2].contains("content differs"),
        "{:?}",
        activity.refused
    );

    assert_eq!(
        store.versions(&ws).await.unwrap(),
        history,
        "history changed"
    );
    let current = store.current(&ws).await.unwrap().unwrap();
    let current: Value = serde_json::from_slice(&current.data).unwrap();
    assert_eq!(current["outputs"]["marker"]["value"], "five");
    for v in &history {
        let data: Value =
            serde_json::from_slice(&store.version(&ws, v.number).await.unwrap()).unwrap();
        assert_eq!(data["serial"].as_u64(), Some(v.serial));
        assert_eq!(data["lineage"], lineage);
    }

    // Once the lease is broken, even a valid successor is refused (fencing).
    store.break_lease(&ws, None).await.unwrap();
    let fenced = push("next.tfstate", state(lineage, 6, "six"));
    assert!(
        !fenced.status.success(),
        "a write after the lease was broken was accepted"
    );
    assert_eq!(store.versions(&ws).await.unwrap(), history);
    server.shutdown().await;
}
