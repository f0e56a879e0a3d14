//! The kill matrix: `terrace run` SIGKILLed at each step of an apply (init, plan, apply mid-
//! resource, just after a state write, just after a lease renewal, at the result write), on
//! every store (folder, S3 with a DynamoDB lease, S3 with a lock object, GCS, Azure Blob),
//! against the emulators and the machine's terraform.
//!
//! After each kill: terraform died with its runner; no state version accepted before the kill
//! is lost or changed, and the history is unbroken (numbers 1..n, one lineage, serials
//! growing); the dead runner's lease is still there and expires; the next job for the workspace
//! takes it over with a higher fence, finds the dead job `interrupted` and leaves the cloud with
//! exactly what the configuration says (nothing doubled, what the dead run made but never saved
//! imported). Delivered again, the dead job runs.
//!
//! A second matrix kills the runner *during* a store call, on the stores reached over HTTP: a
//! proxy in front of the emulator holds one request (taking the lease, writing a state version,
//! renewing the lease, writing the result) before or after the emulator saw it, and the runner
//! is killed while it waits for the answer. The same checks follow, and whether the write
//! landed.
//!
//! `TERRACE_KILL_ROUNDS` (1) repeats the matrix with new workspaces; each store prints what it
//! tried (`--nocapture`), for docs/RELIABILITY.md.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use state_backends::{StateStore, WorkspaceId};
use tests::fault_proxy::{Cloud, FaultProxy};
use tests::stores::{Call, Kind, Under, assert_unbroken, history};
use tests::{Sandbox, children_of, demo_job};

/// What makes the test kill the runner.
#[derive(Clone, Copy)]
enum Trigger {
    /// The runner's log prints this.
    Line(&'static str),
    /// The store shows the victim's lease renewed (its expiry moved) after the log printed
    /// this.
    RenewalAfter(&'static str),
    /// The proxy holds the victim's first `call` (after the log printed `after`, if given):
    /// before the emulator saw it, or, when `landed`, after it did what was asked.
    Held {
        after: Option<&'static str>,
        call: Call,
        landed: bool,
    },
}

/// Where the runner dies.
struct KillPoint {
    name: &'static str,
    trigger: Trigger,
    /// The victim's cluster create is slow, so the kill comes while it is under way.
    slow_cluster: bool,
    /// terraform is running at the kill (after a write it may already have exited).
    terraform_running: bool,
    /// The kill may come after the victim wrote its result and let go of its lease (it is
    /// racing the write): then the result is `succeeded`, not `interrupted`.
    may_have_finished: bool,
    /// Whether the store holds a state version the victim wrote (None: either may be).
    victim_wrote: Option<bool>,
    /// What the victim made but never saved, which the next job imports.
    imports: &'static [&'static str],
    /// The victim recorded its job (`job.json`) before the kill (None: either may be; the
    /// start records are written while terraform initialises and plans, which change nothing,
    /// so a kill then may come before them).
    recorded: Option<bool>,
    /// The store takes each of the victim's log chunks slowly ([`SLOW_LOG`]), so a create's
    /// evidence is still on its way when terraform writes the state after it.
    slow_log: bool,
}

/// How long the proxy holds each log chunk for a point with `slow_log`.
const SLOW_LOG: Duration = Duration::from_millis(1500);

const KILL_POINTS: [KillPoint; 7] = [
    KillPoint {
        name: "init",
        trigger: Trigger::Line("==> terraform init"),
        slow_cluster: false,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: None,
        imports: &[],
        recorded: None,
        slow_log: false,
    },
    KillPoint {
        name: "plan",
        trigger: Trigger::Line("==> terraform plan"),
        slow_cluster: false,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: None,
        imports: &[],
        recorded: None,
        slow_log: false,
    },
    // Apply, mid-resource: the old cluster is being destroyed.
    KillPoint {
        name: "destroying",
        trigger: Trigger::Line("Destroying..."),
        slow_cluster: true,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: None,
        imports: &[],
        recorded: Some(true),
        slow_log: false,
    },
    // Apply, mid-resource: the new network exists in the cloud, but no state records it yet.
    KillPoint {
        name: "created-not-saved",
        trigger: Trigger::Line("testcloud_network.main: Creation complete"),
        slow_cluster: true,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: None,
        imports: &["testcloud_network.main"],
        recorded: Some(true),
        slow_log: false,
    },
    // Right after a state version was accepted, before the result (the last write of the
    // apply, so a slow kill may come after the result).
    KillPoint {
        name: "after-a-write",
        trigger: Trigger::Line("state version"),
        slow_cluster: false,
        terraform_running: false,
        may_have_finished: true,
        victim_wrote: None,
        imports: &[],
        recorded: Some(true),
        slow_log: false,
    },
    // Right after the heartbeat renewed the lease, while the new cluster is being created.
    KillPoint {
        name: "lease-renewal",
        trigger: Trigger::RenewalAfter("testcloud_cluster.main: Creating..."),
        slow_cluster: true,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: None,
        imports: &[],
        recorded: Some(true),
        slow_log: false,
    },
    // The job's last line is logged just before its result is written.
    KillPoint {
        name: "result-write",
        trigger: Trigger::Line(" succeeded in "),
        slow_cluster: false,
        terraform_running: false,
        may_have_finished: true,
        victim_wrote: None,
        imports: &[],
        recorded: Some(true),
        slow_log: false,
    },
];

/// Kill points during a store call (the store reached through a proxy that holds the call).
const IN_A_STORE_CALL: [KillPoint; 5] = [
    // Taking the lease: the store gave it, the runner never heard (no job record yet).
    KillPoint {
        name: "lease-take-landed",
        trigger: Trigger::Held {
            after: None,
            call: Call::Lease,
            landed: true,
        },
        slow_cluster: false,
        terraform_running: false,
        may_have_finished: false,
        victim_wrote: Some(false),
        imports: &[],
        recorded: Some(false),
        slow_log: false,
    },
    // The apply's state write, before the store saw it: the cloud changed, no state says so.
    // The log is stored slowly: the creates' evidence must still land before the state.
    KillPoint {
        name: "state-write-unsent",
        trigger: Trigger::Held {
            after: None,
            call: Call::Version,
            landed: false,
        },
        slow_cluster: false,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: Some(false),
        imports: &["testcloud_network.main", "testcloud_cluster.main"],
        recorded: Some(true),
        slow_log: true,
    },
    // The apply's state write, stored, its answer not yet back.
    KillPoint {
        name: "state-write-landed",
        trigger: Trigger::Held {
            after: None,
            call: Call::Version,
            landed: true,
        },
        slow_cluster: false,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: Some(true),
        imports: &[],
        recorded: Some(true),
        slow_log: false,
    },
    // A renewal stored, its answer not yet back, while the new cluster is being created.
    KillPoint {
        name: "lease-renewal-landed",
        trigger: Trigger::Held {
            after: Some("testcloud_cluster.main: Creating..."),
            call: Call::Lease,
            landed: true,
        },
        slow_cluster: true,
        terraform_running: true,
        may_have_finished: false,
        victim_wrote: Some(false),
        imports: &[],
        recorded: Some(true),
        slow_log: false,
    },
    // The result stored, its answer not yet back: the job is done, its lease never let go.
    KillPoint {
        name: "result-write-landed",
        trigger: Trigger::Held {
            after: None,
            call: Call::Result,
            landed: true,
        },
        slow_cluster: false,
        terraform_running: false,
        may_have_finished: true,
        victim_wrote: Some(true),
        imports: &[],
        recorded: Some(true),
        slow_log: false,
    },
];

/// Runs `job` with `terrace run` and SIGKILLs it (only the runner) at `point`; its terraform
/// must die with it. `proxy` stands between the runner and the store, for held calls.
async fn kill_at(
    sb: &Sandbox,
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job: &std::path::Path,
    point: &KillPoint,
    proxy: Option<(&FaultProxy, Kind)>,
) -> Option<String> {
    let hold = |call: Call| {
        let (proxy, kind) = proxy.expect("a proxy to hold a store call");
        proxy.hold(
            call.matches(kind),
            matches!(point.trigger, Trigger::Held { landed: true, .. }),
        )
    };
    let mut held = match point.trigger {
        Trigger::Held {
            after: None, call, ..
        } => Some(hold(call)),
        _ => None,
    };
    let mut child = sb
        .terrace()
        .args(["run", job.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (line, renewal) = match point.trigger {
        Trigger::Line(line) => (line, false),
        Trigger::RenewalAfter(line) => (line, true),
        Trigger::Held { after, .. } => (after.unwrap_or_default(), false),
    };
    // The log is read on a thread of its own, so the store can be watched meanwhile.
    let stderr = child.stderr.take().unwrap();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for l in BufReader::new(stderr).lines() {
            let Ok(l) = l else { break };
            if !line.is_empty() && l.contains(line) {
                let _ = seen_tx.send(());
            }
            seen.push(l);
        }
        seen
    });
    // A call held from the start needs no line.
    let came = line.is_empty()
        || tokio::task::spawn_blocking(move || {
            seen_rx.recv_timeout(Duration::from_secs(60)).is_ok()
        })
        .await
        .unwrap();
    if !came {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{}: `{line}` never came:\n{}",
            point.name,
            reader.join().unwrap().join("\n")
        );
    }
    if let Trigger::Held {
        after: Some(_),
        call,
        ..
    } = point.trigger
    {
        held = Some(hold(call));
    }
    let held = match held {
        Some(told) => match tokio::time::timeout(Duration::from_secs(60), told).await {
            Ok(Ok(what)) => Some(what),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{}: the call to hold never came:\n{}",
                    point.name,
                    reader.join().unwrap().join("\n")
                );
            }
        },
        None => None,
    };
    if renewal {
        let first = store.lease(ws).await.unwrap().expect("the victim's lease");
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let now = store.lease(ws).await.unwrap().expect("the victim's lease");
            if now.expires_at > first.expires_at {
                assert_eq!(now.fence, first.fence, "a renewal keeps the fence");
                break;
            }
            assert!(
                Instant::now() < give_up,
                "{}: the lease was never renewed",
                point.name
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // terraform, not its providers. The runner logs a step's line just before it starts the
    // step's terraform, so that may take a moment to appear.
    let give_up = Instant::now() + Duration::from_secs(10);
    let (groups, terraform) = loop {
        let groups: Vec<u32> = children_of(child.id());
        let terraform: Vec<u32> = descendants(child.id())
            .into_iter()
            .filter(|&pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| !String::from_utf8_lossy(&c).contains("terraform-provider-"))
            })
            .collect();
        if !terraform.is_empty() || !point.terraform_running {
            break (groups, terraform);
        }
        assert!(
            Instant::now() < give_up,
            "{}: no terraform under the runner after `{line}`",
            point.name
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Only the runner is killed: its terraform must die with it, not go on changing the cloud.
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    let give_up = Instant::now() + Duration::from_secs(10);
    while terraform.iter().any(|&pid| alive(pid)) {
        assert!(
            Instant::now() < give_up,
            "{}: terraform outlived its runner: {terraform:?}",
            point.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its providers (in terraform's process group) are not the runner's children: stop them.
    for pgid in groups.into_iter().map(|p| p as i32) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    held
}

/// Every process below `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let children = children_of(p);
        next.extend(&children);
        all.extend(children);
    }
    all
}

/// Whether a process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

async fn artifact(store: &dyn StateStore, ws: &WorkspaceId, job: &str, name: &str) -> Value {
    let raw = store
        .artifact(ws, job, name)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no {name} for job {job}"));
    serde_json::from_slice(&raw).expect("artifact is JSON")
}

fn rounds() -> usize {
    std::env::var("TERRACE_KILL_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// The kill matrix on a store of `kind`, at `points`; with `through`, the runner reaches the
/// store through a proxy in front of that emulator (for the points that hold a call).
async fn kill_matrix(kind: Kind, points: &[KillPoint], through: Option<(Cloud, String)>) {
    let mut sb = Sandbox::new();
    let proxy = match through {
        Some((cloud, upstream)) => Some(FaultProxy::start(&upstream, cloud, 0.0, 1).await),
        None => None,
    };
    let under = Under::new(
        kind,
        &sb.store,
        "kill",
        proxy.as_ref().map(|p| p.url()).as_deref(),
    )
    .await;
    under.use_in(&mut sb);
    // Short, so that the next job does not wait long for a dead runner's lease; on an emulator
    // long enough that a renewal slowed by a loaded machine (Azurite took more than the 1.5 s a
    // 3 s lease gives one) is not taken for a lost lease: 6 s gives an attempt 2 s, then
    // another.
    let ttl = if kind == Kind::Folder { "3" } else { "6" };
    sb.env.push(("TERRACE_LEASE_TTL".into(), ttl.into()));
    let store = &*under.store;
    let started = Instant::now();
    let (mut kills, mut versions_kept, mut interrupted, mut finished, mut unrecorded) =
        (0, 0, 0, 0, 0);
    let mut held_calls = Vec::new();
    for round in 0..rounds() {
        for (i, point) in points.iter().enumerate() {
            let what = format!("{} at {} (round {round})", kind.name(), point.name);
            let tag = format!("{round}{}{i}", if proxy.is_some() { 'h' } else { 'k' });
            let ws_name = format!("acme/kill{tag}");
            let ws: WorkspaceId = ws_name.parse().unwrap();
            let job =
                |id: &str, cluster: &str| demo_job(id, &format!("kill{tag}"), "apply", cluster, 1);
            let (old, new) = (format!("o{tag}"), format!("n{tag}"));
            let base = sb.job(&format!("b{tag}.yaml"), &job(&format!("b{tag}"), &old));
            let run = sb.run(&["run", "-q", base.to_str().unwrap()]);
            assert_eq!(run.code(), 0, "{what}: {}", run.stderr());
            let before = history(store, &ws).await;

            // The victim renames the cluster: network and cluster are replaced.
            let faults = if point.slow_cluster {
                json!([{ "resource": "testcloud_cluster", "name": new, "op": "create", "kind": "slow", "delay_ms": 60000, "times": 1 }])
            } else {
                json!([])
            };
            sb.faults(faults);
            if point.slow_log {
                let proxy = proxy.as_ref().expect("a proxy to slow the log down");
                proxy.slow(Some(Call::LogChunk.matches(kind)), SLOW_LOG);
            }
            let victim_id = format!("v{tag}");
            let victim = sb.job(&format!("v{tag}.yaml"), &job(&victim_id, &new));
            let held = kill_at(
                &sb,
                store,
                &ws,
                &victim,
                point,
                proxy.as_ref().map(|p| (p, kind)),
            )
            .await;
            let what = match held {
                Some(call) => {
                    held_calls.push(format!("{}: {call}", point.name));
                    format!("{what}, {call} held")
                }
                None => what,
            };
            if let Some(proxy) = &proxy {
                proxy.slow(None, Duration::ZERO);
            }
            kills += 1;
            // Every version the store accepted, including any the victim wrote before it died.
            let accepted = history(store, &ws).await;
            assert_unbroken(&accepted, &what);
            assert_eq!(&accepted[..before.len()], &before[..], "{what}");
            if let Some(wrote) = point.victim_wrote {
                assert_eq!(
                    accepted.len() > before.len(),
                    wrote,
                    "{what}: {} versions before the victim, {} after",
                    before.len(),
                    accepted.len()
                );
            }
            // The dead runner's lease is still recorded (taken over below, with a higher
            // fence); a victim killed as it took the lease never recorded its job.
            let victim_fence = match store.lease(&ws).await.unwrap() {
                Some(lease) => {
                    assert_eq!(lease.owner, victim_id, "{what}");
                    lease.fence
                }
                None => {
                    assert!(
                        point.may_have_finished,
                        "{what}: the dead runner's lease is gone"
                    );
                    artifact(store, &ws, &victim_id, "job.json").await["lease"]["fence"]
                        .as_u64()
                        .unwrap()
                }
            };

            // The next job waits for the lease to expire, then brings the workspace to `new`.
            sb.faults(json!([]));
            let next_id = format!("n{tag}");
            let next = sb.job(&format!("n{tag}.yaml"), &job(&next_id, &new));
            let run = sb.run(&["run", "-q", "--wait", "60", next.to_str().unwrap()]);
            assert_eq!(run.code(), 0, "{what}: {}{}", run.stdout(), run.stderr());
            let result = artifact(store, &ws, &next_id, "result.json").await;
            let fence = artifact(store, &ws, &next_id, "job.json").await["lease"]["fence"]
                .as_u64()
                .unwrap();
            assert!(fence > victim_fence, "{what}: the fence did not grow");

            // No accepted version was lost or changed, and the history is still unbroken.
            let after = history(store, &ws).await;
            assert_unbroken(&after, &what);
            assert_eq!(
                &after[..accepted.len()],
                &accepted[..],
                "{what}: a version accepted before the kill was lost or changed"
            );
            versions_kept += accepted.len();
            assert!(
                store.lease(&ws).await.unwrap().is_none(),
                "{what}: a lease was left"
            );

            // The cloud holds exactly what the configuration says: nothing doubled, nothing
            // stale.
            let cloud: Vec<String> = sb
                .cloud_names()
                .into_iter()
                .filter(|n| n.trim_end_matches("-net").get(1..) == Some(tag.as_str()))
                .collect();
            assert_eq!(
                cloud,
                [new.clone(), format!("{new}-net")],
                "{what}: {result}"
            );
            for address in point.imports {
                assert!(
                    result["recovered"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|i| i["address"] == *address)),
                    "{what}: {address}, made by the dead run, was not imported: {result}"
                );
            }

            // The dead job is `interrupted` (or, killed racing its result write, `succeeded`),
            // and an interrupted one is not final: delivered again, it runs. Killed as it took
            // the lease (or in init or plan, before its start records), it had recorded nothing, and
            // nothing is recorded for it: it changed nothing.
            let recorded = match point.recorded {
                Some(recorded) => recorded,
                None => store
                    .artifact(&ws, &victim_id, "job.json")
                    .await
                    .unwrap()
                    .is_some(),
            };
            if recorded {
                let dead = artifact(store, &ws, &victim_id, "result.json").await;
                match dead["status"].as_str() {
                    Some("interrupted") => interrupted += 1,
                    Some("succeeded") if point.may_have_finished => finished += 1,
                    _ => panic!("{what}: the dead job's result: {dead}"),
                }
            } else {
                for name in ["job.json", "result.json"] {
                    let found = store.artifact(&ws, &victim_id, name).await.unwrap();
                    assert!(found.is_none(), "{what}: the dead job left {name}");
                }
                unrecorded += 1;
            }
            let again = sb.run(&["run", "-q", victim.to_str().unwrap()]);
            assert_eq!(again.code(), 0, "{what}: {}", again.stderr());
            let redone = artifact(store, &ws, &victim_id, "result.json").await;
            assert_eq!(redone["status"], "succeeded", "{what}: {redone}");
            assert_unbroken(&history(store, &ws).await, &what);
        }
    }
    println!(
        "kill matrix {}{}: {kills} kills at {} points in {:.0} s; {versions_kept} versions accepted before a kill, 0 lost or changed; dead jobs {interrupted} interrupted, {finished} finished before the kill, {unrecorded} killed before they recorded the job",
        kind.name(),
        if proxy.is_some() {
            " in a store call"
        } else {
            ""
        },
        points.len(),
        started.elapsed().as_secs_f64()
    );
    for call in held_calls {
        println!("  held {call}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_matrix_on_a_folder() {
    kill_matrix(Kind::Folder, &KILL_POINTS, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_matrix_on_s3_with_a_dynamodb_lease() {
    kill_matrix(Kind::S3DynamoDb, &KILL_POINTS, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_matrix_on_s3_with_a_lock_object() {
    kill_matrix(Kind::S3LockObject, &KILL_POINTS, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_matrix_on_gcs() {
    kill_matrix(Kind::Gcs, &KILL_POINTS, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_matrix_on_azure_blob() {
    kill_matrix(Kind::AzureBlob, &KILL_POINTS, None).await;
}

// A store call on a folder is a few system calls the runner cannot be stopped inside of but by
// a kill between them, which the matrix above does; these hold the call over HTTP.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_in_a_store_call_on_s3_with_a_dynamodb_lease() {
    let upstream = (Cloud::Aws, tests::aws::moto());
    kill_matrix(Kind::S3DynamoDb, &IN_A_STORE_CALL, Some(upstream)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_in_a_store_call_on_s3_with_a_lock_object() {
    let upstream = (Cloud::Aws, tests::aws::moto());
    kill_matrix(Kind::S3LockObject, &IN_A_STORE_CALL, Some(upstream)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_in_a_store_call_on_gcs() {
    let upstream = (Cloud::Gcs, tests::gcs::endpoint());
    kill_matrix(Kind::Gcs, &IN_A_STORE_CALL, Some(upstream)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_in_a_store_call_on_azure_blob() {
    let blob = tests::azure::blob_endpoint();
    let origin = blob
        .trim_end_matches('/')
        .rsplit_once('/')
        .unwrap()
        .0
        .to_owned();
    kill_matrix(
        Kind::AzureBlob,
        &IN_A_STORE_CALL,
        Some((Cloud::Azure, origin)),
    )
    .await;
}
