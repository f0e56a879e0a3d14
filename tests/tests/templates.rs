//! What templates get from the runner, through real runs of `terrace` with the machine's
//! terraform: the default tags (`terrace_tags`).

use serde_json::{Value, json};
use tests::Sandbox;

fn tagged(id: &str, operation: &str, version: &str, extra: &str) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: tags\noperation: {operation}\n\
         template: {{ name: tagged, version: {version} }}\n\
         variables:\n  name: tagged-net\n{extra}timeout: 5m\n"
    )
}

#[tokio::test]
async fn a_template_declaring_terrace_tags_gets_the_tenant_workspace_job_and_version() {
    let sb = Sandbox::new();
    let run = |id: &str, operation: &str, version: &str, code: i32| {
        let path = sb.job(&format!("{id}.yaml"), &tagged(id, operation, version, ""));
        sb.run(&["run", "-q", path.to_str().unwrap()])
            .expect_code(code);
    };
    run("t1", "apply", "1.0.0", 0);
    let r = sb.artifact_json("acme/tags", "t1", "result.json").await;
    assert_eq!(
        r["outputs"]["tags"]["value"],
        json!({
            "terrace_tenant": "acme",
            "terrace_workspace": "tags",
            "terrace_job": "t1",
            "terrace_template": "tagged",
            "terrace_template_version": "1.0.0",
        }),
        "{r}"
    );
    // The job's record holds what the job set, not the tags (a rollback or a drift check
    // rebuilt from it gets them afresh).
    let record = sb.artifact_json("acme/tags", "t1", "job.json").await;
    assert!(
        record["variables"].get("terrace_tags").is_none(),
        "{record}"
    );

    // A drift check tags as the last apply did, so the tags are not drift.
    run("t2", "drift-check", "1.0.0", 0);
    let r = sb.artifact_json("acme/tags", "t2", "result.json").await;
    assert_eq!(r["drift"], false, "{r}");

    // A new apply, of a new template version, retags.
    run("t3", "apply", "1.1.0", 0);
    let r = sb.artifact_json("acme/tags", "t3", "result.json").await;
    let tags = &r["outputs"]["tags"]["value"];
    assert_eq!(
        (&tags["terrace_job"], &tags["terrace_template_version"]),
        (&Value::from("t3"), &Value::from("1.1.0")),
        "{r}"
    );
    run("t4", "drift-check", "1.1.0", 0);
}

#[tokio::test]
async fn a_job_cannot_set_the_tags_and_a_template_must_declare_them_as_a_map() {
    let sb = Sandbox::new();
    let path = sb.job(
        "bad.yaml",
        &tagged("b1", "apply", "1.0.0", "  terrace_tags: { owner: me }\n"),
    );
    let out = sb.run(&["run", path.to_str().unwrap()]);
    out.expect_code(65);
    assert!(
        out.stderr()
            .contains("variables.terrace_tags: is filled by the runner"),
        "{}",
        out.stderr()
    );

    // A template declaring them as something else is refused, naming the fix.
    let dir = sb.templates.join("badtags/1.0.0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("template.yaml"),
        "variables:\n  terrace_tags: { type: string, required: true }\n",
    )
    .unwrap();
    std::fs::write(dir.join("main.tf"), "variable \"terrace_tags\" {}\n").unwrap();
    let path = sb.job(
        "badtags.yaml",
        "id: b2\ntenant: acme\nworkspace: tags\noperation: plan\ntemplate: { name: badtags, version: 1.0.0 }\n",
    );
    let out = sb.run(&["validate", path.to_str().unwrap()]);
    out.expect_code(65);
    assert!(
        out.stderr().contains("declare it as `{ type: map }`"),
        "{}",
        out.stderr()
    );
}
