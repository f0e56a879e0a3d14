//! `terrace submit`: a job put on a `terrace serve` queue folder (here) and on SQS for the
//! Lambda path (aws_lambda.rs), checked first against the templates, followed to its end with
//! `--follow`; each bad input says what to do and sends nothing.

use std::time::{Duration, Instant};

use tests::{Sandbox, demo_job};

#[tokio::test]
async fn a_job_submitted_to_a_serve_folder_runs_and_follow_ends_with_its_result() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(&sb.queue).unwrap();
    let queue = sb.queue.to_str().unwrap();
    let path = sb.job(
        "submit.yaml",
        &demo_job("sub-1", "submit", "apply", "demo", 2),
    );
    // Followed: the submit waits for serve to run the job, printing its log, then its result.
    let follow = sb
        .terrace()
        .args(["submit", path.to_str().unwrap(), "--to", queue, "--follow"])
        .args(["--interval-ms", "200"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let queued = sb.queue.join("sub-1.json");
    let give_up = Instant::now() + Duration::from_secs(30);
    while !queued.exists() {
        assert!(Instant::now() < give_up, "the job never reached the folder");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Sent once: the same id again is refused while it waits.
    let twice = sb.run(&["submit", path.to_str().unwrap(), "--to", queue]);
    twice.expect_code(1);
    assert!(
        twice.stderr().contains("a job id runs once"),
        "{}",
        twice.stderr()
    );

    sb.serve_once(1).expect_code(0);
    let out = follow.wait_with_output().unwrap();
    let stderr = tests::assert_followed_to_success(&out);
    assert!(
        stderr.contains("job sub-1 sent to the queue folder"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("correct-horse") && !stderr.contains("correct-horse"));
    let result = sb
        .artifact_json("acme/submit", "sub-1", "result.json")
        .await;
    assert_eq!(result["status"], "succeeded");
    // Finished, it is not sent again either.
    let after = sb.run(&["submit", path.to_str().unwrap(), "--to", queue]);
    after.expect_code(1);
    assert!(after.stderr().contains("done/sub-1"), "{}", after.stderr());
}

#[test]
fn an_invalid_job_an_unknown_queue_or_a_missing_folder_sends_nothing() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(&sb.queue).unwrap();
    let queue = sb.queue.to_str().unwrap();
    let bad = sb.job(
        "bad.yaml",
        &demo_job("sub-2", "submit", "apply", "demo", 2).replace("template: {", "templat: {"),
    );
    let invalid = sb.run(&["submit", bad.to_str().unwrap(), "--to", queue]);
    invalid.expect_code(65);
    assert!(invalid.stderr().contains("templat"), "{}", invalid.stderr());

    let good = sb.job(
        "good.yaml",
        &demo_job("sub-3", "submit", "apply", "demo", 2),
    );
    let scheme = sb.run(&[
        "submit",
        good.to_str().unwrap(),
        "--to",
        "kafka://broker/jobs",
    ]);
    scheme.expect_code(64);
    assert!(
        scheme.stderr().contains("kafka:// is not a queue") && scheme.stderr().contains("sqs://"),
        "{}",
        scheme.stderr()
    );
    let missing = sb.run(&[
        "submit",
        good.to_str().unwrap(),
        "--to",
        "/nonexistent/queue",
    ]);
    missing.expect_code(1);
    assert!(
        missing.stderr().contains("is not a folder"),
        "{}",
        missing.stderr()
    );
    let unreachable = sb
        .terrace()
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .args([
            "submit",
            good.to_str().unwrap(),
            "--to",
            "sqs://127.0.0.1:9/123456789012/jobs",
        ])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(1), "{unreachable:?}");
    let said = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        said.contains("was not sent") && said.contains("credentials"),
        "{said}"
    );
    let left: Vec<_> = std::fs::read_dir(&sb.queue).unwrap().collect();
    assert!(left.is_empty(), "nothing was queued: {left:?}");
}
