//! Unit tests of `validate`.

use super::*;

const SPEC: &str = r#"
variables:
  region: { type: string, required: true, enum: [eu-west-1, us-east-1] }
  name: { type: string, required: true, pattern: "^[a-z][a-z0-9-]{2,30}$" }
  node_count: { type: number, default: 1, min: 1, max: 20 }
  ha: { type: bool, default: false }
  tags: { type: map, default: {} }
  password: { type: string, sensitive: true, default: "", pattern: "^.{0,64}$" }
  pin: { type: number, sensitive: true, default: 1, max: 9999 }
rules:
  - when: { ha: true }
    require: { node_count: { min: 3 } }
    message: a highly available cluster needs at least 3 nodes
"#;

fn templates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("k8s/1.0.0");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(t.join("template.yaml"), SPEC).unwrap();
    std::fs::write(t.join("main.tf"), "").unwrap();
    dir
}

fn check(text: &str) -> Result<ValidatedJob, Vec<ValidationError>> {
    let root = templates();
    validate(&RawJob::parse(text).unwrap(), root.path())
}

const GOOD: &str = r#"
id: job-1
tenant: acme
workspace: prod
operation: apply
template: { name: k8s, version: 1.0.0 }
variables: { region: eu-west-1, name: main, ha: true, node_count: 3, password: hunter22 }
timeout: 10m
on_failure: destroy-created
"#;

#[test]
fn a_good_job_gets_defaults_and_its_secrets_listed() {
    let job = check(GOOD).unwrap();
    assert_eq!(job.job.timeout, Duration::from_secs(600));
    assert_eq!(job.job.on_failure, OnFailure::DestroyCreated);
    assert_eq!(job.job.variables["tags"], serde_json::json!({}));
    assert_eq!(job.sensitive_values, vec!["hunter22".to_owned()]);
}

#[test]
fn every_mistake_is_reported_with_its_field_and_a_fix() {
    let bad = r#"
id: job-1
tenant: Acme
workspace: prod
operation: deploy
regoin: eu
template: { name: k8s, version: 1.0.0 }
variables: { region: mars-1, name: "9bad", ha: true, node_count: 2, colour: red }
timeout: forever
"#;
    let errors = check(bad).unwrap_err();
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "regoin",
            "tenant",
            "operation",
            "timeout",
            "variables.colour",
            "variables.name",
            "variables.region",
            "variables.node_count",
        ],
        "{errors:#?}"
    );
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert!(
        text[0].contains("did you mean \"region\"") || text[0].contains("remove it"),
        "{}",
        text[0]
    );
    assert!(
        text[2].contains("\"deploy\" is not an operation"),
        "{}",
        text[2]
    );
    assert!(
        text[6].contains("use one of \"eu-west-1\", \"us-east-1\""),
        "{}",
        text[6]
    );
    assert!(text[7].contains("at least 3 nodes"), "{}", text[7]);
}

#[test]
fn sensitive_values_never_appear_in_errors() {
    let errors = check(&GOOD.replace("hunter22", &"s".repeat(70))).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(!errors[0].to_string().contains("sss"), "{}", errors[0]);
    assert!(errors[0].to_string().contains("(sensitive value)"));
}

#[test]
fn retry_policies_are_checked_field_by_field() {
    let job = check(&format!(
        "{GOOD}retry: {{ attempts: 3, base: 250ms, cap: 2s }}\n"
    ))
    .unwrap();
    assert_eq!(job.job.retry.attempts, 3);
    assert_eq!(job.job.retry.base, Duration::from_millis(250));
    assert_eq!(check(GOOD).unwrap().job.retry, RetryPolicy::default());
    let errors = check(&format!(
        "{GOOD}retry: {{ attempts: 0, bas: 1s, cap: soon }}\n"
    ))
    .unwrap_err();
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["retry.attempts", "retry.bas", "retry.cap"],
        "{errors:#?}"
    );
    assert!(errors[1].fix.contains("did you mean \"base\""));
    let errors = check(&format!("{GOOD}retry: {{ base: 10s, cap: 1s }}\n")).unwrap_err();
    assert_eq!(errors[0].field, "retry.cap");
}

#[test]
fn missing_template_and_wrong_types() {
    let errors = check(
        "id: j\ntenant: a\nworkspace: w\noperation: plan\ntemplate: { name: nope, version: '1' }\n",
    )
    .unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].problem.contains("does not exist"),
        "{}",
        errors[0]
    );

    let errors = check(&GOOD.replace("node_count: 3", "node_count: \"3\"")).unwrap_err();
    assert_eq!(errors[0].field, "variables.node_count");
    assert!(
        errors[0]
            .problem
            .contains("must be a number, found a string")
    );

    let errors = check(&GOOD.replace("name: k8s", "name: ../../etc")).unwrap_err();
    assert_eq!(errors[0].field, "template.name");
}

#[test]
fn suggestions_find_close_names() {
    assert_eq!(
        suggest("workspce", &FIELDS, "x"),
        "did you mean \"workspace\"?"
    );
    assert_eq!(suggest("zzzzzz", &FIELDS, "remove it"), "remove it");
}

#[test]
fn free_text_searches_strings_and_long_numbers_never_booleans_or_short_numbers() {
    use serde_json::json;
    assert_eq!(secret_strings(&json!("pw")), vec!["pw".to_owned()]);
    assert!(secret_strings(&json!(true)).is_empty());
    assert!(secret_strings(&json!(1)).is_empty());
    assert!(secret_strings(&json!(443)).is_empty());
    assert_eq!(secret_strings(&json!(4711)), vec!["4711".to_owned()]);
    assert_eq!(
        secret_strings(&json!({ "a": ["x-secret", 12345, false] })),
        vec!["x-secret".to_owned(), "12345".to_owned()]
    );
}

#[test]
fn a_huge_value_is_quoted_short_so_the_rejection_stays_small() {
    let huge = "x".repeat(5 * 1024 * 1024);
    let errors = check(&format!(
        "id: j1\ntenant: acme\nworkspace: demo\noperation: apply\ntemplate: {{ name: k8s, version: 1.0.0 }}\nvariables: {{ region: \"{huge}\", name: good-name }}\n"
    ))
    .unwrap_err();
    let all = serde_json::to_string(&errors).unwrap();
    assert!(all.len() < 4096, "{} bytes of rejection", all.len());
    assert!(all.contains("characters)"), "{all}");
}

#[test]
fn a_sensitive_value_out_of_range_is_never_quoted_not_even_as_a_number() {
    let job = GOOD.replace("password: hunter22", "password: hunter22, pin: 424242");
    let errors = check(&job).unwrap_err();
    let text = serde_json::to_string(&errors).unwrap();
    assert!(!text.contains("424242"), "{text}");
    assert!(text.contains("must be at most 9999"), "{text}");
    // A plain one still says what it found.
    let job = GOOD.replace("node_count: 3", "node_count: 42");
    let text = serde_json::to_string(&check(&job).unwrap_err()).unwrap();
    assert!(text.contains("found 42"), "{text}");
}

#[test]
fn a_job_id_ending_with_a_dot_is_refused() {
    // Azure Blob would store `job-1.`'s run in `job-1`'s folder.
    let errors = check(&GOOD.replace("id: job-1", "id: job-1.")).unwrap_err();
    assert_eq!(errors[0].field, "id", "{errors:?}");
    assert!(errors[0].fix.contains("not ending with '.'"), "{errors:?}");
    assert!(check(&GOOD.replace("id: job-1", "id: job-1.2")).is_ok());
}

/// The approval flow's fields: each misuse is refused naming its field and the fix.
#[test]
fn approval_fields_are_checked_against_the_operation_and_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("app/1.0.0");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(
        t.join("template.yaml"),
        "variables:\n  name: { type: string, required: true }\n  token: { type: string, required: true, sensitive: true, ephemeral: true }\n",
    )
    .unwrap();
    std::fs::write(
        t.join("main.tf"),
        "variable \"token\" {\n  type = string\n  sensitive = true\n  ephemeral = true\n}\n",
    )
    .unwrap();
    let check = |extra: &str| {
        let text = format!(
            "id: j1\ntenant: acme\nworkspace: web\ntemplate: {{ name: app, version: 1.0.0 }}\n{extra}"
        );
        validate(&RawJob::parse(&text).unwrap(), dir.path())
    };
    let fields = |extra: &str| -> Vec<(String, String)> {
        check(extra)
            .unwrap_err()
            .into_iter()
            .map(|e| (e.field, format!("{} / {}", e.problem, e.fix)))
            .collect()
    };
    let key = "k".repeat(PLAN_KEY_CHARS);

    // A plan for approval, and its apply with only the ephemeral variable.
    let plan =
        check("operation: plan\ndestroy: true\nvariables: { name: web, token: t0k3n }\n").unwrap();
    assert!(plan.job.destroy);
    assert_eq!(
        plan.sensitive_values,
        vec!["t0k3n".to_owned()],
        "ephemeral values are secret"
    );
    let apply = check(&format!(
        "operation: apply\nplan: p1\nplan_key: {key}\nvariables: {{ token: t0k3n }}\n"
    ))
    .unwrap();
    assert_eq!(apply.job.plan.as_deref(), Some("p1"));
    assert_eq!(apply.job.plan_key.as_deref(), Some(key.as_str()));
    assert_eq!(apply.job.variables.len(), 1, "only the ephemeral variable");
    assert!(
        apply.sensitive_values.contains(&key),
        "the plan's key is a secret"
    );

    for (extra, field, says) in [
        (
            "operation: plan\nplan: p1\nvariables: { name: web, token: t }\n",
            "plan",
            "a plan job does not do",
        ),
        (
            "operation: drift-check\nplan: p1\nvariables: { name: web, token: t }\n",
            "plan",
            "a drift-check job does not do",
        ),
        (
            "operation: apply\nplan: ../p1\nvariables: { token: t }\n",
            "plan",
            "is not a plan job's id",
        ),
        (
            "operation: apply\nplan: 7\nvariables: { token: t }\n",
            "plan",
            "must be a plan job's id, found a number",
        ),
        (
            "operation: apply\ndestroy: true\nvariables: { name: web, token: t }\n",
            "destroy",
            "is for plan jobs only",
        ),
        (
            "operation: plan\ndestroy: yes please\nvariables: { name: web, token: t }\n",
            "destroy",
            "must be true or false",
        ),
        (
            "operation: apply\nplan_key: abc\nvariables: { name: web, token: t }\n",
            "plan_key",
            "is given without plan",
        ),
        (
            "operation: apply\nplan: p1\nplan_key: short\nvariables: { token: t }\n",
            "plan_key",
            "is not a plan key (5 characters)",
        ),
        (
            "operation: apply\nplan: p1\nvariables: { name: web, token: t }\n",
            "variables.name",
            "is kept in the approved plan",
        ),
        (
            "operation: apply\nplan: p1\nvariables: {}\n",
            "variables.token",
            "required",
        ),
        (
            "operation: apply\nplan: p1\non_failure: destroy-created\nvariables: { token: t }\n",
            "on_failure",
            "destroy-created needs a plan of its own",
        ),
        (
            "operation: apply\nplan: p1\nbudget: { max_monthly_increase: 10 }\nvariables: { token: t }\n",
            "budget",
            "checked when the plan is made",
        ),
        (
            "operation: apply\nplan: j1\nvariables: { token: t }\n",
            "plan",
            "names this job itself",
        ),
        (
            "operation: apply\nplan: p1\nvariables: { token: t, colour: red }\n",
            "variables.colour",
            "is not declared by the template / drop it: an approved plan's apply takes only ephemeral variables (this template's are token)",
        ),
    ] {
        let found = fields(extra);
        assert!(
            found
                .iter()
                .any(|(f, text)| f == field && text.contains(says)),
            "{extra}: {found:?}"
        );
    }
    // One problem for a variable the plan keeps, not two.
    let found = fields("operation: apply\nplan: p1\nvariables: { name: web, token: t }\n");
    assert_eq!(found.len(), 1, "{found:?}");
    // A malformed key is never quoted.
    let secret = "S3cr3t-but-malformed";
    let found = fields(&format!(
        "operation: apply\nplan: p1\nplan_key: {secret}\nvariables: {{ token: t }}\n"
    ));
    assert!(!format!("{found:?}").contains(secret), "{found:?}");
}
