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
    let names: Vec<String> = sb
        .cloud_files()
        .values()
        .map(|c| {
            serde_json::from_str::<Value>(c).unwrap()["name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
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
