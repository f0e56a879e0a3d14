//! Approved plans with the machine's terraform: a plan job keeps its plan sealed, an apply that
//! names it applies exactly that plan once, and every reason it no longer fits refuses it
//! before anything runs.

use serde_json::Value;
use tests::Sandbox;

const SECRET: &str = "plan-canary-sensitive-7f3a";
const TOKEN: &str = "plan-canary-ephemeral-91c2";

fn plan_job(id: &str, workspace: &str, name: &str, extra: &str) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: {workspace}\noperation: plan\n\
         template: {{ name: approval, version: 1.0.0 }}\n\
         variables:\n  name: {name}\n  secret: {SECRET}\n  token: {TOKEN}\n{extra}"
    )
}

fn apply_job(id: &str, workspace: &str, operation: &str, plan: &str, key: Option<&str>) -> String {
    let key = key.map_or_else(String::new, |k| format!("plan_key: {k}\n"));
    format!(
        "id: {id}\ntenant: acme\nworkspace: {workspace}\noperation: {operation}\n\
         template: {{ name: approval, version: 1.0.0 }}\nplan: {plan}\n{key}\
         variables:\n  token: {TOKEN}\n"
    )
}

fn run_json(sb: &Sandbox, name: &str, text: &str, code: i32) -> Value {
    let path = sb.job(name, text);
    let run = sb.run(&["run", "-q", "--json", path.to_str().unwrap()]);
    run.expect_code(code);
    serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}: {}", run.stdout()))
}

fn names_in_state(sb: &Sandbox, ws: &str) -> Vec<String> {
    let state = sb.current_state(ws);
    state["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["name"] == "app")
        .map(|r| r["instances"][0]["attributes"]["output"]["value"].to_string())
        .collect()
}

/// What terraform's plan file holds, unzipped (every member's bytes, one after another).
fn unzipped(plan: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.zip");
    std::fs::write(&path, plan).unwrap();
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nsys.stdout.buffer.write(b''.join(z.read(n) for n in z.namelist()))",
        ])
        .arg(&path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn an_approved_plan_is_applied_exactly_as_planned_once_and_its_secrets_stay_sealed() {
    let sb = Sandbox::new();
    let ws = "acme/approved";
    let plan = run_json(
        &sb,
        "plan.yaml",
        &plan_job("plan-1", "approved", "first", ""),
        0,
    );
    assert_eq!(plan["status"], "succeeded", "{plan}");
    assert_eq!(plan["plan"]["id"], "plan-1", "{plan}");
    assert_eq!(plan["plan"]["sealing"], "plan-key", "{plan}");
    assert!(plan["plan"]["expires_at"].is_string(), "{plan}");
    assert_eq!(plan["changes"]["add"], 2, "{plan}");
    let key = plan["plan"]["key"]
        .as_str()
        .expect("the plan's key")
        .to_owned();
    // Planned, nothing applied.
    assert!(sb.versions(ws).await.is_empty());

    // The kept plan: sealed, and its key is in no stored result.
    let wsid: state_backends::WorkspaceId = ws.parse().unwrap();
    let store = sb.fs_store();
    use state_backends::StateStore as _;
    let stored = store
        .artifact(&wsid, "plan-1", "plan.tfplan")
        .await
        .unwrap()
        .expect("the plan is kept");
    assert!(stored.starts_with(b"TERRACE-PLAN/1\n"));
    let result = sb.artifact_json(ws, "plan-1", "result.json").await;
    assert_eq!(result["plan"]["id"], "plan-1");
    assert!(result["plan"].get("key").is_none(), "{result}");
    let record = sb.artifact_json(ws, "plan-1", "plan.json").await;
    assert_eq!(record["terraform_version"], "1.11.4", "{record}");
    assert_eq!(record["state"], Value::Null, "an empty workspace: {record}");
    assert_eq!(record["template"]["version"], "1.0.0");
    assert!(record["lock_sha256"].is_string() || record["lock_sha256"].is_null());
    // Opened: the plan holds the sensitive value (what the sealing protects), and neither the
    // state server's address and password nor the ephemeral token.
    let opened = shared::run::plans::open(Some(&key), &stored, ("acme", "approved", "plan-1"))
        .expect("the key opens it");
    let inside = unzipped(&opened);
    assert!(contains(&inside, SECRET), "the plan keeps its variables");
    assert!(
        !contains(&inside, "127.0.0.1"),
        "the backend's address is in the plan"
    );
    assert!(
        !contains(&inside, "TF_HTTP"),
        "the backend's settings are in the plan"
    );
    assert!(
        !contains(&inside, TOKEN),
        "the ephemeral token is in the plan"
    );

    // An apply without the token is refused by name before anything runs.
    let bad = sb.job(
        "no-token.yaml",
        &apply_job("apply-0", "approved", "apply", "plan-1", Some(&key))
            .replace(&format!("variables:\n  token: {TOKEN}\n"), ""),
    );
    let refused = sb.run(&["run", "-q", bad.to_str().unwrap()]);
    refused.expect_code(65);
    assert!(
        refused.stderr().contains("variables.token"),
        "{}",
        refused.stderr()
    );

    // The approved apply: init and apply of the kept plan, no plan of its own.
    let applied = run_json(
        &sb,
        "apply.yaml",
        &apply_job("apply-1", "approved", "apply", "plan-1", Some(&key)),
        0,
    );
    assert_eq!(applied["status"], "succeeded", "{applied}");
    assert_eq!(applied["approved_plan"], "plan-1", "{applied}");
    assert_eq!(tests::step_names(&applied), ["init", "apply"], "{applied}");
    assert_eq!(applied["changes"]["add"], 2, "{applied}");
    assert_eq!(applied["outputs"]["name"]["value"], "first", "{applied}");
    assert_eq!(names_in_state(&sb, ws), ["\"first\""]);
    let claim = sb.artifact_json(ws, "plan-1", "plan-applied.json").await;
    assert_eq!(claim["job_id"], "apply-1");
    let versions = sb.versions(ws).await.len();

    // Applied once: another apply of it is refused, and nothing runs.
    let again = run_json(
        &sb,
        "again.yaml",
        &apply_job("apply-2", "approved", "apply", "plan-1", Some(&key)),
        1,
    );
    assert_eq!(again["status"], "failed", "{again}");
    assert_eq!(again["error"]["category"], "plan-refused", "{again}");
    let message = again["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("already applied by job apply-1"),
        "{message}"
    );
    assert_eq!(again["steps"], serde_json::json!([]), "{again}");
    assert_eq!(sb.versions(ws).await.len(), versions);

    // No value of the plan's secrets in any stored object but the sealed plan and the
    // states (which hold what terraform made of the secret; sealed when the store seals).
    for (path, bytes) in sb.store_files() {
        let state = contains(&bytes, "\"lineage\"");
        assert!(
            !contains(&bytes, TOKEN),
            "{} holds the token",
            path.display()
        );
        if !path.ends_with("plan.tfplan") && !state {
            assert!(
                !contains(&bytes, SECRET),
                "{} holds the secret",
                path.display()
            );
            assert!(
                !contains(&bytes, &key),
                "{} holds the plan's key",
                path.display()
            );
        }
    }
}

#[tokio::test]
async fn an_approved_plan_that_no_longer_fits_is_refused_before_anything_runs() {
    let sb = Sandbox::new();
    let ws = "acme/refused";
    let plan = run_json(&sb, "p1.yaml", &plan_job("p1", "refused", "planned", ""), 0);
    let key = plan["plan"]["key"].as_str().unwrap().to_owned();

    // A wrong key, a missing one.
    let other = "A".repeat(shared::job::validate::PLAN_KEY_CHARS);
    let wrong = run_json(
        &sb,
        "wrong.yaml",
        &apply_job("a-wrong", "refused", "apply", "p1", Some(&other)),
        1,
    );
    assert_eq!(wrong["error"]["category"], "plan-refused", "{wrong}");
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not open"),
        "{wrong}"
    );
    let none = run_json(
        &sb,
        "none.yaml",
        &apply_job("a-none", "refused", "apply", "p1", None),
        1,
    );
    assert!(
        none["error"]["hint"].as_str().unwrap().contains("plan_key"),
        "{none}"
    );
    // A plan of another workspace, or none at all.
    let elsewhere = run_json(
        &sb,
        "else.yaml",
        &apply_job("a-else", "other", "apply", "p1", Some(&key)),
        1,
    );
    assert_eq!(
        elsewhere["error"]["category"], "plan-refused",
        "{elsewhere}"
    );
    assert!(
        elsewhere["error"]["message"]
            .as_str()
            .unwrap()
            .contains("there is no plan p1 in workspace acme/other"),
        "{elsewhere}"
    );
    // A destroy job with a plan that is not a destroy plan.
    let kind = run_json(
        &sb,
        "kind.yaml",
        &apply_job("a-kind", "refused", "destroy", "p1", Some(&key)),
        1,
    );
    assert!(
        kind["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is not a destroy plan"),
        "{kind}"
    );
    // None of these claimed the plan, ran terraform or wrote a state.
    assert!(sb.versions(ws).await.is_empty());

    // A later run changes the state: the approved plan is superseded.
    let p2 = run_json(&sb, "p2.yaml", &plan_job("p2", "refused", "second", ""), 0);
    let key2 = p2["plan"]["key"].as_str().unwrap().to_owned();
    let applied = run_json(
        &sb,
        "a1.yaml",
        &apply_job("a1", "refused", "apply", "p1", Some(&key)),
        0,
    );
    assert_eq!(applied["status"], "succeeded", "{applied}");
    let stale = run_json(
        &sb,
        "a2.yaml",
        &apply_job("a2", "refused", "apply", "p2", Some(&key2)),
        1,
    );
    assert_eq!(stale["status"], "superseded", "{stale}");
    assert_eq!(stale["error"]["category"], "superseded", "{stale}");
    assert!(
        stale["error"]["message"]
            .as_str()
            .unwrap()
            .contains("state moved since plan p2"),
        "{stale}"
    );
    assert_eq!(names_in_state(&sb, ws), ["\"planned\""]);

    // A plan that failed has nothing to apply.
    let failed = run_json(
        &sb,
        "p3.yaml",
        &plan_job("p3", "refused", "third", "  fail: true\n"),
        1,
    );
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failed.get("plan").is_none(), "{failed}");
    let nothing = run_json(
        &sb,
        "a3.yaml",
        &apply_job("a3", "refused", "apply", "p3", Some(&key)),
        1,
    );
    assert!(
        nothing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plan p3 did not succeed"),
        "{nothing}"
    );

    // A destroy plan, approved, then applied by a destroy job.
    let d = run_json(
        &sb,
        "pd.yaml",
        &plan_job("pd", "refused", "planned", "destroy: true\n"),
        0,
    );
    assert_eq!(d["plan"]["destroy"], true, "{d}");
    assert_eq!(d["changes"]["destroy"], 2, "{d}");
    let keyd = d["plan"]["key"].as_str().unwrap().to_owned();
    let as_apply = run_json(
        &sb,
        "ad0.yaml",
        &apply_job("ad0", "refused", "apply", "pd", Some(&keyd)),
        1,
    );
    assert!(
        as_apply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is a destroy plan"),
        "{as_apply}"
    );
    let destroyed = run_json(
        &sb,
        "ad.yaml",
        &apply_job("ad", "refused", "destroy", "pd", Some(&keyd)),
        0,
    );
    assert_eq!(destroyed["status"], "succeeded", "{destroyed}");
    assert!(names_in_state(&sb, ws).is_empty());

    // A plan whose time is up: the hourly sweep deletes its file, and its apply is refused.
    let path = sb.job("short.yaml", &plan_job("p-short", "refused", "late", ""));
    let out = sb
        .terrace()
        .env("TERRACE_PLAN_TTL", "1")
        .args(["run", "-q", "--json", path.to_str().unwrap()])
        .output()
        .unwrap();
    let short: Value = serde_json::from_slice(&out.stdout).unwrap();
    let key_short = short["plan"]["key"].as_str().unwrap().to_owned();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let swept = sb.run(&["backup"]);
    swept.expect_code(0);
    assert!(
        swept
            .stdout()
            .contains("acme/refused: deleted plan p-short (expired)"),
        "{}",
        swept.stdout()
    );
    let wsid: state_backends::WorkspaceId = ws.parse().unwrap();
    use state_backends::StateStore as _;
    let store = sb.fs_store();
    assert!(
        store
            .artifact(&wsid, "p-short", "plan.tfplan")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .artifact(&wsid, "pd", "plan.tfplan")
            .await
            .unwrap()
            .is_some(),
        "not expired yet"
    );
    let late = run_json(
        &sb,
        "late.yaml",
        &apply_job("a-late", "refused", "apply", "p-short", Some(&key_short)),
        1,
    );
    assert!(
        late["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plan p-short expired at"),
        "{late}"
    );
    // Swept once: the next sweep has no plan to delete.
    let again = sb.run(&["backup"]);
    assert!(
        again.stdout().contains("; 0 expired plans deleted"),
        "{}",
        again.stdout()
    );
}

/// With a workspace key the store seals the plan itself: no key of its own, none to give back.
/// A plan whose time is up is refused.
#[tokio::test]
async fn a_plan_sealed_with_the_workspace_key_needs_no_plan_key_and_expires() {
    use std::sync::Arc;
    let sb = Sandbox::new();
    use state_backends::sealed::{KeyFile, Keyring, SealedStore};
    let key: [u8; 32] = rand::random();
    let keys = Keyring::new(Arc::new(KeyFile::from_bytes(&key)));
    let store = SealedStore::wrap(Arc::new(sb.fs_store()), Some(keys));
    let runner = sb.runner(store.clone());
    let plan = sb.validated(&plan_job("k1", "keyed", "keyed", ""));
    let planned = finished(runner.run(&plan, Default::default()).await);
    assert_eq!(planned.status.as_str(), "succeeded", "{planned:?}");
    let summary = planned.plan.expect("a plan summary");
    assert_eq!(summary.sealing, shared::run::plans::Sealing::WorkspaceKey);
    assert!(summary.key.is_none());
    let raw = sb.fs_store();
    use state_backends::StateStore as _;
    let wsid: state_backends::WorkspaceId = "acme/keyed".parse().unwrap();
    let stored = raw
        .artifact(&wsid, "k1", "plan.tfplan")
        .await
        .unwrap()
        .unwrap();
    assert!(
        state_backends::sealed::is_sealed(&stored),
        "sealed by the store"
    );
    let apply = sb.validated(&apply_job("k1-apply", "keyed", "apply", "k1", None));
    let applied = finished(runner.run(&apply, Default::default()).await);
    assert_eq!(applied.status.as_str(), "succeeded", "{applied:?}");

    // Whoever can write the bucket cannot put a plan of their own in a kept plan's place:
    // not a plain one (it must be the store's sealing), not another job's sealed one.
    for id in ["k3", "k4"] {
        let plan = sb.validated(&plan_job(id, "keyed", "swapped", ""));
        let planned = finished(runner.run(&plan, Default::default()).await);
        assert_eq!(planned.status.as_str(), "succeeded", "{planned:?}");
    }
    let plain = shared::run::plans::bind("k3", b"PK a plan of someone else's");
    raw.put_artifact(&wsid, "k3", "plan.tfplan", plain)
        .await
        .unwrap();
    let k4 = raw
        .artifact(&wsid, "k4", "plan.tfplan")
        .await
        .unwrap()
        .unwrap();
    let mut record = sb.artifact_json("acme/keyed", "k4", "plan.json").await;
    record["job_id"] = "k2x".into();
    raw.put_artifact(&wsid, "k2x", "plan.tfplan", k4)
        .await
        .unwrap();
    let mut copied = sb.artifact_json("acme/keyed", "k4", "result.json").await;
    copied["job_id"] = "k2x".into();
    for (name, value) in [("plan.json", record), ("result.json", copied)] {
        raw.put_artifact(&wsid, "k2x", name, value.to_string().into_bytes().into())
            .await
            .unwrap();
    }
    let mut k4_job = sb.artifact_json("acme/keyed", "k4", "job.json").await;
    k4_job["id"] = "k2x".into();
    raw.put_artifact(
        &wsid,
        "k2x",
        "job.json",
        k4_job.to_string().into_bytes().into(),
    )
    .await
    .unwrap();
    for (plan, says) in [("k3", "stored plain"), ("k2x", "not this plan job's")] {
        let apply = sb.validated(&apply_job(
            &format!("{plan}-apply"),
            "keyed",
            "apply",
            plan,
            None,
        ));
        let refused = finished(runner.run(&apply, Default::default()).await);
        let error = refused.error.expect("refused");
        assert!(error.message.contains(says), "{plan}: {}", error.message);
        assert!(refused.steps.is_empty(), "{plan}: terraform ran");
    }

    // Expired: a runner whose plans last no time at all.
    let mut config = sb.runner_config();
    config.plan_ttl = std::time::Duration::ZERO;
    let hasty = shared::run::runner::Runner::new(store, config);
    let plan = sb.validated(&plan_job("k2", "keyed", "other", ""));
    finished(hasty.run(&plan, Default::default()).await);
    let apply = sb.validated(&apply_job("k2-apply", "keyed", "apply", "k2", None));
    let refused = finished(hasty.run(&apply, Default::default()).await);
    let error = refused.error.expect("refused");
    assert_eq!(error.category.as_str(), "plan-refused");
    assert!(
        error.message.contains("plan k2 expired at"),
        "{}",
        error.message
    );
}

fn finished(
    outcome: Result<shared::run::runner::RunOutcome, shared::run::runner::RunError>,
) -> shared::run::result::JobResult {
    match outcome.expect("the run") {
        shared::run::runner::RunOutcome::Finished(result) => *result,
        other => panic!("{other:?}"),
    }
}
