use std::time::Duration;

use serde_json::json;

use super::input::{Facts, of_plan};
use super::*;
use crate::job::redact::{MASK, Redactor};

fn set(files: &[(&str, &str)]) -> Result<PolicySet, PolicyError> {
    PolicySet::parse(
        "test".into(),
        files
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect(),
    )
}

fn judge(files: &[(&str, &str)], input: serde_json::Value) -> Result<Verdicts, PolicyError> {
    let set = set(files).unwrap();
    evaluate_here(
        &set.files,
        &set.digest,
        &input.to_string(),
        Duration::from_secs(5),
    )
}

const TAGS_V1: &str = r#"
package main

deny contains msg if {
    some rc in input.resource_changes
    not rc.change.after.tags.owner
    msg := sprintf("%s has no owner tag", [rc.address])
}

warn contains {"msg": sprintf("%s is replaced", [rc.address])} if {
    some rc in input.resource_changes
    "delete" in rc.change.actions
}

helper := 1
"#;

const COST_V0: &str = r#"
package cost

deny_expensive[msg] {
    input.terrace.cost.monthly_delta > 100
    msg := "costs too much"
}

violation[msg] {
    input.terrace.tenant == "blocked"
    msg := "tenant is blocked"
}
"#;

#[test]
fn deny_and_warn_rules_of_every_package_give_their_messages_in_v1_and_v0() {
    let input = json!({
        "resource_changes": [
            {"address": "a.one", "change": {"actions": ["create"], "after": {"tags": {"owner": "x"}}}},
            {"address": "a.two", "change": {"actions": ["delete", "create"], "after": {"tags": {}}}}
        ],
        "terrace": {"tenant": "blocked", "cost": {"monthly_delta": 250}}
    });
    let set = set(&[("tags.rego", TAGS_V1), ("sub/cost.rego", COST_V0)]).unwrap();
    let v0: Vec<_> = set.files.iter().map(|f| (f.name.as_str(), f.v0)).collect();
    assert_eq!(v0, [("sub/cost.rego", true), ("tags.rego", false)]);
    assert!(set.digest.starts_with("sha256:") && set.digest.len() == 71);
    let v = evaluate_here(
        &set.files,
        &set.digest,
        &input.to_string(),
        Duration::from_secs(5),
    )
    .unwrap();
    let mut deny: Vec<_> = v.deny.iter().map(|d| d.message.as_str()).collect();
    deny.sort_unstable();
    assert_eq!(
        deny,
        [
            "a.two has no owner tag",
            "costs too much",
            "tenant is blocked"
        ]
    );
    assert_eq!(v.warn.len(), 1, "{v:?}");
    assert_eq!(v.warn[0].message, "a.two is replaced");
    assert_eq!(v.warn[0].rule, "data.main.warn");
    assert_eq!(v.warn[0].policy, "tags.rego");
    let rules: Vec<_> = v.deny.iter().map(|d| d.rule.as_str()).collect();
    assert!(rules.contains(&"data.cost.deny_expensive"), "{rules:?}");
    assert_eq!(v.policies, set.digest);

    let clean = json!({"resource_changes": [], "terrace": {"tenant": "acme"}});
    let v = judge(&[("tags.rego", TAGS_V1), ("cost.rego", COST_V0)], clean).unwrap();
    assert!(v.deny.is_empty() && v.warn.is_empty(), "{v:?}");
}

#[test]
fn a_file_that_does_not_parse_is_named_with_its_line() {
    let broken = "package main\n\ndeny contains msg if {\n    msg := \n}\n";
    let e = set(&[("ok.rego", TAGS_V1), ("bad/broken.rego", broken)]).unwrap_err();
    let said = e.to_string();
    assert!(
        matches!(&e, PolicyError::Parse { file, .. } if file == "bad/broken.rego"),
        "{said}"
    );
    assert!(
        said.contains("broken.rego:5") || said.contains("broken.rego:4"),
        "{said}"
    );
}

#[test]
fn a_folder_is_read_recursively_without_tests_and_hidden_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("aws")).unwrap();
    std::fs::create_dir_all(dir.path().join(".git")).unwrap();
    std::fs::write(dir.path().join("aws/tags.rego"), TAGS_V1).unwrap();
    std::fs::write(dir.path().join("aws/tags_test.rego"), "not rego").unwrap();
    std::fs::write(dir.path().join(".git/x.rego"), "not rego").unwrap();
    std::fs::write(dir.path().join("README.md"), "# policies").unwrap();
    let set = PolicySet::load(dir.path()).unwrap();
    let names: Vec<_> = set.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["aws/tags.rego"]);

    let empty = tempfile::tempdir().unwrap();
    let e = PolicySet::load(empty.path()).unwrap_err().to_string();
    assert!(e.contains("no .rego file"), "{e}");
}

#[test]
fn a_policy_that_runs_on_is_stopped_at_its_time_limit() {
    let slow = r#"
package main

deny contains "never" if {
    some i in numbers.range(1, 20000)
    some j in numbers.range(1, 20000)
    i * j == -1
}
"#;
    let set = set(&[("slow.rego", slow)]).unwrap();
    let started = std::time::Instant::now();
    let e = evaluate_here(&set.files, &set.digest, "{}", Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, PolicyError::Time { .. }), "{e}");
    assert!(e.is_limit());
    // Stopped near its limit, not after the 400 million steps.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn the_input_masks_what_terraform_and_the_job_mark_sensitive() {
    let plan = json!({
        "format_version": "1.2",
        "variables": {"password": {"value": "hunter2"}, "size": {"value": "s"}, "note": {"value": "the token is tok-123"}},
        "configuration": {"root_module": {
            "variables": {"password": {"sensitive": true, "default": "dflt-pw"}, "size": {}},
            "resources": [{"address": "a.b", "expressions": {"secret": {"constant_value": "lit-pw"}}}],
            "module_calls": {"m": {"module": {"variables": {"key": {"sensitive": true, "default": "mod-pw"}}}}}
        }},
        "action_invocations": [{"config_values": {"token": "act-pw", "name": "x"}, "config_sensitive": {"token": true}}],
        "planned_values": {
            "outputs": {"pw": {"sensitive": true, "value": "hunter2"}, "id": {"sensitive": false, "value": "x"}},
            "root_module": {"resources": [{"address": "a.b", "values": {"name": "n", "secret": {"key": "k1"}}, "sensitive_values": {"secret": {"key": true}}}]}
        },
        "resource_changes": [{"address": "a.b", "change": {
            "actions": ["create"],
            "before": null,
            "after": {"name": "n", "list": ["p", "q"], "tags": {"owner": "o"}},
            "after_sensitive": {"list": [false, true]},
            "before_sensitive": false
        }}],
        "output_changes": {"pw": {"actions": ["create"], "before": null, "after": "hunter2", "after_sensitive": true, "before_sensitive": false}}
    });
    let facts = Facts {
        job_id: "j1",
        tenant: "acme",
        workspace: "net",
        operation: crate::job::Operation::Apply,
        template: "demo@1.0.0".into(),
        cost: None,
    };
    let redactor = Redactor::new(["tok-123".to_owned()]);
    let input = of_plan(&plan.to_string(), &facts, &redactor).unwrap();
    let text = input.to_string();
    for secret in [
        "hunter2", "tok-123", "k1", "\"q\"", "dflt-pw", "lit-pw", "mod-pw", "act-pw",
    ] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert_eq!(input["variables"]["size"]["value"], "s");
    assert_eq!(input["variables"]["password"]["value"], MASK);
    assert_eq!(
        input["resource_changes"][0]["change"]["after"]["list"][0],
        "p"
    );
    assert_eq!(
        input["resource_changes"][0]["change"]["after"]["list"][1],
        MASK
    );
    assert_eq!(
        input["resource_changes"][0]["change"]["after"]["tags"]["owner"],
        "o"
    );
    assert_eq!(input["planned_values"]["outputs"]["id"]["value"], "x");
    assert_eq!(input["output_changes"]["pw"]["after"], MASK);
    assert_eq!(input["action_invocations"][0]["config_values"]["name"], "x");
    assert_eq!(input["terrace"]["tenant"], "acme");
    assert_eq!(input["terrace"]["operation"], "apply");
    assert_eq!(input["terrace"]["template"], "demo@1.0.0");
    assert!(of_plan("[]", &facts, &redactor).is_err());
}

/// The repository's policies (`policies/`), as an operator would point a runner at them.
fn shipped(folder: &str) -> PolicySet {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../policies")
        .join(folder);
    PolicySet::load(&dir).unwrap_or_else(|e| panic!("{folder}: {e}"))
}

fn change(
    address: &str,
    actions: &[&str],
    before: serde_json::Value,
    after: serde_json::Value,
) -> serde_json::Value {
    let kind = address.split('.').next().unwrap();
    json!({"address": address, "type": kind, "change": {"actions": actions, "before": before, "after": after}})
}

fn verdicts_of(
    set: &PolicySet,
    changes: Vec<serde_json::Value>,
    cost: serde_json::Value,
) -> Verdicts {
    let input = json!({"resource_changes": changes, "terrace": {"cost": cost}});
    evaluate_here(
        &set.files,
        &set.digest,
        &input.to_string(),
        Duration::from_secs(5),
    )
    .unwrap()
}

fn said(list: &[Verdict]) -> Vec<String> {
    let mut all: Vec<String> = list.iter().map(|v| v.message.clone()).collect();
    all.sort();
    all
}

#[test]
fn the_shipped_example_policies_deny_what_they_say_and_pass_the_rest() {
    let set = shipped("examples");
    let tags = json!({"owner": "ops", "cost-center": "42"});
    let good = vec![
        change(
            "aws_s3_bucket.logs",
            &["create"],
            json!(null),
            json!({"bucket": "logs", "tags": tags}),
        ),
        change(
            "aws_s3_bucket_public_access_block.logs",
            &["create"],
            json!(null),
            json!({"block_public_acls": true, "block_public_policy": true, "ignore_public_acls": true, "restrict_public_buckets": true}),
        ),
        change(
            "google_storage_bucket.data",
            &["create"],
            json!(null),
            json!({"labels": tags, "public_access_prevention": "enforced"}),
        ),
        change(
            "azurerm_storage_account.st",
            &["create"],
            json!(null),
            json!({"tags": tags, "allow_nested_items_to_be_public": false}),
        ),
        change(
            "azurerm_storage_container.c",
            &["create"],
            json!(null),
            json!({"container_access_type": "private"}),
        ),
        change(
            "aws_instance.old",
            &["delete"],
            json!({"tags": {"protected": "false"}}),
            json!(null),
        ),
    ];
    let v = verdicts_of(
        &set,
        good,
        json!({"monthly_delta": 20.0, "currency": "USD"}),
    );
    assert!(v.deny.is_empty() && v.warn.is_empty(), "{v:?}");

    let bad = vec![
        change(
            "aws_s3_bucket_acl.logs",
            &["create"],
            json!(null),
            json!({"acl": "public-read"}),
        ),
        change(
            "aws_s3_bucket_public_access_block.logs",
            &["update"],
            json!({}),
            json!({"block_public_acls": true, "block_public_policy": false, "ignore_public_acls": true, "restrict_public_buckets": true}),
        ),
        change(
            "google_storage_bucket_iam_member.pub",
            &["create"],
            json!(null),
            json!({"member": "allUsers", "role": "roles/storage.objectViewer"}),
        ),
        change(
            "google_storage_bucket.data",
            &["create"],
            json!(null),
            json!({"labels": {"owner": "ops"}, "public_access_prevention": "inherited"}),
        ),
        change(
            "azurerm_storage_account.st",
            &["create"],
            json!(null),
            json!({"tags": null, "allow_nested_items_to_be_public": true}),
        ),
        change(
            "azurerm_storage_container.c",
            &["create"],
            json!(null),
            json!({"container_access_type": "blob"}),
        ),
        change(
            "aws_db_instance.main",
            &["delete", "create"],
            json!({"tags": {"protected": "true"}}),
            json!({"tags": tags}),
        ),
        change(
            "google_sql_database_instance.main",
            &["delete"],
            json!({"labels": {"protected": "true"}}),
            json!(null),
        ),
    ];
    let v = verdicts_of(
        &set,
        bad,
        json!({"monthly_delta": 750.5, "currency": "USD"}),
    );
    assert_eq!(
        said(&v.deny),
        [
            "aws_db_instance.main is protected and would be replaced",
            "aws_s3_bucket_acl.logs gives the bucket the public ACL \"public-read\"",
            "aws_s3_bucket_public_access_block.logs turns block_public_policy off: the bucket could be made public",
            "azurerm_storage_account.st has no cost-center, owner tags",
            "azurerm_storage_account.st lets its containers be made public: set allow_nested_items_to_be_public = false",
            "azurerm_storage_container.c is readable by anyone (container_access_type \"blob\")",
            "google_sql_database_instance.main is protected and would be destroyed",
            "google_storage_bucket.data has no cost-center labels",
            "google_storage_bucket_iam_member.pub grants roles/storage.objectViewer on the bucket to allUsers",
            "the plan raises the monthly cost by 750.50 USD, over the 500 allowed without a review",
        ]
    );
    assert_eq!(
        said(&v.warn),
        ["google_storage_bucket.data does not enforce public access prevention"]
    );
    let v = verdicts_of(
        &set,
        vec![],
        json!({"monthly_delta": 120.0, "currency": "EUR"}),
    );
    assert_eq!(
        said(&v.warn),
        ["the plan raises the monthly cost by 120.00 EUR"]
    );
    assert!(v.deny.is_empty());
}

#[test]
fn the_demo_policy_denies_a_big_cluster_and_warns_on_small_nodes() {
    let set = shipped("demo");
    let cluster = |nodes: u32, kind: &str| {
        change(
            "testcloud_cluster.main",
            &["create"],
            json!(null),
            json!({"node_count": nodes, "instance_type": kind}),
        )
    };
    let v = verdicts_of(&set, vec![cluster(12, "medium")], json!(null));
    assert_eq!(
        said(&v.deny),
        [
            "testcloud_cluster.main would have 12 nodes; clusters of more than 8 need a capacity review"
        ]
    );
    assert!(v.warn.is_empty());
    let v = verdicts_of(&set, vec![cluster(3, "small")], json!(null));
    assert!(v.deny.is_empty());
    assert_eq!(
        said(&v.warn),
        ["testcloud_cluster.main runs on small nodes: not for production"]
    );
}

#[test]
fn a_set_is_named_by_a_folder_or_a_bucket_url_with_its_name_and_version() {
    use super::source::SetRef;
    assert_eq!(
        SetRef::parse("policies/demo").unwrap(),
        SetRef::Folder("policies/demo".into())
    );
    let published = SetRef::parse("s3://config/policies/baseline/3").unwrap();
    let SetRef::Published {
        base,
        name,
        version,
        ..
    } = &published
    else {
        panic!("{published:?}")
    };
    assert_eq!(
        (base.as_str(), name.as_str(), version.as_str()),
        ("s3://config/policies", "baseline", "3")
    );
    assert_eq!(published.label(), "baseline@3");
    assert_eq!(published.to_string(), "s3://config/policies/baseline/3");
    for wrong in [
        "s3://config",
        "s3://config/3",
        "gs://b/p/_hidden/1",
        "s3://b/p/x/1?sig=abc",
    ] {
        let e = SetRef::parse(wrong).unwrap_err();
        assert!(
            e.contains("NAME/VERSION") || e.contains("query"),
            "{wrong}: {e}"
        );
    }
}

#[test]
fn a_tenants_set_sits_beside_the_runners_named_by_its_label() {
    let runner = set(&[("tags.rego", TAGS_V1)]).unwrap();
    let tenant = set(&[("cost.rego", COST_V0)]).unwrap();
    let both = runner.with(&tenant, "strict@3");
    let names: Vec<_> = both.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["tags.rego", "strict@3/cost.rego"]);
    assert_ne!(both.digest, runner.digest);
    // A tenant's set cannot change the runner's rules, even in a package of the same name:
    // each set is evaluated on its own.
    let guarded = set(&[(
        "guard.rego",
        "package main\n\nimport rego.v1\n\ndefault exempt := false\n\ndeny contains \"no\" if { not exempt }\n",
    )])
    .unwrap();
    let sneaky = set(&[(
        "x.rego",
        "package main\n\nimport rego.v1\n\nexempt := true\n",
    )])
    .unwrap();
    let merged = guarded.with(&sneaky, "sneaky");
    let v = evaluate_here(&merged.files, &merged.digest, "{}", Duration::from_secs(5)).unwrap();
    assert_eq!(said(&v.deny), ["no"], "{v:?}");
}

#[test]
fn any_deny_value_but_false_is_a_verdict_and_too_many_are_capped() {
    let odd = "package odd\n\nimport rego.v1\n\ndeny contains 7 if { true }\n\nwarn contains x if { some x in numbers.range(1, 500) }\n";
    let v = judge(&[("odd.rego", odd)], json!({})).unwrap();
    assert_eq!(said(&v.deny), ["data.odd.deny: 7"]);
    assert_eq!(v.warn.len(), MAX_VERDICTS);
    assert_eq!(
        v.warn.last().unwrap().message,
        format!("… and {} more", 500 - (MAX_VERDICTS - 1))
    );
}
