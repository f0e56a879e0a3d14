//! The demo's policy set (`policies/demo`) as every trigger's tests hold a job to it: a
//! cluster of more than 8 nodes is denied, small nodes are warned about.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// What the demo's set denies for a cluster of 12 nodes.
pub const DENIED: &str =
    "testcloud_cluster.main would have 12 nodes; clusters of more than 8 need a capacity review";
/// What it warns about for the demo template's default (small) nodes.
pub const WARNED: &str = "testcloud_cluster.main runs on small nodes: not for production";

/// The repository's demo set.
pub fn demo() -> PathBuf {
    crate::repo_root().join("policies/demo")
}

/// A set in `dir` with one file that does not parse (line 6), for a runner to refuse at start.
pub fn broken(dir: &Path) -> PathBuf {
    let folder = dir.join("broken-policies");
    std::fs::create_dir_all(&folder).expect("policy folder");
    std::fs::write(
        folder.join("broken.rego"),
        "package broken\n\nimport rego.v1\n\ndeny contains msg if {\n    msg := \n}\n",
    )
    .expect("policy file");
    folder
}

/// The messages of a result's `deny` or `warn` verdicts.
pub fn messages<'a>(result: &'a Value, kind: &str) -> Vec<&'a str> {
    result["policy"][kind]
        .as_array()
        .unwrap_or_else(|| panic!("no {kind} verdicts in {result}"))
        .iter()
        .map(|v| v["message"].as_str().expect("a message"))
        .collect()
}

/// A result stopped by the demo set's deny, before anything was applied.
pub fn assert_denied(result: &Value) {
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["error"]["category"], "policy", "{result}");
    assert_eq!(result["error"]["step"], "policy", "{result}");
    assert!(
        result["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(DENIED)),
        "{result}"
    );
    assert_eq!(messages(result, "deny"), [DENIED]);
    assert!(
        !crate::step_names(result).contains(&"apply".to_owned()),
        "{result}"
    );
}

/// A result that went through with the demo set's warning.
pub fn assert_warned(result: &Value) {
    assert_eq!(result["status"], "succeeded", "{result}");
    assert!(messages(result, "deny").is_empty(), "{result}");
    assert_eq!(messages(result, "warn"), [WARNED]);
}

/// A queue message applying the demo template in `acme/policy`, with `nodes` nodes (the
/// template's default, 1, when none).
pub fn demo_message(id: &str, nodes: Option<u32>) -> Value {
    let mut variables = serde_json::json!({
        "cluster_name": "policy", "region": "eu-west-1", "admin_password": "correct-horse-battery",
    });
    if let Some(nodes) = nodes {
        variables["node_count"] = nodes.into();
    }
    serde_json::json!({
        "job": {
            "id": id, "tenant": "acme", "workspace": "policy", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" },
            "variables": variables,
            "timeout": "5m",
        },
    })
}

/// Starts `runner` (a function's command, its settings naming [`broken`]'s set) and asserts
/// it stops at start: exit 78, naming the file with its line and column.
pub fn assert_refused_at_start(mut runner: std::process::Command) {
    let out = runner
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("the runner starts");
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("broken.rego:6:9"), "{said}");
}
