//! The local runner end to end: the real `terrace` binary, the real terraform binary, the
//! testcloud provider, and the `fs` store.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::{Sandbox, demo_job, step_names};

#[tokio::test]
async fn demo_job_applies_records_versions_and_a_repeat_changes_nothing() {
    let sb = Sandbox::new();
    let job = sb.job(
        "apply-1.yaml",
        &demo_job("apply-1", "demo", "apply", "demo", 3),
    );
    let run = sb.run(&["run", job.to_str().unwrap()]);
    run.expect_code(0);
    assert!(
        run.stdout().contains("status:     succeeded"),
        "{}",
        run.stdout()
    );

    let result = sb
        .artifact_json("acme/demo", "apply-1", "result.json")
        .await;
    assert_eq!(result["status"], "succeeded");
    // The saved plan is applied; changes and outputs come from terraform's -json messages.
    assert_eq!(step_names(&result), ["init", "plan", "apply"]);
    assert_eq!(result["changes"]["add"], 2);
    // The client that ran it, read from `version -json` of the machine's terraform.
    let version = Command::new(tests::terraform())
        .args(["version", "-json"])
        .env("CHECKPOINT_DISABLE", "1")
        .output()
        .unwrap();
    let version: Value = serde_json::from_slice(&version.stdout).unwrap();
    assert_eq!(result["terraform"]["version"], version["terraform_version"]);
    assert_eq!(result["terraform"]["flavour"], "terraform");
    assert_eq!(
        result["schema"],
        shared::run::result::RESULT_SCHEMA,
        "results carry their format"
    );
    assert!(
        run.stdout().contains(&format!(
            "terraform:  Terraform {}",
            version["terraform_version"].as_str().unwrap()
        )),
        "{}",
        run.stdout()
    );
    let cluster_id = result["outputs"]["cluster_id"]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(cluster_id.starts_with("cls-"), "{cluster_id}");
    assert_eq!(
        result["outputs"]["endpoint"]["value"],
        "https://demo.eu-west-1.testcloud.local"
    );
    assert_eq!(result["outputs"]["admin_url"]["value"], "(sensitive value)");

    // The test cloud holds exactly the two resources, as the outputs say.
    let cloud = sb.cloud_files();
    assert_eq!(cloud.len(), 2, "{cloud:?}");
    let cluster: Value =
        serde_json::from_str(&cloud[&format!("cluster/{cluster_id}.json")]).unwrap();
    assert_eq!(
        (cluster["node_count"].as_f64(), cluster["region"].as_str()),
        (Some(3.0), Some("eu-west-1"))
    );

    let versions = sb.versions("acme/demo").await;
    assert!(!versions.is_empty());
    assert_eq!(
        result["state_versions"],
        serde_json::json!(versions.iter().map(|v| v.number).collect::<Vec<_>>())
    );
    let state = sb.current_state("acme/demo");
    assert_eq!(state["resources"].as_array().unwrap().len(), 2);

    // The same job id again: not run again.
    let again = sb.run(&["run", job.to_str().unwrap()]);
    again.expect_code(0);
    assert!(
        again.stdout().contains("already finished"),
        "{}",
        again.stdout()
    );
    assert_eq!(sb.versions("acme/demo").await.len(), versions.len());

    // The same request under new ids: no changes planned, the cloud untouched. Terraform bumps
    // a serial of 0 once even without changes (its own rule), so by the third apply no new
    // version may appear at all.
    for (i, id) in ["apply-2", "apply-3"].iter().enumerate() {
        let before = sb.versions("acme/demo").await;
        let result = sb.run_demo(id, "demo", "apply", "demo", 3, 0).await;
        assert_eq!(
            result["changes"]["resources"],
            serde_json::json!([]),
            "{id}: {result}"
        );
        assert_eq!(
            result["outputs"]["cluster_id"]["value"],
            cluster_id.as_str()
        );
        assert_eq!(sb.cloud_files(), cloud, "{id} changed the cloud");
        let after = sb.versions("acme/demo").await;
        if i == 1 {
            assert_eq!(after, before, "a no-op apply wrote a state version");
        }
        assert_eq!(
            sb.current_state("acme/demo")["resources"],
            state["resources"],
            "{id} changed the state's resources"
        );
    }
}

#[tokio::test]
async fn a_job_with_five_mistakes_gets_five_precise_messages_and_nothing_runs() {
    let sb = Sandbox::new();
    let job = sb.job(
        "bad.yaml",
        "id: bad-1\ntenant: acme\nworkspace: demo\noperation: deploy\n\
         template: { name: demo, version: 1.0.0 }\n\
         variables:\n  cluster_name: Demo_Cluster\n  region: mars-1\n  node_count: 0\n  \
         admin_password: correct-horse-battery-staple\n  colour: blue\n",
    );
    let run = sb.run(&["run", job.to_str().unwrap()]);
    run.expect_code(65);
    let stderr = run.stderr();
    let problems: Vec<&str> = stderr.lines().filter(|l| l.starts_with("  - ")).collect();
    assert_eq!(problems.len(), 5, "{stderr}");
    let expected = [
        ("operation:", "\"deploy\" is not an operation"),
        ("variables.colour:", "is not declared by the template"),
        ("variables.cluster_name:", "does not match the pattern"),
        ("variables.node_count:", "must be at least 1"),
        (
            "variables.region:",
            "use one of \"eu-west-1\", \"eu-central-1\", \"us-east-1\"",
        ),
    ];
    for (field, text) in expected {
        assert!(
            problems
                .iter()
                .any(|p| p.contains(field) && p.contains(text) && p.contains("(fix: ")),
            "no message for {field} containing {text:?}:\n{stderr}"
        );
    }
    assert!(!sb.store.exists(), "an invalid job wrote to the store");
    assert!(sb.cloud_files().is_empty());

    let validate = sb.run(&["validate", job.to_str().unwrap()]);
    validate.expect_code(65);
    let good = sb.job("good.yaml", &demo_job("good-1", "demo", "plan", "demo", 1));
    let ok = sb.run(&["validate", good.to_str().unwrap()]);
    ok.expect_code(0);
    assert!(
        ok.stdout().contains("valid (plan demo@1.0.0 in acme/demo)"),
        "{}",
        ok.stdout()
    );
}

/// (start, end) of a finished job, from its result.
fn interval(result: &Value) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let parse = |k: &str| {
        time::OffsetDateTime::parse(
            result[k].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    (parse("started_at"), parse("finished_at"))
}

#[tokio::test]
async fn serve_runs_one_job_per_workspace_at_a_time_and_other_workspaces_in_parallel() {
    let mut sb = Sandbox::new();
    // Each create takes a second, so the jobs overlap whenever they are allowed to.
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "1000".into()));
    std::fs::write(
        sb.queue.join("a1.yaml"),
        demo_job("a1", "ws-a", "apply", "alpha", 1),
    )
    .unwrap();
    std::fs::write(
        sb.queue.join("a2.yaml"),
        demo_job("a2", "ws-a", "apply", "alpha", 2),
    )
    .unwrap();
    std::fs::write(
        sb.queue.join("b1.yaml"),
        demo_job("b1", "ws-b", "apply", "beta", 1),
    )
    .unwrap();
    std::fs::write(sb.queue.join("x-invalid.yaml"), "id: x\ntenant: acme\n").unwrap();
    // A template that cannot be read cannot say which values are secret: all are masked.
    std::fs::write(
        sb.queue.join("x-unknown.yaml"),
        "id: x2\ntenant: acme\nworkspace: w\noperation: apply\n\
         template: { name: nope, version: 1.0.0 }\nvariables: { pw: s3cr3t-value-1 }\n",
    )
    .unwrap();

    // A job file Terrace cannot read (a key given twice) cannot be searched for its secrets.
    std::fs::write(
        sb.queue.join("x-twice.yaml"),
        "id: x3\ntenant: acme\nworkspace: w\noperation: apply\n\
         template: { name: demo, version: 1.0.0 }\nvariables: { admin_password: canary-first }\n\
         variables: { admin_password: canary-second }\n",
    )
    .unwrap();
    // A misspelt `variables` keeps its values nowhere either.
    std::fs::write(
        sb.queue.join("x-misspelt.yaml"),
        "id: x4\ntenant: acme\nworkspace: w\noperation: apply\n\
         template: { name: demo, version: 1.0.0 }\nvaraibles: { admin_password: canary-typo }\n",
    )
    .unwrap();

    let serve = sb.serve_once(3);
    serve.expect_code(0);

    for name in ["a1.yaml", "a2.yaml", "b1.yaml"] {
        assert!(
            sb.queue.join("done").join(name).exists(),
            "{name} not done: {}",
            serve.stderr()
        );
        let result: Value = serde_json::from_slice(
            &std::fs::read(sb.queue.join("done").join(format!("{name}.result.json"))).unwrap(),
        )
        .unwrap();
        tests::schema::check_record(&result);
        assert_eq!(result["status"], "succeeded");
    }
    let rejected: Value = serde_json::from_slice(
        &std::fs::read(sb.queue.join("failed/x-invalid.yaml.result.json")).unwrap(),
    )
    .unwrap();
    tests::schema::check_record(&rejected);
    assert_eq!(rejected["status"], "rejected");
    assert!(
        rejected["errors"].as_array().unwrap().len() >= 3,
        "{rejected}"
    );
    let kept = std::fs::read_to_string(sb.queue.join("failed/x-unknown.yaml")).unwrap();
    assert!(!kept.contains("s3cr3t-value-1"), "{kept}");
    assert!(kept.contains(shared::job::redact::MASK), "{kept}");
    for name in ["x-twice.yaml", "x-misspelt.yaml"] {
        for file in [name.to_owned(), format!("{name}.result.json")] {
            let kept = std::fs::read_to_string(sb.queue.join("failed").join(&file)).unwrap();
            assert!(!kept.contains("canary"), "{file}: {kept}");
        }
    }
    assert!(!serve.stderr().contains("canary"), "{}", serve.stderr());

    let a1 = interval(&sb.artifact_json("acme/ws-a", "a1", "result.json").await);
    let a2 = interval(&sb.artifact_json("acme/ws-a", "a2", "result.json").await);
    let b1 = interval(&sb.artifact_json("acme/ws-b", "b1", "result.json").await);
    let overlaps =
        |x: (time::OffsetDateTime, time::OffsetDateTime),
         y: (time::OffsetDateTime, time::OffsetDateTime)| { x.0 < y.1 && y.0 < x.1 };
    assert!(
        !overlaps(a1, a2),
        "two jobs of one workspace ran at once: {a1:?} {a2:?}"
    );
    assert!(
        overlaps(a1, b1) || overlaps(a2, b1),
        "ws-b did not run beside ws-a: {a1:?} {a2:?} {b1:?}"
    );

    // Each acquisition of ws-a's lease got a new fence.
    let f1 = sb.artifact_json("acme/ws-a", "a1", "job.json").await["lease"]["fence"]
        .as_u64()
        .unwrap();
    let f2 = sb.artifact_json("acme/ws-a", "a2", "job.json").await["lease"]["fence"]
        .as_u64()
        .unwrap();
    assert_ne!(f1, f2);
    assert_eq!(f1.max(f2), 2);

    // The same job dropped again (another file, the same id): nothing runs, and its result is
    // the first run's.
    let versions = sb.versions("acme/ws-b").await;
    std::fs::write(
        sb.queue.join("b1-again.yaml"),
        demo_job("b1", "ws-b", "apply", "beta", 1),
    )
    .unwrap();
    sb.serve_once(2).expect_code(0);
    let first: Value =
        serde_json::from_slice(&std::fs::read(sb.queue.join("done/b1.yaml.result.json")).unwrap())
            .unwrap();
    let again: Value = serde_json::from_slice(
        &std::fs::read(sb.queue.join("done/b1-again.yaml.result.json")).unwrap(),
    )
    .unwrap();
    tests::schema::check_record(&again);
    assert_eq!(again, first);
    assert_eq!(
        sb.versions("acme/ws-b").await,
        versions,
        "nothing ran again"
    );

    // A job file done with keeps its identifiers, not its secrets.
    let kept = std::fs::read_to_string(sb.queue.join("done/b1.yaml")).unwrap();
    assert!(!kept.contains("correct-horse-battery-staple"), "{kept}");
    assert!(kept.contains(shared::job::redact::MASK), "{kept}");
    let kept = shared::job::RawJob::parse(&kept).unwrap();
    assert_eq!(kept.0["id"], "b1");
    assert_eq!(kept.0["variables"]["cluster_name"], "beta");
}

#[tokio::test]
async fn a_second_process_finds_the_workspace_busy_and_can_wait_for_it() {
    let mut sb = Sandbox::new();
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "2500".into()));
    let first = sb.job("p1.yaml", &demo_job("p1", "shared", "apply", "shared", 1));
    let second = sb.job("p2.yaml", &demo_job("p2", "shared", "apply", "shared", 1));
    let mut running = sb
        .terrace()
        .args(["run", "-q", first.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lease(&sb, "acme/shared", "p1").await;

    // The same job id delivered again while it runs: it waits, then finds the job done.
    let duplicate = sb
        .terrace()
        .args(["run", "-q", "--wait", "60", first.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let busy = sb.run(&["run", "-q", second.to_str().unwrap()]);
    busy.expect_code(75);
    assert!(
        busy.stderr().contains("leased by job p1"),
        "{}",
        busy.stderr()
    );

    let waited = sb.run(&["run", "-q", "--wait", "60", second.to_str().unwrap()]);
    waited.expect_code(0);
    assert!(running.wait().unwrap().success());
    let duplicate = tests::Run(duplicate.wait_with_output().unwrap());
    duplicate.expect_code(0);
    assert!(
        duplicate.stdout().contains("already finished"),
        "{}",
        duplicate.stdout()
    );
    let logs = shared::run::logs::read_log(&sb.fs_store(), &"acme/shared".parse().unwrap(), "p1")
        .await
        .unwrap();
    let inits = logs.iter().filter(|l| l.text == "terraform init").count();
    assert_eq!(inits, 1, "job p1 ran more than once");
    let p1 = interval(&sb.artifact_json("acme/shared", "p1", "result.json").await);
    let p2 = interval(&sb.artifact_json("acme/shared", "p2", "result.json").await);
    assert!(p2.0 >= p1.1, "p2 started before p1 released the workspace");
}

/// A lease broken mid-apply (an operator's `terrace state unlock --force`, another runner
/// taking an expired lease over) fences the run: it ends saying what happened, exit 75, never
/// as an internal error.
#[tokio::test]
async fn a_run_whose_lease_is_broken_mid_apply_says_so_and_exits_75() {
    use state_backends::StateStore;
    let mut sb = Sandbox::new();
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "3000".into()));
    sb.env.push(("TERRACE_LEASE_TTL".into(), "6".into()));
    let job = sb.job("b1.yaml", &demo_job("b1", "broken", "apply", "broken", 1));
    let running = sb
        .terrace()
        .args(["run", "-q", job.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lease(&sb, "acme/broken", "b1").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sb.fs_store()
        .break_lease(&"acme/broken".parse().unwrap(), None)
        .await
        .unwrap();
    let out = tests::Run(running.wait_with_output().unwrap());
    assert_ne!(out.code(), 70, "an internal error: {}", out.stderr());
    out.expect_code(75);
    assert!(
        out.stderr()
            .contains("another runner took the workspace over"),
        "{}",
        out.stderr()
    );
}

/// The local runner holds the store's credentials in its environment, as the functions hold
/// theirs: terraform must not read them. `terrace serve` as root runs each job as a user of
/// its own and kills what it leaves; `terrace run` as any user is non-dumpable and kills what
/// its job leaves (its descendants: it adopts the orphans).
#[tokio::test]
async fn a_provisioner_gets_nothing_of_the_local_runners_environment() {
    use std::os::unix::process::CommandExt;
    let sb = Sandbox::new();
    let probe = |id: &str, name: &str| {
        format!(
            "id: {id}\ntenant: acme\nworkspace: {name}\noperation: apply\n\
             template: {{ name: probe, version: 1.0.0 }}\nvariables: {{ name: {name} }}\n"
        )
    };
    let root = nix::unistd::geteuid().is_root();
    assert!(
        root || std::env::var_os("CI").is_none(),
        "CI runs as root, to run terrace as another user"
    );
    std::fs::write(sb.queue.join("p1.yaml"), probe("p1", "local-probe")).unwrap();
    let serve = sb.serve_once(2);
    serve.expect_code(0);
    assert!(sb.queue.join("done/p1.yaml").exists(), "{}", serve.stderr());
    sb.assert_probe_got_nothing("local-probe", &[], &["TESTCLOUD_ROOT"], root);

    // `terrace run` as a user who is not root: terraform runs as that user too.
    let job = sb.job("p2.yaml", &probe("p2", "local-probe-2"));
    let mine = sb.cloud.join("runner-home");
    std::fs::create_dir(&mine).unwrap();
    let mut cmd = sb.terrace();
    if root {
        nix::unistd::chown(&mine, Some(60998.into()), Some(60998.into())).unwrap();
        cmd.uid(60998).gid(60998);
    }
    let out = cmd
        .current_dir(&mine)
        .env("TERRACE_STORE", mine.join("store"))
        .env("TERRACE_CACHE_DIR", mine.join("cache"))
        .args(["run", "-q", job.to_str().unwrap()])
        .output()
        .unwrap();
    let out = tests::Run(out);
    out.expect_code(0);
    let report = sb.probe("local-probe-2");
    let leftover: i32 = report["leftover"].parse().unwrap();
    let alive = tests::alive(leftover);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(leftover),
        nix::sys::signal::Signal::SIGKILL,
    );
    sb.assert_probe_got_nothing("local-probe-2", &[], &["TESTCLOUD_ROOT"], false);
    assert!(
        !alive,
        "what the job left running outlived `terrace run`: {report:?}"
    );

    // `terrace run` as root with `TERRACE_TERRAFORM_USER=per-job`: a user of the job's own, as
    // `serve` gives by default.
    if root {
        let job = sb.job("p3.yaml", &probe("p3", "local-probe-3"));
        let out = sb
            .terrace()
            .env("TERRACE_TERRAFORM_USER", "per-job")
            .args(["run", "-q", job.to_str().unwrap()])
            .output()
            .unwrap();
        tests::Run(out).expect_code(0);
        sb.assert_probe_got_nothing("local-probe-3", &[], &["TESTCLOUD_ROOT"], true);
    }
}

/// A job whose provisioner allocates without bound meets the per-process memory limit: it fails
/// with its own category, and the runner and the job beside it go on.
#[tokio::test]
async fn a_job_that_allocates_without_bound_fails_on_its_limit_and_the_others_go_on() {
    let mut sb = Sandbox::new();
    sb.env.push(("TERRACE_JOB_MEMORY".into(), "2g".into()));
    std::fs::write(
        sb.queue.join("h1.yaml"),
        "id: h1\ntenant: acme\nworkspace: hog\noperation: apply\n\
         template: { name: hog, version: 1.0.0 }\nvariables: { name: hog }\n",
    )
    .unwrap();
    std::fs::write(
        sb.queue.join("d1.yaml"),
        demo_job("d1", "beside", "apply", "beside", 1),
    )
    .unwrap();
    let serve = sb.serve_once(2);
    serve.expect_code(0);
    let hog = sb.artifact_json("acme/hog", "h1", "result.json").await;
    assert_eq!(hog["status"], "failed", "{hog}");
    assert_eq!(hog["error"]["category"], "resource-limit", "{hog}");
    assert!(
        hog["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("TERRACE_JOB_MEMORY"),
        "{hog}"
    );
    let beside = sb.artifact_json("acme/beside", "d1", "result.json").await;
    assert_eq!(beside["status"], "succeeded", "{beside}");
}

async fn wait_for_lease(sb: &Sandbox, ws: &str, owner: &str) {
    use state_backends::StateStore;
    let ws: state_backends::WorkspaceId = ws.parse().unwrap();
    let store = sb.fs_store();
    let give_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < give_up {
        if store
            .lease(&ws)
            .await
            .unwrap()
            .is_some_and(|l| l.owner == owner)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{owner} never took the lease of {ws}");
}

#[tokio::test]
async fn restore_rolls_forward_and_drift_check_reports_out_of_band_changes() {
    let sb = Sandbox::new();
    sb.run_demo("r1", "restore", "apply", "rest", 1, 0).await;
    sb.run_demo("r2", "restore", "apply", "rest", 4, 0).await;
    let versions = sb.versions("acme/restore").await;
    let first = versions.first().unwrap().number;
    let first_state = sb.version_state("acme/restore", first);

    let listed = sb.run(&["state", "versions", "acme/restore"]);
    listed.expect_code(0);
    assert!(listed.stdout().contains("(current)"), "{}", listed.stdout());

    let restored = sb.run(&[
        "state",
        "restore",
        "acme/restore",
        "--version",
        &first.to_string(),
    ]);
    restored.expect_code(0);
    let after = sb.versions("acme/restore").await;
    assert_eq!(
        after.len(),
        versions.len() + 1,
        "a restore adds exactly one version"
    );
    assert_eq!(&after[..versions.len()], &versions[..], "history untouched");
    let newest = after.last().unwrap();
    assert!(
        newest.serial > versions.last().unwrap().serial,
        "the serial rolls forward"
    );
    let shown = sb.run(&["state", "show", "acme/restore"]);
    let current: Value = serde_json::from_str(&shown.stdout()).unwrap();
    assert_eq!(
        current["resources"], first_state["resources"],
        "the old content is current again"
    );
    assert_eq!(current["lineage"], first_state["lineage"]);

    // The restored state is older than the infrastructure: a drift check's refresh-only plan
    // says what differs, attribute by attribute; the template matches the cloud.
    let stale = sb
        .run_demo("d2", "restore", "drift-check", "rest", 4, 2)
        .await;
    assert_eq!(stale["drift"], true);
    assert_eq!(
        stale["drifted"],
        serde_json::json!([{"address": "testcloud_cluster.main", "action": "update",
            "attributes": [{"path": "node_count", "before": 1, "after": 4}]}])
    );
    assert_eq!(stale["changes"]["resources"], serde_json::json!([]));
    assert_eq!(step_names(&stale), ["init", "plan", "show", "plan"]);
    // An apply brings the state up to date; then nothing has drifted.
    sb.run_demo("r3", "restore", "apply", "rest", 4, 0).await;
    let clean = sb
        .run_demo("d3", "restore", "drift-check", "rest", 4, 0)
        .await;
    assert_eq!(clean["drift"], false);
    assert!(clean.get("drifted").is_none(), "{clean}");

    // Now the cloud changes out of band.
    let (path, content) = sb
        .cloud_files()
        .into_iter()
        .find(|(p, _)| p.starts_with("cluster/"))
        .unwrap();
    let mut cluster: Value = serde_json::from_str(&content).unwrap();
    cluster["node_count"] = 7.into();
    std::fs::write(sb.cloud.join(path), serde_json::to_vec(&cluster).unwrap()).unwrap();
    let job = sb.job(
        "d4.yaml",
        &demo_job("d4", "restore", "drift-check", "rest", 4),
    );
    let run = sb.run(&["run", job.to_str().unwrap()]);
    run.expect_code(2);
    assert!(
        run.stdout()
            .contains("  testcloud_cluster.main changed outside terraform: node_count 4 → 7"),
        "{}",
        run.stdout()
    );
    let drifted = sb.artifact_json("acme/restore", "d4", "result.json").await;
    assert_eq!(drifted["drift"], true);
    assert_eq!(
        drifted["drifted"][0]["attributes"],
        serde_json::json!([{"path": "node_count", "before": 4, "after": 7}])
    );
    // The configuration (4 nodes) now differs from the cloud (7): the plan would update it.
    assert_eq!(
        drifted["changes"]["resources"][0]["address"],
        "testcloud_cluster.main"
    );
    assert_eq!(
        drifted["changes"]["resources"][0]["actions"],
        serde_json::json!(["update"])
    );
    assert_eq!(
        sb.versions("acme/restore").await.len(),
        after.len() + 1,
        "drift checks write no state (the one new version is r3's apply)"
    );

    // The hourly backup copies the changed workspace once; a second sweep finds nothing new.
    let backup = sb.run(&["backup"]);
    backup.expect_code(0);
    let current = sb.versions("acme/restore").await.last().unwrap().number;
    assert!(
        backup
            .stdout()
            .contains(&format!("acme/restore: backed up version {current} as ")),
        "{}",
        backup.stdout()
    );
    let again = sb.run(&["backup"]);
    assert!(
        again.stdout().contains("0 changed, 0 backed up"),
        "{}",
        again.stdout()
    );

    // The versions go (a lifecycle rule, a mistake): the backup still brings the state back,
    // read from its own copy.
    let label = backup
        .stdout()
        .split(" as ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the backup's label")
        .trim_end_matches(&[',', '.', ':'][..])
        .to_owned();
    let backed_up = sb.current_state("acme/restore");
    let ws: state_backends::WorkspaceId = "acme/restore".parse().unwrap();
    std::fs::remove_dir_all(sb.fs_store().workspace_dir(&ws).join("versions")).unwrap();
    let restored = sb.run(&["state", "restore", "acme/restore", "--backup", &label]);
    restored.expect_code(0);
    assert!(
        restored
            .stdout()
            .contains(&format!("backup {label} restored as version")),
        "{}",
        restored.stdout()
    );
    let now = sb.current_state("acme/restore");
    assert_eq!(now["resources"], backed_up["resources"]);
    assert_eq!(now["lineage"], backed_up["lineage"]);
}

#[tokio::test]
async fn sensitive_values_appear_in_no_log_line_and_no_result() {
    let sb = Sandbox::new();
    let token = "tok-5ecr3t-XYZZY";
    let job = sb.job(
        "leak.yaml",
        &format!(
            "id: leak-1\ntenant: acme\nworkspace: leak\noperation: apply\n\
             template: {{ name: leaky, version: 1.0.0 }}\nvariables: {{ name: leaky, token: {token} }}\n"
        ),
    );
    // While the job runs, every process's command line and environment is read every few
    // milliseconds: the secret must be in none of them (terraform gets variables in a file).
    let listings = tests::ProcessListings::start(token, &sb.cloud);
    let run = sb.run(&["run", job.to_str().unwrap()]);
    run.expect_code(0);
    listings.check();
    // Terraform printed the secret (plan, apply, outputs); Terrace masked every occurrence.
    assert!(
        !run.stdout().contains(token) && !run.stderr().contains(token),
        "the console shows the secret"
    );
    // The apply's outputs are shown, masked, and the structured events are masked too.
    assert!(
        run.stderr()
            .contains("connection = \"token=(sensitive value)\""),
        "{}",
        run.stderr()
    );

    let ws: state_backends::WorkspaceId = "acme/leak".parse().unwrap();
    let logs = shared::run::logs::read_log(&sb.fs_store(), &ws, "leak-1")
        .await
        .unwrap();
    assert!(logs.len() > 20, "the log is stored");
    assert!(logs.iter().any(|l| l.text.contains("(sensitive value)")));
    // The durable log keeps terraform's structured messages, masked like the text.
    let outputs = logs
        .iter()
        .filter_map(|l| l.event.as_ref())
        .rfind(|e| e["type"] == "outputs")
        .expect("the apply's outputs message is in the stored log");
    assert_eq!(
        outputs["outputs"]["connection"]["value"],
        "token=(sensitive value)"
    );
    assert!(
        logs.iter()
            .filter_map(|l| l.event.as_ref())
            .any(|e| e["type"] == "apply_complete"),
        "apply progress is kept as events"
    );
    for (path, data) in sb.store_files() {
        let rel = path
            .strip_prefix(&sb.store)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let is_state = rel.ends_with(".tfstate");
        // Terraform's state holds the values it manages, by design; nothing else may.
        if !is_state {
            assert!(
                !String::from_utf8_lossy(&data).contains(token),
                "{rel} contains the secret"
            );
        }
    }
    let result = sb.artifact_json("acme/leak", "leak-1", "result.json").await;
    assert_eq!(
        result["outputs"]["connection"]["value"],
        "token=(sensitive value)"
    );
}

#[tokio::test]
async fn a_job_past_its_timeout_is_interrupted_reported_and_releases_its_lease() {
    let sb = Sandbox::new();
    // The network is made at once; the cluster's create is slow and gives up when interrupted.
    sb.faults(serde_json::json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "slow", "delay_ms": 90000, "times": 1 }]));
    // Long enough for init, plan and show on a loaded machine; far shorter than the create.
    let text =
        demo_job("slow-1", "slow", "apply", "slow", 1).replace("timeout: 5m", "timeout: 15s");
    let job = sb.job("slow.yaml", &text);
    let started = Instant::now();
    let run = sb.run(&["run", "-q", job.to_str().unwrap()]);
    run.expect_code(1);
    // 15 s timeout + 5 s grace (TERRACE_GRACE in the sandbox), far below the 90 s create.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );

    let result = sb.artifact_json("acme/slow", "slow-1", "result.json").await;
    assert_eq!(result["status"], "timed-out", "{result}");
    let error = &result["error"];
    assert_eq!(error["category"], "timeout");
    assert_eq!(error["step"], "apply");
    assert_eq!(error["address"], "testcloud_cluster.main", "{result}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("terraform stopped gracefully") && message.contains("was cancelled"),
        "{message}"
    );
    assert!(
        run.stdout().contains("raise the job's timeout"),
        "{}",
        run.stdout()
    );

    // Terraform saved what it had made before it stopped: the network, not the cluster.
    let last = result["state_versions"].as_array().unwrap().last().cloned();
    let state = sb.version_state(
        "acme/slow",
        last.and_then(|v| v.as_u64()).expect("a version"),
    );
    assert_eq!(state, sb.current_state("acme/slow"));
    let types: Vec<&str> = state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["testcloud_network"], "{state}");
    assert_eq!(sb.cloud_names(), ["slow-net"]);

    use state_backends::StateStore;
    let ws: state_backends::WorkspaceId = "acme/slow".parse().unwrap();
    assert!(
        sb.fs_store().lease(&ws).await.unwrap().is_none(),
        "the lease was not released"
    );
    let logs = shared::run::logs::read_log(&sb.fs_store(), &ws, "slow-1")
        .await
        .unwrap();
    assert!(
        logs.iter()
            .any(|l| l.text.contains("interrupting terraform (SIGINT)"))
    );
}

#[tokio::test]
async fn plan_changes_nothing_and_destroy_removes_everything_it_manages() {
    let sb = Sandbox::new();
    let result = sb.run_demo("plan-1", "life", "plan", "life", 2, 0).await;
    assert_eq!(result["changes"]["add"], 2, "{result}");
    assert_eq!(step_names(&result), ["init", "plan"]);
    assert!(sb.cloud_files().is_empty(), "a plan created resources");
    assert!(
        sb.versions("acme/life").await.is_empty(),
        "a plan wrote state"
    );

    sb.run_demo("apply-1", "life", "apply", "life", 2, 0).await;
    assert_eq!(sb.cloud_files().len(), 2);
    let before = sb.versions("acme/life").await.len();

    let result = sb
        .run_demo("destroy-1", "life", "destroy", "life", 2, 0)
        .await;
    assert_eq!(result["status"], "succeeded");
    let changes = &result["changes"];
    assert_eq!(
        (changes["destroy"].as_u64(), changes["add"].as_u64()),
        (Some(2), Some(0))
    );
    assert!(
        sb.cloud_files().is_empty(),
        "destroy left resources: {:?}",
        sb.cloud_files()
    );
    let after = sb.versions("acme/life").await;
    assert!(after.len() > before, "the destroy's state was not recorded");
    assert_eq!(
        sb.current_state("acme/life")["resources"],
        serde_json::json!([])
    );
}

#[tokio::test]
async fn unlock_refuses_a_live_lease_without_force_and_frees_it_with_force() {
    use state_backends::StateStore;
    let sb = Sandbox::new();
    let ws: state_backends::WorkspaceId = "acme/stuck".parse().unwrap();
    let stuck = sb
        .fs_store()
        .acquire_lease(
            &ws,
            &state_backends::LeaseRequest {
                owner: "stuck-job".into(),
                ttl: Duration::from_secs(600),
                info: Value::Null,
            },
        )
        .await
        .unwrap();

    let refused = sb.run(&["state", "unlock", "acme/stuck"]);
    refused.expect_code(75);
    assert!(
        refused.stderr().contains("leased by job stuck-job")
            && refused.stderr().contains("--force"),
        "{}",
        refused.stderr()
    );
    assert_eq!(
        sb.fs_store().lease(&ws).await.unwrap().map(|l| l.owner),
        Some("stuck-job".into())
    );

    let job = sb.job(
        "after.yaml",
        &demo_job("after-1", "stuck", "apply", "stuck", 1),
    );
    sb.run(&["run", "-q", job.to_str().unwrap()])
        .expect_code(75);

    let forced = sb.run(&["state", "unlock", "acme/stuck", "--force"]);
    forced.expect_code(0);
    assert!(
        forced
            .stdout()
            .contains("broke the live lease of job stuck-job"),
        "{}",
        forced.stdout()
    );
    sb.run(&["run", "-q", job.to_str().unwrap()]).expect_code(0);
    let fence = sb.artifact_json("acme/stuck", "after-1", "job.json").await["lease"]["fence"]
        .as_u64()
        .unwrap();
    assert!(fence > stuck.fence);
    assert!(sb.fs_store().lease(&ws).await.unwrap().is_none());
}

#[tokio::test]
async fn drift_queues_a_check_per_applied_workspace_that_serve_runs() {
    let sb = Sandbox::new();
    let fleet = sb.job(
        "fleet.yaml",
        "id: f1\ntenant: acme\nworkspace: nets\noperation: apply\ntemplate: { name: fleet, version: 1.0.0 }\nvariables: { networks: [a] }\n",
    );
    sb.run(&["run", fleet.to_str().unwrap()]).expect_code(0);
    sb.run_demo("s1", "secret", "apply", "sec", 1, 0).await;

    let queued = sb.run(&["drift", "--queue", sb.queue.to_str().unwrap()]);
    queued.expect_code(0);
    assert!(
        queued.stdout().contains("1 queued, 1 need secrets"),
        "{}",
        queued.stdout()
    );
    assert!(
        queued.stderr().contains("acme/secret") && queued.stderr().contains("admin_password"),
        "{}",
        queued.stderr()
    );
    let files: Vec<String> = std::fs::read_dir(&sb.queue)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with("--acme--nets.json"), "{files:?}");

    sb.serve_once(2).expect_code(0);
    let result: Value = serde_json::from_str(
        &std::fs::read_to_string(
            sb.queue
                .join("done")
                .join(format!("{}.result.json", files[0])),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(result["operation"], "drift-check");
    assert_eq!(result["workspace"], "nets");
    assert_eq!(result["drift"], false, "{result}");
}

#[tokio::test]
async fn a_terraform_older_than_the_floor_is_refused_before_the_state_is_touched() {
    let mut sb = Sandbox::new();
    // A client that says it is the 2021 pre-release this project once ran; it would fail the
    // test if anything but `version -json` reached it.
    let old = sb.dir.path().join("old-terraform");
    std::fs::write(
        &old,
        "#!/bin/sh\nif [ \"$1 $2\" = \"version -json\" ]; then\n  echo '{\"terraform_version\": \"0.15.0-rc2\", \"platform\": \"linux_amd64\"}'\n  exit 0\nfi\necho \"called with $*\" >&2\nexit 99\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    sb.env
        .push(("TERRACE_TERRAFORM".into(), old.display().to_string()));
    let job = sb.job("old.yaml", &demo_job("old-1", "old", "apply", "old", 1));
    let run = sb.run(&["run", job.to_str().unwrap()]);
    run.expect_code(1);
    assert!(
        run.stdout().contains(
            "Terraform 0.15.0-rc2 is not supported: Terrace needs Terraform 1.5.0 or later"
        ),
        "{}",
        run.stdout()
    );
    let result = sb.artifact_json("acme/old", "old-1", "result.json").await;
    assert_eq!(result["status"], "failed");
    assert_eq!(result["error"]["step"], "prepare");
    assert!(
        result["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("TERRACE_TERRAFORM"),
        "{result}"
    );
    assert!(step_names(&result).is_empty(), "terraform ran: {result}");
    assert!(
        sb.versions("acme/old").await.is_empty(),
        "state was written"
    );
    assert!(sb.cloud_files().is_empty());
    use state_backends::StateStore;
    let ws: state_backends::WorkspaceId = "acme/old".parse().unwrap();
    assert!(sb.fs_store().lease(&ws).await.unwrap().is_none());
}

#[tokio::test]
async fn a_job_file_that_is_not_text_is_an_invalid_job_not_a_runner_error() {
    let sb = Sandbox::new();
    let path = sb.dir.path().join("binary.yaml");
    std::fs::write(&path, [0xff, 0xfe, b'i', b'd']).unwrap();
    let run = sb.run(&["run", path.to_str().unwrap()]);
    run.expect_code(65);
    assert!(run.stderr().contains("UTF-8"), "{}", run.stderr());

    // In a queue, it ends in failed/ with why, instead of staying there forever.
    std::fs::copy(&path, sb.queue.join("binary.yaml")).unwrap();
    sb.serve_once(2).expect_code(0);
    let kept = std::fs::read_to_string(sb.queue.join("failed/binary.yaml")).unwrap();
    assert!(
        kept.contains("sha256"),
        "only a note stays of what cannot be read: {kept}"
    );
    let rejected: Value = serde_json::from_slice(
        &std::fs::read(sb.queue.join("failed/binary.yaml.result.json")).unwrap(),
    )
    .unwrap();
    tests::schema::check_record(&rejected);
    assert_eq!(rejected["status"], "rejected");
}

/// A new user's first `terrace run` in a new folder, with no `TERRACE_STORE`: the default
/// store, `.terrace` in the working folder, is made on first use (a relative name's parent is
/// the working folder).
#[test]
fn the_first_run_in_a_new_folder_makes_the_default_store_there() {
    let sb = Sandbox::new();
    let fresh = tempfile::tempdir().unwrap();
    let job = sb.job(
        "first.yaml",
        &demo_job("first-1", "first", "apply", "first", 1),
    );
    let out = sb
        .terrace()
        .current_dir(fresh.path())
        .env_remove("TERRACE_STORE")
        .args(["run", "-q", job.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let result = fresh
        .path()
        .join(".terrace/acme/first/runs/first-1/result.json");
    assert!(result.is_file(), "{}", result.display());
}
