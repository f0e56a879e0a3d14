//! Runs in order with the machine's terraform (`sequence`): on the local queue and the CLI, a
//! request that comes back after a later one ran never puts its older configuration back.

use serde_json::Value;
use tests::{Sandbox, demo_job};

fn with_sequence(id: &str, cluster: &str, sequence: &str) -> String {
    format!(
        "{}sequence: {sequence}\n",
        demo_job(id, "ordered", "apply", cluster, 1)
    )
}

fn cluster_name(sb: &Sandbox) -> String {
    let state = sb.current_state("acme/ordered");
    let resources = state["resources"].as_array().expect("resources");
    let cluster = resources
        .iter()
        .find(|r| r["type"] == "testcloud_cluster")
        .expect("a cluster in the state");
    cluster["instances"][0]["attributes"]["name"]
        .as_str()
        .expect("the cluster's name")
        .to_owned()
}

fn queued_result(sb: &Sandbox, folder: &str, name: &str) -> Value {
    let path = sb.queue.join(folder).join(format!("{name}.result.json"));
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&raw).unwrap()
}

#[tokio::test]
async fn an_older_request_that_comes_back_after_a_later_one_ran_is_superseded() {
    let sb = Sandbox::new();
    // B, the later request (sequence 2), gets the workspace first and applies.
    let b = sb.job("b.yaml", &with_sequence("job-b", "beta", "2"));
    sb.run(&["run", "-q", b.to_str().unwrap()]).expect_code(0);
    assert_eq!(cluster_name(&sb), "beta");
    let versions = sb.versions("acme/ordered").await.len();

    // A, the earlier request (sequence 1), comes back through the queue: it never runs.
    std::fs::write(
        sb.queue.join("a.yaml"),
        with_sequence("job-a", "alpha", "1"),
    )
    .unwrap();
    let serve = sb.serve_once(1);
    serve.expect_code(0);
    let a = queued_result(&sb, "failed", "a.yaml");
    assert_eq!(a["status"], "superseded", "{a}");
    assert_eq!(a["superseded_by"]["job_id"], "job-b", "{a}");
    assert_eq!(a["superseded_by"]["sequence"], 2, "{a}");
    assert_eq!(
        a["steps"],
        serde_json::json!([]),
        "terraform never ran: {a}"
    );
    assert_eq!(cluster_name(&sb), "beta", "A put its configuration back");
    assert_eq!(sb.versions("acme/ordered").await.len(), versions);

    // `terrace run` says so, and fails: the request was not carried out.
    let again = sb.job("a-again.yaml", &with_sequence("job-a2", "alpha", "2"));
    let run = sb.run(&["run", "-q", again.to_str().unwrap()]);
    run.expect_code(1);
    assert!(run.stdout().contains("superseded"), "{}", run.stdout());
    assert!(run.stdout().contains("job-b"), "{}", run.stdout());

    // A later request runs; so does one without a sequence (ordered by the lease alone).
    let c = sb.job("c.yaml", &with_sequence("job-c", "gamma", "3"));
    sb.run(&["run", "-q", c.to_str().unwrap()]).expect_code(0);
    assert_eq!(cluster_name(&sb), "gamma");
    let d = sb.job("d.yaml", &demo_job("job-d", "ordered", "apply", "delta", 1));
    sb.run(&["run", "-q", d.to_str().unwrap()]).expect_code(0);
    assert_eq!(cluster_name(&sb), "delta");
    let recorded = sb
        .artifact_json("acme/ordered", "_workspace", "sequence.json")
        .await;
    assert_eq!(recorded["job_id"], "job-c");
    assert_eq!(recorded["sequence"], 3);
}

#[tokio::test]
async fn a_sequence_that_is_not_a_positive_integer_is_refused_before_anything_runs() {
    let sb = Sandbox::new();
    for (name, sequence) in [("zero", "0"), ("text", "soon"), ("fraction", "1.5")] {
        let path = sb.job(
            &format!("{name}.yaml"),
            &with_sequence(&format!("job-{name}"), "alpha", sequence),
        );
        let run = sb.run(&["validate", path.to_str().unwrap()]);
        run.expect_code(65);
        let said = format!("{}{}", run.stdout(), run.stderr());
        assert!(said.contains("sequence"), "{sequence}: {said}");
        assert!(said.contains("positive integer"), "{sequence}: {said}");
    }
    assert!(sb.versions("acme/ordered").await.is_empty());
}
