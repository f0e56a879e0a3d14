//! Jobs through a faulty network: `terrace run` reaches S3 and DynamoDB (moto), GCS
//! (fake-gcs-server) and Azure Blob (Azurite) through a proxy that, for 30 % of requests,
//! delays, resets the connection (before the emulator sees the request, or after it answered),
//! answers 500 or 503, or throttles; and cuts the network entirely for 5 s while the batch
//! runs (`tests::fault_proxy`).
//!
//! A batch of jobs (3 workspaces, 3 applies each: create, resize, rename) runs as a platform
//! would run it: a job that fails is submitted again as a new job, a run that could not reach
//! the store is delivered again, and a state terraform could not save, which the runner kept
//! but could not push, is pushed (`terrace state push --from-run`) before the next job. Afterwards, on each store: every job's change landed, no state
//! version was lost (the history unbroken: numbers 1..n, one lineage, serials growing), the
//! test cloud holds each workspace's resources exactly once, no lease is left, and every
//! failure said it may pass when tried again. Attempts, faults and time are printed
//! (`--nocapture`) for docs/RELIABILITY.md.
//!
//! `TERRACE_FAULT_RATE` (0.3), `TERRACE_FAULT_SEED` (1) and `TERRACE_FAULT_WORKSPACES` (3)
//! change the run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use state_backends::{StateStore, WorkspaceId};
use tests::fault_proxy::{Cloud, Fault, FaultProxy};
use tests::stores::{Call, Kind, Under, assert_unbroken, history};
use tests::{Sandbox, demo_job};

fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The applies each workspace gets, in order: (cluster, nodes).
const STEPS: [(&str, u32); 3] = [("alpha", 1), ("alpha", 2), ("bravo", 2)];

/// What one workspace's jobs cost.
#[derive(Debug, Default)]
struct Tally {
    /// `terrace run` invocations.
    runs: usize,
    /// Jobs that failed and were submitted again as new jobs, and runs delivered again: why.
    failed: Vec<String>,
    /// Runs that could not reach the store (exit 70) or found the workspace busy (75).
    again: usize,
    /// States terraform could not save, kept by the runner and pushed afterwards.
    pushed: usize,
    /// What the workspace's last successful run printed (`-q`: its warnings and errors), for
    /// a lease it may have left.
    last: String,
}

async fn result(store: &dyn StateStore, ws: &WorkspaceId, job: &str) -> Option<Value> {
    let raw = store.artifact(ws, job, "result.json").await.ok()??;
    serde_json::from_slice(&raw).ok()
}

/// Runs the workspace's applies in order, each until it succeeds, as a platform would.
async fn workspace(sb: Arc<Sandbox>, store: Arc<dyn StateStore>, w: usize) -> Tally {
    let name = format!("faults{w}");
    let ws = WorkspaceId::new("acme", &name).unwrap();
    let mut tally = Tally::default();
    let give_up = Instant::now() + Duration::from_secs(600);
    for (step, (cluster, nodes)) in STEPS.iter().enumerate() {
        let cluster = format!("{cluster}{w}");
        let mut submission = 0;
        loop {
            let id = format!("w{w}s{step}j{submission}");
            let job = sb.job(
                &format!("{id}.yaml"),
                &demo_job(&id, &name, "apply", &cluster, *nodes),
            );
            let sb2 = sb.clone();
            let run = tokio::task::spawn_blocking(move || {
                sb2.run(&["run", "-q", "--wait", "120", job.to_str().unwrap()])
            })
            .await
            .unwrap();
            tally.runs += 1;
            assert!(
                Instant::now() < give_up,
                "{name}: still failing after 10 minutes: {}",
                run.stderr()
            );
            match run.code() {
                0 => {
                    tally.last = run.stderr();
                    break;
                }
                // The store could not be reached, or the lease is still held by a run the
                // network cut off: deliver the same job again.
                70 | 75 => {
                    tally.again += 1;
                    let said = run.stderr();
                    let last = said.lines().last().unwrap_or_default().to_owned();
                    tally
                        .failed
                        .push(format!("exit {}, delivered again: {last}", run.code()));
                }
                1 => {
                    let r = result(&*store, &ws, &id)
                        .await
                        .unwrap_or_else(|| panic!("{id} failed with no result: {}", run.stderr()));
                    if r["status"] == "interrupted" {
                        tally.again += 1;
                        continue;
                    }
                    // terraform could not save its state and the runner could not push it
                    // before giving up: the kept state is pushed, as its hint says, before
                    // anything else runs in the workspace.
                    if r["unsaved_state"]["artifact"].is_string()
                        && r["unsaved_state"]["pushed_as"].is_null()
                    {
                        let ws_name = format!("acme/{name}");
                        loop {
                            let sb2 = sb.clone();
                            let (ws_name, run_id) = (ws_name.clone(), id.clone());
                            let push = tokio::task::spawn_blocking(move || {
                                sb2.run(&["state", "push", &ws_name, "--from-run", &run_id])
                            })
                            .await
                            .unwrap();
                            if push.code() == 0 {
                                break;
                            }
                            assert!(
                                Instant::now() < give_up,
                                "{id}: the kept state was never pushed: {}",
                                push.stderr()
                            );
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        tally.pushed += 1;
                        submission += 1;
                        continue;
                    }
                    assert_eq!(
                        r["error"]["retryable"], true,
                        "{id} failed in a way that says trying again will not help: {r}"
                    );
                    tally.failed.push(format!(
                        "failed, submitted again: {}: {}",
                        r["error"]["category"].as_str().unwrap_or("?"),
                        r["error"]["message"].as_str().unwrap_or("?")
                    ));
                    submission += 1;
                }
                code => panic!("{id}: exit {code}: {}{}", run.stdout(), run.stderr()),
            }
        }
    }
    tally
}

async fn batch(kind: Kind, cloud: Cloud, upstream: &str) {
    let rate: f64 = setting("TERRACE_FAULT_RATE", 0.3);
    let seed: u64 = setting("TERRACE_FAULT_SEED", 1);
    let workspaces: usize = setting("TERRACE_FAULT_WORKSPACES", 3);
    let proxy = FaultProxy::start(upstream, cloud, rate, seed).await;
    let mut sb = Sandbox::new();
    let under = Under::new(kind, &sb.store, "faults", Some(&proxy.url())).await;
    under.use_in(&mut sb);
    let sb = Arc::new(sb);
    let started = Instant::now();
    let tasks: Vec<_> = (0..workspaces)
        .map(|w| tokio::spawn(workspace(sb.clone(), under.store.clone(), w)))
        .collect();
    // The network is cut for 5 s once the batch is under way.
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.partition(Duration::from_secs(5));
    let mut tallies = Vec::new();
    for t in tasks {
        tallies.push(t.await.unwrap());
    }
    let took = started.elapsed();
    let counts = proxy.counts();

    let mut versions = 0;
    for (w, tally) in tallies.iter().enumerate() {
        let ws = WorkspaceId::new("acme", &format!("faults{w}")).unwrap();
        let what = format!("{} {ws}", kind.name());
        let all = history(&*under.store, &ws).await;
        assert_unbroken(&all, &what);
        versions += all.len();
        // The last apply's change is what the store holds.
        let (_, last) = all.last().expect("versions");
        let state: Value = serde_json::from_slice(last).unwrap();
        assert_eq!(
            state["outputs"]["endpoint"]["value"],
            format!("https://bravo{w}.eu-west-1.testcloud.local"),
            "{what}"
        );
        let left = under.store.lease(&ws).await.unwrap();
        assert!(
            left.is_none(),
            "{what}: a lease was left: {left:?}; its last run said:\n{}",
            tally.last
        );
    }
    // Each workspace's cluster and network exist once: nothing made twice, nothing left over.
    let mut expected: Vec<String> = (0..workspaces)
        .flat_map(|w| [format!("bravo{w}"), format!("bravo{w}-net")])
        .collect();
    expected.sort();
    assert_eq!(sb.cloud_names(), expected, "{}", kind.name());
    assert!(
        counts.faults() > 0,
        "{}: the proxy injected no fault ({}), so this proved nothing",
        kind.name(),
        counts.summary()
    );

    let runs: usize = tallies.iter().map(|t| t.runs).sum();
    let again: usize = tallies.iter().map(|t| t.again).sum();
    let pushed: usize = tallies.iter().map(|t| t.pushed).sum();
    let failed: Vec<&String> = tallies.iter().flat_map(|t| &t.failed).collect();
    println!(
        "faults {}: {} jobs succeeded in {:.1} s with {runs} runs ({} failed jobs submitted again, {again} runs delivered again, {pushed} kept states pushed); {versions} versions, 0 lost; proxy: {}",
        kind.name(),
        workspaces * STEPS.len(),
        took.as_secs_f64(),
        failed.len() - again,
        counts.summary()
    );
    for f in failed {
        println!("  {f}");
    }
}

/// Azurite's origin (the proxy's upstream), without the account in the path.
fn azure_origin() -> String {
    let blob = tests::azure::blob_endpoint();
    blob.trim_end_matches('/')
        .rsplit_once('/')
        .unwrap()
        .0
        .to_owned()
}

/// One test per store reached over HTTP, each calling `$helper(kind, cloud, upstream)`.
macro_rules! on_each_store {
    ($helper:ident, $workers:literal: $dynamodb:ident, $lock_object:ident, $gcs:ident, $azure:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
        async fn $dynamodb() {
            $helper(Kind::S3DynamoDb, Cloud::Aws, &tests::aws::moto()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
        async fn $lock_object() {
            $helper(Kind::S3LockObject, Cloud::Aws, &tests::aws::moto()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
        async fn $gcs() {
            $helper(Kind::Gcs, Cloud::Gcs, &tests::gcs::endpoint()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
        async fn $azure() {
            $helper(Kind::AzureBlob, Cloud::Azure, &azure_origin()).await;
        }
    };
}

/// A store of `kind` reached through a proxy with no faults of its own, and one demo apply
/// named `name` (workspace, cluster, and job `name-1`).
async fn one_job(
    kind: Kind,
    cloud: Cloud,
    upstream: &str,
    name: &str,
) -> (FaultProxy, Sandbox, Under, WorkspaceId, std::path::PathBuf) {
    let proxy = FaultProxy::start(upstream, cloud, 0.0, 1).await;
    let mut sb = Sandbox::new();
    let under = Under::new(kind, &sb.store, name, Some(&proxy.url())).await;
    under.use_in(&mut sb);
    let ws = WorkspaceId::new("acme", name).unwrap();
    let job = sb.job(
        &format!("{name}.yaml"),
        &demo_job(&format!("{name}-1"), name, "apply", name, 1),
    );
    (proxy, sb, under, ws, job)
}

/// `terrace run JOB`, started: its stderr piped for the test to read.
fn run_in_background(sb: &Sandbox, job: &std::path::Path) -> std::process::Child {
    sb.terrace()
        .args(["run", job.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a `terrace run` started by [`run_in_background`], checks it exited 0, and returns
/// its stderr.
async fn exited_ok(child: std::process::Child, kind: Kind) -> String {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{}: {}: {stderr}",
        kind.name(),
        out.status
    );
    stderr
}

/// The job succeeded, wrote one version and let go of its lease.
async fn succeeded_cleanly(under: &Under, ws: &WorkspaceId, job_id: &str) {
    let result = result(&*under.store, ws, job_id)
        .await
        .unwrap_or_else(|| panic!("{}: no result", under.kind.name()));
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(history(&*under.store, ws).await.len(), 1, "one version");
    assert!(
        under.store.lease(ws).await.unwrap().is_none(),
        "{}: a lease was left",
        under.kind.name()
    );
}

on_each_store!(batch, 4:
    jobs_on_s3_and_dynamodb_survive_a_faulty_network,
    jobs_on_s3_with_a_lock_object_survive_a_faulty_network,
    jobs_on_gcs_survive_a_faulty_network,
    jobs_on_azure_blob_survive_a_faulty_network
);

/// A store call whose request is sent and never answered (a stalled connection, not a
/// partition's dropped one): the runner's client gives the attempt up after its call timeout
/// (`TERRACE_CALL_TIMEOUT`, here 2 s) and tries again, and the job finishes. The result's
/// write is held: without a timeout, the runner would wait for it for good, its job never
/// reported and its lease never let go.
async fn a_stalled_call(kind: Kind, cloud: Cloud, upstream: &str) {
    let (proxy, mut sb, under, ws, job) = one_job(kind, cloud, upstream, "stall").await;
    sb.env.push(("TERRACE_CALL_TIMEOUT".into(), "2".into()));
    let mut held = proxy.hold(
        Box::new(|m, path, _| {
            (*m == hyper::Method::PUT || *m == hyper::Method::POST) && path.contains("result.json")
        }),
        false,
    );
    let started = Instant::now();
    let mut child = sb
        .terrace()
        .args(["run", "-q", job.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let give_up = started + Duration::from_secs(150);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{}: the run still waits for its stalled call after {:?} (held: {:?})",
                kind.name(),
                started.elapsed(),
                held.try_recv().ok()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    // Well under the clients' defaults (60 s): the setting reached them.
    assert!(
        took < Duration::from_secs(30),
        "{}: {took:?}: TERRACE_CALL_TIMEOUT=2 did not reach the client",
        kind.name()
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{}: {status}: {stderr}", kind.name());
    let held = held
        .try_recv()
        .expect("the proxy held the result's first write, or this proved nothing");
    // The result landed on a later attempt.
    succeeded_cleanly(&under, &ws, "stall-1").await;
    println!(
        "stalled call {}: the job finished in {:.1} s; never answered: {held}",
        kind.name(),
        took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_call_to_s3_is_given_up_and_tried_again() {
    a_stalled_call(Kind::S3DynamoDb, Cloud::Aws, &tests::aws::moto()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_call_to_gcs_is_given_up_and_tried_again() {
    a_stalled_call(Kind::Gcs, Cloud::Gcs, &tests::gcs::endpoint()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_call_to_azure_blob_is_given_up_and_tried_again() {
    a_stalled_call(Kind::AzureBlob, Cloud::Azure, &azure_origin()).await;
}

/// The lease's acquisition lands in the store but its answer is lost, and the network is then
/// cut for longer than the client's own attempts: the runner tries again, finds the lease held
/// by this very request, and the job runs (it used to fail, and delivered again, wait for its
/// own lease to expire).
async fn a_lost_lease_answer(kind: Kind, cloud: Cloud, upstream: &str) {
    let (proxy, mut sb, under, ws, job) = one_job(kind, cloud, upstream, "unseen").await;
    sb.env.push(("TERRACE_CALL_TIMEOUT".into(), "2".into()));
    // The runner says at `info` that it found the lease held by its own lost try.
    sb.env.push(("TERRACE_LOG".into(), "info".into()));
    let held = proxy.hold(Call::Lease.matches(kind), true);
    let started = Instant::now();
    let child = run_in_background(&sb, &job);
    let what = tokio::time::timeout(Duration::from_secs(60), held)
        .await
        .expect("the proxy held the lease's write")
        .unwrap();
    // Longer than the client's own tries of that call (a 2 s timeout each; Azure's client
    // tries four times).
    proxy.partition(Duration::from_secs(14));
    let stderr = exited_ok(child, kind).await;
    let took = started.elapsed();
    // Azure's client keeps trying the write past the cut, and the store itself then finds its
    // record in the blob; the others give up, and the runner's next try finds the lease held
    // by this request.
    let by_runner = stderr.contains("taken by an earlier try whose answer was lost");
    assert!(
        by_runner || kind == Kind::AzureBlob,
        "{}: the lease was not found held by the lost try: {stderr}",
        kind.name()
    );
    // Well under the lease's TTL (60 s): the job never waited for its own lease to expire.
    assert!(took < Duration::from_secs(40), "{}: {took:?}", kind.name());
    succeeded_cleanly(&under, &ws, "unseen-1").await;
    println!(
        "lost lease answer {}: the job finished in {:.1} s; answer lost: {what}; found by {}",
        kind.name(),
        took.as_secs_f64(),
        if by_runner {
            "the runner's next try"
        } else {
            "the store's own retry"
        }
    );
}

on_each_store!(a_lost_lease_answer, 2:
    a_lease_taken_by_a_call_whose_answer_was_lost_is_kept_on_s3_with_a_dynamodb_lease,
    a_lease_taken_by_a_call_whose_answer_was_lost_is_kept_on_s3_with_a_lock_object,
    a_lease_taken_by_a_call_whose_answer_was_lost_is_kept_on_gcs,
    a_lease_taken_by_a_call_whose_answer_was_lost_is_kept_on_azure_blob
);

/// GCS's JSON API (listings, metadata, copies, deletes) answers 503 twice, then works: the
/// bucket tries again itself, and `terrace workspaces` lists the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcs_listing_that_fails_for_a_moment_is_tried_again() {
    let proxy = FaultProxy::start(&tests::gcs::endpoint(), Cloud::Gcs, 0.0, 1).await;
    let mut sb = Sandbox::new();
    let under = Under::new(Kind::Gcs, &sb.store, "listing", Some(&proxy.url())).await;
    under.use_in(&mut sb);
    let job = sb.job("list.yaml", &demo_job("list-1", "list", "apply", "list", 1));
    sb.run(&["run", "-q", job.to_str().unwrap()]).expect_code(0);
    proxy.fail(
        Box::new(|m, path, _| *m == hyper::Method::GET && path.contains("/o?")),
        2,
        Fault::Unavailable,
    );
    let listed = sb.run(&["workspaces", "--json"]);
    listed.expect_code(0);
    let listed: Value = serde_json::from_slice(&listed.0.stdout).unwrap();
    assert_eq!(listed["workspaces"], serde_json::json!(["acme/list"]));
    assert_eq!(
        proxy.counts().of(Fault::Unavailable),
        2,
        "both failures were met, or this proved nothing"
    );
}

/// A lease renewal lands in the store but its answer never comes: the watchdog abandons it
/// after half a renewal period and renews again, which every store accepts (the lease it
/// renews is the one the lost renewal extended), and the job goes on to succeed.
async fn a_lost_renewal_answer(kind: Kind, cloud: Cloud, upstream: &str) {
    let (proxy, mut sb, under, ws, job) = one_job(kind, cloud, upstream, "renew").await;
    // Renewed every 3 s, an attempt abandoned after 2 s; the create below takes 10 s.
    sb.env.push(("TERRACE_LEASE_TTL".into(), "9".into()));
    sb.faults(serde_json::json!([{ "resource": "testcloud_cluster", "name": "renew", "op": "create", "kind": "slow", "delay_ms": 10000, "times": 1 }]));
    let child = run_in_background(&sb, &job);
    // Once the lease is taken, the next write of it is a renewal.
    let waited = Instant::now();
    while under.store.lease(&ws).await.unwrap().is_none() {
        assert!(waited.elapsed() < Duration::from_secs(60), "no lease taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = proxy.hold(Call::Lease.matches(kind), true);
    let what = tokio::time::timeout(Duration::from_secs(30), held)
        .await
        .expect("a renewal was held")
        .unwrap();
    let stderr = exited_ok(child, kind).await;
    assert!(!stderr.contains("lease lost"), "{}: {stderr}", kind.name());
    assert!(
        stderr.contains("renewing the lease did not answer"),
        "{}: the held renewal was not abandoned: {stderr}",
        kind.name()
    );
    succeeded_cleanly(&under, &ws, "renew-1").await;
    println!(
        "lost renewal answer {}: the job went on; answer lost: {what}",
        kind.name()
    );
}

on_each_store!(a_lost_renewal_answer, 2:
    a_renewal_whose_answer_was_lost_is_renewed_again_on_s3_with_a_dynamodb_lease,
    a_renewal_whose_answer_was_lost_is_renewed_again_on_s3_with_a_lock_object,
    a_renewal_whose_answer_was_lost_is_renewed_again_on_gcs,
    a_renewal_whose_answer_was_lost_is_renewed_again_on_azure_blob
);
