//! Failures a person can trust: injected cloud faults through real terraform, classified,
//! retried when transient, reported at once when not.

use serde_json::{Value, json};
use tests::{Sandbox, demo_job};

/// The demo job with a fast retry policy, so tests do not wait for production delays.
fn job_with_retry(id: &str, workspace: &str, cluster: &str) -> String {
    format!(
        "{}retry: {{ attempts: 5, base: 200ms, cap: 2s }}\n",
        demo_job(id, workspace, "apply", cluster, 1)
    )
}

#[tokio::test]
async fn a_transient_failure_three_times_is_retried_with_growing_backoff_then_succeeds() {
    let sb = Sandbox::new();
    sb.faults(json!([{ "resource": "testcloud_cluster", "name": "flaky", "op": "create", "kind": "transient", "times": 3 }]));
    let job = sb.job("t1.yaml", &job_with_retry("t1", "flaky", "flaky"));
    let run = sb.run(&["run", "-q", job.to_str().unwrap()]);
    run.expect_code(0);
    assert!(run.stdout().contains("attempts:   4"), "{}", run.stdout());

    let result = sb.artifact_json("acme/flaky", "t1", "result.json").await;
    assert_eq!(result["status"], "succeeded");
    let attempts = result["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4, "{result}");
    let mut ceilings = Vec::new();
    for a in &attempts[..3] {
        assert_eq!(a["error"]["category"], "transient", "{a}");
        assert_eq!(a["error"]["step"], "apply");
        assert!(
            a["error"]["message"]
                .as_str()
                .unwrap()
                .contains("RequestLimitExceeded"),
            "{a}"
        );
        let (wait, ceiling) = (
            a["retry_after_ms"].as_u64().unwrap(),
            a["max_retry_after_ms"].as_u64().unwrap(),
        );
        assert!(wait <= ceiling, "{a}");
        ceilings.push(ceiling);
    }
    assert_eq!(ceilings, [200, 400, 800], "the backoff ceiling doubles");
    assert!(attempts[3]["error"].is_null());
    assert_eq!(sb.faults_left()[0]["times"], 0);
    // Both resources exist once: the retries created no duplicates.
    let names = sb.cloud_names();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[tokio::test]
async fn a_quota_error_fails_at_once_with_the_quota_hint() {
    let sb = Sandbox::new();
    sb.faults(
        json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "quota", "times": 5 }]),
    );
    let job = sb.job("q1.yaml", &job_with_retry("q1", "quota", "big"));
    let run = sb.run(&["run", "-q", job.to_str().unwrap()]);
    run.expect_code(1);
    let result = sb.artifact_json("acme/quota", "q1", "result.json").await;
    assert_eq!(result["status"], "failed");
    assert_eq!(result["error"]["category"], "quota", "{result}");
    assert_eq!(result["error"]["step"], "apply");
    assert_eq!(result["error"]["retryable"], false);
    assert!(
        result["error"]["message"]
            .as_str()
            .unwrap()
            .contains("vCPU limit 32"),
        "{result}"
    );
    assert!(
        result["error"]["hint"].as_str().unwrap().contains("quota"),
        "{result}"
    );
    assert_eq!(
        result["attempts"].as_array().unwrap().len(),
        1,
        "a quota error was retried"
    );
    assert_eq!(
        sb.faults_left()[0]["times"],
        4,
        "the create was tried more than once"
    );
    assert!(
        run.stdout().contains("hint:       a quota"),
        "{}",
        run.stdout()
    );
}

#[tokio::test]
async fn an_auth_error_fails_at_once() {
    let sb = Sandbox::new();
    sb.faults(
        json!([{ "resource": "testcloud_network", "op": "create", "kind": "auth", "times": 5 }]),
    );
    let job = sb.job("a1.yaml", &job_with_retry("a1", "auth", "denied"));
    sb.run(&["run", "-q", job.to_str().unwrap()]).expect_code(1);
    let result = sb.artifact_json("acme/auth", "a1", "result.json").await;
    assert_eq!(result["error"]["category"], "auth", "{result}");
    assert_eq!(result["error"]["retryable"], false);
    assert!(
        result["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("credentials"),
        "{result}"
    );
    assert_eq!(result["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(sb.faults_left()[0]["times"], 4);
    assert!(sb.cloud_files().is_empty(), "nothing was created");
}

fn fleet_job(id: &str, networks: &[&str], on_failure: &str) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: fleet\noperation: apply\ntemplate: {{ name: fleet, version: 1.0.0 }}\n\
         variables: {{ networks: {} }}\non_failure: {on_failure}\n",
        serde_json::to_string(networks).unwrap()
    )
}

/// Two networks exist; a second apply adds three more, and the third of those fails (quota):
/// two were created by the failed run.
async fn partial_apply(
    sb: &Sandbox,
    on_failure: &str,
) -> (Value, std::collections::BTreeMap<String, String>) {
    let first = sb.job("f1.yaml", &fleet_job("f1", &["a", "b"], "keep"));
    sb.run(&["run", "-q", first.to_str().unwrap()])
        .expect_code(0);
    let before = sb.cloud_files();
    assert_eq!(before.len(), 2);
    sb.faults(json!([{ "resource": "testcloud_network", "name": "e", "op": "create", "kind": "quota", "times": 1 }]));
    let second = sb.job(
        "f2.yaml",
        &fleet_job("f2", &["a", "b", "c", "d", "e"], on_failure),
    );
    sb.run(&["run", "-q", second.to_str().unwrap()])
        .expect_code(1);
    (
        sb.artifact_json("acme/fleet", "f2", "result.json").await,
        before,
    )
}

#[tokio::test]
async fn destroy_created_removes_exactly_what_the_failed_run_created() {
    let sb = Sandbox::new();
    let (result, before) = partial_apply(&sb, "destroy-created").await;
    assert_eq!(result["error"]["category"], "quota", "{result}");
    let cleanup = &result["cleanup"];
    assert_eq!(cleanup["policy"], "destroy-created");
    assert_eq!(
        cleanup["created"],
        json!(["testcloud_network.n[\"c\"]", "testcloud_network.n[\"d\"]"]),
        "{result}"
    );
    assert_eq!(cleanup["destroyed"], cleanup["created"]);
    assert_eq!(cleanup["left"], json!([]));
    assert!(cleanup["error"].is_null(), "{cleanup}");
    assert_eq!(sb.cloud_names(), ["a", "b"]);
    // The networks that existed before the job are untouched, byte for byte.
    for (path, content) in &before {
        assert_eq!(&sb.cloud_files()[path], content);
    }
    let state = sb.current_state("acme/fleet");
    assert_eq!(
        state["resources"][0]["instances"].as_array().unwrap().len(),
        2
    );
}

#[tokio::test]
async fn keep_leaves_what_the_failed_run_created_and_lists_it() {
    let sb = Sandbox::new();
    let (result, _) = partial_apply(&sb, "keep").await;
    let cleanup = &result["cleanup"];
    assert_eq!(cleanup["policy"], "keep");
    assert_eq!(
        cleanup["created"],
        json!(["testcloud_network.n[\"c\"]", "testcloud_network.n[\"d\"]"]),
        "{result}"
    );
    assert_eq!(cleanup["left"], cleanup["created"]);
    assert_eq!(cleanup["destroyed"], json!([]));
    assert_eq!(sb.cloud_names(), ["a", "b", "c", "d"]);
}

fn cloud_id(sb: &Sandbox, name: &str) -> String {
    sb.cloud_files()
        .values()
        .map(|c| serde_json::from_str::<Value>(c).unwrap())
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in the cloud"))["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_false_failure_is_retried_then_imported_and_no_duplicate_exists() {
    let sb = Sandbox::new();
    // The cloud makes network "c" but answers with an error.
    sb.faults(json!([{ "resource": "testcloud_network", "name": "c", "op": "create", "kind": "false-failure", "times": 1 }]));
    let text = format!(
        "{}retry: {{ attempts: 5, base: 200ms, cap: 2s }}\n",
        fleet_job("ff1", &["a", "b", "c"], "keep")
    );
    let job = sb.job("ff1.yaml", &text);
    let run = sb.run(&["run", "-q", job.to_str().unwrap()]);
    run.expect_code(0);
    assert!(
        run.stdout()
            .contains("recovered:  imported testcloud_network.n[\"c\"] as net-"),
        "{}",
        run.stdout()
    );
    let result = sb.artifact_json("acme/fleet", "ff1", "result.json").await;
    assert_eq!(result["status"], "succeeded", "{result}");

    // 1: the false failure (transient); 2: "already exists" (imported); 3: done.
    let attempts = result["attempts"].as_array().unwrap();
    let categories: Vec<&Value> = attempts.iter().map(|a| &a["error"]["category"]).collect();
    assert_eq!(
        categories,
        [
            &json!("transient"),
            &json!("provider-conflict"),
            &Value::Null
        ],
        "{result}"
    );
    assert_eq!(
        // The instance, as terraform's diagnostic names it.
        attempts[1]["error"]["address"],
        "testcloud_network.n[\"c\"]",
        "{result}"
    );
    let id = cloud_id(&sb, "c");
    assert_eq!(
        result["recovered"],
        json!([{
            "action": "imported",
            "address": "testcloud_network.n[\"c\"]",
            "id": id,
            "after": attempts[1]["error"]["message"],
        }]),
        "{result}"
    );
    // One network per name in the cloud, and the state knows each by its cloud id.
    assert_eq!(sb.cloud_names(), ["a", "b", "c"]);
    let state = sb.current_state("acme/fleet");
    let instances = state["resources"][0]["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 3, "{state}");
    let c = instances
        .iter()
        .find(|i| i["index_key"] == "c")
        .expect("c in the state");
    assert_eq!(c["attributes"]["id"], id.as_str());
    let log = shared::run::logs::read_log(&sb.fs_store(), &"acme/fleet".parse().unwrap(), "ff1")
        .await
        .unwrap();
    assert!(
        log.iter()
            .any(|l| l.text.contains("already exists in the cloud") && l.text.contains(&id)),
        "the log says what was imported"
    );
}

#[tokio::test]
async fn a_hanging_create_is_killed_and_the_next_apply_imports_what_it_left() {
    let sb = Sandbox::new();
    // The network is made at once; the cluster's create never returns, even when interrupted.
    sb.faults(
        json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "hang", "times": 1 }]),
    );
    let text = demo_job("h1", "hang", "apply", "stuck", 1).replace("timeout: 5m", "timeout: 15s");
    let job = sb.job("h1.yaml", &text);
    sb.run(&["run", "-q", job.to_str().unwrap()]).expect_code(1);
    let result = sb.artifact_json("acme/hang", "h1", "result.json").await;
    assert_eq!(result["status"], "timed-out", "{result}");
    assert_eq!(result["error"]["step"], "apply");
    let message = result["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("was killed") && message.contains("may exist in the cloud"),
        "{message}"
    );
    let ws: state_backends::WorkspaceId = "acme/hang".parse().unwrap();
    {
        use state_backends::StateStore;
        assert!(sb.fs_store().lease(&ws).await.unwrap().is_none());
    }
    // The network was made in the cloud; whether terraform saved it before it was killed
    // depends on the terraform version.
    assert_eq!(sb.cloud_names(), ["stuck-net"]);
    let saved = sb.versions("acme/hang").await.last().is_some_and(|_| {
        sb.current_state("acme/hang")["resources"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    });

    // The next apply finishes the job without a second network.
    let next = sb.job("h2.yaml", &demo_job("h2", "hang", "apply", "stuck", 1));
    sb.run(&["run", "-q", next.to_str().unwrap()])
        .expect_code(0);
    let result = sb.artifact_json("acme/hang", "h2", "result.json").await;
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(sb.cloud_names(), ["stuck", "stuck-net"]);
    if !saved {
        assert_eq!(
            result["recovered"][0]["address"], "testcloud_network.main",
            "{result}"
        );
        assert_eq!(result["recovered"][0]["id"], cloud_id(&sb, "stuck-net"));
    }
}

/// Two workspaces that name their objects alike: the second meets "already exists" for objects
/// the first made, which no run of its own was creating, so it fails and imports nothing. Its
/// destroy would otherwise delete the first workspace's network and cluster.
#[tokio::test]
async fn an_object_another_workspace_made_is_not_imported() {
    let sb = Sandbox::new();
    let first = sb.job("o1.yaml", &demo_job("o1", "owner", "apply", "shared", 1));
    sb.run(&["run", "-q", first.to_str().unwrap()])
        .expect_code(0);
    let made = sb.cloud_names();
    assert_eq!(made, ["shared", "shared-net"]);

    let second = sb.job("o2.yaml", &demo_job("o2", "other", "apply", "shared", 1));
    let run = sb.run(&["run", "-q", second.to_str().unwrap()]);
    run.expect_code(1);
    let result = sb.artifact_json("acme/other", "o2", "result.json").await;
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["error"]["category"], "provider-conflict", "{result}");
    let hint = result["error"]["hint"].as_str().unwrap();
    assert!(
        hint.contains("no run of this workspace was creating testcloud_network.main")
            && hint.contains(&format!(
                "terraform import testcloud_network.main {}",
                cloud_id(&sb, "shared-net")
            )),
        "{hint}"
    );
    assert!(
        !hint.contains("import it into the state, or delete it"),
        "the hint says why it was not imported, not also the general advice: {hint}"
    );
    assert!(result.get("recovered").is_none(), "{result}");
    // Nothing adopted: the second workspace's state, if it has one, holds none of the first
    // one's objects.
    if !sb.versions("acme/other").await.is_empty() {
        let state = sb.current_state("acme/other");
        assert!(
            state["resources"].as_array().is_none_or(|r| r.is_empty()),
            "{state}"
        );
    }
    assert_eq!(sb.cloud_names(), made);
}

fn tiers_job(id: &str, version: &str, cidr: &str, extra: &[&str], on_failure: &str) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: tiers\noperation: apply\ntemplate: {{ name: tiers, version: {version} }}\n\
         variables: {{ cidr: \"{cidr}\", token: tok-3f9a-77c1, extra: {} }}\non_failure: {on_failure}\n",
        serde_json::to_string(extra).unwrap()
    )
    .replace(", extra: []", "")
}

#[tokio::test]
async fn rollback_returns_the_workspace_to_its_last_successful_apply() {
    let sb = Sandbox::new();
    let first = sb.job(
        "r1.yaml",
        &tiers_job("r1", "1.0.0", "10.0.0.0/16", &[], "keep"),
    );
    sb.run(&["run", "-q", first.to_str().unwrap()])
        .expect_code(0);
    let before = sb.cloud_files();
    let state_before = sb.current_state("acme/tiers");

    // The upgrade changes the core network in place, then fails creating the extra "y".
    sb.faults(json!([{ "resource": "testcloud_network", "name": "y", "op": "create", "kind": "quota", "times": 1 }]));
    let upgrade = sb.job(
        "r2.yaml",
        &tiers_job("r2", "1.1.0", "10.1.0.0/16", &["x", "y"], "rollback"),
    );
    let run = sb.run(&["run", "-q", upgrade.to_str().unwrap()]);
    run.expect_code(1);
    assert!(
        run.stdout()
            .contains("rolled back to the configuration of r1"),
        "{}",
        run.stdout()
    );
    let result = sb.artifact_json("acme/tiers", "r2", "result.json").await;
    assert_eq!(result["error"]["category"], "quota", "{result}");
    let cleanup = &result["cleanup"];
    assert_eq!(cleanup["policy"], "rollback");
    assert_eq!(cleanup["rolled_back_to"], "r1", "{result}");
    assert_eq!(
        cleanup["reverted"],
        json!(["testcloud_network.core"]),
        "{result}"
    );
    assert_eq!(cleanup["destroyed"], cleanup["created"], "{result}");
    assert_eq!(cleanup["left"], json!([]), "{result}");
    assert!(cleanup["error"].is_null(), "{result}");

    // The cloud is as it was after r1, byte for byte, and so is what the state says of it.
    assert_eq!(sb.cloud_files(), before);
    let state = sb.current_state("acme/tiers");
    assert_eq!(state["resources"], state_before["resources"]);
    assert!(!result.to_string().contains("tok-3f9a-77c1"));
}

#[tokio::test]
async fn rollback_of_a_first_apply_destroys_what_it_created() {
    let sb = Sandbox::new();
    sb.faults(json!([{ "resource": "testcloud_network", "name": "y", "op": "create", "kind": "quota", "times": 1 }]));
    let job = sb.job(
        "r1.yaml",
        &tiers_job("r1", "1.1.0", "10.1.0.0/16", &["y"], "rollback"),
    );
    sb.run(&["run", "-q", job.to_str().unwrap()]).expect_code(1);
    let result = sb.artifact_json("acme/tiers", "r1", "result.json").await;
    let cleanup = &result["cleanup"];
    assert_eq!(
        cleanup["created"],
        json!(["testcloud_network.core"]),
        "{result}"
    );
    assert_eq!(cleanup["destroyed"], cleanup["created"]);
    assert!(cleanup["rolled_back_to"].is_null());
    assert!(
        cleanup["error"]
            .as_str()
            .unwrap()
            .contains("no earlier apply succeeded"),
        "{result}"
    );
    assert!(sb.cloud_files().is_empty());
}
