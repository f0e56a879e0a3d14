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

fn stack(id: &str, version: &str, nodes: u32) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: stack\noperation: apply\n\
         template: {{ name: stack, version: {version} }}\n\
         variables:\n  name: stk\n  node_count: {nodes}\ntimeout: 5m\n"
    )
}

#[tokio::test]
async fn a_template_of_pinned_library_modules_gets_a_new_module_version_only_with_a_new_template_version()
 {
    let sb = Sandbox::new();
    let apply = |id: &str, version: &str, nodes: u32| {
        let path = sb.job(&format!("{id}.yaml"), &stack(id, version, nodes));
        sb.run(&["run", "-q", path.to_str().unwrap()])
            .expect_code(0);
    };
    // stack 1.0.0 pins network 1.0.0 (10.1.0.0/16) and cluster 1.0.0; the library also holds
    // network 1.1.0 (10.2.0.0/16), which only stack 1.1.0 pins.
    apply("m1", "1.0.0", 2);
    let r = sb.artifact_json("acme/stack", "m1", "result.json").await;
    assert_eq!(r["outputs"]["network_cidr"]["value"], "10.1.0.0/16", "{r}");
    assert!(r["outputs"]["cluster_id"]["value"].is_string(), "{r}");
    assert_eq!(r["changes"]["add"], 2);

    apply("m2", "1.0.0", 2);
    let r = sb.artifact_json("acme/stack", "m2", "result.json").await;
    assert_eq!(
        (&r["changes"]["add"], &r["changes"]["change"]),
        (&json!(0), &json!(0)),
        "the same template version runs the same modules: {r}"
    );

    apply("m3", "1.1.0", 2);
    let r = sb.artifact_json("acme/stack", "m3", "result.json").await;
    assert_eq!(r["outputs"]["network_cidr"]["value"], "10.2.0.0/16", "{r}");
    assert_eq!(
        (&r["changes"]["add"], &r["changes"]["change"]),
        (&json!(0), &json!(1)),
        "the network is updated in place: {r}"
    );

    let shown = sb.run(&["template", "show", "stack", "1.1.0", "--json"]);
    shown.expect_code(0);
    let shown: Value = serde_json::from_str(&shown.stdout()).unwrap();
    let pins: Vec<(String, String)> = shown["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_owned(),
                m["version"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        pins,
        [
            ("cluster".into(), "1.0.0".into()),
            ("network".into(), "1.1.0".into())
        ]
    );
}

/// Copies `from` into `to`, following the sandbox's links.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test]
async fn a_module_changed_since_it_was_pinned_or_pinned_loosely_is_refused() {
    let mut sb = Sandbox::new();
    let root = sb.dir.path().join("own-templates");
    for name in ["stack", "_modules"] {
        copy_tree(&sb.templates.join(name), &root.join(name));
    }
    sb.env
        .push(("TERRACE_TEMPLATES".into(), root.display().to_string()));
    let path = sb.job("d1.yaml", &stack("d1", "1.0.0", 1));
    sb.run(&["validate", path.to_str().unwrap()]).expect_code(0);

    // One character of the library's network 1.0.0 changes.
    let module = root.join("_modules/network/1.0.0/main.tf");
    let text = std::fs::read_to_string(&module).unwrap();
    std::fs::write(&module, text.replace("10.1.0.0/16", "10.9.0.0/16")).unwrap();
    let out = sb.run(&["run", path.to_str().unwrap()]);
    out.expect_code(65);
    let err = out.stderr();
    assert!(
        err.contains("modules.network.sha256")
            && err.contains("the module changed since it was pinned"),
        "{err}"
    );
    assert!(sb.cloud_files().is_empty(), "nothing ran");
    let listed = sb.run(&["template", "list"]);
    listed.expect_code(1);
    assert!(listed.stdout().contains("INVALID"), "{}", listed.stdout());
    assert!(
        !listed.stdout().contains("_modules"),
        "the library is not a template: {}",
        listed.stdout()
    );
    // stack 1.1.0 pins network 1.1.0, which did not change.
    sb.run(&["template", "show", "stack", "1.1.0"])
        .expect_code(0);

    // A range is not a pin; a version the library lacks is named.
    let spec = root.join("stack/1.1.0/template.yaml");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&spec, text.replace("version: 1.1.0", "version: \"~> 1.1\"")).unwrap();
    let out = sb.run(&["template", "show", "stack", "1.1.0"]);
    out.expect_code(65);
    assert!(
        out.stderr().contains("is not an exact version"),
        "{}",
        out.stderr()
    );
    std::fs::write(&spec, text.replace("version: 1.1.0", "version: 1.7.0")).unwrap();
    let out = sb.run(&["template", "show", "stack", "1.1.0"]);
    out.expect_code(65);
    assert!(
        out.stderr()
            .contains("network 1.7.0 is not in the module library"),
        "{}",
        out.stderr()
    );
}

#[tokio::test]
async fn a_templates_per_cloud_defaults_fill_what_the_job_leaves_unset() {
    let sb = Sandbox::new();
    let nodes = |id: &str, cloud: &str, set: Option<u32>| {
        let mut text = stack(id, "1.0.0", 1).replace("operation: apply", "operation: plan");
        if set.is_none() {
            text = text.replace("  node_count: 1\n", "");
        }
        let path = sb.job(&format!("{id}.yaml"), &text);
        sb.run(&["--cloud", cloud, "run", "-q", path.to_str().unwrap()])
            .expect_code(0);
        id.to_owned()
    };
    // stack's template.yaml: node_count defaults to 1; on aws to 3, locally to 2.
    for (id, cloud, set, expected) in [
        ("f1", "local", None, 2),
        ("f2", "aws", None, 3),
        ("f3", "gcp", None, 1),
        ("f4", "aws", Some(1), 1),
    ] {
        let id = nodes(id, cloud, set);
        let record = sb.artifact_json("acme/stack", &id, "job.json").await;
        assert_eq!(
            record["variables"]["node_count"], expected,
            "{cloud}: {record}"
        );
    }
    let out = sb.run(&["--cloud", "moon", "workspaces"]);
    out.expect_code(64);
}

/// Templates published to a bucket, then run from it by `terrace --templates URL`: the
/// template and the modules it pins are fetched (and checked) at run time; publishing again
/// is idempotent; a version not published is refused naming the bucket; a module file changed
/// in the bucket behind its listing is refused, and nothing runs.
async fn published_templates_run_from(
    sb: &Sandbox,
    url: &str,
    raw: std::sync::Arc<dyn state_backends::objects::Bucket>,
    raw_prefix: &str,
) {
    let publish = sb.run(&["template", "publish", "stack", "1.0.0", "--to", url]);
    publish.expect_code(0);
    for part in [
        "_modules/network/1.0.0",
        "_modules/cluster/1.0.0",
        "stack/1.0.0",
    ] {
        assert!(
            publish.stdout().contains(&format!("published {part} to ")),
            "{}",
            publish.stdout()
        );
    }
    let again = sb.run(&["template", "publish", "stack", "1.0.0", "--to", url]);
    again.expect_code(0);
    assert_eq!(
        again
            .stdout()
            .matches("already published with the same files")
            .count(),
        3,
        "{}",
        again.stdout()
    );

    // Run from the bucket only: the folder the sandbox names is not read.
    let cache = sb.dir.path().join("template-cache");
    let cold = sb.dir.path().join("cold-cache");
    let with_cache = |cache: &std::path::Path, args: &[&str]| {
        let mut all = vec![
            "--templates",
            url,
            "--template-cache",
            cache.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        sb.run(&all)
    };
    let from_bucket = |args: &[&str]| with_cache(&cache, args);
    let path = sb.job("p1.yaml", &stack("p1", "1.0.0", 2));
    from_bucket(&["run", "-q", path.to_str().unwrap()]).expect_code(0);
    let r = sb.artifact_json("acme/stack", "p1", "result.json").await;
    assert_eq!(r["outputs"]["network_cidr"]["value"], "10.1.0.0/16", "{r}");
    assert_eq!(r["changes"]["add"], 2, "{r}");
    assert!(cache.join("_modules/network/1.0.0/main.tf").is_file());
    let listed = from_bucket(&["template", "list", "--json"]);
    listed.expect_code(0);
    let listed: Value = serde_json::from_str(&listed.stdout()).unwrap();
    assert_eq!(
        listed["templates"],
        json!([{ "name": "stack", "version": "1.0.0", "valid": true,
                 "description": listed["templates"][0]["description"],
                 "modules": listed["templates"][0]["modules"] }]),
        "{listed}"
    );

    // stack 1.1.0 is in the folder but was never published.
    let path = sb.job("p2.yaml", &stack("p2", "1.1.0", 2));
    let out = from_bucket(&["run", path.to_str().unwrap()]);
    out.expect_code(65);
    assert!(
        out.stderr()
            .contains(&format!("template stack 1.1.0 is not published in {url}")),
        "{}",
        out.stderr()
    );
    assert!(
        out.stderr().contains("terrace template publish"),
        "{}",
        out.stderr()
    );

    // A module file rewritten in the bucket, around `publish`: refused, nothing runs.
    raw.put(
        &format!("{raw_prefix}_modules/network/1.0.0/main.tf"),
        bytes::Bytes::from_static(b"# changed in the bucket\n"),
        Default::default(),
        state_backends::objects::Condition::None,
    )
    .await
    .unwrap();
    // A runner fetching it afresh reads the changed file and refuses it.
    let path = sb.job("p3.yaml", &stack("p3", "1.0.0", 3));
    let out = with_cache(&cold, &["run", path.to_str().unwrap()]);
    out.expect_code(65);
    assert!(
        out.stderr()
            .contains("main.tf differs from its line in the listing"),
        "{}",
        out.stderr()
    );
    assert_eq!(sb.versions("acme/stack").await.len(), 1, "no state written");
    assert!(!cold.join("_modules/network").exists());
    // A runner whose copy matches the listing reads no file again: it runs what was published.
    let path = sb.job("p4.yaml", &stack("p4", "1.0.0", 3));
    from_bucket(&["run", "-q", path.to_str().unwrap()]).expect_code(0);
    assert!(
        std::fs::read_to_string(cache.join("_modules/network/1.0.0/main.tf"))
            .unwrap()
            .contains("10.1.0.0/16"),
        "the checked copy stays"
    );
    let r = sb.artifact_json("acme/stack", "p4", "result.json").await;
    assert_eq!(r["outputs"]["network_cidr"]["value"], "10.1.0.0/16", "{r}");
}

#[tokio::test]
async fn templates_published_to_s3_run_from_it() {
    let bucket = tests::aws::bucket().await;
    let mut sb = Sandbox::new();
    sb.env.extend(tests::aws::cli_env());
    let raw = state_backends::s3::S3Store::from_sdk(
        &tests::aws::sdk_config().await,
        true,
        state_backends::s3::S3Config {
            bucket: bucket.clone(),
            prefix: String::new(),
            lease: state_backends::s3::LeaseMode::from_table(None),
            kms_key_id: None,
        },
    )
    .unwrap()
    .into_bucket();
    let url = format!("s3://{bucket}/published");
    published_templates_run_from(&sb, &url, std::sync::Arc::new(raw), "published/").await;
}

#[tokio::test]
async fn templates_published_to_gcs_run_from_it() {
    let bucket = tests::gcs::bucket().await;
    let mut sb = Sandbox::new();
    sb.env.extend([
        ("TERRACE_GCS_ENDPOINT".to_owned(), tests::gcs::endpoint()),
        ("TERRACE_GCS_ANONYMOUS".to_owned(), "1".to_owned()),
    ]);
    let raw = tests::gcs::store(&bucket, "").await.into_bucket();
    let url = format!("gs://{bucket}/t/published");
    published_templates_run_from(&sb, &url, std::sync::Arc::new(raw), "t/published/").await;
}

#[tokio::test]
async fn templates_published_to_azure_blob_run_from_it() {
    let with_sas = tests::azure::container().await;
    let container = with_sas.split('?').next().unwrap().to_owned();
    let mut sb = Sandbox::new();
    sb.env
        .push(("AZURE_STORAGE_SAS_TOKEN".to_owned(), tests::azure::sas()));
    let raw = tests::azure::store(&with_sas, "").into_bucket();
    let url = format!("{container}/published");
    published_templates_run_from(&sb, &url, std::sync::Arc::new(raw), "published/").await;
}
