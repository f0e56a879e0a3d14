//! Policies on plans (docs/policy.md) through real runs of `terrace` with the machine's
//! terraform: the demo's policy set (`policies/demo`), and policies written here to loop, to
//! allocate without end, to look for secrets, and not to parse.

use serde_json::Value;
use tests::policy::{DENIED, WARNED, messages};
use tests::{Sandbox, demo_job};

const MASK: &str = "(sensitive value)";
const PASSWORD: &str = "correct-horse-battery-staple";

/// A sandbox whose `terrace` holds plans to `folder`.
fn judged_by(folder: &std::path::Path) -> Sandbox {
    let mut sb = Sandbox::new();
    sb.env
        .push(("TERRACE_POLICIES".into(), folder.display().to_string()));
    sb
}

/// A sandbox holding plans to the demo's policies: a cluster of more than 8 nodes is denied,
/// small nodes warned about.
fn demo_policies() -> Sandbox {
    judged_by(&tests::policy::demo())
}

/// A sandbox holding plans to these policy files, written in a folder of its own.
fn written(files: &[(&str, &str)]) -> Sandbox {
    let sb = Sandbox::new();
    let folder = sb.dir.path().join("policies");
    for (name, text) in files {
        let path = folder.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let mut sb = sb;
    sb.env
        .push(("TERRACE_POLICIES".into(), folder.display().to_string()));
    sb
}

#[tokio::test]
async fn a_plan_that_breaks_a_deny_policy_stops_before_apply_and_changes_nothing() {
    let sb = demo_policies();
    let r = sb.run_demo("big", "policy", "apply", "big", 12, 1).await;
    let e = &r["error"];
    assert_eq!(
        (e["category"].as_str(), e["step"].as_str()),
        (Some("policy"), Some("policy")),
        "{r}"
    );
    let deny = DENIED;
    assert!(e["message"].as_str().unwrap().contains(deny), "{e}");
    assert!(e["hint"].as_str().unwrap().contains("nothing was applied"));
    assert_eq!(e["retryable"], false);
    // Every verdict, with the rule and the file that gave it, and the set's digest.
    let p = &r["policy"];
    assert_eq!(messages(&r, "deny"), [deny]);
    assert_eq!(p["deny"][0]["rule"], "data.testcloud.deny");
    assert_eq!(p["deny"][0]["policy"], "testcloud.rego");
    assert_eq!(messages(&r, "warn"), [WARNED]);
    assert!(p["policies"].as_str().unwrap().starts_with("sha256:"));
    assert!(!tests::step_names(&r).contains(&"apply".to_owned()), "{r}");
    assert!(sb.cloud_files().is_empty(), "nothing was made");
    assert!(sb.versions("acme/policy").await.is_empty(), "no state");

    // A plan job is judged as well: a denied plan is never kept for approval.
    let plan = sb.job("p.yaml", &demo_job("p1", "policy", "plan", "big", 12));
    let out = sb.run(&["run", plan.to_str().unwrap()]);
    out.expect_code(1);
    let r = sb.artifact_json("acme/policy", "p1", "result.json").await;
    assert_eq!(r["error"]["category"], "policy", "{r}");
    assert!(r["plan"].is_null(), "a denied plan is not kept: {r}");
    assert!(
        out.stdout().contains("policy:     1 denied, 1 warned")
            && out.stdout().contains(&format!("deny: {deny}")),
        "{}",
        out.stdout()
    );

    // `terrace estimate` says the same, before anything runs.
    let est = sb.job("e.yaml", &demo_job("e1", "policy", "apply", "big", 12));
    let out = sb.run(&["estimate", "--json", est.to_str().unwrap()]);
    out.expect_code(1);
    let said: Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(messages(&said, "deny"), [deny], "{said}");
    assert!(sb.cloud_files().is_empty());
}

#[tokio::test]
async fn a_warning_is_reported_and_the_job_goes_on() {
    let sb = demo_policies();
    let r = sb.run_demo("small", "policy", "apply", "small", 2, 0).await;
    assert_eq!(r["status"], "succeeded", "{r}");
    tests::policy::assert_warned(&r);
    assert_eq!(sb.cloud_names(), ["small", "small-net"]);
    let log = sb.run(&["logs", "acme/policy", "small"]).stdout();
    assert!(
        log.contains("warn: testcloud_cluster.main runs on small nodes")
            && log.contains("0 denied, 1 warned by"),
        "{log}"
    );

    // Without policies, the same job carries no verdicts.
    let plain = Sandbox::new();
    let r = plain
        .run_demo("small", "policy", "apply", "small", 2, 0)
        .await;
    assert!(r.get("policy").is_none(), "{r}");
}

#[tokio::test]
async fn a_policy_that_never_ends_is_cut_off_and_nothing_is_applied() {
    let mut sb = written(&[(
        "slow.rego",
        "package slow\n\nimport rego.v1\n\ndeny contains \"never\" if {\n    some i in numbers.range(1, 100000)\n    some j in numbers.range(1, 100000)\n    i * j == -1\n}\n",
    )]);
    sb.env.push(("TERRACE_POLICY_TIMEOUT".into(), "1".into()));
    let started = std::time::Instant::now();
    let r = sb.run_demo("slow", "policy", "apply", "slow", 1, 1).await;
    let e = &r["error"];
    assert_eq!(e["category"], "policy", "{r}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("ran past their limit of 1s"),
        "{e}"
    );
    assert!(
        e["hint"]
            .as_str()
            .unwrap()
            .contains("TERRACE_POLICY_TIMEOUT")
    );
    assert!(sb.cloud_files().is_empty(), "nothing was made");
    // Ten billion steps would take hours: the job ended at its bound.
    println!("cut off; the job took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_policy_that_allocates_without_end_is_stopped_by_its_memory_bound() {
    let mut sb = written(&[(
        "hog.rego",
        "package hog\n\nimport rego.v1\n\ndeny contains \"never\" if {\n    count(numbers.range(1, 1000000000)) < 0\n}\n",
    )]);
    sb.env
        .push(("TERRACE_POLICY_MEMORY_MB".into(), "256".into()));
    let r = sb.run_demo("hog", "policy", "apply", "hog", 1, 1).await;
    let e = &r["error"];
    assert_eq!(e["category"], "policy", "{r}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("ran out of memory (limit 256 MiB)"),
        "{e}"
    );
    assert!(sb.cloud_files().is_empty(), "nothing was made");
}

#[tokio::test]
async fn a_policy_sees_no_secret_of_the_job() {
    // The password is a sensitive variable of the template; the policy tries every way to it.
    let sb = written(&[(
        "snoop.rego",
        r#"package snoop

import rego.v1

deny contains msg if {
    msg := sprintf("the password is %s", [input.variables.admin_password.value])
}

# Searched for inside the policy: the whole input, as text, and its size (so the search
# provably ran over all of it).
warn contains sprintf("the input has %d bytes", [count(json.marshal(input))])

warn contains "the password is somewhere in the input" if {
    contains(json.marshal(input), "correct-horse")
}

warn contains "the input has the plan and the job" if {
    input.resource_changes[_]
    input.terrace.tenant == "acme"
}
"#,
    )]);
    let r = sb.run_demo("snoop", "policy", "apply", "snoop", 1, 1).await;
    assert_eq!(
        messages(&r, "deny"),
        [format!("the password is {MASK}").as_str()],
        "{r}"
    );
    let warned = messages(&r, "warn");
    assert!(
        warned.contains(&"the input has the plan and the job")
            && !warned.contains(&"the password is somewhere in the input"),
        "{warned:?}"
    );
    assert!(
        warned
            .iter()
            .any(|w| w.starts_with("the input has ") && w.ends_with(" bytes"))
    );
    for (what, text) in [
        ("the result", r.to_string()),
        (
            "the log",
            sb.run(&["logs", "acme/policy", "snoop"]).stdout(),
        ),
    ] {
        assert!(
            !text.contains(PASSWORD),
            "{what} shows the password: {text}"
        );
    }
    assert!(sb.cloud_files().is_empty());
}

#[tokio::test]
async fn a_policy_that_does_not_parse_stops_terrace_before_anything_runs() {
    let sb = written(&[
        (
            "good.rego",
            "package good\n\nimport rego.v1\n\nwarn contains \"x\" if { true }\n",
        ),
        (
            "team/broken.rego",
            "package broken\n\nimport rego.v1\n\ndeny contains msg if {\n    msg := \n}\n",
        ),
    ]);
    let job = sb.job("j.yaml", &demo_job("j1", "policy", "apply", "never", 1));
    let out = sb.run(&["run", job.to_str().unwrap()]);
    out.expect_code(78);
    let said = out.stderr();
    assert!(
        said.contains("TERRACE_POLICIES")
            && said.contains("policy team/broken.rego does not parse")
            && said.contains("team/broken.rego:6:9"),
        "{said}"
    );
    assert!(
        !sb.store.exists() || sb.store_files().is_empty(),
        "nothing was recorded"
    );
    assert!(sb.cloud_files().is_empty());
}

#[tokio::test]
async fn an_approved_plan_carries_its_warnings_and_is_judged_again_when_applied() {
    // Planned while the runner held plans to no policy: kept for approval.
    let mut sb = Sandbox::new();
    // Its key is in the result as it is delivered (here, run's output), stored nowhere.
    let plan = sb.job(
        "p12.yaml",
        &demo_job("p12", "approved", "plan", "approved", 12),
    );
    let out = sb.run(&["run", "--json", "-q", plan.to_str().unwrap()]);
    out.expect_code(0);
    let r: Value = serde_json::from_str(&out.stdout()).unwrap();
    let key = r["plan"]["key"]
        .as_str()
        .expect("the plan's key")
        .to_owned();

    // The policies of the time of its apply decide: the rule stops it.
    sb.env.push((
        "TERRACE_POLICIES".into(),
        tests::policy::demo().display().to_string(),
    ));
    let apply = sb.job(
        "a12.yaml",
        &format!(
            "id: a12\ntenant: acme\nworkspace: approved\noperation: apply\n\
             template: {{ name: demo, version: 1.0.0 }}\nplan: p12\nplan_key: {key}\n"
        ),
    );
    sb.run(&["run", "-q", apply.to_str().unwrap()])
        .expect_code(1);
    let r = sb
        .artifact_json("acme/approved", "a12", "result.json")
        .await;
    tests::policy::assert_denied(&r);
    assert!(sb.cloud_files().is_empty(), "nothing was applied");
    assert!(sb.versions("acme/approved").await.is_empty());

    // A plan within the policies keeps its warning in its record, for the approval screen.
    sb.run_demo("p2", "approved", "plan", "approved", 2, 0)
        .await;
    let record = sb.artifact_json("acme/approved", "p2", "plan.json").await;
    assert_eq!(record["policy"]["warn"][0]["message"], WARNED, "{record}");
    assert!(record["policy"]["deny"].as_array().unwrap().is_empty());
}

/// Puts `body` at `key` in `bucket`, as anyone who can write the bucket could.
async fn put_object(bucket: &str, key: &str, body: &str) {
    tests::aws::s3()
        .await
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(body.as_bytes().to_vec().into())
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_set_published_to_a_bucket_is_read_from_it_and_refused_once_changed_behind_its_listing() {
    let bucket = tests::aws::bucket().await;
    let url = format!("s3://{bucket}/policies");
    let mut sb = Sandbox::new();
    sb.env.extend(tests::aws::cli_env());
    let demo = tests::policy::demo();
    let publish = |dir: &std::path::Path, name: &str| {
        sb.run(&[
            "policy",
            "publish",
            dir.to_str().unwrap(),
            name,
            "1",
            "--to",
            &url,
        ])
    };
    let published = publish(&demo, "demo");
    published.expect_code(0);
    let set = format!("{url}/demo/1");
    let said = published.stdout();
    assert!(
        said.contains("demo 1: published (1 files, sha256:")
            && said.contains(&format!("TERRACE_POLICIES={set}")),
        "{said}"
    );
    // Again, the same files: nothing changes. Other files under the same version: refused.
    let again = publish(&demo, "demo");
    again.expect_code(0);
    assert!(
        again.stdout().contains("already published"),
        "{}",
        again.stdout()
    );
    let other = sb.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(
        other.join("x.rego"),
        "package x\n\nimport rego.v1\n\nwarn contains \"x\" if { true }\n",
    )
    .unwrap();
    let refused = publish(&other, "demo");
    refused.expect_code(78);
    assert!(
        refused.stderr().contains("never changes"),
        "{}",
        refused.stderr()
    );
    // A set that does not parse is never published.
    let refused = publish(&tests::policy::broken(sb.dir.path()), "broken");
    refused.expect_code(78);
    assert!(
        refused.stderr().contains("broken.rego:6:9"),
        "{}",
        refused.stderr()
    );

    // A runner reads the published set.
    sb.env.push(("TERRACE_POLICIES".into(), set.clone()));
    let r = sb
        .run_demo("pub-big", "published", "apply", "pub", 12, 1)
        .await;
    tests::policy::assert_denied(&r);
    assert_eq!(r["policy"]["deny"][0]["policy"], "testcloud.rego");

    // Someone with write access to the bucket loosens the rule behind the listing.
    let loosened = std::fs::read_to_string(demo.join("testcloud.rego"))
        .unwrap()
        .replace("> 8", "> 80");
    put_object(&bucket, "policies/demo/1/testcloud.rego", &loosened).await;
    // A runner with a fresh cache fetches it and finds it differs from its listing.
    let mut fresh = Sandbox::new();
    fresh.env.extend(sb.env.iter().cloned());
    let job = fresh.job("j.yaml", &demo_job("j1", "published", "apply", "fresh", 12));
    let out = fresh.run(&["run", job.to_str().unwrap()]);
    out.expect_code(78);
    assert!(
        out.stderr()
            .contains("testcloud.rego differs from its line in the listing"),
        "{}",
        out.stderr()
    );
    // The first runner keeps its checked copy: the rule still holds.
    let r = sb
        .run_demo("pub-big2", "published", "apply", "pub", 12, 1)
        .await;
    tests::policy::assert_denied(&r);
    // A listing rewritten to match: refused by the runner that fetched the first one.
    let sums = format!(
        "{}  testcloud.rego\n",
        state_backends::sha256_hex(loosened.as_bytes())
    );
    put_object(&bucket, "policies/demo/1.SHA256SUMS", &sums).await;
    let job = sb.job("j2.yaml", &demo_job("j2", "published", "apply", "pub", 12));
    let out = sb.run(&["run", job.to_str().unwrap()]);
    out.expect_code(78);
    assert!(
        out.stderr()
            .contains("its listing changed after it was published"),
        "{}",
        out.stderr()
    );
    assert!(sb.cloud_files().is_empty() && fresh.cloud_files().is_empty());
}
