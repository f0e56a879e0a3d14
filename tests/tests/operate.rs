//! The operator's CLI on every kind of store: `terrace` with `--store` naming a folder, an S3
//! bucket (with a DynamoDB lease table through an assumed role, and with a lock object), a GCS
//! bucket and an Azure container, against moto, fake-gcs-server and Azurite. Jobs run through
//! the same binary, with the machine's terraform, so what is read back is what a runner wrote.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::{Sandbox, demo_job};

/// A sandbox whose `terrace` works on the store `url`, with `env` (endpoints, credentials).
fn sandbox(url: &str, env: &[(&str, String)]) -> Sandbox {
    let mut sb = Sandbox::new();
    sb.env.push(("TERRACE_STORE".into(), url.into()));
    sb.env
        .extend(env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    sb
}

fn json(run: &tests::Run) -> Value {
    serde_json::from_str(&run.stdout())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", run.stdout(), run.stderr()))
}

fn moto_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", tests::aws::moto()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_CONFIG_FILE", "/nonexistent".into()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
        ("TERRACE_S3_FORCE_PATH_STYLE", "1".into()),
    ]
}

/// Every command an operator has, on the store `sb` names: two applies, then workspaces, runs,
/// result, logs, versions, backup, backups, restore and a drift sweep, each read back.
fn every_command_works(sb: &Sandbox) {
    let ws = "acme/ops";
    for (id, nodes) in [("ops-1", 1), ("ops-2", 2)] {
        let job = sb.job(
            &format!("{id}.yaml"),
            &demo_job(id, "ops", "apply", "ops", nodes),
        );
        sb.run(&["run", job.to_str().unwrap()]).expect_code(0);
    }

    let listed = json(sb.run(&["workspaces", "--json"]).expect_code(0));
    assert_eq!(listed["schema"], 1);
    assert_eq!(listed["workspaces"], serde_json::json!([ws]));

    let runs = json(sb.run(&["runs", ws, "--json"]).expect_code(0));
    assert_eq!(runs["total"], 2);
    let ids: Vec<&str> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ops-2", "ops-1"], "newest first: {runs}");
    for r in runs["runs"].as_array().unwrap() {
        assert_eq!(r["status"], "succeeded", "{r}");
        assert_eq!(r["operation"], "apply", "{r}");
        assert_eq!(r["template"], "demo@1.0.0", "{r}");
        assert!(r["duration_ms"].as_u64().unwrap() > 0, "{r}");
    }
    assert!(runs["runs"][0]["fence"].as_u64() > runs["runs"][1]["fence"].as_u64());
    let text = sb.run(&["runs", ws, "--limit", "1"]);
    text.expect_code(0);
    assert!(text.stdout().contains("ops-2"), "{}", text.stdout());
    assert!(!text.stdout().contains("ops-1"), "{}", text.stdout());
    assert!(
        text.stderr().contains("1 older runs not shown"),
        "{}",
        text.stderr()
    );

    // The result, found without naming the workspace, and as text with the job's exit code.
    let result = json(sb.run(&["result", "ops-1", "--json"]).expect_code(0));
    assert_eq!(
        (result["job_id"].as_str(), result["status"].as_str()),
        (Some("ops-1"), Some("succeeded"))
    );
    assert_eq!(result["state_versions"], serde_json::json!([1]));
    let shown = sb.run(&["result", "ops-2", "-w", ws]);
    shown.expect_code(0);
    assert!(
        shown.stdout().contains("status:     succeeded"),
        "{}",
        shown.stdout()
    );
    sb.run(&["result", "ops-9"]).expect_code(66);

    // The newest run's log by default; a named one; NDJSON with --json.
    let log = sb.run(&["logs", ws]);
    log.expect_code(0);
    assert!(
        log.stdout().contains("==> job ops-2 succeeded"),
        "{}",
        log.stdout()
    );
    let log = sb.run(&["logs", ws, "ops-1", "--json"]);
    log.expect_code(0);
    let lines: Vec<Value> = log
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() > 10, "{}", log.stdout());
    assert!(
        lines
            .windows(2)
            .all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64())
    );
    assert!(
        !log.stdout().contains("correct-horse-battery-staple"),
        "the stored log is redacted"
    );
    sb.run(&["logs", ws, "ops-9"]).expect_code(66);

    // The lifecycle record, written under the lease in this store.
    let status = json(sb.run(&["status", ws, "--json"]).expect_code(0));
    assert_eq!(status["status"], "active", "{status}");
    let moves: Vec<(&str, &str)> = status["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["to"].as_str().unwrap(), t["job_id"].as_str().unwrap()))
        .collect();
    assert_eq!(
        moves,
        [
            ("provisioning", "ops-1"),
            ("active", "ops-1"),
            ("updating", "ops-2"),
            ("active", "ops-2")
        ]
    );

    let versions = json(sb.run(&["state", "versions", ws, "--json"]).expect_code(0));
    assert_eq!(versions["current"], 2);
    assert_eq!(versions["versions"].as_array().unwrap().len(), 2);

    let backup = sb.run(&["backup"]);
    backup.expect_code(0);
    assert!(
        backup.stdout().contains("acme/ops: backed up version 2"),
        "{}",
        backup.stdout()
    );
    let backups = json(sb.run(&["state", "backups", ws, "--json"]).expect_code(0));
    assert_eq!(backups["backups"][0]["version"], 2, "{backups}");

    let restored = sb.run(&["state", "restore", ws, "--version", "1"]);
    restored.expect_code(0);
    assert!(
        restored
            .stdout()
            .contains("version 1 restored as version 3"),
        "{}",
        restored.stdout()
    );
    let versions = json(sb.run(&["state", "versions", ws, "--json"]).expect_code(0));
    assert_eq!(versions["current"], 3);

    // The drift sweep reads the last apply's record from the store: the demo's password is
    // sensitive, so the check is listed for sending with it rather than queued.
    let queue = sb.dir.path().join("drift-queue");
    let drift = sb.run(&["drift", "--queue", queue.to_str().unwrap()]);
    drift.expect_code(0);
    assert!(
        drift.stderr().contains(
            "acme/ops: not queued: its last apply had sensitive variables (admin_password)"
        ),
        "{}",
        drift.stderr()
    );
    assert!(
        drift.stdout().contains("0 queued, 1 need secrets"),
        "{}",
        drift.stdout()
    );

    let unlock = sb.run(&["state", "unlock", ws]);
    unlock.expect_code(0);
    assert!(
        unlock.stdout().contains("has no lease"),
        "{}",
        unlock.stdout()
    );
}

#[tokio::test]
async fn every_command_works_on_a_folder() {
    let sb = Sandbox::new();
    every_command_works(&sb);
}

#[tokio::test]
async fn every_command_works_on_s3_with_a_lease_table_through_an_assumed_role() {
    let bucket = tests::aws::bucket().await;
    let table = tests::aws::lease_table().await;
    let url = format!(
        "s3://{bucket}/terrace?lease_table={table}&region=us-east-1\
         &role_arn=arn:aws:iam::123456789012:role/terrace&external_id=ops-test"
    );
    let sb = sandbox(&url, &moto_env());
    every_command_works(&sb);
    // The store is the bucket and the table: the state is under the prefix in S3, and the
    // table recorded the lease.
    let keys = tests::aws::s3()
        .await
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("terrace/acme/ops/")
        .send()
        .await
        .unwrap();
    assert!(keys.key_count().unwrap_or(0) > 0);
    let items = tests::aws::dynamodb()
        .await
        .scan()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    assert_eq!(items.count(), 1, "one lease item for the workspace");
}

/// The role in the URL is assumed: with STS out of reach, nothing is read with the caller's
/// own credentials instead.
#[tokio::test]
async fn an_s3_store_with_a_role_is_reached_only_through_the_role() {
    let bucket = tests::aws::bucket().await;
    let mut env = moto_env();
    env.push(("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9".into()));
    let sb = sandbox(
        &format!(
            "s3://{bucket}?region=us-east-1&role_arn=arn:aws:iam::123456789012:role/terrace&external_id=x"
        ),
        &env,
    );
    let run = sb.run(&["runs", "acme/ops"]);
    run.expect_code(70);
    assert!(!run.stderr().contains("testing"), "{}", run.stderr());
}

/// Job ids a person may type wrongly, and runs not started yet, on the folder store.
#[tokio::test]
async fn queued_runs_records_and_ambiguous_ids_are_told_apart() {
    let sb = Sandbox::new();
    every_command_works(&sb);
    // A job staged for a task that has not started: newest, and queued.
    let staged = sb.store.join("acme/ops/runs/q-1");
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(staged.join("request-0123456789abcdef.json"), "{}").unwrap();
    let runs = json(sb.run(&["runs", "acme/ops", "--json"]).expect_code(0));
    assert_eq!(
        (
            runs["runs"][0]["job_id"].as_str(),
            runs["runs"][0]["status"].as_str()
        ),
        (Some("q-1"), Some("queued")),
        "{runs}"
    );
    let waiting = sb.run(&["result", "q-1"]);
    waiting.expect_code(75);
    assert!(
        waiting.stderr().contains("it is queued"),
        "{}",
        waiting.stderr()
    );
    // The workspace's own records are not a job; nor is a path.
    for id in ["_workspace", "../ops-1"] {
        let refused = sb.run(&["result", id]);
        refused.expect_code(64);
        assert!(
            refused.stderr().contains("is not a job id"),
            "{}",
            refused.stderr()
        );
        sb.run(&["logs", "acme/ops", id]).expect_code(64);
    }
    // The same id in two workspaces: the workspace must be named.
    let copy = sb.store.join("acme/ops2/runs/ops-1");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(
        sb.store.join("acme/ops/runs/ops-1/result.json"),
        copy.join("result.json"),
    )
    .unwrap();
    let ambiguous = sb.run(&["result", "ops-1"]);
    ambiguous.expect_code(64);
    assert!(
        ambiguous
            .stderr()
            .contains("acme/ops, acme/ops2: name one with -w"),
        "{}",
        ambiguous.stderr()
    );
    sb.run(&["result", "ops-1", "-w", "acme/ops2"])
        .expect_code(0);
}

#[tokio::test]
async fn every_command_works_on_s3_with_a_lock_object() {
    let bucket = tests::aws::bucket().await;
    let mut env = moto_env();
    env.push(("AWS_REGION", "us-east-1".into()));
    let sb = sandbox(&format!("s3://{bucket}"), &env);
    every_command_works(&sb);
}

#[tokio::test]
async fn every_command_works_on_gcs() {
    let bucket = tests::gcs::bucket().await;
    let sb = sandbox(
        &format!("gs://{bucket}/terrace"),
        &[
            ("TERRACE_GCS_ENDPOINT", tests::gcs::endpoint()),
            ("TERRACE_GCS_ANONYMOUS", "1".into()),
        ],
    );
    every_command_works(&sb);
}

#[tokio::test]
async fn every_command_works_on_azure_blob() {
    let with_sas = tests::azure::container().await;
    let container = with_sas.split('?').next().unwrap();
    let sb = sandbox(
        &format!("{container}/terrace"),
        &[("AZURE_STORAGE_SAS_TOKEN", tests::azure::sas())],
    );
    every_command_works(&sb);
    let refused = sb.run(&["--store", &with_sas, "runs", "acme/ops"]);
    refused.expect_code(64);
    assert!(
        refused.stderr().contains("AZURE_STORAGE_SAS_TOKEN"),
        "{}",
        refused.stderr()
    );
    assert!(!refused.stderr().contains("sig="), "{}", refused.stderr());
}

#[tokio::test]
async fn a_store_without_credentials_or_region_says_what_to_set() {
    let sb = sandbox(
        "s3://bucket",
        &[
            ("AWS_CONFIG_FILE", "/nonexistent".into()),
            ("AWS_REGION", String::new()),
        ],
    );
    let run = sb.run(&["runs", "acme/ops"]);
    run.expect_code(70);
    assert!(
        run.stderr().contains("add ?region=") && run.stderr().contains("AWS_REGION"),
        "{}",
        run.stderr()
    );
    // A malformed setting is named, and trying again cannot pass: a usage error.
    let mut sb = sb;
    sb.env.push(("TERRACE_CALL_TIMEOUT".into(), "soon".into()));
    let run = sb.run(&["runs", "acme/ops"]);
    run.expect_code(64);
    assert!(
        run.stderr()
            .contains("TERRACE_CALL_TIMEOUT=\"soon\" is not a number of seconds"),
        "{}",
        run.stderr()
    );
}

/// `logs --follow` prints a running job's lines before it ends, ends with the job, and the
/// delay from a line's time to its printing is reported (p50, p99; not asserted: a figure).
#[tokio::test]
async fn logs_follow_prints_a_running_jobs_lines_before_it_ends() {
    let bucket = tests::aws::bucket().await;
    let mut env = moto_env();
    env.push(("AWS_REGION", "us-east-1".into()));
    // Each create in the test cloud takes 3 s: the apply runs for about 6 s.
    env.push(("TESTCLOUD_CREATE_DELAY_MS", "3000".into()));
    let sb = sandbox(&format!("s3://{bucket}/follow"), &env);
    let job = sb.job("slow.yaml", &demo_job("slow-1", "slow", "apply", "slow", 1));
    let mut runner = sb.start(&["--quiet", "run", job.to_str().unwrap()]);
    let mut follower = sb
        .terrace()
        .args([
            "logs",
            "acme/slow",
            "slow-1",
            "--follow",
            "--json",
            "--interval-ms",
            "200",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lags = Vec::new();
    let mut before_end = 0;
    let mut saw_running = false;
    let mut last = Value::Null;
    for line in BufReader::new(follower.stdout.take().unwrap()).lines() {
        let line: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let ts = time::OffsetDateTime::parse(
            line["ts"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        lags.push((time::OffsetDateTime::now_utc() - ts).as_seconds_f64());
        if runner.try_wait().unwrap().is_none() {
            before_end += 1;
            if !saw_running {
                let runs = json(sb.run(&["runs", "acme/slow", "--json"]).expect_code(0));
                saw_running = runs["runs"][0]["status"] == "running";
            }
        }
        last = line;
    }
    let started = Instant::now();
    let code = follower.wait().unwrap().code();
    assert_eq!(code, Some(0), "the follower ends with the job");
    assert!(runner.wait().unwrap().success());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        before_end >= 5,
        "only {before_end} lines were printed while the job ran"
    );
    assert!(saw_running, "`runs` showed the job as running while it ran");
    assert!(
        last["text"]
            .as_str()
            .unwrap()
            .starts_with("job slow-1 succeeded"),
        "{last}"
    );
    lags.sort_by(f64::total_cmp);
    let pct = |p: f64| lags[((lags.len() - 1) as f64 * p) as usize];
    eprintln!(
        "logs --follow (S3 in moto, 200 ms polls): {} lines, lag p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        lags.len(),
        pct(0.5),
        pct(0.99),
        lags[lags.len() - 1]
    );
}

/// A runner killed mid-job leaves no result: `runs` calls the run unfinished once its lease
/// has expired, `result` says it has none (exit 75), and `logs --follow` stops saying why.
#[tokio::test]
async fn a_killed_runs_logs_and_status_say_it_stopped() {
    let mut sb = Sandbox::new();
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "20000".into()));
    sb.env.push(("TERRACE_LEASE_TTL".into(), "2".into()));
    let job = sb.job(
        "killed.yaml",
        &demo_job("killed-1", "killed", "apply", "killed", 1),
    );
    let mut runner = sb.start(&["--quiet", "run", job.to_str().unwrap()]);
    // Killed once the apply has started (its first stored chunk mentions it).
    sb.wait_for_log(
        "acme/killed",
        "killed-1",
        "==> terraform apply",
        Duration::from_secs(60),
    )
    .await;
    let runs = json(sb.run(&["runs", "acme/killed", "--json"]).expect_code(0));
    assert_eq!(runs["runs"][0]["status"], "running", "{runs}");
    Command::new("kill")
        .args(["-KILL", &runner.id().to_string()])
        .status()
        .unwrap();
    runner.wait().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await; // the lease expires
    let runs = json(sb.run(&["runs", "acme/killed", "--json"]).expect_code(0));
    assert_eq!(runs["runs"][0]["status"], "unfinished", "{runs}");
    let result = sb.run(&["result", "killed-1"]);
    result.expect_code(75);
    assert!(
        result.stderr().contains("no result yet: it is unfinished"),
        "{}",
        result.stderr()
    );
    let follow = sb.run(&[
        "logs",
        "acme/killed",
        "killed-1",
        "--follow",
        "--interval-ms",
        "100",
    ]);
    follow.expect_code(1);
    assert!(
        follow.stderr().contains("stopped without a result"),
        "{}",
        follow.stderr()
    );
    assert!(
        follow.stdout().contains("terraform apply"),
        "{}",
        follow.stdout()
    );
}
