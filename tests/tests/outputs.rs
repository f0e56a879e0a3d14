//! Sensitive outputs sealed to the platform's key (docs/outputs.md), on the local runner with the
//! machine's terraform: the demo's sensitive output opens, with the platform's identity, to
//! exactly what terraform produced, and its plain value is in no log, record or answer; each
//! bad input says what to do.

use serde_json::Value;
use tests::{Sandbox, demo_job};

const PASSWORD: &str = "correct-horse-battery-staple";

#[tokio::test]
async fn the_demos_sensitive_output_opens_with_the_platforms_identity_and_nowhere_else() {
    let mut sb = Sandbox::new();
    let (identity, recipient) = tests::outputs_key();
    sb.env
        .push(("TERRACE_OUTPUTS_RECIPIENT".into(), recipient.clone()));
    let path = sb.job(
        "apply.yaml",
        &demo_job("out-1", "sealed", "apply", "demo", 2),
    );
    let run = sb.run(&["run", "-q", "--json", path.to_str().unwrap()]);
    run.expect_code(0);
    let delivered: Value = serde_json::from_str(&run.stdout()).unwrap();
    assert_eq!(
        delivered["outputs"]["admin_url"]["value"],
        "(sensitive value)"
    );
    assert_eq!(delivered["sealed_outputs"]["recipient"], recipient.as_str());
    assert_eq!(
        delivered["sealed_outputs"]["names"],
        serde_json::json!(["admin_url"])
    );

    // What terraform produced: the state's output, in plain, as terraform keeps it.
    let state = sb.current_state("acme/sealed");
    let produced = state["outputs"]["admin_url"]["value"].clone();
    assert!(produced.as_str().unwrap().contains(PASSWORD), "{produced}");
    let stored = sb
        .artifact_json("acme/sealed", "out-1", "result.json")
        .await;
    assert_eq!(
        tests::open_sealed(&stored, &identity)["admin_url"],
        produced
    );

    // `terrace result --identity` opens them as a platform's operator would.
    let key = sb.dir.path().join("platform.key");
    std::fs::write(
        &key,
        format!(
            "# created: by the test\n# public key: {recipient}\n{}\n",
            shared::run::sealed_outputs::identity_text(&identity)
        ),
    )
    .unwrap();
    let opened = sb.run(&["result", "out-1", "--identity", key.to_str().unwrap()]);
    opened.expect_code(0);
    let opened: Value = serde_json::from_str(&opened.stdout()).unwrap();
    assert_eq!(opened, serde_json::json!({ "admin_url": produced }));

    // And with the age tool a platform already has (installed by `make tools`).
    let sealed = sb.dir.path().join("outputs.age");
    std::fs::write(&sealed, stored["sealed_outputs"]["age"].as_str().unwrap()).unwrap();
    let age = std::process::Command::new("age")
        .args(["-d", "-i"])
        .arg(&key)
        .arg(&sealed)
        .output()
        .expect("the age tool (make tools installs it)");
    assert!(age.status.success(), "{age:?}");
    let by_age: Value = serde_json::from_slice(&age.stdout).unwrap();
    assert_eq!(by_age, opened);

    // The canary: the password is in the store's states only, in no log line, record, or
    // answer of the CLI.
    for (path, bytes) in sb.store_files() {
        let text = String::from_utf8_lossy(&bytes);
        let state = path.extension().is_some_and(|e| e == "tfstate");
        assert!(
            state || !text.contains(PASSWORD),
            "{} holds the password",
            path.display()
        );
    }
    assert!(!run.stdout().contains(PASSWORD) && !run.stderr().contains(PASSWORD));
    for args in [
        vec!["result", "out-1", "--json"],
        vec!["logs", "acme/sealed", "out-1", "--json"],
        vec!["runs", "acme/sealed", "--json"],
    ] {
        let out = sb.run(&args);
        assert!(
            !out.stdout().contains(PASSWORD) && !out.stderr().contains(PASSWORD),
            "terrace {args:?}"
        );
    }
}

#[tokio::test]
async fn a_bad_recipient_identity_or_unsealed_result_each_say_what_to_do() {
    let mut sb = Sandbox::new();
    let path = sb.job(
        "apply.yaml",
        &demo_job("out-2", "plain", "apply", "demo", 1),
    );

    let bad = sb
        .terrace()
        .env("TERRACE_OUTPUTS_RECIPIENT", "age1-not-a-key")
        .args(["run", "-q", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64), "a usage error");
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("not an age X25519 recipient") && said.contains("age-keygen"),
        "{said}"
    );
    assert!(sb.cloud_names().is_empty(), "nothing ran");

    // Without a key the outputs are masked only, as always.
    sb.run(&["run", "-q", path.to_str().unwrap()])
        .expect_code(0);
    let stored = sb.artifact_json("acme/plain", "out-2", "result.json").await;
    assert!(stored.get("sealed_outputs").is_none(), "{stored}");
    let (identity, _) = tests::outputs_key();
    let key = sb.dir.path().join("platform.key");
    std::fs::write(
        &key,
        format!(
            "{}\n",
            shared::run::sealed_outputs::identity_text(&identity)
        ),
    )
    .unwrap();
    let unsealed = sb.run(&["result", "out-2", "--identity", key.to_str().unwrap()]);
    unsealed.expect_code(1);
    assert!(
        unsealed.stderr().contains("no sealed outputs")
            && unsealed.stderr().contains("outputs_recipient"),
        "{}",
        unsealed.stderr()
    );

    // A malformed identity file names its line, never its text.
    std::fs::write(&key, "# a comment\nAGE-SECRET-KEY-1NOT-A-KEY-XYZ\n").unwrap();
    let malformed = sb.run(&["result", "out-2", "--identity", key.to_str().unwrap()]);
    malformed.expect_code(64);
    assert!(
        malformed.stderr().contains("line 2"),
        "{}",
        malformed.stderr()
    );
    assert!(
        !malformed.stderr().contains("NOT-A-KEY"),
        "{}",
        malformed.stderr()
    );

    // Outputs sealed to another key: which key they need.
    let (_, other) = tests::outputs_key();
    sb.env
        .push(("TERRACE_OUTPUTS_RECIPIENT".into(), other.clone()));
    let again = sb.job(
        "again.yaml",
        &demo_job("out-3", "plain", "apply", "demo", 1),
    );
    sb.run(&["run", "-q", again.to_str().unwrap()])
        .expect_code(0);
    std::fs::write(
        &key,
        format!(
            "{}\n",
            shared::run::sealed_outputs::identity_text(&identity)
        ),
    )
    .unwrap();
    let wrong = sb.run(&["result", "out-3", "--identity", key.to_str().unwrap()]);
    wrong.expect_code(1);
    assert!(wrong.stderr().contains(&other), "{}", wrong.stderr());
}

/// A sensitive output terraform derives itself (a digest of the secret): the runner's redaction
/// cannot know it, so only its handling of outputs keeps it out of logs and records. It is in
/// the sealed outputs and the states, nowhere else.
#[tokio::test]
async fn a_sensitive_output_terraform_derives_is_sealed_and_in_no_log_or_record() {
    let mut sb = Sandbox::new();
    let (identity, recipient) = tests::outputs_key();
    sb.env.push(("TERRACE_OUTPUTS_RECIPIENT".into(), recipient));
    let canary = "canary-5d1a-local-5ecret";
    let job = format!(
        "id: derived-1\ntenant: acme\nworkspace: derived\noperation: apply\n\
         template: {{ name: leaky, version: 1.0.0 }}\n\
         variables:\n  name: leaky\n  token: {canary}\n"
    );
    let path = sb.job("derived.yaml", &job);
    let run = sb.run(&["run", path.to_str().unwrap()]);
    run.expect_code(0);
    let digest = state_backends::sha256_hex(canary.as_bytes());
    let stored = sb
        .artifact_json("acme/derived", "derived-1", "result.json")
        .await;
    let opened = tests::open_sealed(&stored, &identity);
    assert_eq!(opened["token_digest"], digest.as_str());
    assert_eq!(opened["token"], canary);
    let mut states = 0;
    for (path, bytes) in sb.store_files() {
        let text = String::from_utf8_lossy(&bytes);
        if path.extension().is_some_and(|e| e == "tfstate") {
            states += usize::from(text.contains(&digest));
        } else {
            assert!(
                !text.contains(&digest),
                "{} holds the derived output",
                path.display()
            );
        }
    }
    assert!(states > 0, "the state holds the derived output");
    let said = format!("{}{}", run.stdout(), run.stderr());
    assert!(
        said.contains("terraform output"),
        "the log was printed: {said}"
    );
    assert!(
        !said.contains(&digest),
        "the console log holds the derived output"
    );
}
