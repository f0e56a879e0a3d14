//! The real `terrace-gcp` service: Pub/Sub push envelopes with OIDC tokens signed by a test
//! key (served as a JWKS on loopback), real terraform, state in fake-gcs-server.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use state_backends::{LeaseRequest, StateStore, WorkspaceId};
use tests::gcp::{
    AUDIENCE, PUSHER, Service, SigningKey, push_envelope, serve_changing_jwks, serve_jwks,
};
use tests::http::{Answer, post_json};
use tests::pubsub::{self, Relay};
use tests::{Sandbox, gcs};

struct World {
    sb: Sandbox,
    key: SigningKey,
    bucket: String,
    jwks: String,
    _jwks_server: tokio::task::JoinHandle<()>,
}

impl World {
    async fn new() -> Self {
        let key = SigningKey::new("test-key-1");
        let (jwks, server) = serve_jwks(vec![key.jwk.clone()]).await;
        Self {
            sb: Sandbox::new(),
            key,
            bucket: gcs::bucket().await,
            jwks,
            _jwks_server: server,
        }
    }

    async fn start(&self) -> Service {
        self.start_with(&[]).await
    }

    /// The service, with `acme` registered to this world's bucket, and `extra` settings.
    async fn start_with(&self, extra: &[(&str, &str)]) -> Service {
        let tenants = self.tenants();
        let mut env = vec![("TERRACE_TENANTS", tenants.as_str())];
        env.extend_from_slice(extra);
        Service::start(&self.sb, &self.jwks, &env).await
    }

    fn command(&self, extra: &[(&str, &str)]) -> std::process::Command {
        let mut cmd = Service::command(&self.sb, &self.jwks, extra);
        cmd.env("TERRACE_TENANTS", self.tenants());
        cmd
    }

    /// The service's tenant registry: `acme`'s is this world's bucket.
    fn tenants(&self) -> String {
        json!({ "acme": self.target() }).to_string()
    }

    fn target(&self) -> Value {
        json!({
            "service_account": "terrace@acme-prod.iam.gserviceaccount.com",
            "bucket": self.bucket,
            "prefix": "states",
        })
    }

    fn message(&self, id: &str, workspace: &str) -> Value {
        json!({
            "job": {
                "id": id, "tenant": "acme", "workspace": workspace, "operation": "apply",
                "template": { "name": "demo", "version": "1.0.0" },
                "variables": { "cluster_name": workspace, "region": "eu-west-1", "admin_password": "correct-horse-battery" },
                "timeout": "5m",
            },
        })
    }

    async fn store(&self) -> Arc<dyn StateStore> {
        Arc::new(gcs::store(&self.bucket, "states").await)
    }

    /// Pushes `envelope` as the subscription would; an answer that is a results-channel
    /// record (a result, a rejection, a hand-off, a cancel's answer) is checked against the
    /// published schema.
    async fn push(&self, service: &Service, envelope: &Value) -> Answer {
        let bearer = self.key.bearer();
        let answer = post_json(
            &format!("{}/pubsub", service.url),
            &[("authorization", &bearer)],
            envelope,
        )
        .await;
        if let Ok(record) = serde_json::from_str::<Value>(&answer.body)
            && record.get("kind").is_some()
        {
            tests::schema::check("message", &record);
        }
        answer
    }
}

fn ws(name: &str) -> WorkspaceId {
    WorkspaceId::new("acme", name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioner_gets_nothing_of_the_services_own_credentials() {
    let w = World::new().await;
    let service = w
        .start_with(&[(
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE",
            "/run/secrets/service-token",
        )])
        .await;
    let probe = json!({
        "job": {
            "id": "p-1", "tenant": "acme", "workspace": "probe", "operation": "apply",
            "template": { "name": "probe", "version": "1.0.0" },
            "variables": { "name": "run-probe" }, "timeout": "5m",
        },
    });
    let answer = w.push(&service, &push_envelope("m-p", &probe)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("\"succeeded\""), "{}", answer.body);
    w.sb.assert_probe_got_nothing(
        "run-probe",
        &["TERRACE_PUSH_SERVICE_ACCOUNTS"],
        &[],
        nix::unistd::geteuid().is_root(),
    );
}

/// The service holds every plan to the policies `TERRACE_POLICIES` names: a deny stops the
/// job before apply (acknowledged: it is done), a warning goes through, and a policy that does
/// not parse stops the service at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_plan_that_breaks_a_policy_stops_before_apply_and_a_warning_goes_through() {
    let w = World::new().await;
    let policies = tests::policy::demo();
    let service = w
        .start_with(&[("TERRACE_POLICIES", policies.to_str().unwrap())])
        .await;
    let mut big = w.message("pol-big", "policy");
    big["job"]["variables"]["node_count"] = json!(12);
    let answer = w.push(&service, &push_envelope("m-big", &big)).await;
    assert_eq!(answer.status, 200, "done, not retried: {}", answer.body);
    let result: Value = serde_json::from_str(&answer.body).unwrap();
    tests::policy::assert_denied(&result);
    assert!(w.sb.cloud_files().is_empty(), "nothing was made");

    let small = w.message("pol-small", "policy");
    let answer = w.push(&service, &push_envelope("m-small", &small)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    tests::policy::assert_warned(&serde_json::from_str(&answer.body).unwrap());

    let broken = tests::policy::broken(w.sb.dir.path());
    tests::policy::assert_refused_at_start(
        w.command(&[("TERRACE_POLICIES", broken.to_str().unwrap())]),
    );
}

/// A tenant's own policy set (its registry entry's `policies`) holds that tenant's plans, on
/// top of the runner's set; another tenant's plans meet the runner's set alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_own_policy_set_applies_to_that_tenant_only() {
    let w = World::new().await;
    let runner_set = w.sb.dir.path().join("runner-policies");
    std::fs::create_dir_all(&runner_set).unwrap();
    std::fs::write(
        runner_set.join("everyone.rego"),
        "package everyone\n\nimport rego.v1\n\nwarn contains sprintf(\"%s plans %d changes\", [input.terrace.tenant, count(input.resource_changes)]) if { true }\n",
    )
    .unwrap();
    let mut acme = w.target();
    acme["policies"] = json!(tests::policy::demo());
    let mut globex = w.target();
    globex["prefix"] = json!("globex-states");
    let registry = json!({ "acme": acme, "globex": globex }).to_string();
    let service = w
        .start_with(&[
            ("TERRACE_TENANTS", registry.as_str()),
            ("TERRACE_POLICIES", runner_set.to_str().unwrap()),
        ])
        .await;
    let big = |id: &str, tenant: &str| {
        let mut m = w.message(id, "tenant-policy");
        m["job"]["tenant"] = json!(tenant);
        m["job"]["variables"]["node_count"] = json!(12);
        m["job"]["variables"]["cluster_name"] = json!(format!("{tenant}-big"));
        m
    };
    let answer = w
        .push(&service, &push_envelope("m-acme", &big("t-acme", "acme")))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let acme: Value = serde_json::from_str(&answer.body).unwrap();
    tests::policy::assert_denied(&acme);
    let mut warned = tests::policy::messages(&acme, "warn");
    warned.sort_unstable();
    assert_eq!(warned, ["acme plans 2 changes", tests::policy::WARNED]);
    assert_eq!(acme["policy"]["deny"][0]["policy"], "demo/testcloud.rego");

    let answer = w
        .push(
            &service,
            &push_envelope("m-globex", &big("t-globex", "globex")),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let globex: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(globex["status"], "succeeded", "{globex}");
    assert!(tests::policy::messages(&globex, "deny").is_empty());
    assert_eq!(
        tests::policy::messages(&globex, "warn"),
        ["globex plans 2 changes"]
    );
    assert_ne!(acme["policy"]["policies"], globex["policy"]["policies"]);
    assert_eq!(w.sb.cloud_names(), ["globex-big", "globex-big-net"]);

    // A tenant's set that does not parse stops the service at start, naming the tenant.
    let broken = tests::policy::broken(w.sb.dir.path());
    let mut acme = w.target();
    acme["policies"] = json!(broken);
    let registry = json!({ "acme": acme }).to_string();
    tests::policy::assert_refused_at_start(Service::command(
        &w.sb,
        &w.jwks,
        &[("TERRACE_TENANTS", &registry)],
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_job_runs_once_and_its_state_and_log_land_in_the_bucket() {
    let w = World::new().await;
    let service = w.start().await;
    let envelope = push_envelope("m-1", &w.message("g-1", "run"));

    let answer = w.push(&service, &envelope).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let result: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(result["job_id"], "g-1");

    let store = w.store().await;
    let versions = store.versions(&ws("run")).await.unwrap();
    assert!(!versions.is_empty(), "state versions in the bucket");
    let artifacts = store.artifacts(&ws("run"), "g-1").await.unwrap();
    assert!(
        artifacts.iter().any(|a| a.starts_with("log")),
        "{artifacts:?}"
    );
    assert!(
        artifacts.contains(&"result.json".to_owned()),
        "{artifacts:?}"
    );
    assert_eq!(w.sb.cloud_names().len(), 2, "a network and a cluster");

    // Pub/Sub delivers at least once: the same message again runs nothing.
    let again = w.push(&service, &envelope).await;
    assert_eq!(again.status, 200, "{}", again.body);
    let again: Value = serde_json::from_str(&again.body).unwrap();
    assert_eq!(
        again["started_at"], result["started_at"],
        "the earlier result"
    );
    assert_eq!(store.versions(&ws("run")).await.unwrap(), versions);

    // Cloud Scheduler's hourly call backs up the workspace that changed.
    let sweep = post_json(
        &format!("{}/sweeps/backup", service.url),
        &[("authorization", &w.key.bearer())],
        &json!({}),
    )
    .await;
    assert_eq!(sweep.status, 200, "{}", sweep.body);
    let sweep: Value = serde_json::from_str(&sweep.body).unwrap();
    tests::schema::check("sweep-report", &sweep);
    assert_eq!(sweep["buckets"][0]["backed_up"], 1, "{sweep}");
    assert_eq!(store.backups(&ws("run")).await.unwrap().len(), 1);
}

/// The service reads templates from the runner's own bucket at run time: a version published
/// there (with `terrace template publish`) runs; one not published is refused, naming the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_published_to_the_runners_bucket_run_without_a_new_image() {
    let w = World::new().await;
    let url = format!("gs://{}/published", gcs::bucket().await);
    let published =
        w.sb.terrace()
            .env("TERRACE_GCS_ENDPOINT", gcs::endpoint())
            .env("TERRACE_GCS_ANONYMOUS", "1")
            .args(["template", "publish", "demo", "1.0.0", "--to", &url])
            .output()
            .unwrap();
    assert!(published.status.success(), "{published:?}");
    let cache = w.sb.dir.path().join("service-template-cache");
    let service = w
        .start_with(&[
            ("TERRACE_TEMPLATES", &url),
            ("TERRACE_TEMPLATE_CACHE", cache.to_str().unwrap()),
        ])
        .await;
    let answer = w
        .push(&service, &push_envelope("m-p1", &w.message("gp-1", "pub")))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let result: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    assert!(cache.join("demo/1.0.0/main.tf").is_file());

    let mut unpublished = w.message("gp-2", "pub");
    unpublished["job"]["template"]["version"] = json!("9.9.9");
    let answer = w.push(&service, &push_envelope("m-p2", &unpublished)).await;
    assert_eq!(answer.status, 200, "acknowledged: {}", answer.body);
    let record: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(record["status"], "rejected", "{record}");
    assert_eq!(
        record["errors"][0]["problem"],
        format!("template demo 9.9.9 is not published in {url}")
    );
}

/// Secrets canary: a job whose secret terraform prints in a resource, an output and its plan
/// (the `leaky` template). The secret is in none of the service's log, its answer, the
/// objects in the customer's bucket other than the states themselves, or any process's command
/// line or environment while the job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_secret_is_in_no_log_answer_or_object_but_the_state() {
    let w = World::new().await;
    let log_path = w.sb.dir.path().join("service.log");
    let port = tests::gcp::free_port();
    let mut cmd = w.command(&[]);
    // Here the key is the tenant's own, in the registry.
    let (identity, recipient) = tests::outputs_key();
    let mut tenant = w.target();
    tenant["outputs_recipient"] = json!(recipient);
    cmd.env("TERRACE_TENANTS", json!({ "acme": tenant }).to_string());
    cmd.env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let service = Service {
        child: cmd.spawn().unwrap(),
        url: format!("http://127.0.0.1:{port}"),
    };
    tests::gcp::wait_for_port(port, Duration::from_secs(10), "terrace-gcp").await;
    let canary = "canary-3b9d-cloudrun-5ecret";
    let message = tests::canary_message("canary-1", canary, "5m");
    let listings = tests::ProcessListings::start(canary, &w.sb.cloud);
    let answer = w.push(&service, &push_envelope("m-c1", &message)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    listings.check();
    assert!(answer.body.contains("\"succeeded\""), "{}", answer.body);
    assert!(!answer.body.contains(canary), "{}", answer.body);
    let result: Value = serde_json::from_str(&answer.body).unwrap();
    let opened = tests::open_sealed(&result, &identity);
    let digest = state_backends::sha256_hex(canary.as_bytes());
    assert_eq!(opened["token"], json!(canary));
    assert_eq!(opened["token_digest"], json!(digest));
    assert!(!answer.body.contains(&digest), "{}", answer.body);
    let raw = gcs::store(&w.bucket, "").await.into_bucket();
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
    drop(service);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("canary-1"), "the service logged the job");
    assert!(!log.contains(canary), "the service's log holds the secret");
    assert!(
        !log.contains(&digest),
        "the service's log holds the derived output"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_for_this_service_are_refused_and_nothing_runs() {
    let w = World::new().await;
    let service = w.start().await;
    let envelope = push_envelope("m-2", &w.message("g-2", "guarded"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stranger = SigningKey::new("test-key-1"); // same kid, another key
    let hs256 = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("test-key-1".into());
        let claims = json!({
            "iss": "https://accounts.google.com", "aud": AUDIENCE, "exp": now + 3600,
            "email": PUSHER, "email_verified": true,
        });
        let token = jsonwebtoken::encode(
            &header,
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(b"not-a-google-key"),
        )
        .unwrap();
        format!("Bearer {token}")
    };
    let url = format!("{}/pubsub", service.url);
    let cases: Vec<(&str, Option<String>, u16)> = vec![
        ("no token", None, 401),
        ("not a JWT", Some("Bearer not-a-token".into()), 401),
        (
            "expired",
            Some(format!(
                "Bearer {}",
                w.key.token(json!({ "iat": now - 7200, "exp": now - 3600 }))
            )),
            401,
        ),
        (
            "another audience",
            Some(format!(
                "Bearer {}",
                w.key.token(json!({ "aud": "https://someone-else.test" }))
            )),
            403,
        ),
        (
            "another issuer",
            Some(format!(
                "Bearer {}",
                w.key.token(json!({ "iss": "https://issuer.test" }))
            )),
            403,
        ),
        (
            "another service account",
            Some(format!(
                "Bearer {}",
                w.key
                    .token(json!({ "email": "intruder@elsewhere.iam.gserviceaccount.com" }))
            )),
            403,
        ),
        ("signed by another key", Some(stranger.bearer()), 401),
        (
            "an unverified email",
            Some(format!(
                "Bearer {}",
                w.key.token(json!({ "email_verified": false }))
            )),
            403,
        ),
        (
            "signed with a shared secret (HS256)",
            Some(hs256.clone()),
            401,
        ),
    ];
    for (case, bearer, status) in cases {
        let headers: Vec<(&str, &str)> = bearer
            .as_deref()
            .map(|b| vec![("authorization", b)])
            .unwrap_or_default();
        let answer = post_json(&url, &headers, &envelope).await;
        assert_eq!(answer.status, status, "{case}: {}", answer.body);
        assert!(answer.body.contains("error"), "{case}: {}", answer.body);
    }
    let sweep = post_json(&format!("{}/sweeps/backup", service.url), &[], &json!({})).await;
    assert_eq!(sweep.status, 401, "the sweep needs a token too");

    let store = w.store().await;
    assert!(store.workspaces().await.unwrap().is_empty(), "nothing ran");
    assert!(w.sb.cloud_names().is_empty());

    // Without a list of the callers' service accounts, the service does not start: anyone can
    // get a Google-signed token for any audience.
    let out = w
        .command(&[("TERRACE_PUSH_SERVICE_ACCOUNTS", "")])
        .env("PORT", tests::gcp::free_port().to_string())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("TERRACE_PUSH_SERVICE_ACCOUNTS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_key_google_withdraws_stops_being_accepted_once_the_cached_keys_age_out() {
    let w = World::new().await;
    let published = std::sync::Arc::new(std::sync::Mutex::new(vec![w.key.jwk.clone()]));
    let (jwks, _server) = serve_changing_jwks(published.clone()).await;
    let tenants = w.tenants();
    let service = Service::start(
        &w.sb,
        &jwks,
        &[
            ("TERRACE_TENANTS", tenants.as_str()),
            ("TERRACE_OIDC_KEYS_MAX_AGE", "1"),
        ],
    )
    .await;
    let url = format!("{}/sweeps/backup", service.url);
    let bearer = w.key.bearer();
    let auth = [("authorization", bearer.as_str())];
    let before = post_json(&url, &auth, &json!({})).await;
    assert_eq!(before.status, 200, "{}", before.body);

    // Google withdraws the key; the service's cached copy ages out within a second (and a
    // refetch is tried at most every 30 s: the first try comes after the age).
    published.lock().unwrap().clear();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let after = post_json(&url, &auth, &json!({})).await;
    assert_eq!(after.status, 401, "{}", after.body);
    assert!(after.body.contains("is not Google's"), "{}", after.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_envelopes_get_400_and_invalid_jobs_are_acknowledged_with_their_problems() {
    let w = World::new().await;
    let service = w.start().await;
    let bearer = w.key.bearer();
    let url = format!("{}/pubsub", service.url);
    let auth = [("authorization", bearer.as_str())];

    let not_json = tests::http::call(
        "POST",
        &url,
        &[
            ("authorization", &bearer),
            ("content-type", "application/json"),
        ],
        "{not json",
    )
    .await;
    assert_eq!(not_json.status, 400, "{}", not_json.body);
    assert!(not_json.body.contains("not a Pub/Sub push envelope"));
    let no_data = post_json(
        &url,
        &auth,
        &json!({ "message": { "messageId": "m" }, "subscription": "s" }),
    )
    .await;
    // A message of attributes only can never be a job: acknowledged with a rejection, not
    // delivered again until dead-lettered.
    assert_eq!(no_data.status, 200, "{}", no_data.body);
    assert!(no_data.body.contains("\"rejected\""), "{}", no_data.body);
    assert!(no_data.body.contains("message.data"));
    let not_base64 = post_json(
        &url,
        &auth,
        &json!({ "message": { "messageId": "m", "data": "%%%" }, "subscription": "s" }),
    )
    .await;
    assert_eq!(not_base64.status, 400, "{}", not_base64.body);

    // A push that is well formed but can never be a job: acknowledged, with why. A message
    // cannot choose another service account to impersonate than its tenant's.
    let mut bad_target = w.message("g-3", "bad");
    bad_target["target"] = w.target();
    bad_target["target"]["service_account"] = json!("owner@victim.iam.gserviceaccount.com");
    let answer = post_json(&url, &auth, &push_envelope("m-3", &bad_target)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let record: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(record["status"], "rejected");
    assert_eq!(record["message_id"], "m-3");
    assert_eq!(record["errors"][0]["field"], "target.service_account");
    assert!(
        !answer.body.contains("terrace@acme-prod"),
        "the rejection names the registered account: {}",
        answer.body
    );
    let mut unknown = w.message("g-3b", "bad");
    unknown["job"]["tenant"] = json!("mallory");
    let answer = post_json(&url, &auth, &push_envelope("m-3b", &unknown)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let record: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(record["errors"][0]["field"], "tenant", "{record}");

    let mut bad_job = w.message("g-4", "bad");
    bad_job["job"]["variables"]["region"] = json!("mars-north-1");
    bad_job["job"]["variables"]
        .as_object_mut()
        .unwrap()
        .remove("admin_password");
    let answer = post_json(&url, &auth, &push_envelope("m-4", &bad_job)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let record: Value = serde_json::from_str(&answer.body).unwrap();
    let fields: Vec<&str> = record["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"variables.region"), "{record}");
    assert!(fields.contains(&"variables.admin_password"), "{record}");

    let mut too_long = w.message("g-5", "bad");
    too_long["job"]["timeout"] = json!("2h");
    let answer = post_json(&url, &auth, &push_envelope("m-5", &too_long)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("request timeout"), "{}", answer.body);

    let store = w.store().await;
    assert!(store.workspaces().await.unwrap().is_empty(), "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_workspace_is_answered_429_and_the_job_runs_once_the_lease_is_free() {
    let w = World::new().await;
    let service = w.start().await;
    let store = w.store().await;
    let held = store
        .acquire_lease(
            &ws("busy"),
            &LeaseRequest {
                owner: "other-job".into(),
                ttl: Duration::from_secs(600),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    let envelope = push_envelope("m-6", &w.message("g-6", "busy"));
    let answer = w.push(&service, &envelope).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
    assert!(answer.body.contains("other-job"), "{}", answer.body);
    assert!(store.versions(&ws("busy")).await.unwrap().is_empty());

    store.release_lease(&ws("busy"), &held).await.unwrap();
    let answer = w.push(&service, &envelope).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("\"succeeded\""), "{}", answer.body);
}

/// Runs in order on the Pub/Sub push path: A (sequence 1) is answered 429 behind a busy
/// workspace; B (sequence 2) runs; Pub/Sub's redelivery of A is answered 200 with a
/// `superseded` result naming B, and the state keeps B's configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_request_redelivered_after_a_later_one_ran_is_superseded() {
    let w = World::new().await;
    let service = w.start().await;
    let store = w.store().await;
    let held = store
        .acquire_lease(
            &ws("order"),
            &LeaseRequest {
                owner: "other-job".into(),
                ttl: Duration::from_secs(600),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    let message = |id: &str, cluster: &str, sequence: u64| {
        let mut m = w.message(id, "order");
        m["job"]["sequence"] = json!(sequence);
        m["job"]["variables"]["cluster_name"] = json!(cluster);
        m
    };
    let a = push_envelope("m-a", &message("ord-a", "alpha", 1));
    let answer = w.push(&service, &a).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
    store.release_lease(&ws("order"), &held).await.unwrap();

    let b = w
        .push(
            &service,
            &push_envelope("m-b", &message("ord-b", "beta", 2)),
        )
        .await;
    assert_eq!(b.status, 200, "{}", b.body);
    assert!(b.body.contains("\"succeeded\""), "{}", b.body);
    let versions = store.versions(&ws("order")).await.unwrap();

    let again = w.push(&service, &a).await;
    assert_eq!(again.status, 200, "{}", again.body);
    let result: Value = serde_json::from_str(&again.body).unwrap();
    assert_eq!(result["status"], "superseded", "{result}");
    assert_eq!(
        result["superseded_by"],
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_interrupts_a_running_job_releases_its_lease_and_the_redelivery_runs_it() {
    let w = World::new().await;
    let slow = w
        .start_with(&[("TESTCLOUD_CREATE_DELAY_MS", "20000")])
        .await;
    let envelope = push_envelope("m-7", &w.message("g-7", "stopped"));
    let store = w.store().await;

    let pushing = {
        let url = format!("{}/pubsub", slow.url);
        let bearer = w.key.bearer();
        let envelope = envelope.clone();
        tokio::spawn(async move { post_json(&url, &[("authorization", &bearer)], &envelope).await })
    };
    // Wait until the job holds the workspace and terraform is creating.
    let mut held = false;
    for _ in 0..600 {
        if store.lease(&ws("stopped")).await.unwrap().is_some() && !w.sb.cloud_names().is_empty() {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held, "the job started");
    slow.terminate();
    let answer = pushing.await.unwrap();
    assert_eq!(answer.status, 503, "delivered again: {}", answer.body);
    assert!(answer.body.contains("shutting down"), "{}", answer.body);
    let mut slow = slow;
    let exited = slow.child.wait().unwrap();
    assert!(exited.success(), "{exited:?}");
    assert!(
        store.lease(&ws("stopped")).await.unwrap().is_none(),
        "the lease is released"
    );
    let result = store
        .artifact(&ws("stopped"), "g-7", "result.json")
        .await
        .unwrap()
        .unwrap();
    let result: Value = serde_json::from_slice(&result).unwrap();
    assert_eq!(result["status"], "interrupted", "{result}");

    // Pub/Sub delivers it again, to another instance: it runs.
    let service = w.start().await;
    let answer = w.push(&service, &envelope).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("\"succeeded\""), "{}", answer.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_a_request_goes_to_a_cloud_run_job_a_failed_start_leaves_nothing_staged_and_the_task_runs_it()
 {
    let w = World::new().await;
    // Nothing listens there: the Cloud Run Admin API cannot be reached.
    let admin = format!("http://127.0.0.1:{}", tests::gcp::free_port());
    let job = "projects/platform/locations/europe-west1/jobs/terrace";
    let service = w
        .start_with(&[
            ("TERRACE_REQUEST_TIMEOUT", "120"),
            ("TERRACE_CLOUD_RUN_JOB", job),
            ("TERRACE_CLOUD_RUN_ENDPOINT", &admin),
        ])
        .await;
    let message = w.message("g-8", "long");
    let answer = w.push(&service, &push_envelope("m-8", &message)).await;
    assert_eq!(answer.status, 503, "delivered again: {}", answer.body);
    assert!(
        answer.body.contains("Cloud Run Admin API"),
        "{}",
        answer.body
    );

    // Nothing ran here, and the hand-off that failed left no staged copy (with the job's
    // variables) behind: the redelivery stages it afresh.
    let store = w.store().await;
    let left = store.artifacts(&ws("long"), "g-8").await.unwrap();
    assert!(!left.iter().any(|a| a.starts_with("request")), "{left:?}");
    assert!(store.versions(&ws("long")).await.unwrap().is_empty());

    // Staged as a hand-off that reached the Admin API stages it, byte for byte.
    let staged = message.to_string().into_bytes();
    let name = "request-0123456789abcdef.json";
    store
        .put_artifact(&ws("long"), "g-8", name, staged.clone().into())
        .await
        .unwrap();

    // The execution's entry point runs it from the reference alone.
    let reference = json!({
        "target": w.target(), "tenant": "acme", "workspace": "long", "job_id": "g-8",
        "sha256": state_backends::sha256_hex(&staged), "staged": name,
    });
    // A task takes no requests: it needs none of the token settings.
    let out = w
        .command(&[])
        .arg("task")
        .env_remove("TERRACE_PUSH_AUDIENCE")
        .env_remove("TERRACE_PUSH_SERVICE_ACCOUNTS")
        .env("TERRACE_JOB_REF", reference.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    assert!(!store.versions(&ws("long")).await.unwrap().is_empty());
    // The staged message held the job's variables: it is gone once the job is done.
    let left = store.artifacts(&ws("long"), "g-8").await.unwrap();
    assert!(left.contains(&"result.json".to_owned()), "{left:?}");
    assert!(!left.iter().any(|a| a.starts_with("request")), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_sweep_plans_a_check_per_applied_workspace_and_reports_what_it_could_not_queue() {
    let w = World::new().await;
    // No Pub/Sub emulator exists: the topic's API is unreachable, so the sweep must say which
    // checks it could not queue (and a result that cannot be published must not fail a job).
    let pubsub = format!("http://127.0.0.1:{}", tests::gcp::free_port());
    let service = w
        .start_with(&[
            (
                "TERRACE_JOBS_TOPIC",
                "projects/platform/topics/terrace-jobs",
            ),
            (
                "TERRACE_RESULTS_TOPIC",
                "projects/platform/topics/terrace-results",
            ),
            ("TERRACE_PUBSUB_ENDPOINT", &pubsub),
        ])
        .await;
    let fleet = json!({
        "job": {
            "id": "f-1", "tenant": "acme", "workspace": "nets", "operation": "apply",
            "template": { "name": "fleet", "version": "1.0.0" },
            "variables": { "networks": ["a"] }, "timeout": "5m",
        },
        "target": w.target(),
    });
    let applied = w.push(&service, &push_envelope("m-9", &fleet)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    assert!(applied.body.contains("\"succeeded\""), "{}", applied.body);
    let applied = w
        .push(
            &service,
            &push_envelope("m-10", &w.message("s-1", "secret")),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);

    let sweep = post_json(
        &format!("{}/sweeps/drift", service.url),
        &[("authorization", &w.key.bearer())],
        &json!({ "tenants": ["acme"] }),
    )
    .await;
    assert_eq!(sweep.status, 500, "{}", sweep.body);
    let sweep: Value = serde_json::from_str(&sweep.body).unwrap();
    tests::schema::check("sweep-report", &sweep);
    let report = &sweep["buckets"][0];
    assert_eq!(report["queued"], 0, "{sweep}");
    assert_eq!(
        report["needs_secrets"],
        json!([{ "workspace": "acme/secret", "sensitive_variables": ["admin_password"] }])
    );
    let failed = report["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{sweep}");
    assert_eq!(failed[0]["workspace"], "acme/nets");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("projects/platform/topics/terrace-jobs"),
        "{sweep}"
    );

    let unauthorized = post_json(&format!("{}/sweeps/drift", service.url), &[], &json!({})).await;
    assert_eq!(unauthorized.status, 401);

    // A sweep covers registered tenants only: a bucket cannot be named in the request.
    let unknown = post_json(
        &format!("{}/sweeps/drift", service.url),
        &[("authorization", &w.key.bearer())],
        &json!({ "tenants": ["mallory"] }),
    )
    .await;
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    assert!(unknown.body.contains("not registered"), "{}", unknown.body);
    let named = post_json(
        &format!("{}/sweeps/drift", service.url),
        &[("authorization", &w.key.bearer())],
        &json!({ "targets": [w.target()] }),
    )
    .await;
    assert_eq!(named.status, 400, "{}", named.body);
}

/// A service wired to the Pub/Sub emulator: jobs pushed from a topic through a relay that adds
/// the token (dead-lettered after 5 unacknowledged deliveries), results published to a topic.
struct Wired {
    service: Service,
    relay: Relay,
    jobs: String,
    results: String,
    dead: String,
}

impl World {
    async fn wired(&self) -> Wired {
        self.wired_with(&[]).await
    }

    /// As [`World::wired`], with `extra` settings for the service.
    async fn wired_with(&self, extra: &[(&str, &str)]) -> Wired {
        self.wired_to(extra, None).await
    }

    /// As [`World::wired_with`], the service's stderr to `stderr` when given.
    async fn wired_to(&self, extra: &[(&str, &str)], stderr: Option<Stdio>) -> Wired {
        let jobs = pubsub::topic("jobs").await;
        let results_topic = pubsub::topic("results").await;
        let dead_topic = pubsub::topic("dead").await;
        let results = pubsub::pull_subscription(&results_topic).await;
        let dead = pubsub::pull_subscription(&dead_topic).await;
        let endpoint = pubsub::endpoint();
        let mut env = vec![
            ("TERRACE_JOBS_TOPIC", jobs.as_str()),
            ("TERRACE_RESULTS_TOPIC", results_topic.as_str()),
            ("TERRACE_PUBSUB_ENDPOINT", endpoint.as_str()),
            ("TERRACE_REQUEUE_WAIT", "1"),
        ];
        env.extend_from_slice(extra);
        let service = match stderr {
            Some(stderr) => {
                let mut cmd = self.command(&env);
                cmd.stderr(stderr);
                Service::spawn(cmd).await
            }
            None => self.start_with(&env).await,
        };
        let relay = Relay::start(&service.url, self.key.bearer()).await;
        pubsub::push_subscription(&jobs, &relay.url, &dead_topic, 5).await;
        Wired {
            service,
            relay,
            jobs,
            results,
            dead,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pubsub_a_job_waiting_behind_a_busy_workspace_runs_later_and_is_never_dead_lettered()
 {
    let w = World::new().await;
    let p = w.wired().await;
    let store = w.store().await;
    let held = store
        .acquire_lease(
            &ws("queued"),
            &LeaseRequest {
                owner: "other-job".into(),
                ttl: Duration::from_secs(600),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    pubsub::publish(&p.jobs, &w.message("g-20", "queued")).await;

    // The job waits longer than 5 deliveries, the subscription's dead-letter limit.
    let give_up = std::time::Instant::now() + Duration::from_secs(90);
    while p.relay.pushed().len() < 8 {
        assert!(
            std::time::Instant::now() < give_up,
            "{:?}",
            p.relay.pushed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(store.versions(&ws("queued")).await.unwrap().is_empty());
    store.release_lease(&ws("queued"), &held).await.unwrap();

    let results = results_until(&p.results, Duration::from_secs(120), |r| {
        r["job_id"] == "g-20"
    })
    .await;
    let result = results
        .iter()
        .find(|r| r["job_id"] == "g-20")
        .unwrap_or_else(|| panic!("no result: {results:?} after {:?}", p.relay.pushed()));
    assert_eq!(result["status"], "succeeded", "{result}");
    assert!(!store.versions(&ws("queued")).await.unwrap().is_empty());

    // Each delivery while it waited was acknowledged and a fresh message published, so no
    // message was delivered twice, and nothing reached the dead-letter topic.
    let pushed = p.relay.pushed();
    assert!(
        pushed.iter().all(|d| d.job_id == "g-20" && d.status == 200),
        "{pushed:?}"
    );
    let ids: std::collections::HashSet<&str> =
        pushed.iter().map(|d| d.message_id.as_str()).collect();
    assert_eq!(
        ids.len(),
        pushed.len(),
        "a message delivered again: {pushed:?}"
    );
    assert_eq!(pubsub::pull(&p.dead).await, Vec::<Value>::new());
}

/// `terrace submit --to pubsub://…` publishes a job as a platform would; the push reaches the
/// service, and `--follow` streams the log from the customer's bucket to the job's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_to_the_pubsub_topic_is_pushed_to_the_service_and_followed_to_its_result() {
    let w = World::new().await;
    let p = w.wired().await;
    let path = w.sb.job(
        "submit.yaml",
        &tests::demo_job("g-sub-1", "submitted", "apply", "demo", 1),
    );
    let mut submit = w.sb.terrace();
    submit
        .env("TERRACE_PUBSUB_ENDPOINT", pubsub::endpoint())
        .env("TERRACE_STORE", format!("gs://{}/states", w.bucket))
        .env("TERRACE_GCS_ENDPOINT", tests::gcs::endpoint())
        .env("TERRACE_GCS_ANONYMOUS", "1")
        .args(["submit", path.to_str().unwrap(), "--follow", "--to"])
        .arg(format!("pubsub://{}", p.jobs));
    // The relay runs on this runtime: the submit is waited for off it.
    let out = tokio::task::spawn_blocking(move || submit.output().unwrap())
        .await
        .unwrap();
    tests::assert_followed_to_success(&out);
    let results = results_until(&p.results, Duration::from_secs(60), |r| {
        r["job_id"] == "g-sub-1"
    })
    .await;
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(
        p.relay.pushed().len(),
        1,
        "pushed once: {:?}",
        p.relay.pushed()
    );
    let _ = &p.service;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pubsub_a_finished_job_published_again_reports_the_same_result_again() {
    let w = World::new().await;
    let p = w.wired().await;
    let message = w.message("g-21", "twice");
    pubsub::publish(&p.jobs, &message).await;
    let first = results_until(&p.results, Duration::from_secs(120), |r| {
        r["job_id"] == "g-21"
    })
    .await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["status"], "succeeded", "{first:?}");
    let versions = w.store().await.versions(&ws("twice")).await.unwrap();

    pubsub::publish(&p.jobs, &message).await;
    let again = results_until(&p.results, Duration::from_secs(60), |r| {
        r["job_id"] == "g-21"
    })
    .await;
    assert_eq!(again, first, "the same result, from the first run");
    assert_eq!(
        w.store().await.versions(&ws("twice")).await.unwrap(),
        versions,
        "nothing ran again"
    );
    assert_eq!(p.relay.pushed().len(), 2, "{:?}", p.relay.pushed());
    let _ = &p.service;
}

/// The built image (`make images`) as Cloud Run runs it (as root, so each job's terraform runs
/// as a user of its own): a signed push applies the demo, and the probe finds nothing of the
/// service's. Nothing of the host's terraform, templates or providers is in the container.
/// `--pid=host` lets the probe's leftover process be looked for from here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs the built image: make test-images"]
async fn the_image_answers_a_signed_push_and_applies_the_job() {
    use tests::image::{Container, image};
    let image = image("gcp");
    let w = World::new().await;
    let port = tests::gcp::free_port();
    let mut service = w.command(&[]);
    service.env("PORT", port.to_string());
    let _container = Container::run(&service, &image, &["--pid=host"], &[]);
    let url = format!("http://127.0.0.1:{port}");
    tests::gcp::wait_for_port(port, Duration::from_secs(60), "the image's service").await;
    let push = |envelope: Value| {
        let bearer = w.key.bearer();
        let url = format!("{url}/pubsub");
        async move { post_json(&url, &[("authorization", &bearer)], &envelope).await }
    };

    let answer = push(push_envelope("m-1", &w.message("gi-1", "image"))).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let result: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    assert!(
        result["outputs"]["cluster_id"]["value"].is_string(),
        "{result}"
    );
    assert_eq!(w.sb.cloud_names().len(), 2, "a network and a cluster");
    let store = w.store().await;
    assert!(!store.versions(&ws("image")).await.unwrap().is_empty());

    let probe = json!({
        "job": {
            "id": "gi-2", "tenant": "acme", "workspace": "probe", "operation": "apply",
            "template": { "name": "probe", "version": "1.0.0" },
            "variables": { "name": "image-probe" }, "timeout": "5m",
        },
    });
    let answer = push(push_envelope("m-2", &probe)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("\"succeeded\""), "{}", answer.body);
    w.sb.assert_probe_got_nothing("image-probe", &["TERRACE_PUSH_SERVICE_ACCOUNTS"], &[], true);
}

/// Approved plans on Cloud Run's path: the plan's own key is in the push's answer, the apply
/// that gives it back applies that plan once, and a second apply is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_plan_pushed_then_applied_once() {
    let w = World::new().await;
    let service = w.start().await;
    let store = w.store().await;
    let job = |id: &str, extra: Value| {
        let mut m = json!({ "job": {
            "id": id, "tenant": "acme", "workspace": "run-approved",
            "template": { "name": "approval", "version": "1.0.0" },
            "variables": { "token": "tok-run-1" }, "timeout": "5m",
        }});
        for (k, v) in extra.as_object().unwrap() {
            m["job"][k] = v.clone();
        }
        m
    };
    let plan = job(
        "rp-1",
        json!({ "operation": "plan", "variables": { "name": "from-run", "secret": "s3cret-run", "token": "tok-run-1" } }),
    );
    let planned = w.push(&service, &push_envelope("m-rp", &plan)).await;
    assert_eq!(planned.status, 200, "{}", planned.body);
    let planned: Value = serde_json::from_str(&planned.body).unwrap();
    assert_eq!(planned["status"], "succeeded", "{planned}");
    let key = planned["plan"]["key"].as_str().expect("the key").to_owned();
    assert!(
        store
            .versions(&ws("run-approved"))
            .await
            .unwrap()
            .is_empty()
    );

    let apply = |id: &str| {
        job(
            id,
            json!({ "operation": "apply", "plan": "rp-1", "plan_key": key }),
        )
    };
    let applied = w
        .push(&service, &push_envelope("m-ra1", &apply("ra-1")))
        .await;
    let applied: Value = serde_json::from_str(&applied.body).unwrap();
    assert_eq!(applied["status"], "succeeded", "{applied}");
    assert_eq!(applied["outputs"]["name"]["value"], "from-run", "{applied}");
    let again = w
        .push(&service, &push_envelope("m-ra2", &apply("ra-2")))
        .await;
    let again: Value = serde_json::from_str(&again.body).unwrap();
    assert_eq!(again["error"]["category"], "plan-refused", "{again}");
    assert_eq!(store.versions(&ws("run-approved")).await.unwrap().len(), 1);
}

/// A cancel pushed before its job arrives stops the job before it starts; one pushed for a
/// finished job changes nothing and says so; one for another tenant is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_pushed_stops_a_queued_job_and_leaves_a_finished_one() {
    let w = World::new().await;
    let service = w.start().await;
    let store = w.store().await;
    let cancel = |job: &str, tenant: &str| json!({ "cancel": { "job": job, "tenant": tenant, "workspace": "run-cancel" } });
    let asked = w
        .push(&service, &push_envelope("m-c1", &cancel("rc-1", "acme")))
        .await;
    assert_eq!(asked.status, 200, "{}", asked.body);
    assert!(asked.body.contains("cancel-requested"), "{}", asked.body);
    let stranger = w
        .push(&service, &push_envelope("m-c2", &cancel("rc-1", "mallory")))
        .await;
    assert!(stranger.body.contains("rejected"), "{}", stranger.body);

    let ran = w
        .push(
            &service,
            &push_envelope("m-j1", &w.message("rc-1", "run-cancel")),
        )
        .await;
    let ran: Value = serde_json::from_str(&ran.body).unwrap();
    assert_eq!(ran["status"], "cancelled", "{ran}");
    assert!(
        store.versions(&ws("run-cancel")).await.unwrap().is_empty(),
        "nothing ran"
    );

    let done = w
        .push(
            &service,
            &push_envelope("m-j2", &w.message("rc-2", "run-cancel")),
        )
        .await;
    assert!(done.body.contains("\"succeeded\""), "{}", done.body);
    let late = w
        .push(&service, &push_envelope("m-c3", &cancel("rc-2", "acme")))
        .await;
    assert!(late.body.contains("already-finished"), "{}", late.body);
    assert_eq!(store.versions(&ws("run-cancel")).await.unwrap().len(), 1);
}

/// Cancel mid-apply on Cloud Run's path: a cancel pushed while the job's own push is being
/// answered stops the apply within seconds; its `on_failure: destroy-created` destroys what it
/// made, and the job's answer says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_pushed_mid_apply_stops_it_and_its_clean_up_destroys_what_it_made() {
    let w = World::new().await;
    let service = w.start().await;
    let store = w.store().await;
    w.sb.faults(json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "slow", "delay_ms": 90000, "times": 1 }]));
    let mut job = w.message("rm-1", "run-cancel-mid");
    job["job"]["on_failure"] = json!("destroy-created");
    let bearer = w.key.bearer();
    let url = format!("{}/pubsub", service.url);
    let envelope = push_envelope("m-rm1", &job);
    let running =
        tokio::spawn(
            async move { post_json(&url, &[("authorization", &bearer)], &envelope).await },
        );
    tests::wait_for_stored_log(
        &*store,
        &ws("run-cancel-mid"),
        "rm-1",
        "testcloud_cluster.main: Creating",
        Duration::from_secs(120),
    )
    .await;
    let cancel =
        json!({ "cancel": { "job": "rm-1", "tenant": "acme", "workspace": "run-cancel-mid" } });
    let asked = w.push(&service, &push_envelope("m-rmc", &cancel)).await;
    assert!(asked.body.contains("cancel-requested"), "{}", asked.body);
    let answer = running.await.unwrap();
    let result: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["cleanup"]["policy"], "destroy-created", "{result}");
    assert!(
        result["cleanup"]["destroyed"]
            .to_string()
            .contains("testcloud_network"),
        "{result}"
    );
    let state = store.current(&ws("run-cancel-mid")).await.unwrap().unwrap();
    assert!(!String::from_utf8_lossy(&state.data).contains("testcloud_network"));
}

/// Pulls the results topic's subscription until `pred` holds (see [`pubsub::pull_until`]),
/// every message checked against the published schema.
async fn results_until(
    subscription: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let seen = pubsub::pull_until(subscription, within, pred).await;
    seen.iter().for_each(tests::schema::check_record);
    seen
}

/// A tenant whose registry entry lists senders: the service runs a job published with
/// `terrace submit --sign`, refuses an unsigned one (nothing runs, nothing is dead-lettered),
/// and answers a cancel sent signed with `terrace cancel --to pubsub://…`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pubsub_a_tenant_with_senders_runs_only_signed_jobs_and_cancels() {
    let w = World::new().await;
    let (key, public) = tests::keygen(&w.sb, "platform.pem");
    let mut registry: Value = serde_json::from_str(&w.tenants()).unwrap();
    registry["acme"]["senders"] = json!([public]);
    let registry = registry.to_string();
    let p = w.wired_with(&[("TERRACE_TENANTS", &registry)]).await;
    let topic = format!("pubsub://{}", p.jobs);
    let key = key.to_str().unwrap().to_owned();
    let signed = w.sb.job(
        "signed.yaml",
        &tests::demo_job("g-sig-1", "signed", "apply", "demo", 1),
    );
    let unsigned = w.sb.job(
        "unsigned.yaml",
        &tests::demo_job("g-sig-2", "unsigned", "apply", "demo", 1),
    );
    let send = |args: Vec<String>| {
        let mut cmd = w.sb.terrace();
        cmd.env("TERRACE_PUBSUB_ENDPOINT", pubsub::endpoint())
            .args(args);
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
    };
    let strings = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    for args in [
        strings(&[
            "submit",
            signed.to_str().unwrap(),
            "--to",
            &topic,
            "--sign",
            &key,
        ]),
        strings(&["submit", unsigned.to_str().unwrap(), "--to", &topic]),
        strings(&[
            "cancel",
            "g-sig-9",
            "-w",
            "acme/signed",
            "--to",
            &topic,
            "--sign",
            &key,
        ]),
    ] {
        let out = send(args).await.unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    // All three: the job's result, the rejection and the cancel's answer, in any order.
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let results = results_until(&p.results, Duration::from_secs(120), |r| {
        let mut seen = seen.lock().unwrap();
        seen.insert(r["kind"].as_str().unwrap_or_default().to_owned());
        seen.len() == 3
    })
    .await;
    let ran = results.iter().find(|r| r["job_id"] == "g-sig-1").unwrap();
    assert_eq!(ran["status"], "succeeded", "{ran}");
    let refused = results
        .iter()
        .find(|r| r["status"] == "rejected")
        .unwrap_or_else(|| panic!("no rejection: {results:?}"));
    assert_eq!(refused["errors"][0]["field"], "signature", "{refused}");
    assert!(
        refused["errors"][0]["problem"]
            .as_str()
            .unwrap()
            .starts_with("is missing"),
        "{refused}"
    );
    let answered = results
        .iter()
        .find(|r| r["kind"] == "cancel")
        .unwrap_or_else(|| panic!("no cancel answer: {results:?}"));
    assert_eq!(answered["status"], "cancel-requested", "{answered}");
    assert!(
        w.store()
            .await
            .versions(&ws("unsigned"))
            .await
            .unwrap()
            .is_empty(),
        "the unsigned job ran"
    );
    assert_eq!(pubsub::pull(&p.dead).await, Vec::<Value>::new());
}

/// A benchmark, not a test (`benches/start-latency.sh`): enqueue to terraform's first output
/// through the Pub/Sub emulator's push subscription, one job at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: benches/start-latency.sh runs it"]
async fn start_latency() {
    let w = World::new().await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let p = w
        .wired_to(&[], Some(Stdio::from(log.reopen().unwrap())))
        .await;
    let store = w.store().await;
    let mut samples = tests::start::Samples::default();
    for i in 0..=tests::start::jobs() {
        let id = format!("start-{i}");
        let queued = std::time::SystemTime::now();
        pubsub::publish(&p.jobs, &w.message(&id, &id)).await;
        let results = results_until(&p.results, Duration::from_secs(300), |r| {
            r["job_id"] == id.as_str()
        })
        .await;
        let result = results.iter().find(|r| r["job_id"] == id.as_str()).unwrap();
        assert_eq!(result["status"], "succeeded", "{result}");
        if i == 0 {
            continue; // a warm-up: the service's first job opens its clients
        }
        let first = tests::start::first_output_ms(store.as_ref(), &ws(&id), &id, queued).await;
        let stderr = std::fs::read_to_string(log.path()).unwrap();
        samples.add(first, tests::start::share(&stderr, &id));
    }
    samples.report(
        "Pub/Sub push -> Cloud Run (the emulator's push subscription, a relay adding the token, a warm instance)",
        "the publish, the emulator's push (its own delivery loop), the relay, checking the token, \
         and terraform's start-up to its first line",
    );
}
