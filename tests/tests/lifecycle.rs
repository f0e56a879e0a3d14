//! A workspace's lifecycle through real runs of `terrace` with the machine's terraform: every
//! transition (provisioning, active, updating, deleting, deleted, failed, interrupted), the
//! record and its history that `terrace status` reads, the transition each result carries, and
//! what needs an operator's attention.

use std::time::Duration;

use serde_json::{Value, json};
use tests::Sandbox;

fn job(id: &str, operation: &str, region: &str, nodes: u32, on_failure: &str) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: life\noperation: {operation}\n\
         template: {{ name: demo, version: 1.0.0 }}\n\
         variables:\n  cluster_name: life\n  region: {region}\n  node_count: {nodes}\n  \
         admin_password: correct-horse-battery-staple\ntimeout: 5m\non_failure: {on_failure}\n"
    )
}

/// Runs a job to its end and returns its result.
async fn run(sb: &Sandbox, id: &str, operation: &str, region: &str, code: i32) -> Value {
    let path = sb.job(
        &format!("{id}.yaml"),
        &job(id, operation, region, 2, "keep"),
    );
    sb.run(&["run", "-q", path.to_str().unwrap()])
        .expect_code(code);
    sb.artifact_json("acme/life", id, "result.json").await
}

fn status(sb: &Sandbox) -> Value {
    let shown = sb.run(&["status", "acme/life", "--json"]);
    shown.expect_code(0);
    serde_json::from_str(&shown.stdout()).unwrap()
}

/// `(from, to, job)` of every move in the record's history.
fn moves(status: &Value) -> Vec<(String, String, String)> {
    status["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["from"].as_str().unwrap_or("new").to_owned(),
                t["to"].as_str().unwrap().to_owned(),
                t["job_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn mv(from: &str, to: &str, job: &str) -> (String, String, String) {
    (from.into(), to.into(), job.into())
}

#[tokio::test]
async fn provisioning_active_updating_deleting_deleted_and_a_plan_moves_nothing() {
    let sb = Sandbox::new();
    sb.run(&["status", "acme/life"]).expect_code(66);

    let r = run(&sb, "l1", "apply", "eu-west-1", 0).await;
    assert_eq!(
        (
            r["lifecycle"]["from"].as_str(),
            r["lifecycle"]["to"].as_str()
        ),
        (Some("provisioning"), Some("active")),
        "{r}"
    );
    assert!(r.get("attention").is_none(), "{r}");
    let r = run(&sb, "l2", "apply", "us-east-1", 0).await;
    assert_eq!(
        (
            r["lifecycle"]["from"].as_str(),
            r["lifecycle"]["to"].as_str()
        ),
        (Some("updating"), Some("active"))
    );
    let r = run(&sb, "l3", "plan", "us-east-1", 0).await;
    assert!(r.get("lifecycle").is_none(), "a plan moves nothing: {r}");
    let r = run(&sb, "l4", "destroy", "us-east-1", 0).await;
    assert_eq!(
        (
            r["lifecycle"]["from"].as_str(),
            r["lifecycle"]["to"].as_str()
        ),
        (Some("deleting"), Some("deleted"))
    );
    // After a destroy, the next apply provisions again.
    run(&sb, "l5", "apply", "eu-west-1", 0).await;

    let s = status(&sb);
    assert_eq!(
        (s["status"].as_str(), s["job_id"].as_str()),
        (Some("active"), Some("l5"))
    );
    assert_eq!(s["schema"], 1);
    assert_eq!(
        moves(&s),
        [
            mv("new", "provisioning", "l1"),
            mv("provisioning", "active", "l1"),
            mv("active", "updating", "l2"),
            mv("updating", "active", "l2"),
            mv("active", "deleting", "l4"),
            mv("deleting", "deleted", "l4"),
            mv("deleted", "provisioning", "l5"),
            mv("provisioning", "active", "l5"),
        ]
    );
    let text = sb.run(&["status", "acme/life", "--history", "2"]);
    text.expect_code(0);
    assert!(
        text.stdout().starts_with("acme/life: active since "),
        "{}",
        text.stdout()
    );
    assert_eq!(text.stdout().matches(" l5").count(), 3, "{}", text.stdout());
    assert!(!text.stdout().contains(" l4"), "{}", text.stdout());
}

#[tokio::test]
async fn a_failed_first_apply_is_failed_with_its_reason_then_repeated_failures_need_attention() {
    let sb = Sandbox::new();
    // The cluster's create fails (quota) three times; the network is created and kept.
    sb.faults(
        json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "quota", "times": 3 }]),
    );
    let r = run(&sb, "f1", "apply", "eu-west-1", 1).await;
    assert_eq!(
        (
            r["lifecycle"]["from"].as_str(),
            r["lifecycle"]["to"].as_str()
        ),
        (Some("provisioning"), Some("failed"))
    );
    let reason = r["lifecycle"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("quota at apply: "), "{reason}");
    let kinds: Vec<&str> = r["attention"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["resources-left"], "{r}");
    assert!(
        r["attention"][0]["message"]
            .as_str()
            .unwrap()
            .contains("testcloud_network.main"),
        "{r}"
    );
    // Nothing became active: the next apply provisions again, and fails again.
    run(&sb, "f2", "apply", "eu-west-1", 1).await;
    let r = run(&sb, "f3", "apply", "eu-west-1", 1).await;
    let attention = r["attention"].as_array().unwrap();
    let repeated = attention
        .iter()
        .find(|a| a["kind"] == "failing-repeatedly")
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        repeated["message"]
            .as_str()
            .unwrap()
            .starts_with("the workspace's last 3 runs failed"),
        "{repeated}"
    );
    let s = status(&sb);
    assert_eq!(s["status"], "failed");
    assert_eq!(s["consecutive_failures"], 3);
    assert_eq!(s["exists"], false);
    assert!(
        s["reason"].as_str().unwrap().starts_with("quota at apply"),
        "{s}"
    );
    // The faults are used up: the fourth apply provisions and the count starts again.
    let r = run(&sb, "f4", "apply", "eu-west-1", 0).await;
    assert_eq!(
        (
            r["lifecycle"]["from"].as_str(),
            r["lifecycle"]["to"].as_str()
        ),
        (Some("provisioning"), Some("active"))
    );
    assert_eq!(status(&sb)["consecutive_failures"], 0);
    assert_eq!(
        moves(&status(&sb))[..2],
        [
            mv("new", "provisioning", "f1"),
            mv("provisioning", "failed", "f1")
        ]
    );
}

/// Starts an update that replaces the cluster with a create that takes a minute, and returns
/// the runner once that create is under way.
async fn start_slow_update(sb: &Sandbox, id: &str) -> std::process::Child {
    sb.faults(json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "slow", "delay_ms": 60000, "times": 1 }]));
    // A new region replaces the cluster: a delete, then the slow create.
    let path = sb.job(
        &format!("{id}.yaml"),
        &job(id, "apply", "us-east-1", 2, "keep"),
    );
    let child = sb.start(&["-q", "run", path.to_str().unwrap()]);
    // The cluster's slow create has begun (its delete came first).
    sb.wait_for_log(
        "acme/life",
        id,
        "testcloud_cluster.main: Creating",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(status(sb)["status"], "updating");
    child
}

#[tokio::test]
async fn an_interrupted_update_is_recorded_whether_the_runner_is_stopped_or_killed() {
    let mut sb = Sandbox::new();
    sb.env.push(("TERRACE_LEASE_TTL".into(), "2".into()));
    run(&sb, "i1", "apply", "eu-west-1", 0).await;

    // Stopped (SIGTERM): terraform is interrupted, the run ends cancelled, the workspace
    // interrupted, and the result says it needs attention.
    let mut runner = start_slow_update(&sb, "i2").await;
    nix_kill(runner.id(), "TERM");
    assert_eq!(runner.wait().unwrap().code(), Some(1));
    let r = sb.artifact_json("acme/life", "i2", "result.json").await;
    assert_eq!(r["status"], "cancelled", "{r}");
    assert_eq!(
        (
            r["lifecycle"]["from"].as_str(),
            r["lifecycle"]["to"].as_str()
        ),
        (Some("updating"), Some("interrupted"))
    );
    assert!(
        r["attention"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["kind"] == "interrupted"),
        "{r}"
    );

    // Killed (SIGKILL): no result and no record of its end; the next job, once the lease has
    // expired, records it as interrupted before its own update, and flags it.
    let mut runner = start_slow_update(&sb, "i3").await;
    nix_kill(runner.id(), "KILL");
    runner.wait().unwrap();
    assert_eq!(
        status(&sb)["status"],
        "updating",
        "nothing recorded the kill yet"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = run(&sb, "i4", "apply", "eu-west-1", 0).await;
    let flagged = r["attention"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "interrupted")
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        flagged["message"].as_str().unwrap().contains("job i3"),
        "{flagged}"
    );
    let s = status(&sb);
    assert_eq!(s["status"], "active");
    let history = moves(&s);
    assert_eq!(
        history[history.len() - 5..],
        [
            mv("updating", "interrupted", "i2"),
            mv("interrupted", "updating", "i3"),
            mv("updating", "interrupted", "i3"),
            mv("interrupted", "updating", "i4"),
            mv("updating", "active", "i4"),
        ]
    );
    let i3 = &s["history"][history.len() - 3];
    assert!(
        i3["reason"]
            .as_str()
            .unwrap()
            .contains("stopped without finishing"),
        "{i3}"
    );
}

fn nix_kill(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid}");
}
