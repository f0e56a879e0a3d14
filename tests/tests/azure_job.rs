//! The real `terrace-azure` Container Apps job against Azurite: messages on a real Storage
//! Queue, real terraform, state in a Blob container.

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use state_backends::{LeaseRequest, StateStore, WorkspaceId};
use tests::azure::{self, TestQueue};
use tests::fault_proxy::{Cloud, FaultProxy};
use tests::{Sandbox, terraform, workspace_bin};

struct World {
    sb: Sandbox,
    /// The container's URL with the SAS, for the test's own store.
    container: String,
    jobs: TestQueue,
    poison: TestQueue,
    results: TestQueue,
    /// Terraform's recorded version, as the image carries it (`TERRACE_TERRAFORM_VERSION_FILE`).
    version_record: std::path::PathBuf,
}

impl World {
    async fn new() -> Self {
        let jobs = TestQueue::new("jobs").await;
        let poison = TestQueue::named(&format!("{}-poison", jobs.name));
        let sb = Sandbox::new();
        Self {
            version_record: tests::record_terraform_version(sb.dir.path()),
            sb,
            container: azure::container().await,
            jobs,
            poison,
            results: TestQueue::new("results").await,
        }
    }

    /// The container's URL as a message names it (no SAS: the job has its own).
    fn container_url(&self) -> String {
        self.container
            .split_once('?')
            .map_or(self.container.clone(), |(url, _)| url.to_owned())
    }

    fn target(&self) -> Value {
        json!({ "container_url": self.container_url(), "prefix": "states" })
    }

    /// The job's tenant registry: `acme`'s is this world's container.
    fn tenants(&self) -> String {
        json!({ "acme": self.target() }).to_string()
    }

    fn message(&self, id: &str, workspace: &str) -> Value {
        json!({
            "job": {
                "id": id, "tenant": "acme", "workspace": workspace, "operation": "apply",
                "template": { "name": "fleet", "version": "1.0.0" },
                "variables": { "networks": ["blue", "green"] },
                "timeout": "5m",
            },
        })
    }

    fn store(&self) -> Arc<dyn StateStore> {
        Arc::new(azure::store(&self.container, "states"))
    }

    fn command(&self, extra: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(workspace_bin("terrace-azure"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TERRACE_TENANTS", self.tenants())
            .env("TERRACE_QUEUE_URL", self.jobs.plain())
            .env("TERRACE_RESULTS_QUEUE_URL", self.results.plain())
            .env("TERRACE_AZURE_SAS", azure::sas())
            .env("TERRACE_TEMPLATES", &self.sb.templates)
            .env("TERRACE_TERRAFORM", terraform())
            .env("TERRACE_TF_CLI_CONFIG", &self.sb.cli_config)
            .env("TERRACE_TERRAFORM_VERSION_FILE", &self.version_record)
            .env(
                "TERRACE_PASS_ENV",
                "TESTCLOUD_ROOT,TESTCLOUD_CREATE_DELAY_MS",
            )
            .env("TESTCLOUD_ROOT", &self.sb.cloud)
            .env("TERRACE_GRACE", "5")
            .env("TERRACE_LEASE_TTL", "10")
            .env("TERRACE_LOG", "info")
            .envs(extra.iter().copied())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("TERRACE_TEST_VERBOSE").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        cmd
    }

    /// One execution, to its end.
    fn run(&self, extra: &[(&str, &str)]) -> Output {
        self.command(extra).output().expect("terrace-azure runs")
    }

    /// One execution with no extra settings, to a good end; its stderr kept.
    fn run_well(&self) -> Output {
        let out = self
            .command(&[])
            .stderr(Stdio::piped())
            .output()
            .expect("terrace-azure runs");
        assert!(out.status.success(), "{out:?}");
        out
    }

    fn sweep(&self, kind: &str) -> Value {
        let out = self
            .command(&[("TERRACE_SWEEP_TENANTS", "acme")])
            .args(["sweep", kind])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let report = serde_json::from_slice(&out.stdout).unwrap();
        tests::schema::check("sweep-report", &report);
        report
    }
}

fn ws(name: &str) -> WorkspaceId {
    WorkspaceId::new("acme", name).unwrap()
}

/// Records from the results or jobs queue, each checked against its published schema.
fn checked(texts: Vec<String>) -> Vec<Value> {
    let records = records(texts);
    records.iter().for_each(tests::schema::check_record);
    records
}

/// The poison queue's records, each checked against the published dead-letter schema.
fn dead_letters(texts: Vec<String>) -> Vec<Value> {
    let records = records(texts);
    for record in &records {
        tests::schema::check("dead-letter", record);
    }
    records
}

fn records(texts: Vec<String>) -> Vec<Value> {
    texts
        .iter()
        .map(|t| serde_json::from_str(t).expect("a JSON record"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioner_gets_nothing_of_the_jobs_own_identity() {
    let w = World::new().await;
    let probe = |id: &str, name: &str| {
        json!({
            "job": {
                "id": id, "tenant": "acme", "workspace": name, "operation": "apply",
                "template": { "name": "probe", "version": "1.0.0" },
                "variables": { "name": name }, "timeout": "5m",
            },
        })
        .to_string()
    };
    // What Container Apps puts in a job's environment for its managed identity.
    let identity = [
        ("IDENTITY_ENDPOINT", "http://localhost:42356/msi/token"),
        ("IDENTITY_HEADER", "the-identity-header-secret"),
    ];
    w.jobs.send(&probe("p-1", "az-probe")).await;
    let out = w.run(&identity);
    assert!(out.status.success(), "{out:?}");
    let result = checked(w.results.peek().await).pop().unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    let root = nix::unistd::geteuid().is_root();
    w.sb.assert_probe_got_nothing("az-probe", &[], &[], root);

    // A runner that is not root runs terraform as its own user: then only its being
    // non-dumpable keeps its environment from terraform.
    use std::os::unix::process::CommandExt;
    w.jobs.send(&probe("p-2", "az-probe-2")).await;
    let mut cmd = w.command(&identity);
    if root {
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let result = checked(w.results.peek().await).pop().unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    w.sb.assert_probe_got_nothing("az-probe-2", &[], &[], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_runs_once_and_its_message_is_deleted() {
    let w = World::new().await;
    let message = w.message("az-1", "net").to_string();
    w.jobs.send(&message).await;
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0, "the message is deleted");

    // State versions, the log and the result are in the container.
    let store = w.store();
    let versions = store.versions(&ws("net")).await.unwrap();
    assert!(!versions.is_empty());
    let artifacts = store.artifacts(&ws("net"), "az-1").await.unwrap();
    assert!(
        artifacts.iter().any(|a| a.starts_with("log/")),
        "{artifacts:?}"
    );
    let result: Value = serde_json::from_slice(
        &store
            .artifact(&ws("net"), "az-1", "result.json")
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    let reported = checked(w.results.peek().await);
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0]["job_id"], "az-1");
    assert_eq!(reported[0]["status"], "succeeded");

    // The same message again (at-least-once delivery): nothing runs twice.
    w.jobs.send(&message).await;
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0, "the repeat is deleted too");
    assert_eq!(store.versions(&ws("net")).await.unwrap(), versions);
    // … and its result is reported again, the same: a platform whose first report was lost
    // still hears.
    let reported_again = checked(w.results.peek().await);
    assert_eq!(reported_again.len(), 2, "{reported_again:?}");
    assert_eq!(reported_again[1], reported[0]);

    // An empty queue: the execution just ends.
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");

    // The timer's sweeps: the changed workspace is backed up; its drift check is queued.
    let backup = w.sweep("backup");
    assert_eq!(backup["buckets"][0]["backed_up"], 1, "{backup}");
    assert_eq!(store.backups(&ws("net")).await.unwrap().len(), 1);
    let drift = w.sweep("drift");
    assert_eq!(drift["buckets"][0]["queued"], 1, "{drift}");
    let queued = checked(w.jobs.peek().await);
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0]["job"]["operation"], "drift-check");
    assert_eq!(queued[0]["job"]["workspace"], "net");
    // … and runs as a job: nothing drifted.
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0);
    let check = checked(w.results.peek().await).pop().unwrap();
    assert_eq!(check["operation"], "drift-check", "{check}");
    assert_eq!(check["drift"], false, "{check}");
}

/// The job holds every plan to the policies `TERRACE_POLICIES` names: a deny stops the job
/// before apply (its message deleted: it is done), a warning goes through, and a policy that
/// does not parse stops the execution at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_plan_that_breaks_a_policy_stops_before_apply_and_a_warning_goes_through() {
    let w = World::new().await;
    let policies = tests::policy::demo();
    let with = [("TERRACE_POLICIES", policies.to_str().unwrap())];
    let big = tests::policy::demo_message("pol-big", Some(12));
    w.jobs.send(&big.to_string()).await;
    let out = w.run(&with);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0, "done, not retried");
    let reported = checked(w.results.peek().await);
    assert_eq!(reported.len(), 1, "{reported:?}");
    tests::policy::assert_denied(&reported[0]);
    assert!(w.sb.cloud_files().is_empty(), "nothing was made");

    let small = tests::policy::demo_message("pol-small", None);
    w.jobs.send(&small.to_string()).await;
    let out = w.run(&with);
    assert!(out.status.success(), "{out:?}");
    let reported = checked(w.results.peek().await);
    tests::policy::assert_warned(reported.last().unwrap());

    let broken = tests::policy::broken(w.sb.dir.path());
    tests::policy::assert_refused_at_start(
        w.command(&[("TERRACE_POLICIES", broken.to_str().unwrap())]),
    );
}

/// The job reads templates from the runner's own container at run time: a version published
/// there (with `terrace template publish`) runs; one not published is refused, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_published_to_the_runners_container_run_without_a_new_image() {
    let w = World::new().await;
    let with_sas = azure::container().await;
    let url = format!("{}/published", with_sas.split('?').next().unwrap());
    let published =
        w.sb.terrace()
            .env("AZURE_STORAGE_SAS_TOKEN", azure::sas())
            .args(["template", "publish", "fleet", "1.0.0", "--to", &url])
            .output()
            .unwrap();
    assert!(published.status.success(), "{published:?}");
    let cache = w.sb.dir.path().join("job-template-cache");
    let from_bucket = [
        ("TERRACE_TEMPLATES", url.as_str()),
        ("TERRACE_TEMPLATE_CACHE", cache.to_str().unwrap()),
    ];
    w.jobs.send(&w.message("azp-1", "pub").to_string()).await;
    let out = w.run(&from_bucket);
    assert!(out.status.success(), "{out:?}");
    let reported = checked(w.results.peek().await);
    assert_eq!(reported[0]["status"], "succeeded", "{reported:?}");
    assert!(cache.join("fleet/1.0.0/main.tf").is_file());

    let mut unpublished = w.message("azp-2", "pub");
    unpublished["job"]["template"]["version"] = json!("9.9.9");
    w.jobs.send(&unpublished.to_string()).await;
    let out = w.run(&from_bucket);
    assert!(out.status.success(), "{out:?}");
    let poisoned = dead_letters(w.poison.peek().await);
    assert_eq!(poisoned.len(), 1, "{poisoned:?}");
    assert_eq!(poisoned[0]["status"], "rejected");
    assert_eq!(
        poisoned[0]["errors"][0]["problem"],
        format!("template fleet 9.9.9 is not published in {url}")
    );
}

/// `terrace submit --to azqueue://…` sends a job as a platform would: the Container Apps job's
/// next execution runs it and reports its result; the message is a job message the registry
/// completes. A queue that is not there is an error that says so, and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_to_the_storage_queue_runs_in_the_next_execution() {
    let w = World::new().await;
    let path = w.sb.job(
        "submit.yaml",
        &tests::demo_job("az-sub-1", "submitted", "apply", "demo", 1),
    );
    let account = std::env::var("TERRACE_TEST_AZURE_ACCOUNT").unwrap();
    let submit = |queue: &str| {
        w.sb.terrace()
            .env("TERRACE_AZURE_QUEUE_ENDPOINT", azure::queue_endpoint())
            .env("AZURE_STORAGE_SAS_TOKEN", azure::sas())
            .args(["submit", path.to_str().unwrap(), "--to"])
            .arg(format!("azqueue://{account}/{queue}"))
            .output()
            .unwrap()
    };
    let missing = submit("no-such-queue");
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains("has no queue no-such-queue"), "{said}");
    assert!(!said.contains("sig="), "the SAS is not quoted: {said}");

    // Followed: the submit streams the job's log from the customer's container until it ends.
    let follow =
        w.sb.terrace()
            .env("TERRACE_AZURE_QUEUE_ENDPOINT", azure::queue_endpoint())
            .env("AZURE_STORAGE_SAS_TOKEN", azure::sas())
            .env(
                "TERRACE_STORE",
                format!("{}/states", w.container.split('?').next().unwrap()),
            )
            .args([
                "submit",
                path.to_str().unwrap(),
                "--follow",
                "--interval-ms",
                "200",
                "--to",
            ])
            .arg(format!("azqueue://{account}/{}", w.jobs.name))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
    let mut follow = Some(follow);
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while w.jobs.peek().await.is_empty() {
        let child = follow.as_mut().unwrap();
        if child.try_wait().unwrap().is_some() || std::time::Instant::now() > give_up {
            let out = follow.take().unwrap().wait_with_output().unwrap();
            panic!("the job was never sent: {out:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let follow = follow.unwrap();
    let queued = records(w.jobs.peek().await);
    assert_eq!(queued.len(), 1, "sent once: {queued:?}");
    tests::schema::check("job-message", &queued[0]);
    assert!(
        queued[0].get("target").is_none(),
        "the registry names the customer"
    );

    let out = w.command(&[]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let reported = checked(w.results.peek().await);
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0]["job_id"], "az-sub-1");
    assert_eq!(reported[0]["status"], "succeeded", "{}", reported[0]);
    let out = tokio::task::spawn_blocking(move || follow.wait_with_output().unwrap())
        .await
        .unwrap();
    tests::assert_followed_to_success(&out);
}

/// Secrets canary: a job whose secret terraform prints in a resource, an output and its plan
/// (the `leaky` template). The secret is in none of the job's log, the result on the results
/// queue, the blobs in the customer's container other than the states themselves, or any
/// process's command line or environment while the job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_secret_is_in_no_log_result_or_blob_but_the_state() {
    let w = World::new().await;
    let canary = "canary-9e2f-containerapps-5ecret";
    let message = tests::canary_message("canary-1", canary, "5m");
    w.jobs.send(&message.to_string()).await;
    let listings = tests::ProcessListings::start(canary, &w.sb.cloud);
    let (identity, recipient) = tests::outputs_key();
    let out = w
        .command(&[("TERRACE_OUTPUTS_RECIPIENT", &recipient)])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    listings.check();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("canary-1"), "the job logged the job");
    assert!(!log.contains(canary), "the job's log holds the secret");
    let reported = checked(w.results.peek().await);
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0]["status"], "succeeded", "{}", reported[0]);
    assert!(!reported[0].to_string().contains(canary), "{}", reported[0]);
    let opened = tests::open_sealed(&reported[0], &identity);
    let digest = state_backends::sha256_hex(canary.as_bytes());
    assert_eq!(opened["token"], json!(canary));
    assert_eq!(opened["token_digest"], json!(digest));
    assert!(
        !log.contains(&digest),
        "the job's log holds the derived output"
    );
    assert!(
        !reported[0].to_string().contains(&digest),
        "{}",
        reported[0]
    );
    let raw = azure::store(&w.container, "").into_bucket();
    let states = tests::canary_in_states(
        &raw,
        "states/acme/canary/",
        canary,
        "testcloud_network.leak",
    )
    .await;
    assert!(
        states > 0,
        "the canary reached terraform (its state holds it)"
    );
    let derived = tests::canary_in_states(
        &raw,
        "states/acme/canary/",
        &digest,
        "testcloud_network.leak",
    )
    .await;
    assert!(derived > 0, "the state holds the derived output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_ends_in_the_poison_queue_with_an_error_record() {
    let w = World::new().await;
    let mut invalid = w.message("az-2", "bad");
    invalid["job"]["variables"] = json!({ "networks": "not-a-list" });
    invalid["target"] = w.target();
    invalid["target"]["container_url"] = json!("ftp://elsewhere");
    let mut unknown = w.message("az-3", "bad");
    unknown["job"]["tenant"] = json!("mallory");
    // A job whose template has a secret, invalid for another reason.
    let secret = json!({
        "job": {
            "id": "az-4", "tenant": "acme", "workspace": "bad", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" },
            "variables": { "cluster_name": "x", "region": "mars-1", "admin_password": "poison-5ecret-pw" },
        },
    });
    for text in [
        "this is not json".to_owned(),
        invalid.to_string(),
        unknown.to_string(),
        secret.to_string(),
    ] {
        w.jobs.send(&text).await;
        let out = w.run(&[]);
        assert!(out.status.success(), "{out:?}");
    }
    assert_eq!(w.jobs.count().await, 0, "both left the jobs queue");
    let poisoned = dead_letters(w.poison.peek().await);
    assert_eq!(poisoned.len(), 4, "{poisoned:?}");
    assert_eq!(poisoned[0]["status"], "rejected");
    // Text that is no job cannot be searched for secrets: its size and digest only.
    assert!(
        poisoned[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("(not a job envelope: 16 bytes, sha256 "),
        "{}",
        poisoned[0]
    );
    assert!(
        poisoned[0]["errors"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("not a job envelope"),
        "{}",
        poisoned[0]
    );
    let fields: Vec<&str> = poisoned[1]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"target.container_url"), "{fields:?}");
    assert!(fields.contains(&"variables.networks"), "{fields:?}");
    assert_eq!(poisoned[1]["message"], invalid.to_string());
    assert_eq!(
        poisoned[2]["errors"][0]["field"], "tenant",
        "{}",
        poisoned[2]
    );
    // The poison queue keeps the job and why it was refused, not its secrets.
    let kept = poisoned[3]["message"].as_str().unwrap();
    assert!(!kept.contains("poison-5ecret-pw"), "{kept}");
    assert!(
        kept.contains("az-4") && kept.contains("(sensitive value)"),
        "{kept}"
    );
    assert!(
        poisoned[3]["errors"]
            .to_string()
            .contains("variables.region"),
        "{}",
        poisoned[3]
    );
    // Nothing was written.
    assert!(w.store().workspaces().await.unwrap().is_empty());

    // Without the operator's tenant registry the job does not start: a message alone would
    // choose the customer's account.
    let out = w
        .command(&[])
        .env_remove("TERRACE_TENANTS")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TERRACE_TENANTS is not set"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_workspace_leaves_the_message_for_later() {
    let w = World::new().await;
    let store = w.store();
    let lease = store
        .acquire_lease(
            &ws("busy"),
            &LeaseRequest {
                owner: "another-job".into(),
                ttl: Duration::from_secs(20),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    w.jobs.send(&w.message("az-3", "busy").to_string()).await;
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 1, "the message stays");
    assert!(
        w.jobs.peek().await.is_empty(),
        "… invisible until it may run"
    );
    assert!(store.versions(&ws("busy")).await.unwrap().is_empty());
    store.release_lease(&ws("busy"), &lease).await.unwrap();
    // Visible again when the holder's lease would have ended (about 20 s).
    let mut waited = 0;
    while w.jobs.peek().await.is_empty() {
        assert!(waited < 120, "the message never came back");
        tokio::time::sleep(Duration::from_millis(500)).await;
        waited += 1;
    }
    // A fresh copy: waiting for a busy workspace does not count towards the poison queue.
    assert_eq!(
        w.jobs.receive(1).await,
        Some(1),
        "received as a new message"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0);
    assert!(!store.versions(&ws("busy")).await.unwrap().is_empty());
}

/// Runs in order on the Storage Queue path: A (sequence 1) finds its workspace busy and its
/// message waits, invisible; B (sequence 2) runs meanwhile; when A's message comes back, A
/// never runs: its result is `superseded`, naming B, and the state keeps B's networks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_request_that_comes_back_after_a_later_one_ran_is_superseded() {
    let w = World::new().await;
    let store = w.store();
    let lease = store
        .acquire_lease(
            &ws("order"),
            &LeaseRequest {
                owner: "another-job".into(),
                ttl: Duration::from_secs(3),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    let message = |id: &str, network: &str, sequence: u64| {
        let mut m = w.message(id, "order");
        m["job"]["sequence"] = json!(sequence);
        m["job"]["variables"]["networks"] = json!([network]);
        m.to_string()
    };
    w.jobs.send(&message("ord-a", "alpha", 1)).await;
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 1, "A waits");
    store.release_lease(&ws("order"), &lease).await.unwrap();

    w.jobs.send(&message("ord-b", "beta", 2)).await;
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    let reported = checked(w.results.peek().await);
    assert_eq!(reported.last().unwrap()["job_id"], "ord-b", "{reported:?}");
    assert_eq!(reported.last().unwrap()["status"], "succeeded");
    let versions = store.versions(&ws("order")).await.unwrap();

    let mut waited = 0;
    while w.jobs.peek().await.is_empty() {
        assert!(waited < 120, "A's message never came back");
        tokio::time::sleep(Duration::from_millis(500)).await;
        waited += 1;
    }
    let out = w.run(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0, "A's message is settled");
    let a = checked(w.results.peek().await).pop().unwrap();
    assert_eq!(a["job_id"], "ord-a", "{a}");
    assert_eq!(a["status"], "superseded", "{a}");
    assert_eq!(
        a["superseded_by"],
        json!({ "job_id": "ord-b", "sequence": 2 })
    );
    assert_eq!(store.versions(&ws("order")).await.unwrap(), versions);
    let current = store.current(&ws("order")).await.unwrap().unwrap();
    let state = String::from_utf8(current.data.to_vec()).unwrap();
    assert!(
        state.contains("\"beta\"") && !state.contains("\"alpha\""),
        "{state}"
    );
}

/// A receive from the jobs queue that never gets an answer is given up after the call timeout
/// (the store's HTTP client, `TERRACE_CALL_TIMEOUT`) and made again: an execution never hangs
/// on its queue while its time runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_receive_never_answered_is_given_up_and_made_again() {
    let w = World::new().await;
    w.jobs.send(&w.message("az-held", "held").to_string()).await;
    let plain = w.jobs.plain();
    let at = plain.find("://").unwrap() + 3;
    let (origin, path) = plain.split_at(at + plain[at..].find('/').unwrap());
    let proxy = FaultProxy::start(origin, Cloud::Azure, 0.0, 1).await;
    // The first receive (not a peek) is held, unsent, for good.
    let held = proxy.hold(
        Box::new(|m, path, _| {
            m == hyper::Method::GET && path.contains("/messages") && !path.contains("peekonly")
        }),
        false,
    );
    let url = format!("{}{path}", proxy.url());
    let child = w
        .command(&[("TERRACE_QUEUE_URL", &url), ("TERRACE_CALL_TIMEOUT", "2")])
        .spawn()
        .expect("terrace-azure starts");
    let pid = child.id();
    let what = tokio::time::timeout(Duration::from_secs(60), held)
        .await
        .expect("the receive reached the proxy")
        .unwrap();
    // The next request comes once the held one is given up: after the call timeout (2 s) and
    // a retry's pause, where the SDK's own transport would wait 60 s.
    let seen = proxy.counts().requests();
    let mut waited = 0;
    while proxy.counts().requests() == seen {
        if waited == 300 {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the held receive ({what}) was not given up within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    let Ok(out) = out else {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        panic!("terrace-azure still waits on its held receive ({what})");
    };
    let out = out.unwrap().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0, "the message is deleted");
    let result = checked(w.results.peek().await).pop().expect("a result");
    assert_eq!(result["job_id"], "az-held", "{result}");
    assert_eq!(result["status"], "succeeded", "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_received_too_often_goes_to_the_poison_queue_without_running() {
    let w = World::new().await;
    w.jobs.send(&w.message("az-4", "flaky").to_string()).await;
    // An earlier execution received it and died.
    assert_eq!(w.jobs.receive(1).await, Some(1));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let out = w.run(&[("TERRACE_MAX_DEQUEUES", "1")]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(w.jobs.count().await, 0);
    let poisoned = dead_letters(w.poison.peek().await);
    assert_eq!(poisoned.len(), 1);
    assert_eq!(poisoned[0]["dequeue_count"], 2);
    assert!(
        poisoned[0]["errors"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("received 2 times"),
        "{}",
        poisoned[0]
    );
    assert!(w.store().versions(&ws("flaky")).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_jobs_message_stays_invisible_and_sigterm_makes_it_visible_again() {
    let w = World::new().await;
    w.jobs.send(&w.message("az-5", "slow").to_string()).await;
    // Each create takes 20 s; the message is received invisible for 3 s only, and the job
    // extends that every second.
    let mut child = w
        .command(&[
            ("TERRACE_VISIBILITY_TIMEOUT", "3"),
            ("TESTCLOUD_CREATE_DELAY_MS", "20000"),
        ])
        .spawn()
        .unwrap();
    // Once the job has received it…
    let mut waited = 0;
    while !w.jobs.peek().await.is_empty() {
        assert!(waited < 60, "the job never received the message");
        tokio::time::sleep(Duration::from_millis(250)).await;
        waited += 1;
    }
    // … it stays invisible for 8 s, well past its 3 s.
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            w.jobs.peek().await.is_empty(),
            "the message became visible while its job ran"
        );
    }
    assert_eq!(w.jobs.count().await, 1);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    // Interrupted: queued again at once (a fresh copy), the lease released, the result says so.
    assert_eq!(w.jobs.peek().await.len(), 1, "the message is visible again");
    assert_eq!(w.jobs.count().await, 1, "… once");
    let store = w.store();
    assert!(store.lease(&ws("slow")).await.unwrap().is_none());
    let result: Value = serde_json::from_slice(
        &store
            .artifact(&ws("slow"), "az-5", "result.json")
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(result["status"], "interrupted", "{result}");
}

/// The built image (`make images`) as a Container Apps job runs it: an event-driven execution
/// takes the queued job and applies it, and a scheduled execution (`sweep backup`) backs the
/// workspace up. Nothing of the host's terraform, templates or providers is in the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs the built image: make test-images"]
async fn the_image_takes_a_queued_job_applies_it_and_its_sweep_backs_it_up() {
    use tests::image::{Container, image};
    let image = image("azure");
    let w = World::new().await;
    w.jobs.send(&w.message("azi-1", "image").to_string()).await;

    let mut execution = Container::run(&w.command(&[]), &image, &[], &[]);
    assert_eq!(execution.wait(), Some(0), "the execution ends well");
    assert_eq!(w.jobs.count().await, 0, "the job's message is deleted");
    let reported = checked(w.results.peek().await);
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0]["job_id"], "azi-1");
    assert_eq!(reported[0]["status"], "succeeded", "{}", reported[0]);
    assert_eq!(
        w.sb.cloud_names(),
        ["blue", "green"],
        "the fleet's networks are in the test cloud"
    );
    let store = w.store();
    assert_eq!(store.versions(&ws("image")).await.unwrap().len(), 1);

    let mut sweep = Container::run(
        &w.command(&[("TERRACE_SWEEP_TENANTS", "acme")]),
        &image,
        &[],
        &["sweep", "backup"],
    );
    assert_eq!(sweep.wait(), Some(0), "the sweep ends well");
    assert_eq!(store.backups(&ws("image")).await.unwrap().len(), 1);
}

/// Approved plans and cancel on the Container Apps job's path: the plan's own key is in the
/// reported result, the apply giving it back applies that plan once; a cancel queued before
/// its job stops the job before it starts, and one for a finished job changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_plan_applies_once_and_a_queued_cancel_stops_its_job() {
    let w = World::new().await;
    let store = w.store();
    let job = |id: &str, extra: Value| {
        let mut m = json!({ "job": {
            "id": id, "tenant": "acme", "workspace": "az-approved",
            "template": { "name": "approval", "version": "1.0.0" },
            "variables": { "token": "tok-az-1" }, "timeout": "5m",
        }});
        for (k, v) in extra.as_object().unwrap() {
            m["job"][k] = v.clone();
        }
        m.to_string()
    };
    w.jobs
        .send(&job(
            "zp-1",
            json!({ "operation": "plan", "variables": { "name": "from-azure", "secret": "s3cret-az", "token": "tok-az-1" } }),
        ))
        .await;
    assert!(w.run(&[]).status.success());
    let planned = last(&w, "zp-1").await;
    assert_eq!(planned["status"], "succeeded", "{planned}");
    let key = planned["plan"]["key"].as_str().expect("the key").to_owned();

    let apply = |id: &str| {
        job(
            id,
            json!({ "operation": "apply", "plan": "zp-1", "plan_key": key }),
        )
    };
    w.jobs.send(&apply("za-1")).await;
    assert!(w.run(&[]).status.success());
    let applied = last(&w, "za-1").await;
    assert_eq!(applied["status"], "succeeded", "{applied}");
    assert_eq!(
        applied["outputs"]["name"]["value"], "from-azure",
        "{applied}"
    );
    w.jobs.send(&apply("za-2")).await;
    assert!(w.run(&[]).status.success());
    assert_eq!(last(&w, "za-2").await["error"]["category"], "plan-refused");
    assert_eq!(store.versions(&ws("az-approved")).await.unwrap().len(), 1);

    // Cancel: before its job, then after a finished one.
    let cancel = |id: &str| {
        json!({ "cancel": { "job": id, "tenant": "acme", "workspace": "az-cancel" } }).to_string()
    };
    w.jobs.send(&cancel("zc-1")).await;
    assert!(w.run(&[]).status.success());
    w.jobs
        .send(&w.message("zc-1", "az-cancel").to_string())
        .await;
    assert!(w.run(&[]).status.success());
    assert_eq!(last(&w, "zc-1").await["status"], "cancelled");
    assert!(
        store.versions(&ws("az-cancel")).await.unwrap().is_empty(),
        "nothing ran"
    );
    w.jobs
        .send(&w.message("zc-2", "az-cancel").to_string())
        .await;
    assert!(w.run(&[]).status.success());
    w.jobs.send(&cancel("zc-2")).await;
    assert!(w.run(&[]).status.success());
    let late = last(&w, "zc-2").await;
    assert!(late.to_string().contains("already-finished"), "{late}");
    assert_eq!(w.jobs.count().await, 0, "every message is settled");
}

/// The last record reported for `id` (a job's result, or a cancel's answer).
async fn last(w: &World, id: &str) -> Value {
    checked(w.results.peek().await)
        .into_iter()
        .rev()
        .find(|r| r["job_id"] == id || r["cancel"]["job_id"] == id)
        .unwrap_or_else(|| panic!("no record for {id}"))
}

/// Cancel mid-apply on the Container Apps job's path: one execution runs a slow apply, a
/// second takes the cancel message; the apply stops within seconds and its `on_failure:
/// destroy-created` destroys what it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_queued_mid_apply_stops_it_and_its_clean_up_destroys_what_it_made() {
    let w = World::new().await;
    let store = w.store();
    w.sb.faults(json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "slow", "delay_ms": 90000, "times": 1 }]));
    let mut job = w.message("zm-1", "az-cancel-mid");
    job["job"]["template"] = json!({ "name": "demo", "version": "1.0.0" });
    job["job"]["variables"] = json!({ "cluster_name": "az-cancel-mid", "region": "eu-west-1", "admin_password": "correct-horse-battery" });
    job["job"]["on_failure"] = json!("destroy-created");
    w.jobs.send(&job.to_string()).await;
    let running = w.command(&[]).spawn().expect("terrace-azure runs");
    let ws = ws("az-cancel-mid");
    tests::wait_for_stored_log(
        &*store,
        &ws,
        "zm-1",
        "testcloud_cluster.main: Creating",
        Duration::from_secs(120),
    )
    .await;
    let cancel =
        json!({ "cancel": { "job": "zm-1", "tenant": "acme", "workspace": "az-cancel-mid" } });
    w.jobs.send(&cancel.to_string()).await;
    assert!(w.run(&[]).status.success());
    let out = running.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let result = last(&w, "zm-1").await;
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["cleanup"]["policy"], "destroy-created", "{result}");
    assert!(
        result["cleanup"]["destroyed"]
            .to_string()
            .contains("testcloud_network"),
        "{result}"
    );
    let state = store.current(&ws).await.unwrap().unwrap();
    assert!(!String::from_utf8_lossy(&state.data).contains("testcloud_network"));
    assert_eq!(w.jobs.count().await, 0, "both messages are settled");
}

/// A tenant whose registry entry lists senders: the execution runs a job sent with `terrace
/// submit --sign`, refuses an unsigned one (to the poison queue, saying the signature is
/// missing; nothing runs), and answers a cancel sent signed with `terrace cancel --to
/// azqueue://…`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_senders_runs_only_signed_jobs_and_cancels_in_an_execution() {
    let w = World::new().await;
    let (key, public) = tests::keygen(&w.sb, "platform.pem");
    let mut registry: Value = serde_json::from_str(&w.tenants()).unwrap();
    registry["acme"]["senders"] = json!([public]);
    let registry = registry.to_string();
    let account = std::env::var("TERRACE_TEST_AZURE_ACCOUNT").unwrap();
    let queue = format!("azqueue://{account}/{}", w.jobs.name);
    let key = key.to_str().unwrap();
    let job = |id: &str, workspace: &str| {
        w.sb.job(
            &format!("{id}.yaml"),
            &tests::demo_job(id, workspace, "apply", "demo", 1),
        )
    };
    let (signed, unsigned) = (job("az-sig-1", "signed"), job("az-sig-2", "unsigned"));
    let send = |args: &[&str]| {
        let out =
            w.sb.terrace()
                .env("TERRACE_AZURE_QUEUE_ENDPOINT", azure::queue_endpoint())
                .env("AZURE_STORAGE_SAS_TOKEN", azure::sas())
                .args(args)
                .output()
                .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    };
    send(&[
        "submit",
        signed.to_str().unwrap(),
        "--to",
        &queue,
        "--sign",
        key,
    ]);
    send(&["submit", unsigned.to_str().unwrap(), "--to", &queue]);
    send(&[
        "cancel",
        "az-sig-9",
        "-w",
        "acme/signed",
        "--to",
        &queue,
        "--sign",
        key,
    ]);

    // One message an execution.
    for _ in 0..3 {
        let out = w
            .command(&[("TERRACE_TENANTS", &registry)])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    assert!(w.jobs.peek().await.is_empty(), "a message was left");
    let reported = checked(w.results.peek().await);
    let ran = reported
        .iter()
        .find(|r| r["job_id"] == "az-sig-1")
        .unwrap_or_else(|| panic!("{reported:?}"));
    assert_eq!(ran["status"], "succeeded", "{ran}");
    let answered = reported
        .iter()
        .find(|r| r["kind"] == "cancel")
        .unwrap_or_else(|| panic!("{reported:?}"));
    assert_eq!(answered["status"], "cancel-requested", "{answered}");
    let refused: Vec<Value> = reported
        .iter()
        .chain(dead_letters(w.poison.peek().await).iter())
        .filter(|r| r["status"] == "rejected")
        .cloned()
        .collect();
    assert!(!refused.is_empty(), "no rejection: {reported:?}");
    assert!(
        refused
            .iter()
            .all(|r| r["errors"][0]["field"] == "signature"
                && r["errors"][0]["problem"]
                    .as_str()
                    .unwrap()
                    .starts_with("is missing")),
        "{refused:?}"
    );
    assert!(
        w.store()
            .versions(&"acme/unsigned".parse().unwrap())
            .await
            .unwrap()
            .is_empty(),
        "the unsigned job ran"
    );
}

/// An execution (a fresh process, as a fresh container is) takes terraform's version from the
/// record the image carries instead of starting terraform to ask, while the binary is the file
/// recorded; a record of another file is not used, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_reads_terraforms_version_from_its_record() {
    let w = World::new().await;
    let mut record: Value =
        serde_json::from_slice(&std::fs::read(&w.version_record).unwrap()).unwrap();
    let asked = record["version"]["terraform_version"]
        .as_str()
        .unwrap()
        .to_owned();
    // A version terraform would not say: the result tells where the runner read it.
    record["version"]["terraform_version"] = "1.99.0".into();
    std::fs::write(&w.version_record, record.to_string()).unwrap();
    let execution = |id: &str| {
        let w = &w;
        let id = id.to_owned();
        async move {
            let mut message = w.message(&id, &id);
            message["job"]["variables"]["networks"] = json!([id]);
            w.jobs.send(&message.to_string()).await;
            let out = w.run_well();
            // What the platform reads on the results queue: the job's result.
            let result = checked(w.results.peek().await)
                .into_iter()
                .find(|r| r["job_id"] == id.as_str())
                .expect("the job's result is reported");
            assert_eq!(result["status"], "succeeded", "{result}");
            (
                result["terraform"]["version"].as_str().unwrap().to_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let (version, stderr) = execution("recorded").await;
    assert_eq!(version, "1.99.0", "the record was not used");
    assert!(!stderr.contains("recorded terraform version"), "{stderr}");

    // One byte off in size: another file, so terraform is asked, and the runner says why.
    record["size"] = (record["size"].as_u64().unwrap() + 1).into();
    std::fs::write(&w.version_record, record.to_string()).unwrap();
    let (version, stderr) = execution("asked").await;
    assert_eq!(version, asked, "a record of another file was used");
    assert!(
        stderr.contains("cannot use the recorded terraform version"),
        "{stderr}"
    );
}

/// A benchmark, not a test (`benches/start-latency.sh`): enqueue to terraform's first output on
/// the Storage Queue, one job at a time, each in an execution started right after its message
/// is queued (as the scaler would start one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: benches/start-latency.sh runs it"]
async fn start_latency() {
    let w = World::new().await;
    let store = w.store();
    let mut samples = tests::start::Samples::default();
    for i in 0..=tests::start::jobs() {
        let id = format!("start-{i}");
        let queued = std::time::SystemTime::now();
        w.jobs.send(&w.message(&id, &id).to_string()).await;
        let out = w.run_well();
        if i == 0 {
            continue; // a warm-up, as for the other triggers
        }
        let first = tests::start::first_output_ms(store.as_ref(), &ws(&id), &id, queued).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        samples.add(first, tests::start::share(&stderr, &id));
    }
    samples.report(
        "Storage Queue -> Container Apps job (Azurite, one execution per message started at once)",
        "the execution's start (a process here; in Azure the scaler polls the queue, every 30 s \
         by default, and starts a container), its receive, reading the tenant's target, and \
         terraform's start-up to its first line",
    );
}
