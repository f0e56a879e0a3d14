//! Jobs signed by their sender (docs/signing.md) on the local path: `terrace serve --senders`
//! runs a tenant's jobs and cancels only when one of its keys signed them, and says whether a
//! refused signature was missing, wrong or replayed. The cloud functions' tests do the same
//! through their registries (aws_lambda.rs, gcp_service.rs, azure_job.rs).

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use tests::{Sandbox, demo_job, keygen};

/// `terrace serve --once` on the sandbox's queue, taking signed jobs as `senders` says.
fn serve(sb: &Sandbox, senders: &Path) -> tests::Run {
    sb.run(&[
        "serve",
        "-q",
        "--queue",
        sb.queue.to_str().unwrap(),
        "--once",
        "--poll-ms",
        "50",
        "--senders",
        senders.to_str().unwrap(),
    ])
}

/// The names of the drift checks' result files serve left in the queue's `sub` folder.
fn drift_results(queue: &Path, sub: &str) -> Vec<String> {
    std::fs::read_dir(queue.join(sub))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("drift-") && n.ends_with(".result.json"))
        .collect()
}

/// The rejection serve wrote for a refused job file, and its one error's problem.
fn refusal(queue: &Path, file: &str) -> String {
    let raw = std::fs::read(queue.join(format!("failed/{file}.result.json")))
        .unwrap_or_else(|e| panic!("no result for {file}: {e}"));
    let record: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(record["status"], "rejected", "{record}");
    let errors = record["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "only the signature is looked at: {record}");
    assert_eq!(errors[0]["field"], "signature", "{record}");
    errors[0]["problem"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_tenant_with_senders_runs_only_jobs_they_signed_and_a_replay_runs_nothing() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(&sb.queue).unwrap();
    let queue = sb.queue.to_str().unwrap();
    let (key, public) = keygen(&sb, "platform.pem");
    let (other, _) = keygen(&sb, "other.pem");
    // A key is never overwritten.
    let again = sb.run(&["keygen", "--out", key.to_str().unwrap()]);
    again.expect_code(64);
    assert!(
        again.stderr().contains("never overwritten"),
        "{}",
        again.stderr()
    );
    let senders = sb.dir.path().join("senders.yaml");
    std::fs::write(&senders, format!("acme:\n  - {public}\n")).unwrap();

    let job = |id: &str| {
        sb.job(
            &format!("{id}.yaml"),
            &demo_job(id, "signed", "apply", "demo", 1),
        )
    };
    // Unsigned, signed by a key the tenant does not list, and signed right.
    // Followed: the unsigned job never starts, and the follow ends with its rejection.
    let none = job("sig-none");
    let follow = sb
        .terrace()
        .args(["submit", none.to_str().unwrap(), "--to", queue, "--follow"])
        .args(["--interval-ms", "100"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !sb.queue.join("sig-none.json").exists() {
        assert!(std::time::Instant::now() < give_up, "never sent");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let wrong = job("sig-wrong");
    sb.run(&[
        "submit",
        wrong.to_str().unwrap(),
        "--to",
        queue,
        "--sign",
        other.to_str().unwrap(),
    ])
    .expect_code(0);
    let good = job("sig-good");
    sb.run(&[
        "submit",
        good.to_str().unwrap(),
        "--to",
        queue,
        "--sign",
        key.to_str().unwrap(),
    ])
    .expect_code(0);
    let signed: Value =
        serde_json::from_slice(&std::fs::read(sb.queue.join("sig-good.json")).unwrap()).unwrap();
    tests::schema::check("job", &signed);
    assert!(signed["signature"]["ed25519"].is_string(), "{signed}");
    // A signed job changed on the way: the node count raised.
    let mut changed = signed.clone();
    changed["variables"]["node_count"] = json!(9);
    std::fs::write(sb.queue.join("sig-changed.json"), changed.to_string()).unwrap();

    let served = serve(&sb, &senders);
    served.expect_code(0);
    assert!(refusal(&sb.queue, "sig-none.json").starts_with("is missing: tenant \"acme\""));
    let followed = follow.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&followed.stderr);
    assert_eq!(followed.status.code(), Some(65), "{said}");
    assert!(
        said.contains("job sig-none was rejected by the runner")
            && said.contains("signature: is missing"),
        "{said}"
    );
    assert!(refusal(&sb.queue, "sig-wrong.json").starts_with("is wrong"));
    assert!(refusal(&sb.queue, "sig-changed.json").starts_with("is wrong"));
    let result = sb
        .artifact_json("acme/signed", "sig-good", "result.json")
        .await;
    assert_eq!(result["status"], "succeeded");
    // Nothing of the refused ones ran, nor reached the store.
    let runs = sb.run(&["runs", "acme/signed", "--json"]);
    let runs: Value = serde_json::from_str(&runs.stdout()).unwrap();
    let ids: Vec<&str> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["sig-good"], "{runs}");
    let versions = sb.versions("acme/signed").await.len();

    // A copy of the signed job, put back under another name: its id ran, so it gets its
    // result again and nothing runs.
    std::fs::write(sb.queue.join("replay.json"), signed.to_string()).unwrap();
    serve(&sb, &senders).expect_code(0);
    let replayed: Value = serde_json::from_slice(
        &std::fs::read(sb.queue.join("done/replay.json.result.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(replayed["job_id"], "sig-good");
    assert_eq!(
        replayed["started_at"], result["started_at"],
        "the stored result, not a new run"
    );
    assert_eq!(
        sb.versions("acme/signed").await.len(),
        versions,
        "no new state version"
    );

    // The drift sweep's checks: refused unsigned, run when signed with a listed key. (The
    // demo's workspace has a secret variable, so its check is not queued; the fleet's is.)
    let fleet = sb.job(
        "fleet.yaml",
        "id: f1\ntenant: acme\nworkspace: nets\noperation: apply\ntemplate: { name: fleet, version: 1.0.0 }\nvariables: { networks: [a] }\n",
    );
    sb.run(&["run", "-q", fleet.to_str().unwrap()])
        .expect_code(0);
    let drift = sb.run(&["drift", "--queue", queue]);
    drift.expect_code(0);
    serve(&sb, &senders).expect_code(0);
    let failed = drift_results(&sb.queue, "failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        refusal(&sb.queue, failed[0].trim_end_matches(".result.json")).starts_with("is missing")
    );
    sb.run(&["drift", "--queue", queue, "--sign", key.to_str().unwrap()])
        .expect_code(0);
    serve(&sb, &senders).expect_code(0);
    let done = drift_results(&sb.queue, "done");
    assert_eq!(done.len(), 1, "{done:?}");
    let checked: Value =
        serde_json::from_slice(&std::fs::read(sb.queue.join("done").join(&done[0])).unwrap())
            .unwrap();
    assert_eq!(checked["operation"], "drift-check", "{checked}");
    assert_eq!(checked["status"], "succeeded", "{checked}");

    // A refused job never ran: signed, it may be sent again under its id, and runs.
    let resent = sb.run(&[
        "submit",
        none.to_str().unwrap(),
        "--to",
        queue,
        "--sign",
        key.to_str().unwrap(),
    ]);
    resent.expect_code(0);
    serve(&sb, &senders).expect_code(0);
    let result = sb
        .artifact_json("acme/signed", "sig-none", "result.json")
        .await;
    assert_eq!(result["status"], "succeeded", "{result}");
    // One that ran is not sent again.
    let again = sb.run(&["submit", good.to_str().unwrap(), "--to", queue]);
    again.expect_code(1);
    assert!(
        again.stderr().contains("a job id runs once"),
        "{}",
        again.stderr()
    );
}

#[tokio::test]
async fn a_job_signed_as_the_docs_say_with_openssl_runs_and_an_old_signature_is_a_replay() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(&sb.queue).unwrap();
    let queue = sb.queue.to_str().unwrap();
    // The sender's key made with openssl, as docs/signing.md shows.
    let key = sb.dir.path().join("openssl.pem");
    let status = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "ed25519",
            "-out",
            key.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let public = Command::new("openssl")
        .args(["pkey", "-in", key.to_str().unwrap(), "-pubout"])
        .output()
        .unwrap();
    let senders = sb.dir.path().join("senders.json");
    let pem = String::from_utf8(public.stdout).unwrap();
    std::fs::write(&senders, json!({ "acme": [pem] }).to_string()).unwrap();

    // The docs' recipe: canonical JSON (for a job of text and whole numbers, Python's sorted,
    // compact dump is RFC 8785's), after the header; signed with `openssl pkeyutl -rawin`.
    let sign = |id: &str, signed_at: &str| -> Value {
        let job = json!({
            "id": id, "tenant": "acme", "workspace": "openssl", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" },
            "variables": { "cluster_name": "demo", "region": "eu-west-1", "node_count": 1, "admin_password": "correct-horse-battery-staple" },
        });
        let script = r#"
import base64, json, subprocess, sys, tempfile
job, signed_at, key = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
canonical = json.dumps(job, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
message = ("terrace-signature-v1\njob\n" + signed_at + "\n" + canonical).encode()
# openssl signs Ed25519 in one shot: from a file, not a pipe.
with tempfile.NamedTemporaryFile() as f:
    f.write(message)
    f.flush()
    signature = subprocess.run(["openssl", "pkeyutl", "-sign", "-rawin", "-inkey", key, "-in", f.name],
                               capture_output=True, check=True).stdout
job["signature"] = {"signed_at": signed_at, "ed25519": base64.b64encode(signature).decode()}
print(json.dumps(job))
"#;
        let out = Command::new("python3")
            .args([
                "-c",
                script,
                &job.to_string(),
                signed_at,
                key.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    std::fs::write(
        sb.queue.join("fresh.json"),
        sign("ossl-1", &now).to_string(),
    )
    .unwrap();
    let old = (time::OffsetDateTime::now_utc() - time::Duration::hours(25))
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    std::fs::write(sb.queue.join("old.json"), sign("ossl-2", &old).to_string()).unwrap();
    serve(&sb, &senders).expect_code(0);
    let result = sb
        .artifact_json("acme/openssl", "ossl-1", "result.json")
        .await;
    assert_eq!(result["status"], "succeeded");
    let problem = refusal(&sb.queue, "old.json");
    assert!(
        problem.starts_with(&format!("is replayed: it was made at {old}"))
            && problem.contains("24 h"),
        "{problem}"
    );

    // A malformed senders file stops serve before it reads a job.
    std::fs::write(&senders, r#"{"acme": ["not a key"]}"#).unwrap();
    let bad = sb.run(&[
        "serve",
        "-q",
        "--queue",
        queue,
        "--once",
        "--senders",
        senders.to_str().unwrap(),
    ]);
    bad.expect_code(64);
    assert!(
        bad.stderr()
            .contains("tenant \"acme\" [0] is neither PEM nor base64")
            && bad.stderr().contains("terrace keygen"),
        "{}",
        bad.stderr()
    );
}

#[tokio::test]
async fn a_signed_cancel_sent_to_the_queue_stops_the_job_and_an_unsigned_one_is_refused() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(&sb.queue).unwrap();
    let queue = sb.queue.to_str().unwrap();
    let (key, public) = keygen(&sb, "platform.pem");
    let senders = sb.dir.path().join("senders.yaml");
    std::fs::write(&senders, format!("acme: [{public}]\n")).unwrap();

    // An unsigned cancel and a signed one, both for a job not yet queued.
    let unsigned = sb.run(&["cancel", "later-1", "-w", "acme/cancelled", "--to", queue]);
    unsigned.expect_code(0);
    assert!(
        unsigned
            .stderr()
            .contains("cancel of job later-1 (acme/cancelled) sent to"),
        "{}",
        unsigned.stderr()
    );
    std::fs::rename(
        sb.queue.join("cancel-later-1.json"),
        sb.queue.join("unsigned-cancel.json"),
    )
    .unwrap();
    sb.run(&[
        "cancel",
        "later-1",
        "-w",
        "acme/cancelled",
        "--to",
        queue,
        "--sign",
        key.to_str().unwrap(),
    ])
    .expect_code(0);
    let sent: Value =
        serde_json::from_slice(&std::fs::read(sb.queue.join("cancel-later-1.json")).unwrap())
            .unwrap();
    tests::schema::check("cancel-message", &sent);
    serve(&sb, &senders).expect_code(0);
    let raw = std::fs::read(sb.queue.join("failed/unsigned-cancel.json.result.json")).unwrap();
    let refused: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        refused["errors"][0]["field"], "cancel.signature",
        "{refused}"
    );
    let raw = std::fs::read(sb.queue.join("done/cancel-later-1.json.result.json")).unwrap();
    let answer: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(answer["status"], "cancel-requested", "{answer}");

    // The job, signed, then never runs.
    let job = sb.job(
        "later.yaml",
        &demo_job("later-1", "cancelled", "apply", "demo", 1),
    );
    sb.run(&[
        "submit",
        job.to_str().unwrap(),
        "--to",
        queue,
        "--sign",
        key.to_str().unwrap(),
    ])
    .expect_code(0);
    serve(&sb, &senders).expect_code(0);
    let result = sb
        .artifact_json("acme/cancelled", "later-1", "result.json")
        .await;
    assert_eq!(result["status"], "cancelled", "{result}");
    assert!(
        sb.versions("acme/cancelled").await.is_empty(),
        "nothing was applied"
    );

    // Bad keys say so and send nothing.
    std::fs::write(
        sb.dir.path().join("public.pem"),
        format!("-----BEGIN PUBLIC KEY-----\n{public}\n-----END PUBLIC KEY-----\n"),
    )
    .unwrap();
    let bad = sb.run(&[
        "cancel",
        "later-2",
        "-w",
        "acme/cancelled",
        "--to",
        queue,
        "--sign",
        sb.dir.path().join("public.pem").to_str().unwrap(),
    ]);
    bad.expect_code(64);
    assert!(bad.stderr().contains("is a public key"), "{}", bad.stderr());
    assert!(!sb.queue.join("cancel-later-2.json").exists());
}
