//! The runner SIGKILLed at several points of an apply: its terraform dies with it, no state
//! version accepted before the kill is lost or changed, the dead runner's lease
//! expires, the next job for the workspace takes over with a higher fence, finds the dead job
//! `interrupted`, and leaves the cloud with exactly what the configuration says, importing what
//! the dead run made but never saved.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use state_backends::{StateStore, WorkspaceId};
use tests::{Sandbox, children_of, demo_job};

/// Where the runner dies: when its log prints `trigger`.
struct KillPoint {
    name: &'static str,
    trigger: &'static str,
    /// The victim's cluster create is slow, so the kill comes while it is under way.
    slow_cluster: bool,
    /// terraform is running at the kill (after a write it may already have exited).
    terraform_running: bool,
}

const KILL_POINTS: [KillPoint; 4] = [
    KillPoint {
        name: "init",
        trigger: "terraform init",
        slow_cluster: false,
        terraform_running: true,
    },
    KillPoint {
        name: "destroying",
        trigger: "Destroying...",
        slow_cluster: true,
        terraform_running: true,
    },
    // The new network exists in the cloud, but no state records it yet.
    KillPoint {
        name: "created-not-saved",
        trigger: "testcloud_network.main: Creation complete",
        slow_cluster: true,
        terraform_running: true,
    },
    // Right after a state version was accepted, before the result.
    KillPoint {
        name: "after-a-write",
        trigger: "state version",
        slow_cluster: false,
        terraform_running: false,
    },
];

fn version_bytes(sb: &Sandbox, ws: &str, number: u64) -> Vec<u8> {
    std::fs::read(sb.store.join(format!("{ws}/versions/{number:010}.tfstate"))).unwrap()
}

/// Runs `job` with `terrace run` and SIGKILLs it and its terraform when `trigger` is logged.
fn kill_at(sb: &Sandbox, job: &std::path::Path, point: &KillPoint) {
    let trigger = point.trigger;
    let mut child = sb
        .terrace()
        .args(["run", job.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let hit = line.contains(trigger);
        seen.push(line);
        if hit {
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|l| l.contains(trigger)),
        "`{trigger}` never came:\n{}",
        seen.join("\n")
    );
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
            "no terraform under the runner after `{trigger}`"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // Only the runner is killed: its terraform must die with it, not go on changing the cloud.
    child.kill().unwrap();
    child.wait().unwrap();
    let give_up = Instant::now() + Duration::from_secs(10);
    while terraform.iter().any(|&pid| alive(pid)) {
        assert!(
            Instant::now() < give_up,
            "terraform outlived its runner: {terraform:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its providers (in terraform's process group) are not the runner's children: stop them.
    for pgid in groups.into_iter().map(|p| p as i32) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
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

#[tokio::test]
async fn a_runner_killed_at_any_point_loses_no_version_and_the_next_job_takes_over() {
    let mut sb = Sandbox::new();
    sb.env.push(("TERRACE_LEASE_TTL".into(), "3".into()));
    let store = sb.fs_store();
    for (i, point) in KILL_POINTS.iter().enumerate() {
        let ws_name = format!("acme/kill{i}");
        let ws: WorkspaceId = ws_name.parse().unwrap();
        let job = |id: &str, cluster: &str| demo_job(id, &format!("kill{i}"), "apply", cluster, 1);
        let (old, new) = (format!("old{i}"), format!("new{i}"));
        let base = sb.job(&format!("b{i}.yaml"), &job(&format!("b{i}"), &old));
        sb.run(&["run", "-q", base.to_str().unwrap()])
            .expect_code(0);

        // The victim renames the cluster: network and cluster are replaced.
        let faults = if point.slow_cluster {
            json!([{ "resource": "testcloud_cluster", "name": new, "op": "create", "kind": "slow", "delay_ms": 60000, "times": 1 }])
        } else {
            json!([])
        };
        sb.faults(faults);
        let victim_id = format!("v{i}");
        let victim = sb.job(&format!("v{i}.yaml"), &job(&victim_id, &new));
        kill_at(&sb, &victim, point);
        // Every version the store accepted, including any the victim wrote before it died.
        let accepted: Vec<(u64, Vec<u8>)> = sb
            .versions(&ws_name)
            .await
            .iter()
            .map(|v| (v.number, version_bytes(&sb, &ws_name, v.number)))
            .collect();
        let lease = store
            .lease(&ws)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{}: the dead runner's lease is gone", point.name));
        assert_eq!(lease.owner, victim_id, "{}", point.name);

        // The next job waits for the lease to expire, then brings the workspace to `new`.
        sb.faults(json!([]));
        let next_id = format!("n{i}");
        let next = sb.job(&format!("n{i}.yaml"), &job(&next_id, &new));
        let started = Instant::now();
        let run = sb.run(&["run", "-q", "--wait", "60", next.to_str().unwrap()]);
        assert_eq!(run.code(), 0, "{}: {}", point.name, run.stdout());
        assert!(started.elapsed() < Duration::from_secs(60));
        let result = sb.artifact_json(&ws_name, &next_id, "result.json").await;
        let fence = sb.artifact_json(&ws_name, &next_id, "job.json").await["lease"]["fence"]
            .as_u64()
            .unwrap();
        assert!(fence > lease.fence, "{}: fence did not grow", point.name);

        // No accepted version was lost or changed, and numbering has no gaps.
        let after = sb.versions(&ws_name).await;
        for (number, data) in &accepted {
            assert_eq!(
                &version_bytes(&sb, &ws_name, *number),
                data,
                "{}: version {number} changed",
                point.name
            );
        }
        let numbers: Vec<u64> = after.iter().map(|v| v.number).collect();
        assert_eq!(numbers, (1..=after.len() as u64).collect::<Vec<_>>());

        // The cloud holds exactly what the configuration says: nothing doubled, nothing stale.
        let cloud: Vec<String> = sb
            .cloud_names()
            .into_iter()
            .filter(|n| n.ends_with(&i.to_string()) || n.ends_with(&format!("{i}-net")))
            .collect();
        assert_eq!(
            cloud,
            [new.clone(), format!("{new}-net")],
            "{}: {result}",
            point.name
        );
        if point.name == "created-not-saved" {
            assert_eq!(
                result["recovered"][0]["address"], "testcloud_network.main",
                "the network the dead run made was imported: {result}"
            );
        }

        // The dead job is `interrupted`, and not final: delivered again, it runs.
        let dead = sb.artifact_json(&ws_name, &victim_id, "result.json").await;
        assert_eq!(dead["status"], "interrupted", "{}: {dead}", point.name);
        let again = sb.run(&["run", "-q", victim.to_str().unwrap()]);
        again.expect_code(0);
        let redone: Value = sb.artifact_json(&ws_name, &victim_id, "result.json").await;
        assert_eq!(redone["status"], "succeeded", "{}", point.name);
    }
}
