//! `terrace cancel` with the machine's terraform: a queued job never runs, a running apply is
//! interrupted within seconds and ends `cancelled` (what it created is kept, as `on_failure:
//! keep` says), and a finished job is left as it is.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{Sandbox, demo_job};

fn job(id: &str) -> String {
    demo_job(id, "cancel", "apply", "cancel", 1)
}

#[tokio::test]
async fn a_queued_job_cancelled_before_it_starts_never_runs() {
    let sb = Sandbox::new();
    // Nothing of it is in the store yet: the workspace must be named.
    sb.run(&["cancel", "q1"]).expect_code(66);
    let asked = sb.run(&["cancel", "q1", "-w", "acme/cancel"]);
    asked.expect_code(0);
    assert!(
        asked.stdout().contains("will not run"),
        "{}",
        asked.stdout()
    );

    std::fs::write(sb.queue.join("q1.yaml"), job("q1")).unwrap();
    sb.serve_once(1).expect_code(0);
    let raw = std::fs::read(sb.queue.join("failed/q1.yaml.result.json")).unwrap();
    let result: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["error"]["step"], "start", "{result}");
    assert_eq!(result["steps"], json!([]), "terraform never ran");
    assert!(sb.versions("acme/cancel").await.is_empty());
    assert!(sb.cloud_names().is_empty(), "{:?}", sb.cloud_names());
}

#[tokio::test]
async fn a_running_apply_is_interrupted_soon_after_a_cancel_and_what_it_made_is_kept() {
    let sb = Sandbox::new();
    // The cluster takes a minute to create; the network before it does not.
    sb.faults(json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "slow", "delay_ms": 60000, "times": 1 }]));
    let path = sb.job("c1.yaml", &job("c1"));
    let mut child = sb.start(&["-q", "run", path.to_str().unwrap()]);
    sb.wait_for_log(
        "acme/cancel",
        "c1",
        "testcloud_cluster.main: Creating",
        Duration::from_secs(60),
    )
    .await;

    let asked = Instant::now();
    sb.run(&["cancel", "c1"]).expect_code(0);
    let status = child.wait().unwrap();
    let took = asked.elapsed();
    assert_eq!(status.code(), Some(1), "a cancelled run is not a success");
    // Well before the create's minute: seen within the 2 s poll, then terraform's grace.
    assert!(took < Duration::from_secs(45), "stopped after {took:?}");

    let result = sb.artifact_json("acme/cancel", "c1", "result.json").await;
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["error"]["category"], "cancelled", "{result}");
    assert_eq!(result["error"]["step"], "apply", "{result}");
    let log = sb.run(&["logs", "acme/cancel", "c1"]);
    assert!(
        log.stdout().contains("cancel asked by terrace cancel"),
        "{}",
        log.stdout()
    );
    // `keep`: the network the run made before it was stopped is in the state.
    let state = sb.current_state("acme/cancel");
    let types: Vec<&str> = state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["type"].as_str())
        .collect();
    assert!(types.contains(&"testcloud_network"), "{state}");
    assert!(
        sb.run(&["status", "acme/cancel"])
            .stdout()
            .contains("interrupted"),
        "the workspace is left interrupted"
    );

    // A cancel of a finished job changes nothing and says so.
    let again = sb.run(&["cancel", "c1", "--json"]);
    again.expect_code(0);
    let said: Value = serde_json::from_str(&again.stdout()).unwrap();
    assert_eq!(said["cancelled"], false, "{said}");
    assert_eq!(said["status"], "cancelled", "{said}");
    let after = sb.artifact_json("acme/cancel", "c1", "result.json").await;
    assert_eq!(after, result);
}

/// `on_failure: destroy-created` holds for a cancelled apply too: what it made before the
/// cancel is destroyed (under the lease, in a clean-up of its own), and the result says so.
#[tokio::test]
async fn a_cancelled_apply_with_destroy_created_destroys_what_it_made() {
    let sb = Sandbox::new();
    sb.faults(json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "slow", "delay_ms": 60000, "times": 1 }]));
    let text = job("c2").replace(
        "timeout: 5m\n",
        "timeout: 5m\non_failure: destroy-created\n",
    );
    assert!(text.contains("destroy-created"), "{text}");
    let path = sb.job("c2.yaml", &text);
    let mut child = sb.start(&["-q", "run", path.to_str().unwrap()]);
    sb.wait_for_log(
        "acme/cancel",
        "c2",
        "testcloud_cluster.main: Creating",
        Duration::from_secs(60),
    )
    .await;
    sb.run(&["cancel", "c2"]).expect_code(0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "a cancelled run is not a success");

    let result = sb.artifact_json("acme/cancel", "c2", "result.json").await;
    assert_eq!(result["status"], "cancelled", "{result}");
    let cleanup = &result["cleanup"];
    assert_eq!(cleanup["policy"], "destroy-created", "{result}");
    let destroyed: Vec<&str> = cleanup["destroyed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(destroyed.contains(&"testcloud_network.main"), "{result}");
    assert!(cleanup["error"].is_null(), "{result}");
    // Nothing of the network is left: not in the state, not in the cloud.
    let state = sb.current_state("acme/cancel");
    let left: Vec<&str> = state["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["type"].as_str())
        .collect();
    assert!(!left.contains(&"testcloud_network"), "{state}");
    let cloud = sb.cloud_files();
    assert!(
        !cloud.keys().any(|k| k.starts_with("network/")),
        "{:?}",
        cloud.keys()
    );
}
