//! `terrace serve --queue amqp://…`: workers on the real RabbitMQ node that
//! `scripts/with-emulators.sh` starts, real terraform, the sandbox's folder store shared by
//! every worker (its leases decide who runs a workspace).

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use state_backends::{LeaseRequest, StateStore as _, WorkspaceId};
use tests::Sandbox;
use tests::amqp::{self, Names, Worker, message};

fn results_by_job(records: &[Value]) -> HashMap<String, Vec<&Value>> {
    let mut by_job: HashMap<String, Vec<&Value>> = HashMap::new();
    for r in records.iter().filter(|r| r["kind"] == "result") {
        by_job
            .entry(r["job_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(r);
    }
    by_job
}

fn time(v: &Value) -> time::OffsetDateTime {
    time::OffsetDateTime::parse(
        v.as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
}

/// Three workers share 60 jobs over 12 workspaces: every job runs once and succeeds, no two
/// runs of a workspace overlap, and every result reaches the results exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_sixty_jobs_each_runs_once_one_at_a_time_per_workspace() {
    let sb = Sandbox::new();
    let names = Names::new("share").await;
    let workers: Vec<Worker> = (0..3)
        .map(|_| Worker::start(&sb, &names, &["--concurrency", "2"]))
        .collect();
    // The first worker to connect declares the queues and exchanges.
    names.ready().await;
    let jobs: Vec<(String, String)> = (0..60)
        .map(|i| (format!("j{i:02}"), format!("ws-{:02}", i % 12)))
        .collect();
    for (i, (id, ws)) in jobs.iter().enumerate() {
        names
            .publish(&message(id, ws, &format!("cluster-{i}")))
            .await;
    }
    let records = names
        .results_until(Duration::from_secs(600), |got| {
            let rejected: Vec<&Value> = got.iter().filter(|r| r["kind"] != "result").collect();
            assert!(rejected.is_empty(), "{rejected:#?}");
            results_by_job(got).len() == jobs.len()
        })
        .await;
    for w in workers {
        w.stop();
    }

    let by_job = results_by_job(&records);
    for (id, _) in &jobs {
        let results = &by_job[id];
        assert_eq!(results[0]["status"], "succeeded", "{id}: {results:?}");
        tests::schema::check("message", results[0]);
    }
    // One at a time per workspace: the runs' intervals never overlap.
    let mut runs: BTreeMap<&str, Vec<(time::OffsetDateTime, time::OffsetDateTime)>> =
        BTreeMap::new();
    for results in by_job.values() {
        let r = results[0];
        runs.entry(r["workspace"].as_str().unwrap())
            .or_default()
            .push((time(&r["started_at"]), time(&r["finished_at"])));
    }
    assert_eq!(runs.len(), 12);
    for (ws, mut intervals) in runs {
        intervals.sort();
        for pair in intervals.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "{ws}: runs overlap: {pair:?}");
        }
        // Each run made its own state version: none was lost or written twice.
        let versions = sb.versions(&format!("acme/{ws}")).await;
        assert_eq!(versions.len(), 5, "{ws}: {versions:?}");
    }
    // Every job's message was settled: nothing waits or was dead-lettered.
    assert_eq!(names.depth(&names.jobs).await, 0);
    assert_eq!(names.depth(&format!("{}.delay", names.jobs)).await, 0);
    assert_eq!(names.depth(&format!("{}.dead", names.jobs)).await, 0);
}

/// A job whose workspace another process holds waits on the delay queue (never redelivered
/// at once), and runs once the workspace is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_workspaces_job_waits_on_the_delay_queue_and_runs_once_free() {
    let sb = Sandbox::new();
    let names = Names::new("busy").await;
    let store = sb.fs_store();
    let ws: WorkspaceId = "acme/held".parse().unwrap();
    let held = store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "another-runner".into(),
                ttl: Duration::from_secs(600),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    let _w = Worker::start(&sb, &names, &[]);
    names.ready().await;
    names.publish(&message("b1", "held", "held")).await;

    // Seen on the delay queue, not run, not redelivered in a loop.
    let delay = format!("{}.delay", names.jobs);
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while names.depth(&delay).await == 0 {
        assert!(std::time::Instant::now() < give_up, "never delayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sb.versions("acme/held").await.is_empty());
    assert!(
        names.drain(&names.collected).await.is_empty(),
        "nothing reported yet"
    );

    store.release_lease(&ws, &held).await.unwrap();
    let records = names
        .results_until(Duration::from_secs(120), |got| {
            got.iter().any(|r| r["job_id"] == "b1")
        })
        .await;
    assert_eq!(
        records.last().unwrap()["status"],
        "succeeded",
        "{records:?}"
    );
    assert_eq!(sb.versions("acme/held").await.len(), 1);
}

/// A message that can never be a job is rejected on the results exchange and moved to the
/// dead-letter queue with its values masked; the worker goes on with the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_is_not_a_job_is_dead_lettered_masked_and_the_next_runs() {
    let sb = Sandbox::new();
    let names = Names::new("poison").await;
    let _w = Worker::start(&sb, &names, &[]);
    names.ready().await;
    let mut bad = message("p1", "poison", "poison");
    bad["job"]["operation"] = json!("explode");
    bad["job"]["variables"]["admin_password"] = json!("canary-8d2f-secret");
    names.publish(&bad).await;
    names.publish_raw(b"not json at all").await;
    names.publish(&message("p2", "poison", "poison")).await;

    let records = names
        .results_until(Duration::from_secs(120), |got| {
            got.iter().any(|r| r["job_id"] == "p2")
        })
        .await;
    let rejections: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "rejection")
        .collect();
    assert_eq!(rejections.len(), 2, "{records:?}");
    for r in &rejections {
        tests::schema::check("message", r);
    }
    assert!(
        rejections
            .iter()
            .any(|r| r.to_string().contains("operation")),
        "{rejections:?}"
    );
    assert_eq!(records.last().unwrap()["status"], "succeeded");

    let dead = names.drain(&format!("{}.dead", names.jobs)).await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    for d in &dead {
        tests::schema::check("dead-letter", d);
        assert!(!d.to_string().contains("canary-8d2f-secret"), "{d}");
    }
    assert!(
        dead.iter()
            .any(|d| d["message"].as_str().unwrap().contains("explode")),
        "the message is kept, masked: {dead:?}"
    );
}

/// Bad settings get a clear error naming the fix, and the password is never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_password_a_missing_queue_and_credentials_in_the_url_are_clear_errors() {
    let sb = Sandbox::new();
    let names = Names::new("bad").await;
    let run = |url: &str, env: &[(&str, &str)], declare: bool| {
        let mut cmd = sb.terrace();
        cmd.envs(amqp::credentials())
            .envs(env.iter().copied())
            .args(["serve", "--queue", url]);
        if declare {
            cmd.arg("--declare");
        }
        let out = cmd.output().expect("terrace runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, said) = run(
        &names.url(),
        &[("TERRACE_AMQP_PASSWORD", "wrong-password-4b1e")],
        true,
    );
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("refused the user"), "{said}");
    assert!(!said.contains("wrong-password-4b1e"), "{said}");

    let (code, said) = run(&names.url(), &[], false);
    assert_eq!(code, Some(64), "{said}");
    assert!(
        said.contains(&format!("has no queue {}", names.jobs)) && said.contains("--declare"),
        "{said}"
    );

    let with_password = names.url().replace("amqp://", "amqp://u:inline-secret-77@");
    let (code, said) = run(&with_password, &[], true);
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("TERRACE_AMQP_PASSWORD"), "{said}");
    assert!(!said.contains("inline-secret-77"), "{said}");
}

/// `amqps://`: a worker that trusts the broker's CA (`TERRACE_AMQP_CA_FILE`) takes a job
/// submitted over TLS, runs it and publishes its result; one that does not, or that speaks TLS
/// to the plain port, stops at once with the fix, and nothing of the password is said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_amqps_runs_jobs_and_an_untrusted_broker_is_a_clear_error() {
    let mut sb = Sandbox::new();
    let names = Names::new("tls").await;
    let serve = |sb: &Sandbox, url: &str| {
        let mut cmd = sb.terrace();
        cmd.envs(amqp::credentials())
            .args(["serve", "--queue", url, "--declare"]);
        cmd
    };
    // Not trusted: the system's roots do not hold the test CA.
    let out = serve(&sb, &names.tls_url()).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{said}");
    assert!(
        said.contains("TLS certificate is not trusted") && said.contains("TERRACE_AMQP_CA_FILE"),
        "{said}"
    );
    // TLS to the plain port.
    let plain_port = names.url().replace("amqp://", "amqps://");
    let out = serve(&sb, &plain_port).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{said}");
    assert!(said.contains("does not speak TLS"), "{said}");
    assert!(
        !said.contains(&amqp::credentials()[1].1),
        "the password is never said: {said}"
    );

    sb.env.push(("TERRACE_AMQP_CA_FILE".into(), amqp::ca()));
    let mut cmd = serve(&sb, &names.tls_url());
    let _w = Worker(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    names.ready().await;
    submitted_and_followed(&sb, &names, "tls1", &names.tls_url()).await;
}

/// Submits the demo apply `id` to `to` with `terrace submit --follow`: it is followed to its
/// success, and its result is published.
async fn submitted_and_followed(sb: &Sandbox, names: &Names, id: &str, to: &str) {
    let path = sb.job(
        &format!("{id}.yaml"),
        &tests::demo_job(
            id,
            &format!("ws-{id}"),
            "apply",
            &format!("cluster-{id}"),
            1,
        ),
    );
    let mut submit = sb.terrace();
    submit.envs(amqp::credentials()).args([
        "submit",
        path.to_str().unwrap(),
        "--follow",
        "--to",
        to,
    ]);
    let out = tokio::task::spawn_blocking(move || submit.output().unwrap())
        .await
        .unwrap();
    tests::assert_followed_to_success(&out);
    let (result, _) = names.result_of(id, Duration::from_secs(60)).await;
    assert_eq!(result["status"], "succeeded", "{result:#}");
}

/// A worker cut off from the broker mid-job by a silent network (no FIN, no RST: a partition)
/// notices by its heartbeats (`heartbeat=2`), and so does the broker, which gives the job's
/// message to the other worker; that one finds the workspace leased and waits on the delay
/// queue until the cut-off run stores its result, then reports it. The run goes on, once; when
/// the network heals the worker connects again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_by_a_partition_notices_by_heartbeat_and_its_job_runs_once() {
    let mut sb = Sandbox::new();
    // Two creates of 4 s: the job outlives the partition's detection.
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "4000".into()));
    let names = Names::new("partition").await;
    let upstream = amqp::broker().trim_start_matches("amqp://").to_owned();
    let network = tests::blackhole::Blackhole::start(&upstream).await;
    let through = format!(
        "{}&heartbeat=2",
        names
            .url()
            .replace(&upstream, &format!("127.0.0.1:{}", network.port()))
    );
    let mut cmd = sb.terrace();
    cmd.envs(amqp::credentials())
        .args(["serve", "--queue", &through, "--declare"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let cut_off = Worker(child);
    names.ready().await;
    names
        .publish(&message("p1", "partitioned", "partitioned"))
        .await;
    let ws: WorkspaceId = "acme/partitioned".parse().unwrap();
    let store = sb.fs_store();
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while store.lease(&ws).await.unwrap().is_none() {
        assert!(std::time::Instant::now() < give_up, "the job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The job runs on the worker behind the network; the other is reached directly.
    let _other = Worker::start(&sb, &names, &[]);
    network.cut();
    let (result, _) = names.result_of("p1", Duration::from_secs(120)).await;
    assert_eq!(result["status"], "succeeded", "{result:#}");
    network.heal();
    names.drained(Duration::from_secs(60)).await;
    assert_eq!(store.versions(&ws).await.unwrap().len(), 1);
    assert_eq!(sb.cloud_names(), ["partitioned", "partitioned-net"]);
    // Connected again once the network healed (the backoff's longest wait is 30 s).
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let consumers = names.consumers(&names.jobs).await;
        if consumers == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "{consumers} consumers on the jobs queue"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(cut_off);
    let said = said.join().unwrap();
    assert!(said.contains("heartbeat"), "{said}");
    assert!(said.contains("connecting again in"), "{said}");
}

/// A platform bound to the log exchange sees the job's lines while it runs (before its
/// result exists), routed by tenant, workspace and job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_of_the_log_exchange_sees_the_lines_while_the_job_runs() {
    let mut sb = Sandbox::new();
    // The create takes 3 s: the job is still running when its first lines are out.
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "3000".into()));
    let names = Names::new("logs").await;
    let _w = Worker::start(&sb, &names, &[]);
    names.ready().await;
    let lines = names.bind(&names.logs, "acme.live.l1").await;
    let others = names.bind(&names.logs, "acme.other.#").await;
    names.publish(&message("l1", "live", "live")).await;

    let ws: WorkspaceId = "acme/live".parse().unwrap();
    let store = sb.fs_store();
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let terraform_line = loop {
        assert!(std::time::Instant::now() < give_up, "no line: {seen:?}");
        let got = names.drain(&lines).await;
        if let Some(line) = got.iter().find(|l| l["stream"] == "stdout") {
            break line.clone();
        }
        seen.extend(got);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        store
            .artifact(&ws, "l1", "result.json")
            .await
            .unwrap()
            .is_none(),
        "the line came while the job ran: {terraform_line}"
    );
    tests::schema::check("cli-log-line", &terraform_line);
    assert!(!terraform_line.to_string().contains("correct-horse"));
    let records = names
        .results_until(Duration::from_secs(120), |got| {
            got.iter().any(|r| r["job_id"] == "l1")
        })
        .await;
    assert_eq!(records.last().unwrap()["status"], "succeeded");
    assert!(names.drain(&others).await.is_empty(), "routed by workspace");
}

/// A worker killed mid-apply: its message goes back to the queue, another worker takes it
/// once the dead worker's lease expires, and the job ends with no state version lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_apply_leaves_its_job_to_another_with_nothing_lost() {
    let mut sb = Sandbox::new();
    sb.env
        .push(("TESTCLOUD_CREATE_DELAY_MS".into(), "3000".into()));
    sb.env.push(("TERRACE_LEASE_TTL".into(), "6".into()));
    let names = Names::new("kill").await;
    let mut first = Worker::start(&sb, &names, &[]);
    names.ready().await;
    names.publish(&message("k1", "killed", "killed")).await;

    let ws: WorkspaceId = "acme/killed".parse().unwrap();
    let store = sb.fs_store();
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while store.lease(&ws).await.unwrap().is_none() {
        assert!(std::time::Instant::now() < give_up, "the job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Mid-apply: terraform is creating (3 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _second = Worker::start(&sb, &names, &[]);
    first.0.kill().unwrap();
    first.0.wait().unwrap();

    let (result, _) = names.result_of("k1", Duration::from_secs(180)).await;
    assert_eq!(result["status"], "succeeded", "{result:#}");
    // The run that finished found the killed worker's run interrupted: the job was taken over.
    assert!(
        result["attention"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["kind"] == "interrupted")),
        "{result:#}"
    );
    let numbers: Vec<u64> = sb
        .versions("acme/killed")
        .await
        .iter()
        .map(|v| v.number)
        .collect();
    assert!(!numbers.is_empty());
    assert_eq!(
        numbers,
        (1..=numbers.len() as u64).collect::<Vec<_>>(),
        "no version lost or skipped"
    );
    assert_eq!(names.depth(&format!("{}.dead", names.jobs)).await, 0);
}

/// A cancel travels the jobs queue as on the other triggers: a queued job it names ends
/// `cancelled` with nothing applied, and the cancel's answer is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_the_jobs_queue_stops_the_job_it_names() {
    let sb = Sandbox::new();
    let names = Names::new("cancel").await;
    let _w = Worker::start(&sb, &names, &["--concurrency", "1"]);
    names.ready().await;
    names
        .publish(&json!({ "cancel": { "job": "c1", "tenant": "acme", "workspace": "cancelled" } }))
        .await;
    names
        .publish(&message("c1", "cancelled", "cancelled"))
        .await;
    let records = names
        .results_until(Duration::from_secs(120), |got| {
            got.iter()
                .any(|r| r["kind"] == "result" && r["job_id"] == "c1")
        })
        .await;
    for r in &records {
        tests::schema::check("message", r);
    }
    assert!(
        records.iter().any(|r| r["kind"] == "cancel"),
        "the cancel is answered: {records:#?}"
    );
    let result = records.iter().find(|r| r["kind"] == "result").unwrap();
    assert_eq!(result["status"], "cancelled", "{result:#}");
    assert!(sb.versions("acme/cancelled").await.is_empty());
}

/// `terrace submit --to amqp://… --follow` queues a job for the workers as a platform would,
/// and follows its log in the store to its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_to_the_broker_runs_on_a_worker_and_is_followed_to_its_result() {
    let sb = Sandbox::new();
    let names = Names::new("submit").await;
    let _w = Worker::start(&sb, &names, &[]);
    names.ready().await;
    submitted_and_followed(&sb, &names, "s1", &names.url()).await;
    let path = sb.dir.path().join("s1.yaml");

    // To a queue no worker declared: said, with the fix, and nothing is sent.
    let mut missing = sb.terrace();
    missing
        .envs(amqp::credentials())
        .args(["submit", path.to_str().unwrap(), "--to"])
        .arg(format!("{}/?jobs=no-such-queue", amqp::broker()));
    let out = missing.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("has no queue no-such-queue"), "{said}");
}

/// Records with no queue bound to the results exchange are dropped by the broker, as AMQP
/// does: the job is still acknowledged once (never redelivered in a loop), and its stored
/// result is there for `terrace result` and for its next delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nobody_bound_to_the_results_the_job_is_acknowledged_once() {
    let sb = Sandbox::new();
    let names = Names::new("unbound").await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = sb.terrace();
    cmd.envs(amqp::credentials())
        .args(["serve", "--queue", &names.url(), "--declare"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log.reopen().unwrap()));
    let _w = Worker(cmd.spawn().unwrap());
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(log.path())
        .unwrap()
        .contains("serving queue")
    {
        assert!(
            std::time::Instant::now() < give_up,
            "the worker never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    names.publish(&message("u1", "unbound", "unbound")).await;
    let ws: WorkspaceId = "acme/unbound".parse().unwrap();
    let store = sb.fs_store();
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    while store
        .artifact(&ws, "u1", "result.json")
        .await
        .unwrap()
        .is_none()
    {
        assert!(std::time::Instant::now() < give_up, "no result");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let said = std::fs::read_to_string(log.path()).unwrap();
    assert!(!said.contains("returned to the queue"), "{said}");
    assert_eq!(names.depth(&names.jobs).await, 0, "{said}");
    let out = sb.run(&["result", "u1", "-w", "acme/unbound"]);
    out.expect_code(0);
}

/// `terrace drift --queue amqp://…` queues a check per applied workspace on the jobs queue; a
/// worker runs it and publishes what it found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_sweep_queues_checks_on_the_broker_that_a_worker_runs() {
    let sb = Sandbox::new();
    let names = Names::new("drift").await;
    let _w = Worker::start(&sb, &names, &[]);
    names.ready().await;
    names
        .publish(&json!({ "job": {
            "id": "d1", "tenant": "acme", "workspace": "nets", "operation": "apply",
            "template": { "name": "fleet", "version": "1.0.0" },
            "variables": { "networks": ["a"] },
        }}))
        .await;
    names
        .results_until(Duration::from_secs(120), |got| {
            got.iter().any(|r| r["job_id"] == "d1")
        })
        .await;

    let sweep = sb
        .terrace()
        .envs(amqp::credentials())
        .args(["drift", "--queue", &names.url()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&sweep.stdout);
    assert_eq!(sweep.status.code(), Some(0), "{said} {sweep:?}");
    assert!(
        said.contains("acme/nets: drift check") && said.contains("1 queued"),
        "{said}"
    );
    // Without the broker's user: said before anything is planned or sent.
    let refused = sb.run(&["drift", "--queue", &names.url()]);
    refused.expect_code(64);
    assert!(
        refused.stderr().contains("TERRACE_AMQP_USER"),
        "{}",
        refused.stderr()
    );
    let records = names
        .results_until(Duration::from_secs(120), |got| {
            got.iter().any(|r| r["operation"] == "drift-check")
        })
        .await;
    let check = records
        .iter()
        .find(|r| r["operation"] == "drift-check")
        .unwrap();
    tests::schema::check("message", check);
    assert_eq!(check["workspace"], "nets", "{check:#}");
    assert_eq!(check["status"], "succeeded", "{check:#}");
    assert_eq!(check["drift"], false, "{check:#}");
}

/// A benchmark, not a test (`benches/amqp-workers.sh`): throughput and enqueue to terraform's
/// first output with 1, 2 and 3 workers (`--concurrency 1` each) sharing `TERRACE_BENCH_N`
/// jobs (default 30), each on a workspace of its own, all queued at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: benches/amqp-workers.sh runs it"]
async fn workers_throughput() {
    let n = std::env::var("TERRACE_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(30usize);
    for count in [1, 2, 3] {
        let sb = Sandbox::new();
        let names = Names::new("bench").await;
        let workers: Vec<Worker> = (0..count)
            .map(|_| Worker::start(&sb, &names, &["--concurrency", "1"]))
            .collect();
        names.ready().await;
        // One warm-up job per worker: terraform's provider cache and the workers' clients.
        for i in 0..count {
            names
                .publish(&message(
                    &format!("warm-{i}"),
                    &format!("warm-{i}"),
                    "warm-up",
                ))
                .await;
        }
        names
            .results_until(Duration::from_secs(300), |got| {
                results_by_job(got).len() == count
            })
            .await;
        let mut queued = Vec::new();
        let start = std::time::Instant::now();
        for i in 0..n {
            let id = format!("b{i:03}");
            queued.push((id.clone(), std::time::SystemTime::now()));
            names
                .publish(&message(&id, &id, &format!("bench-{i}")))
                .await;
        }
        let records = names
            .results_until(Duration::from_secs(1800), |got| {
                results_by_job(got).len() == n
            })
            .await;
        let wall = start.elapsed();
        drop(workers);
        assert!(
            records
                .iter()
                .all(|r| r["kind"] != "result" || r["status"] == "succeeded"),
            "{records:#?}"
        );
        let store = sb.fs_store();
        let mut first = Vec::new();
        for (id, at) in &queued {
            let ws: WorkspaceId = format!("acme/{id}").parse().unwrap();
            first.push(tests::start::first_output_ms(&store, &ws, id, *at).await);
        }
        println!(
            "{count} worker(s), {n} jobs queued at once: {:.1} s, {:.1} jobs/min; enqueue -> terraform's first output p50 {:.0} ms, p99 {:.0} ms",
            wall.as_secs_f64(),
            n as f64 / wall.as_secs_f64() * 60.0,
            tests::start::percentile(&first, 50.0),
            tests::start::percentile(&first, 99.0)
        );
    }
}

/// The worker's image (`make images`, the Dockerfile's `terrace` target) as
/// deploy/self-hosted/compose.yaml runs it: `terrace serve` on the broker takes a job and
/// applies it with what the image brings (terraform, templates, providers), publishes its
/// result, and stops cleanly on SIGTERM as the container's first process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs the built image: make test-images"]
async fn the_image_serves_the_broker_applies_a_job_and_stops_on_sigterm() {
    use tests::image::{Container, image, podman};
    let image = image("worker");
    let sb = Sandbox::new();
    let names = Names::new("image").await;
    let mut function = sb.terrace();
    function.envs(amqp::credentials());
    // The sandbox (its store and the cache) at the same path in the container.
    let dir = sb.dir.path().display().to_string();
    let mut worker = Container::run(
        &function,
        &image,
        &["--volume", &format!("{dir}:{dir}"), "--workdir", &dir],
        &["serve", "--queue", &names.url(), "--declare"],
    );
    names.ready().await;
    names.collect().await;
    names
        .publish(&message("img1", "image", "from-the-image"))
        .await;
    let (result, _) = names.result_of("img1", Duration::from_secs(120)).await;
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(sb.cloud_names(), ["from-the-image", "from-the-image-net"]);
    let ws: WorkspaceId = "acme/image".parse().unwrap();
    assert_eq!(sb.fs_store().versions(&ws).await.unwrap().len(), 1);
    assert_eq!(names.depth(&names.jobs).await, 0, "the job is acknowledged");

    // `podman stop` sends SIGTERM to the container's first process, terrace: it settles and
    // exits 0 well before podman's 30 s would turn to SIGKILL.
    let stopped = podman()
        .args(["stop", "--time", "30", &worker.name])
        .output()
        .unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    assert_eq!(worker.wait(), Some(0), "the worker ends well on SIGTERM");
}
