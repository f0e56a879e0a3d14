//! The real `terrace-aws` binary, driven through a local Lambda Runtime API with SQS events
//! made of real messages from moto's queue; real terraform; the customer's bucket, lease
//! table, queues and ECS in moto.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use state_backends::s3::{LeaseMode, S3Config, S3Store};
use state_backends::{LeaseRequest, StateStore, WorkspaceId};
use tests::lambda::RuntimeApi;
use tests::{Sandbox, aws, terraform, workspace_bin};

struct World {
    sb: Sandbox,
    bucket: String,
    table: String,
    jobs: String,
    results: String,
    sqs: aws_sdk_sqs::Client,
    /// A subnet and security group for ECS tasks.
    network: (String, String),
}

/// Kills the function when the test ends, however it ends.
struct Function(Child);

impl Drop for Function {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl World {
    async fn new() -> Self {
        let sqs = aws_sdk_sqs::Client::new(&aws::sdk_config().await);
        let queue = |name: String| {
            let sqs = sqs.clone();
            async move {
                sqs.create_queue()
                    .queue_name(name)
                    .send()
                    .await
                    .unwrap()
                    .queue_url()
                    .unwrap()
                    .to_owned()
            }
        };
        Self {
            sb: Sandbox::new(),
            bucket: aws::bucket().await,
            table: aws::lease_table().await,
            jobs: queue(aws::unique("jobs")).await,
            results: queue(aws::unique("results")).await,
            sqs,
            network: aws::default_network(),
        }
    }

    /// The function's tenant registry: `acme` is the customer whose role and bucket these are.
    fn tenants(&self) -> String {
        let mut registered = self.target();
        registered["external_id"] = json!("ext-7f3a");
        json!({ "acme": registered }).to_string()
    }

    /// `acme`'s target as a message may show it (never with the ExternalId).
    fn target(&self) -> Value {
        json!({
            "role_arn": "arn:aws:iam::123456789012:role/terrace",
            "bucket": self.bucket,
            "prefix": "states",
            "lease_table": self.table,
            "region": "us-east-1",
        })
    }

    fn envelope(&self, id: &str, workspace: &str, timeout: &str) -> String {
        json!({
            "job": {
                "id": id, "tenant": "acme", "workspace": workspace, "operation": "apply",
                "template": { "name": "demo", "version": "1.0.0" },
                "variables": { "cluster_name": workspace, "region": "eu-west-1", "admin_password": "correct-horse-battery" },
                "timeout": timeout,
            },
        })
        .to_string()
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(workspace_bin("terrace-aws"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AWS_ENDPOINT_URL", aws::moto())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("TERRACE_TENANTS", self.tenants())
            .env("TERRACE_TEMPLATES", &self.sb.templates)
            .env("TERRACE_TERRAFORM", terraform())
            .env("TERRACE_TF_CLI_CONFIG", &self.sb.cli_config)
            .env("TERRACE_PASS_ENV", "TESTCLOUD_ROOT")
            .env("TESTCLOUD_ROOT", &self.sb.cloud)
            .env("TERRACE_GRACE", "5")
            .env("TERRACE_LEASE_TTL", "10")
            .env("TERRACE_JOBS_QUEUE_URL", &self.jobs)
            .env("TERRACE_RESULTS_QUEUE_URL", &self.results)
            .env("TERRACE_S3_FORCE_PATH_STYLE", "1")
            .env("TERRACE_ECS_CLUSTER", "terrace")
            .env("TERRACE_ECS_TASK_DEFINITION", "terrace")
            .env("TERRACE_ECS_SUBNETS", &self.network.0)
            .env("TERRACE_ECS_SECURITY_GROUPS", &self.network.1)
            .env("TERRACE_LOG", "info");
        cmd
    }

    fn start(&self, api: &RuntimeApi) -> Function {
        self.start_with(api, &[])
    }

    /// The function's command with what Lambda's runtime sets for a function using `api`.
    fn lambda_command(&self, api: &RuntimeApi) -> Command {
        let mut cmd = self.command();
        cmd.env("AWS_LAMBDA_RUNTIME_API", &api.address)
            .env("AWS_LAMBDA_FUNCTION_NAME", "terrace")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "2048")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1");
        cmd
    }

    fn start_with(&self, api: &RuntimeApi, env: &[(&str, &str)]) -> Function {
        let child = self
            .lambda_command(api)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log_output())
            .spawn()
            .expect("terrace-aws starts");
        Function(child)
    }

    /// Sends bodies to the jobs queue and receives them back as an SQS event for Lambda.
    async fn batch(&self, bodies: &[String]) -> (Value, Vec<String>) {
        self.batch_invisible_for(bodies, 60).await
    }

    /// Sends one apply of the demo (`id` on `workspace`) through the function behind `api` and
    /// returns its result, asserting that the batch was answered with no failure and the job
    /// succeeded.
    async fn apply_one(&self, api: &RuntimeApi, id: &str, workspace: &str) -> Value {
        let (event, _) = self.batch(&[self.envelope(id, workspace, "3m")]).await;
        let response = api
            .invoke(event, Duration::from_secs(5 * 60))
            .await
            .expect("the batch is answered");
        assert!(failures(&response).is_empty(), "{response}");
        let mut results = self.results().await;
        assert_eq!(results.len(), 1, "{results:?}");
        let result = results.remove(0);
        assert_eq!(result["status"], "succeeded", "{result}");
        result
    }

    /// As [`World::batch`], received with a visibility timeout of `seconds`.
    async fn batch_invisible_for(&self, bodies: &[String], seconds: i32) -> (Value, Vec<String>) {
        let mut ids = Vec::new();
        for body in bodies {
            let sent = self
                .sqs
                .send_message()
                .queue_url(&self.jobs)
                .message_body(body)
                .send()
                .await
                .unwrap();
            ids.push(sent.message_id().unwrap().to_owned());
        }
        (self.receive(bodies.len(), seconds).await, ids)
    }

    /// Receives `n` messages from the jobs queue as an SQS event for Lambda (within 2 minutes).
    async fn receive(&self, n: usize, seconds: i32) -> Value {
        let mut records = Vec::new();
        let give_up = std::time::Instant::now() + Duration::from_secs(120);
        while records.len() < n {
            assert!(
                std::time::Instant::now() < give_up,
                "{} of {n} messages on the jobs queue after 2 minutes",
                records.len()
            );
            let got = self
                .sqs
                .receive_message()
                .queue_url(&self.jobs)
                .max_number_of_messages(10)
                .visibility_timeout(seconds)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            for m in got.messages() {
                records.push(json!({
                    "messageId": m.message_id(), "receiptHandle": m.receipt_handle(),
                    "body": m.body(), "attributes": { "ApproximateReceiveCount": "1" },
                    "messageAttributes": {}, "md5OfBody": m.md5_of_body(),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:jobs",
                    "awsRegion": "us-east-1",
                }));
            }
        }
        json!({ "Records": records })
    }

    /// Every message on the results queue now (consumed).
    /// Sends `bodies` as one SQS batch to the function, checks that none is returned to the
    /// queue, and gives what it reported on the results queue.
    async fn answer(&self, api: &RuntimeApi, bodies: &[String]) -> Vec<Value> {
        let (event, _) = self.batch(bodies).await;
        let response = api
            .invoke(event, Duration::from_secs(14 * 60))
            .await
            .expect("the batch is answered");
        assert!(failures(&response).is_empty(), "{response}");
        self.results().await
    }

    async fn results(&self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let got = self
                .sqs
                .receive_message()
                .queue_url(&self.results)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            if got.messages().is_empty() {
                return out;
            }
            for m in got.messages() {
                out.push(tests::schema::message(
                    serde_json::from_str(m.body().unwrap()).unwrap(),
                ));
                self.sqs
                    .delete_message()
                    .queue_url(&self.results)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    async fn store(&self) -> S3Store {
        S3Store::new(
            aws::s3().await,
            Some(aws::dynamodb().await),
            S3Config {
                bucket: self.bucket.clone(),
                prefix: "states".into(),
                lease: LeaseMode::DynamoDb {
                    table: self.table.clone(),
                },
                kms_key_id: None,
            },
        )
        .unwrap()
    }

    async fn keys(&self, prefix: &str) -> Vec<String> {
        keys_in(&self.bucket, prefix).await
    }
}

/// The keys under `prefix` in `bucket` (one page).
async fn keys_in(bucket: &str, prefix: &str) -> Vec<String> {
    let out = aws::s3()
        .await
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .send()
        .await
        .unwrap();
    out.contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_owned))
        .collect()
}

/// The function's log: shown with `TERRACE_TEST_VERBOSE=1`, else dropped.
fn log_output() -> Stdio {
    if std::env::var_os("TERRACE_TEST_VERBOSE").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}

fn failures(response: &Value) -> Vec<&str> {
    response["batchItemFailures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap())
        .collect()
}

/// A tenant registered with `client_side_kms_key`: the function seals every state object it
/// writes to the customer's bucket with data keys from the customer's KMS key (in moto).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_a_client_side_kms_key_gets_every_state_sealed_with_it() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let key = aws::kms_key();
    let mut registered = w.target();
    registered["external_id"] = json!("ext-7f3a");
    registered["client_side_kms_key"] = json!(key);
    let tenants = json!({ "acme": registered }).to_string();
    let _function = w.start_with(&api, &[("TERRACE_TENANTS", &tenants)]);
    w.apply_one(&api, "kms-1", "kms").await;
    let keys = w.keys("states/acme/kms/").await;
    let states: Vec<&String> = keys.iter().filter(|k| k.ends_with(".tfstate")).collect();
    assert!(states.len() >= 2, "{keys:?}");
    let s3 = aws::s3().await;
    for k in states {
        let object = s3
            .get_object()
            .bucket(&w.bucket)
            .key(k)
            .send()
            .await
            .unwrap();
        let data = object.body.collect().await.unwrap().into_bytes();
        assert!(
            state_backends::sealed::is_sealed(&data),
            "{k} is not sealed"
        );
        assert!(
            !String::from_utf8_lossy(&data).contains("testcloud_cluster"),
            "{k}"
        );
        let (_, header, _) = state_backends::sealed::split(&data).unwrap();
        assert_eq!(header.key, format!("aws-kms:{key}"));
    }
}

/// The function reads templates from the runner's own bucket at run time (no new image): a
/// version published there runs; one not published is rejected, naming the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_published_to_the_runners_bucket_run_without_a_new_image() {
    let w = World::new().await;
    let url = format!("s3://{}/published", aws::bucket().await);
    let published =
        w.sb.terrace()
            .envs(aws::cli_env())
            .args(["template", "publish", "demo", "1.0.0", "--to", &url])
            .output()
            .unwrap();
    assert!(published.status.success(), "{published:?}");
    let cache = w.sb.dir.path().join("function-template-cache");
    let api = RuntimeApi::start().await;
    let _function = w.start_with(
        &api,
        &[
            ("TERRACE_TEMPLATES", &url),
            ("TERRACE_TEMPLATE_CACHE", cache.to_str().unwrap()),
        ],
    );
    w.apply_one(&api, "pub-1", "published").await;
    assert!(cache.join("demo/1.0.0/main.tf").is_file());

    let unpublished = w
        .envelope("pub-2", "published", "3m")
        .replace("\"1.0.0\"", "\"9.9.9\"");
    let (event, _) = w.batch(&[unpublished]).await;
    let response = api.invoke(event, Duration::from_secs(60)).await.unwrap();
    assert!(
        failures(&response).is_empty(),
        "rejected, not retried: {response}"
    );
    let results = w.results().await;
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["status"], "rejected", "{}", results[0]);
    let problem = results[0]["errors"][0]["problem"].as_str().unwrap();
    assert_eq!(
        problem,
        format!("template demo 9.9.9 is not published in {url}")
    );

    // A place this runner cannot read templates from stops it at start, naming the setting.
    let out = w
        .command()
        .env("TERRACE_TEMPLATES", "gs://elsewhere/t")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("TERRACE_TEMPLATES=gs://elsewhere/t: gs://elsewhere/t is not an S3 bucket"),
        "{said}"
    );
}

/// The function holds every plan to the policies `TERRACE_POLICIES` names (a set published to
/// a bucket): a deny stops the job before apply (the message is done, not retried), a warning
/// goes through, and a policy that does not parse stops the function at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_lambda_a_plan_that_breaks_a_policy_stops_before_apply_and_a_warning_goes_through() {
    let w = World::new().await;
    // Published to the runner's bucket, read by the function with its own identity.
    let url = format!("s3://{}/policies", aws::bucket().await);
    let demo = tests::policy::demo();
    let published =
        w.sb.terrace()
            .envs(aws::cli_env())
            .args(["policy", "publish", demo.to_str().unwrap(), "demo", "1"])
            .args(["--to", &url])
            .output()
            .unwrap();
    assert!(published.status.success(), "{published:?}");
    let set = format!("{url}/demo/1");
    let cache = w.sb.dir.path().join("policy-cache");
    let api = RuntimeApi::start().await;
    let _function = w.start_with(
        &api,
        &[
            ("TERRACE_POLICIES", &set),
            ("TERRACE_POLICY_CACHE", cache.to_str().unwrap()),
        ],
    );
    let mut big: Value = serde_json::from_str(&w.envelope("pol-big", "policy", "3m")).unwrap();
    big["job"]["variables"]["node_count"] = json!(12);
    let (event, _) = w.batch(&[big.to_string()]).await;
    let response = api.invoke(event, Duration::from_secs(300)).await.unwrap();
    assert!(
        failures(&response).is_empty(),
        "done, not retried: {response}"
    );
    let results = w.results().await;
    assert_eq!(results.len(), 1, "{results:?}");
    tests::policy::assert_denied(&results[0]);
    assert!(w.sb.cloud_files().is_empty(), "nothing was made");

    let small = w.apply_one(&api, "pol-small", "policy").await;
    tests::policy::assert_warned(&small);

    let broken = tests::policy::broken(w.sb.dir.path());
    let mut refused = w.command();
    refused.env("TERRACE_POLICIES", &broken);
    tests::policy::assert_refused_at_start(refused);
}

/// Secrets canary: a job whose secret terraform prints in a resource, an output and its plan
/// (the `leaky` template). The secret is in none of the function's log, the result sent to
/// the results queue, the objects in the customer's bucket other than the states themselves,
/// or any process's command line or environment while the job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_secret_is_in_no_log_result_or_object_but_the_state() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let log_path = w.sb.dir.path().join("function.log");
    let (identity, recipient) = tests::outputs_key();
    let child = w
        .lambda_command(&api)
        .env("TERRACE_OUTPUTS_RECIPIENT", &recipient)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let function = Function(child);
    let canary = "canary-7c1e-lambda-5ecret";
    let body = tests::canary_message("canary-1", canary, "3m").to_string();
    let (event, _) = w.batch(&[body]).await;
    let listings = tests::ProcessListings::start(canary, &w.sb.cloud);
    let response = api.invoke(event, Duration::from_secs(300)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    listings.check();
    let results = w.results().await;
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["status"], "succeeded", "{}", results[0]);
    assert!(!results[0].to_string().contains(canary), "{}", results[0]);
    assert_eq!(
        results[0]["outputs"]["connection"]["value"],
        "token=(sensitive value)"
    );
    // The sensitive output, sealed to the platform's key, opens to what terraform produced.
    assert_eq!(results[0]["outputs"]["token"]["sensitive"], true);
    let opened = tests::open_sealed(&results[0], &identity);
    let digest = state_backends::sha256_hex(canary.as_bytes());
    assert_eq!(
        opened,
        [
            ("token".to_owned(), json!(canary)),
            ("token_digest".to_owned(), json!(digest))
        ]
        .into()
    );
    assert!(!results[0].to_string().contains(&digest), "{}", results[0]);
    let raw = S3Store::from_sdk(
        &aws::sdk_config().await,
        true,
        S3Config {
            bucket: w.bucket.clone(),
            prefix: String::new(),
            lease: LeaseMode::LockObject,
            kms_key_id: None,
        },
    )
    .unwrap()
    .into_bucket();
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
    // The output terraform derived (no redaction knows it) is in the states only, too.
    let derived = tests::canary_in_states(
        &raw,
        "states/acme/canary/",
        &digest,
        "testcloud_network.leak",
    )
    .await;
    assert!(derived > 0, "the state holds the derived output");
    drop(function);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("canary-1"), "the function logged the job");
    assert!(!log.contains(canary), "the function's log holds the secret");
    assert!(
        !log.contains(&digest),
        "the function's log holds the derived output"
    );
}

/// `terrace submit --to sqs://…` puts a job on the jobs queue as a platform would; the Lambda
/// runs it, and `--follow` streams its log from the customer's bucket and ends with its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_to_the_sqs_queue_runs_on_the_lambda_and_is_followed_to_its_result() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let path = w.sb.job(
        "submit.yaml",
        // Short enough for the invocation's time left (a longer one is handed to ECS).
        &tests::demo_job("sub-sqs-1", "submitted", "apply", "demo", 1)
            .replace("timeout: 5m", "timeout: 2m"),
    );
    let queue = format!("sqs://{}", w.jobs.split_once("://").unwrap().1);
    let follow =
        w.sb.terrace()
            .env("AWS_ENDPOINT_URL", aws::moto())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("TERRACE_S3_FORCE_PATH_STYLE", "1")
            .env(
                "TERRACE_STORE",
                format!("s3://{}/states?region=us-east-1", w.bucket),
            )
            .args(["submit", path.to_str().unwrap(), "--to", &queue, "--follow"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
    // The Lambda's event source: the message as the queue holds it.
    let event = w.receive(1, 60).await;
    let body: Value = serde_json::from_str(event["Records"][0]["body"].as_str().unwrap()).unwrap();
    tests::schema::check("job-message", &body);
    assert_eq!(body["job"]["id"], "sub-sqs-1");
    assert!(
        body.get("target").is_none(),
        "the registry names the customer"
    );
    let response = api.invoke(event, Duration::from_secs(300)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let out = tokio::task::spawn_blocking(move || follow.wait_with_output().unwrap())
        .await
        .unwrap();
    tests::assert_followed_to_success(&out);
    let results = w.results().await;
    assert_eq!(results[0]["job_id"], "sub-sqs-1");
    assert_eq!(results[0]["status"], "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqs_batch_runs_its_jobs_and_queues_the_busy_one_again_for_later() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let store = w.store().await;

    // Another job holds lam-b.
    let lam_b: WorkspaceId = "acme/lam-b".parse().unwrap();
    let other = store
        .acquire_lease(
            &lam_b,
            &LeaseRequest {
                owner: "other-job".into(),
                ttl: Duration::from_secs(600),
                info: Value::Null,
            },
        )
        .await
        .unwrap();

    // Whoever can enqueue tries another bucket with an ExternalId of their own, and a tenant
    // the function does not know.
    let mut elsewhere: Value = serde_json::from_str(&w.envelope("d-1", "lam-d", "5m")).unwrap();
    elsewhere["target"] = w.target();
    elsewhere["target"]["bucket"] = json!("someone-elses-bucket");
    elsewhere["target"]["external_id"] = json!("guessed");
    let mut unknown: Value = serde_json::from_str(&w.envelope("e-1", "lam-e", "5m")).unwrap();
    unknown["job"]["tenant"] = json!("mallory");
    let bodies = [
        w.envelope("a-1", "lam-a", "5m"),
        w.envelope("b-1", "lam-b", "5m"),
        "this is not a job".to_owned(),
        elsewhere.to_string(),
        unknown.to_string(),
    ];
    let (event, ids) = w.batch(&bodies).await;
    let response = api
        .invoke(event, Duration::from_secs(14 * 60))
        .await
        .expect("the batch is answered");
    // Nothing is returned: the busy one is queued again as a fresh message (so waiting does not
    // count towards the queue's maxReceiveCount), delayed until the lease holding it runs out
    // (SQS caps a delay at 15 minutes).
    assert!(failures(&response).is_empty(), "{response}");
    let attributes = w
        .sqs
        .get_queue_attributes()
        .queue_url(&w.jobs)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .unwrap();
    let delayed = attributes
        .attributes()
        .and_then(|a| {
            a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        })
        .cloned();
    assert_eq!(delayed.as_deref(), Some("1"), "{attributes:?}");

    // A ran: its result is on the results queue, its versions and log are in the bucket.
    let results = w.results().await;
    let find = |pred: &dyn Fn(&Value) -> bool| results.iter().find(|r| pred(r)).cloned();
    let a = find(&|r| r["job_id"] == "a-1").expect("a-1's result");
    assert_eq!(a["status"], "succeeded", "{a}");
    let keys = w.keys("states/acme/lam-a/").await;
    assert!(
        keys.iter()
            .any(|k| k.ends_with("versions/0000000001.tfstate")),
        "{keys:?}"
    );
    assert!(keys.iter().any(|k| k.contains("runs/a-1/log/")), "{keys:?}");
    assert!(
        keys.iter().any(|k| k.ends_with("runs/a-1/result.json")),
        "{keys:?}"
    );
    // The two bad messages were answered with errors, not retried.
    let not_json =
        find(&|r| r["message_id"] == ids[2].as_str()).expect("a rejection for the garbage");
    assert_eq!(not_json["status"], "rejected");
    assert!(
        not_json["errors"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("not a job envelope")
    );
    let fields = |r: &Value| -> Vec<String> {
        r["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap().to_owned())
            .collect()
    };
    let elsewhere = find(&|r| r["message_id"] == ids[3].as_str())
        .expect("a rejection for the target that is not the tenant's");
    assert_eq!(
        fields(&elsewhere),
        ["target.bucket", "target.external_id"],
        "{elsewhere}"
    );
    assert!(
        !elsewhere.to_string().contains(&w.bucket),
        "the rejection names the registered bucket: {elsewhere}"
    );
    let unknown = find(&|r| r["message_id"] == ids[4].as_str())
        .expect("a rejection for the unregistered tenant");
    assert_eq!(fields(&unknown), ["tenant"], "{unknown}");
    assert!(
        w.keys("states/acme/lam-d/").await.is_empty() && w.keys("states/mallory/").await.is_empty(),
        "nothing of the refused jobs was written"
    );
    assert_eq!(results.len(), 4, "{results:?}");
    // So SQS does not hand it straight back.
    let visible = w
        .sqs
        .receive_message()
        .queue_url(&w.jobs)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    assert!(visible.messages().is_empty());

    // The same job delivered again does not run again …
    let versions = store
        .versions(&"acme/lam-a".parse().unwrap())
        .await
        .unwrap()
        .len();
    let (again, _) = w.batch(&[w.envelope("a-1", "lam-a", "5m")]).await;
    let response = api
        .invoke(again, Duration::from_secs(14 * 60))
        .await
        .unwrap();
    assert!(failures(&response).is_empty());
    assert_eq!(
        store
            .versions(&"acme/lam-a".parse().unwrap())
            .await
            .unwrap()
            .len(),
        versions
    );
    // … and reports its result again: a platform whose first report was lost still hears.
    let repeated = w.results().await;
    assert_eq!(repeated.len(), 1, "{repeated:?}");
    assert_eq!(repeated[0], a, "the same result, not a new run's");

    // Once the lease is free, B runs.
    store.release_lease(&lam_b, &other).await.unwrap();
    let (retry, _) = w.batch(&[w.envelope("b-1", "lam-b", "5m")]).await;
    let response = api
        .invoke(retry, Duration::from_secs(14 * 60))
        .await
        .unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let b = w.results().await;
    assert_eq!(b[0]["job_id"], "b-1");
    assert_eq!(b[0]["status"], "succeeded");

    // The scheduled backup sweep copies the two workspaces that changed.
    let sweep = api
        .invoke(
            json!({ "terrace": "backup-sweep" }),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    tests::schema::check("sweep-report", &sweep);
    assert_eq!(sweep["buckets"][0]["backed_up"], 2, "{sweep}");
}

/// The name of the cluster in a workspace's current state.
async fn cluster_in(store: &dyn StateStore, ws: &WorkspaceId) -> String {
    let current = store.current(ws).await.unwrap().expect("a state");
    let state: Value = serde_json::from_slice(&current.data).unwrap();
    state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["type"] == "testcloud_cluster")
        .expect("a cluster")["instances"][0]["attributes"]["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Runs in order on the SQS path: A (sequence 1) finds its workspace busy and goes back on the
/// queue; B (sequence 2) gets the workspace and runs; A's copy comes back and never runs: it is
/// `superseded`, naming B, and the state keeps B's configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_request_back_from_the_queue_after_a_later_one_ran_is_superseded() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let store = w.store().await;
    let ws: WorkspaceId = "acme/lam-order".parse().unwrap();
    let other = store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "other-job".into(),
                ttl: Duration::from_secs(600),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    let body = |id: &str, cluster: &str, sequence: u64| {
        let mut v: Value = serde_json::from_str(&w.envelope(id, "lam-order", "5m")).unwrap();
        v["job"]["sequence"] = json!(sequence);
        v["job"]["variables"]["cluster_name"] = json!(cluster);
        v.to_string()
    };
    let a = body("ord-a", "alpha", 1);
    assert!(
        w.answer(&api, std::slice::from_ref(&a)).await.is_empty(),
        "A waits"
    );
    store.release_lease(&ws, &other).await.unwrap();

    let b = w.answer(&api, &[body("ord-b", "beta", 2)]).await;
    assert_eq!(b[0]["status"], "succeeded", "{b:?}");
    assert_eq!(cluster_in(&store, &ws).await, "beta");
    let versions = store.versions(&ws).await.unwrap().len();

    // A's copy (the body the requeue put back) comes back.
    let a = w.answer(&api, &[a]).await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["job_id"], "ord-a");
    assert_eq!(a[0]["status"], "superseded", "{a:?}");
    assert_eq!(
        a[0]["superseded_by"],
        json!({ "job_id": "ord-b", "sequence": 2 })
    );
    assert_eq!(cluster_in(&store, &ws).await, "beta", "A ran");
    assert_eq!(store.versions(&ws).await.unwrap().len(), versions);
}

/// A cancel on the jobs queue, for the tenant's own job: the job, delivered afterwards, never
/// runs; a cancel for a tenant the registry does not know is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_the_queue_stops_the_tenants_queued_job() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let cancel = |tenant: &str| {
        json!({ "cancel": { "job": "cx-1", "tenant": tenant, "workspace": "lam-cancel" } })
            .to_string()
    };
    let answers = w.answer(&api, &[cancel("acme"), cancel("mallory")]).await;
    let of = |tenant: &str| {
        answers
            .iter()
            .find(|a| {
                a["cancel"]["tenant"] == tenant || a["status"] == "rejected" && tenant == "mallory"
            })
            .cloned()
            .unwrap_or_else(|| panic!("no answer for {tenant}: {answers:?}"))
    };
    assert_eq!(of("acme")["status"], "cancel-requested", "{answers:?}");
    assert_eq!(of("mallory")["status"], "rejected", "{answers:?}");

    let job = w
        .answer(&api, &[w.envelope("cx-1", "lam-cancel", "5m")])
        .await;
    assert_eq!(job[0]["job_id"], "cx-1", "{job:?}");
    assert_eq!(job[0]["status"], "cancelled", "{job:?}");
    assert_eq!(job[0]["error"]["step"], "start", "{job:?}");
    let store = w.store().await;
    let ws: WorkspaceId = "acme/lam-cancel".parse().unwrap();
    assert!(store.versions(&ws).await.unwrap().is_empty(), "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_sweep_queues_a_check_per_workspace_that_runs_once_and_finds_the_drift() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let fleet = json!({
        "job": {
            "id": "f-1", "tenant": "acme", "workspace": "drifty", "operation": "apply",
            "template": { "name": "fleet", "version": "1.0.0" },
            "variables": { "networks": ["a", "b"] }, "timeout": "5m",
        },
        "target": w.target(),
    })
    .to_string();
    let (event, _) = w
        .batch(&[fleet, w.envelope("s-1", "secretive", "5m")])
        .await;
    let response = api.invoke(event, Duration::from_secs(600)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let applied = w.results().await;
    assert_eq!(applied.len(), 2);
    assert!(
        applied.iter().all(|r| r["status"] == "succeeded"),
        "{applied:?}"
    );

    let sweep = api
        .invoke(
            json!({ "terrace": "drift-sweep", "tenants": ["acme"] }),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    tests::schema::check("sweep-report", &sweep);
    let report = &sweep["buckets"][0];
    assert_eq!(report["queued"], 1, "{sweep}");
    assert_eq!(
        report["needs_secrets"],
        json!([{ "workspace": "acme/secretive", "sensitive_variables": ["admin_password"] }]),
        "the demo template's admin_password is masked in the record: the platform sends that check"
    );
    assert_eq!(report["failed"], json!([]));

    // Network b goes away out of band.
    let (path, _) =
        w.sb.cloud_files()
            .into_iter()
            .find(|(p, c)| p.starts_with("network/") && c.contains("\"b\""))
            .expect("network b in the cloud");
    std::fs::remove_file(w.sb.cloud.join(path)).unwrap();

    let check = w.receive(1, 60).await;
    let queued: Value =
        serde_json::from_str(check["Records"][0]["body"].as_str().unwrap()).unwrap();
    tests::schema::check("job-message", &queued);
    assert_eq!(queued["job"]["operation"], "drift-check");
    assert_eq!(
        queued["job"]["variables"],
        json!({ "networks": ["a", "b"] })
    );
    let response = api
        .invoke(check.clone(), Duration::from_secs(600))
        .await
        .unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let results = w.results().await;
    assert_eq!(results.len(), 1, "{results:?}");
    let drift = &results[0];
    assert_eq!(drift["status"], "succeeded", "{drift}");
    assert_eq!(drift["workspace"], "drifty");
    assert!(drift["job_id"].as_str().unwrap().starts_with("drift-"));
    assert_eq!(drift["drift"], true, "{drift}");

    // The same check delivered again (a repeated sweep within the hour) does not run again.
    let response = api.invoke(check, Duration::from_secs(600)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    // It runs once; the same result is reported again.
    let repeated = w.results().await;
    assert_eq!(repeated.len(), 1, "{repeated:?}");
    assert_eq!(
        &repeated[0], drift,
        "the earlier check's result, not a new one"
    );
    let store = w.store().await;
    let ws: WorkspaceId = "acme/drifty".parse().unwrap();
    assert_eq!(
        store.versions(&ws).await.unwrap().len(),
        1,
        "a drift check only reads the state"
    );
}

/// A job whose provisioner tries to read the runner's environment (see the `probe` template).
fn probe_job(id: &str, name: &str) -> String {
    json!({
        "job": {
            "id": id, "tenant": "acme", "workspace": name, "operation": "apply",
            "template": { "name": "probe", "version": "1.0.0" },
            "variables": { "name": name }, "timeout": "5m",
        },
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioner_gets_nothing_of_the_functions_own_credentials() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    // What Lambda and ECS put in a function's environment, besides the keys above.
    let _function = w.start_with(
        &api,
        &[
            ("AWS_SESSION_TOKEN", "function-session-token"),
            (
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "/v2/credentials/function-guid",
            ),
        ],
    );
    // Two jobs of one batch, run side by side.
    let (event, _) = w
        .batch(&[
            probe_job("p-1", "lam-probe"),
            probe_job("p-2", "lam-probe-2"),
        ])
        .await;
    let response = api.invoke(event, Duration::from_secs(600)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let results = w.results().await;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        results.iter().all(|r| r["status"] == "succeeded"),
        "{results:?}"
    );
    // The config file of the job's own broker: its credential_process serves the customer's
    // session only.
    let broker = ["AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"];
    let root = nix::unistd::geteuid().is_root();
    let one =
        w.sb.assert_probe_got_nothing("lam-probe", &[], &broker, root);
    let two =
        w.sb.assert_probe_got_nothing("lam-probe-2", &[], &broker, root);
    if root {
        assert_ne!(one, two, "jobs side by side run as users of their own");
    }
}

/// On Lambda the function is not root: every job's terraform runs as the function's own user.
/// A job of one tenant leaves a process behind that searches every workdir and process it can
/// read; the next invocation runs another tenant's job with a sensitive canary. The leftover
/// is killed when its job ends, before the next may start, and never sees the canary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_tenants_job_leaves_running_never_sees_the_next_tenants_job() {
    use std::os::unix::process::CommandExt;
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let mut registered = w.target();
    registered["external_id"] = json!("ext-7f3a");
    let mut other = registered.clone();
    other["prefix"] = json!("beta-states");
    let tenants = json!({ "acme": registered, "beta": other }).to_string();
    let root = nix::unistd::geteuid().is_root();
    assert!(
        root || std::env::var_os("CI").is_none(),
        "CI runs as root, to run the function as a user of its own"
    );
    // A uid of the function's own, as Lambda gives it (no other process of it on the machine).
    let mut cmd = w.lambda_command(&api);
    cmd.env("TERRACE_TENANTS", &tenants)
        .stdout(Stdio::null())
        .stderr(log_output());
    if root {
        cmd.uid(60999).gid(60999);
    }
    let _function = Function(cmd.spawn().expect("terrace-aws starts"));
    let job = |id: &str, tenant: &str, name: &str, secret: &str| {
        json!({
            "job": {
                "id": id, "tenant": tenant, "workspace": name, "operation": "apply",
                "template": { "name": "lurker", "version": "1.0.0" },
                "variables": { "name": name, "secret": secret }, "timeout": "5m",
            },
        })
        .to_string()
    };
    let leftover = |name: &str| -> i32 {
        let report = std::fs::read_to_string(w.sb.cloud.join(format!("{name}-lurker.txt")))
            .expect("the lurker's record");
        report
            .lines()
            .find_map(|l| l.strip_prefix("leftover="))
            .and_then(|pid| pid.parse().ok())
            .expect("its pid")
    };
    let alive = tests::alive;
    let run = async |body: String, name: &str| -> i32 {
        let (event, _) = w.batch(&[body]).await;
        // Time enough left that the job runs here, not in a task.
        let response = api.invoke(event, Duration::from_secs(600)).await.unwrap();
        assert!(failures(&response).is_empty(), "{response}");
        let results = w.results().await;
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results[0]["status"], "succeeded", "{results:?}");
        leftover(name)
    };
    let first = run(job("lurk-1", "acme", "lurk-a", ""), "lurk-a").await;
    // A SIGKILL takes effect when the process is next scheduled: a moment on a busy machine.
    let mut still = alive(first);
    for _ in 0..20 {
        if !still {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        still = alive(first);
    }
    let canary = format!("canary-{:016x}", rand::random::<u64>());
    let second = run(job("lurk-2", "beta", "lurk-b", &canary), "lurk-b").await;
    let loot = std::fs::read_to_string(w.sb.cloud.join("lurk-a-loot.txt")).unwrap();
    let rounds = std::fs::read_to_string(w.sb.cloud.join("lurk-a-lurker.txt"))
        .unwrap()
        .lines()
        .filter(|l| *l == "round")
        .count();
    let second_alive = alive(second);
    for pid in [first, second] {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(rounds >= 1, "the leftover never searched");
    assert!(
        !loot.contains(&canary),
        "acme's leftover read beta's secret: {loot}"
    );
    assert!(
        !still,
        "what acme's job left running (pid {first}) outlived its job: {rounds} searches"
    );
    assert!(
        !second_alive,
        "what beta's job left running outlived its job"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_gets_a_session_of_its_own_through_credential_process_never_static_keys() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let body = json!({
        "job": {
            "id": "c-1", "tenant": "acme", "workspace": "creds", "operation": "apply",
            "template": { "name": "awscreds", "version": "1.0.0" },
            "variables": { "name": "probe" }, "timeout": "5m",
        },
        "target": w.target(),
    })
    .to_string();
    let (event, _) = w.batch(&[body]).await;
    let response = api.invoke(event, Duration::from_secs(600)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let results = w.results().await;
    assert_eq!(results[0]["status"], "succeeded", "{results:?}");

    let read = |name: &str| std::fs::read_to_string(w.sb.cloud.join(name)).unwrap();
    let first: Value = serde_json::from_str(&read("probe-first.json")).expect("a document");
    assert_eq!(first["Version"], 1);
    let key = first["AccessKeyId"].as_str().unwrap();
    assert!(
        !key.is_empty() && key != "testing",
        "an assumed session, not the function's own key: {key}"
    );
    assert!(
        first["SessionToken"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    let expires = time::OffsetDateTime::parse(
        first["Expiration"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert!(
        expires > time::OffsetDateTime::now_utc() + Duration::from_secs(14 * 60),
        "a session for the job (at least STS's 15 min): {expires}"
    );
    let second: Value = serde_json::from_str(&read("probe-second.json")).unwrap();
    assert_eq!(
        second, first,
        "a fresh session is reused, not assumed again per call"
    );

    let names = read("probe-env.txt");
    let names: Vec<&str> = names.lines().collect();
    for needed in [
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_REGION",
    ] {
        assert!(names.contains(&needed), "{needed} in {names:?}");
    }
    for leaked in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        assert!(
            !names.contains(&leaked),
            "terraform saw {leaked}: {names:?}"
        );
    }
    assert!(
        read("probe-refused.txt").contains("401"),
        "a wrong token gets nothing: {}",
        read("probe-refused.txt")
    );

    // A session with less left than the function's threshold is replaced: with a threshold
    // longer than any session, every call assumes the role again.
    drop(_function);
    let api = RuntimeApi::start().await;
    let _function = w.start_with(&api, &[("TERRACE_REFRESH_CREDENTIALS_BEFORE", "7200")]);
    let body = json!({
        "job": {
            "id": "c-2", "tenant": "acme", "workspace": "creds-2", "operation": "apply",
            "template": { "name": "awscreds", "version": "1.0.0" },
            "variables": { "name": "refreshed" }, "timeout": "5m",
        },
        "target": w.target(),
    })
    .to_string();
    let (event, _) = w.batch(&[body]).await;
    api.invoke(event, Duration::from_secs(600)).await.unwrap();
    assert_eq!(w.results().await[0]["status"], "succeeded");
    let one: Value = serde_json::from_str(&read("refreshed-first.json")).unwrap();
    let two: Value = serde_json::from_str(&read("refreshed-second.json")).unwrap();
    assert_ne!(one["AccessKeyId"], two["AccessKeyId"], "a new session");

    // The provisioner printed the session: its secrets are masked in every line stored.
    let secret = first["SecretAccessKey"].as_str().unwrap();
    let token = first["SessionToken"].as_str().unwrap();
    let s3 = aws::s3().await;
    let mut masked = false;
    for key in w.keys("states/acme/creds/runs/c-1/").await {
        let object = s3
            .get_object()
            .bucket(&w.bucket)
            .key(&key)
            .send()
            .await
            .unwrap();
        let bytes = object.body.collect().await.unwrap().into_bytes();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(secret), "{key} holds the session's secret");
        assert!(!text.contains(token), "{key} holds the session's token");
        masked |= key.contains("/log/") && text.contains(shared::job::redact::MASK);
    }
    assert!(masked, "the printed session was logged, masked");
}

/// moto's ECS with the cluster and task definition [`World::command`] names.
async fn ecs() -> aws_sdk_ecs::Client {
    use aws_sdk_ecs::types::{Compatibility, ContainerDefinition, NetworkMode};
    let ecs = aws_sdk_ecs::Client::new(&aws::sdk_config().await);
    ecs.create_cluster()
        .cluster_name("terrace")
        .send()
        .await
        .unwrap();
    ecs.register_task_definition()
        .family("terrace")
        .requires_compatibilities(Compatibility::Fargate)
        .network_mode(NetworkMode::Awsvpc)
        .cpu("1024")
        .memory("2048")
        .container_definitions(
            ContainerDefinition::builder()
                .name("terrace")
                .image("123456789012.dkr.ecr.us-east-1.amazonaws.com/terrace:latest")
                // moto sums the containers' memory to place the task.
                .memory(2048)
                .cpu(1024)
                .build(),
        )
        .send()
        .await
        .unwrap();
    ecs
}

impl World {
    /// The jobs queue's messages: (visible, in flight).
    async fn on_jobs_queue(&self) -> (u64, u64) {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let got = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.jobs)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        let n = |a: A| got.attributes().unwrap()[&a].parse().unwrap();
        (
            n(A::ApproximateNumberOfMessages),
            n(A::ApproximateNumberOfMessagesNotVisible),
        )
    }

    /// The `TERRACE_JOB_REF` of the ECS task started for the hand-off `record` reports.
    async fn task_reference(&self, ecs: &aws_sdk_ecs::Client, record: &Value) -> String {
        let task_arn = record["task_arn"].as_str().unwrap();
        let tasks = ecs
            .describe_tasks()
            .cluster("terrace")
            .tasks(task_arn)
            .send()
            .await
            .unwrap();
        let container = &tasks.tasks()[0].overrides().unwrap().container_overrides()[0];
        container.environment()[0].value().unwrap().to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_the_lambda_has_left_is_handed_to_ecs_and_the_task_runs_it() {
    let w = World::new().await;
    let ecs = ecs().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);

    // 60 s before the deadline, less the 45 s margin: a 10-minute job does not fit.
    let body = w.envelope("long-1", "lam-long", "10m");
    let (event, ids) = w.batch(std::slice::from_ref(&body)).await;
    let response = api.invoke(event, Duration::from_secs(60)).await.unwrap();
    // The message stays on the queue, out of sight, for the task to settle.
    assert_eq!(failures(&response), [ids[0].as_str()], "{response}");
    assert_eq!(w.on_jobs_queue().await, (0, 1));
    let handed = w.results().await;
    assert_eq!(handed[0]["status"], "handed-off", "{handed:?}");
    let task_arn = handed[0]["task_arn"].as_str().unwrap().to_owned();

    let tasks = ecs
        .describe_tasks()
        .cluster("terrace")
        .tasks(&task_arn)
        .send()
        .await
        .unwrap();
    let task = &tasks.tasks()[0];
    assert_eq!(task.started_by(), Some("long-1"));
    let container = &task.overrides().unwrap().container_overrides()[0];
    assert_eq!(container.name(), Some("terrace"));
    assert_eq!(container.command(), ["terrace-aws", "task"]);
    let env = &container.environment()[0];
    assert_eq!(env.name(), Some("TERRACE_JOB_REF"));
    let reference: Value = serde_json::from_str(env.value().unwrap()).unwrap();
    assert_eq!(reference["job_id"], "long-1");
    assert!(reference["receipt"].is_string(), "{reference}");
    assert_eq!(reference["target"]["bucket"], w.bucket.as_str());
    // The job's variables stay out of ECS's API: they are staged in the customer's bucket.
    assert!(!env.value().unwrap().contains("correct-horse-battery"));
    let staged = aws::s3()
        .await
        .get_object()
        .bucket(&w.bucket)
        .key(format!(
            "states/acme/lam-long/runs/long-1/{}",
            reference["staged"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(staged, body.as_bytes());

    // The task's entry point runs the same job here.
    let status = w
        .command()
        .arg("task")
        .env("TERRACE_JOB_REF", env.value().unwrap())
        .stdout(Stdio::null())
        .stderr(log_output())
        .status()
        .unwrap();
    assert!(status.success());
    let result = w.results().await;
    assert_eq!(result[0]["job_id"], "long-1");
    assert_eq!(result[0]["status"], "succeeded", "{result:?}");
    let store = w.store().await;
    let ws: WorkspaceId = "acme/lam-long".parse().unwrap();
    assert!(store.current(&ws).await.unwrap().is_some());
    // The staged message held the job's variables: it is gone once the job is done.
    let left = store.artifacts(&ws, "long-1").await.unwrap();
    assert!(left.contains(&"result.json".to_owned()), "{left:?}");
    assert!(!left.iter().any(|a| a.starts_with("request")), "{left:?}");
    // The task deleted the message once the job had its result.
    assert_eq!(w.on_jobs_queue().await, (0, 0));
}

/// The ECS hand-off keeps the job's message until a task settles it: a task that never starts
/// its code, and one killed mid-job (as an OOM kill does), leave the message to come back, and
/// the job runs once a task gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_job_whose_task_never_starts_or_is_killed_comes_back_and_runs() {
    use std::os::unix::process::ExitStatusExt;
    let w = World::new().await;
    let ecs = ecs().await;
    let api = RuntimeApi::start().await;
    let _function = w.start_with(&api, &[("TERRACE_ECS_START_WINDOW", "3")]);
    let body = w.envelope("lost-1", "lam-lost", "10m");
    let (event, ids) = w.batch(std::slice::from_ref(&body)).await;
    let response = api.invoke(event, Duration::from_secs(60)).await.unwrap();
    assert_eq!(failures(&response), [ids[0].as_str()], "{response}");
    let handed = w.results().await;
    assert_eq!(handed[0]["status"], "handed-off", "{handed:?}");

    // 1. ECS never ran the task's code: past the start window the message is back.
    assert_eq!(w.on_jobs_queue().await, (0, 1), "out of sight first");
    let event = w.receive(1, 60).await;
    assert_eq!(event["Records"][0]["body"], body.as_str());
    assert_eq!(event["Records"][0]["messageId"], ids[0].as_str());

    // 2. The second hand-off's task takes the job and is killed mid-apply (each create takes
    //    4 s): it kept the message out of sight for 4 s at a time, so it comes back soon.
    let response = api.invoke(event, Duration::from_secs(60)).await.unwrap();
    assert_eq!(failures(&response), [ids[0].as_str()], "{response}");
    let handed = w.results().await;
    let reference = w.task_reference(&ecs, &handed[0]).await;
    let mut task = w
        .command()
        .arg("task")
        .env("TERRACE_JOB_REF", &reference)
        .env("TERRACE_KEEP_INVISIBLE_EVERY", "1")
        .env(
            "TERRACE_PASS_ENV",
            "TESTCLOUD_ROOT,TESTCLOUD_CREATE_DELAY_MS",
        )
        .env("TESTCLOUD_CREATE_DELAY_MS", "4000")
        .stdout(Stdio::null())
        .stderr(log_output())
        .spawn()
        .unwrap();
    let store = w.store().await;
    let ws: WorkspaceId = "acme/lam-lost".parse().unwrap();
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    while store.lease(&ws).await.unwrap().is_none() {
        assert!(
            std::time::Instant::now() < give_up,
            "the task never took the lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the start window: only the task keeps the message out of sight now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(w.on_jobs_queue().await, (0, 1), "the running task keeps it");
    task.kill().unwrap();
    assert_eq!(task.wait().unwrap().signal(), Some(9));
    let event = w.receive(1, 60).await;
    assert_eq!(event["Records"][0]["body"], body.as_str());
    assert!(w.results().await.is_empty(), "no result for a killed task");

    // 3. Once the killed task's lease runs out (10 s), a third task runs the job to the end
    //    and deletes the message.
    let response = api.invoke(event, Duration::from_secs(60)).await.unwrap();
    assert_eq!(failures(&response), [ids[0].as_str()], "{response}");
    let handed = w.results().await;
    let reference = w.task_reference(&ecs, &handed[0]).await;
    let status = w
        .command()
        .arg("task")
        .env("TERRACE_JOB_REF", &reference)
        .stdout(Stdio::null())
        .stderr(log_output())
        .status()
        .unwrap();
    assert!(status.success());
    let result = w.results().await;
    assert_eq!(result.len(), 1, "{result:?}");
    assert_eq!(result[0]["job_id"], "lost-1");
    assert_eq!(result[0]["status"], "succeeded", "{result:?}");
    assert_eq!(w.on_jobs_queue().await, (0, 0), "settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_jobs_message_stays_invisible_until_the_job_is_done() {
    let w = World::new().await;
    let api = Arc::new(RuntimeApi::start().await);
    // Each create takes 4 s, the job about 10 s; the message was received invisible for 3 s
    // only, and the function extends that every second.
    let _function = w.start_with(
        &api,
        &[
            ("TERRACE_KEEP_INVISIBLE_EVERY", "1"),
            (
                "TERRACE_PASS_ENV",
                "TESTCLOUD_ROOT,TESTCLOUD_CREATE_DELAY_MS",
            ),
            ("TESTCLOUD_CREATE_DELAY_MS", "4000"),
        ],
    );
    let (event, _) = w
        .batch_invisible_for(&[w.envelope("slow-1", "lam-slow", "5m")], 3)
        .await;
    let invocation = {
        let api = api.clone();
        tokio::spawn(async move { api.invoke(event, Duration::from_secs(14 * 60)).await })
    };
    let mut polls = 0;
    while !invocation.is_finished() {
        let seen = w
            .sqs
            .receive_message()
            .queue_url(&w.jobs)
            .visibility_timeout(0)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        assert!(
            seen.messages().is_empty(),
            "the running job's message became visible after {polls} s"
        );
        polls += 1;
    }
    let response = invocation.await.unwrap().unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    assert!(
        polls >= 6,
        "the job ran only about {polls} s: the test proves nothing"
    );
    let result = w.results().await;
    assert_eq!(result[0]["status"], "succeeded", "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_refuses_a_changed_staged_job_and_puts_a_busy_one_back_on_the_queue_to_run_later() {
    let w = World::new().await;
    let store = w.store().await;
    let ws: WorkspaceId = "acme/lam-task".parse().unwrap();
    let body = w.envelope("t-1", "lam-task", "5m");
    // Staged as the Lambda stages a job it hands off, with the reference it gives the task.
    let stage = |bytes: Vec<u8>| {
        let (store, ws) = (&store, &ws);
        async move {
            store
                .put_artifact(ws, "t-1", "request.json", bytes.into())
                .await
                .unwrap();
        }
    };
    stage(body.clone().into_bytes()).await;
    let reference = json!({
        "target": w.target(), "tenant": "acme", "workspace": "lam-task", "job_id": "t-1",
        "sha256": state_backends::sha256_hex(body.as_bytes()),
    })
    .to_string();
    let task = |wait: &str| {
        w.command()
            .arg("task")
            .env("TERRACE_JOB_REF", &reference)
            .env("TERRACE_TASK_LEASE_WAIT", wait)
            .stdout(Stdio::null())
            .stderr(log_output())
            .status()
            .unwrap()
    };

    // Someone who can write to the bucket changes the staged job: refused, reported, not run.
    let mut changed: Value = serde_json::from_str(&body).unwrap();
    changed["job"]["variables"]["node_count"] = json!(20);
    stage(changed.to_string().into_bytes()).await;
    let status = task("0");
    assert_eq!(status.code(), Some(65), "{status:?}");
    let refused = w.results().await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["status"], "rejected");
    assert_eq!(refused[0]["job_id"], "t-1");
    let problem = refused[0]["errors"][0]["problem"].as_str().unwrap();
    assert!(problem.contains("changed after it was staged"), "{problem}");
    assert!(store.current(&ws).await.unwrap().is_none(), "nothing ran");
    assert!(w.sb.cloud_names().is_empty(), "nothing was created");

    // Staged as it was, but another job holds the workspace past the task's wait: the job goes
    // back on the jobs queue, delayed until that lease should end, and its staged copy goes.
    stage(body.clone().into_bytes()).await;
    store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "other-job".into(),
                ttl: Duration::from_secs(6),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    let status = task("1");
    assert!(status.success(), "{status:?}");
    assert!(w.results().await.is_empty(), "no result yet: it runs later");
    assert!(
        !store
            .artifacts(&ws, "t-1")
            .await
            .unwrap()
            .contains(&"request.json".to_owned()),
        "the staged copy with the job's variables is gone"
    );
    // Not at once: the copy is delayed until the holder's lease ends (it is not renewed).
    let early = w
        .sqs
        .receive_message()
        .queue_url(&w.jobs)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    assert!(early.messages().is_empty(), "{early:?}");

    // Then it comes back and runs like any job.
    let event = w.receive(1, 60).await;
    assert_eq!(event["Records"][0]["body"], body.as_str());
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let response = api.invoke(event, Duration::from_secs(600)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let ran = w.results().await;
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0]["job_id"], "t-1");
    assert_eq!(ran[0]["status"], "succeeded", "{ran:?}");
    assert!(store.current(&ws).await.unwrap().is_some());
}

/// The built image (`make images`), run as Lambda runs a container image: as a user of its
/// own, with every capability dropped and a read-only file system but `/tmp`. Nothing of the
/// host's terraform, templates or providers is in the container: what applies is the image's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs the built image: make test-images"]
async fn the_image_runs_a_job_as_lambda_runs_it() {
    use tests::image::{Container, image};
    let image = image("aws");
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _container = Container::run(
        &w.lambda_command(&api),
        &image,
        &[
            "--user=993:990",
            "--cap-drop=all",
            "--read-only",
            "--tmpfs=/tmp:rw,exec,mode=1777",
        ],
        &[],
    );
    let result = w.apply_one(&api, "img-1", "img").await;
    let cluster = result["outputs"]["cluster_id"]["value"]
        .as_str()
        .expect("the cluster's id among the outputs");
    assert!(
        w.sb.cloud_names().iter().any(|n| n.contains("img")),
        "the cluster {cluster} is in the test cloud: {:?}",
        w.sb.cloud_names()
    );
    let keys = w.keys("states/acme/img/").await;
    assert!(
        keys.iter()
            .any(|k| k.ends_with("versions/0000000001.tfstate")),
        "{keys:?}"
    );
    let log = w.keys("states/acme/img/runs/img-1/log/").await;
    assert!(!log.is_empty(), "the job's log is in the bucket");
    // The image's price books (/opt/terrace/price-books) priced the plan.
    assert_eq!(
        result["cost"]["price_books"][0]["name"], "testcloud",
        "{result}"
    );
}

/// The customer's side from the quick-create template (`deploy/aws/customer-quick-create.yaml`),
/// deployed into moto's CloudFormation as a customer would launch it; a job then runs through
/// `terrace-aws` against the bucket, table and role the stack made, registered from the
/// stack's outputs. (moto checks neither the role's trust policy nor the ExternalId: the
/// template's policies are checked by checkov and cfn-lint, and the ExternalId rule by the
/// function's own tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_against_the_bucket_table_and_role_the_quick_create_stack_made() {
    use aws_sdk_cloudformation::types::{Capability, Parameter, StackStatus};
    let w = World::new().await;
    let cfn = aws_sdk_cloudformation::Client::new(&aws::sdk_config().await);
    let template =
        std::fs::read_to_string(tests::repo_root().join("deploy/aws/customer-quick-create.yaml"))
            .expect("the quick-create template");
    let external_id = format!("ext-{}", aws::unique("stack"));
    let parameter = |key: &str, value: &str| {
        Parameter::builder()
            .parameter_key(key)
            .parameter_value(value)
            .build()
    };
    let stack = aws::unique("customer");
    cfn.create_stack()
        .stack_name(&stack)
        .template_body(template)
        .parameters(parameter(
            "RunnerRoleArn",
            "arn:aws:iam::123456789012:role/terrace-runner",
        ))
        .parameters(parameter("ExternalId", &external_id))
        .parameters(parameter("Prefix", "terrace"))
        .capabilities(Capability::CapabilityNamedIam)
        .send()
        .await
        .expect("the stack is created");
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    let outputs = loop {
        let described = cfn
            .describe_stacks()
            .stack_name(&stack)
            .send()
            .await
            .unwrap();
        let s = &described.stacks()[0];
        match s.stack_status() {
            Some(StackStatus::CreateComplete) => break s.outputs().to_vec(),
            Some(StackStatus::CreateInProgress) => {}
            other => panic!("the stack did not complete: {other:?} {s:?}"),
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the stack is still in progress"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let output = |key: &str| {
        outputs
            .iter()
            .find(|o| o.output_key() == Some(key))
            .and_then(|o| o.output_value())
            .unwrap_or_else(|| panic!("the stack's output {key}: {outputs:?}"))
            .to_owned()
    };
    let (role_arn, bucket, table) = (
        output("RoleArn"),
        output("BucketName"),
        output("LeaseTableName"),
    );
    assert_eq!(output("Prefix"), "terrace");
    assert_eq!(output("Region"), "us-east-1");
    // The bucket is encrypted, as the template says (moto's CloudFormation applies a bucket's
    // encryption but drops its versioning, public access block and lifecycle).
    let s3 = aws::s3().await;
    let encryption = s3
        .get_bucket_encryption()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    let rules = encryption
        .server_side_encryption_configuration()
        .map(|c| c.rules().len());
    assert_eq!(rules, Some(1), "{encryption:?}");

    // The operator registers the tenant from the stack's outputs and the ExternalId it gave.
    let tenants = json!({ "acme": {
        "role_arn": role_arn, "external_id": external_id, "bucket": bucket,
        "prefix": output("Prefix"), "lease_table": table, "region": output("Region"),
    }});
    let api = RuntimeApi::start().await;
    let tenants = tenants.to_string();
    let _function = w.start_with(&api, &[("TERRACE_TENANTS", &tenants)]);
    w.apply_one(&api, "cfn-1", "stack").await;

    let keys = keys_in(&bucket, "terrace/acme/stack/").await;
    assert!(
        keys.iter()
            .any(|k| k.ends_with("versions/0000000001.tfstate")),
        "the state is in the stack's bucket: {keys:?}"
    );
    let leases = aws::dynamodb()
        .await
        .scan()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    assert!(
        leases.count() > 0,
        "the workspace's lease (and fence) lives in the stack's table"
    );
}

/// The function's stderr is JSON lines only: its log, each event of a job in the job's span
/// (job id, tenant, workspace, operation) and a step's in the step's, and one CloudWatch EMF
/// record for the job, whose declared metrics are all there as numbers. With an OTLP endpoint
/// set, the spans are exported there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_stderr_is_json_lines_with_the_jobs_span_and_one_emf_record_and_otlp_gets_the_spans()
 {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let (collector, exports) = otlp_collector().await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = w
        .lambda_command(&api)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .expect("terrace-aws starts");
    let function = Function(child);
    let result = w.apply_one(&api, "obs-1", "obs").await;
    drop(function);
    // The results queue carries the workspace's move with the result.
    assert_eq!(
        (
            result["lifecycle"]["from"].as_str(),
            result["lifecycle"]["to"].as_str()
        ),
        (Some("provisioning"), Some("active")),
        "{result}"
    );
    let text = std::fs::read_to_string(log.path()).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let in_job: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["job_id"] == "obs-1" || l["spans"][0]["job_id"] == "obs-1")
        .collect();
    let ended = in_job
        .iter()
        .find(|l| l["fields"]["message"] == "job succeeded")
        .unwrap_or_else(|| panic!("no end of the job in its span: {text}"));
    let span = &ended["span"];
    assert_eq!(
        (
            span["tenant"].as_str(),
            span["workspace"].as_str(),
            span["operation"].as_str()
        ),
        (Some("acme"), Some("obs"), Some("apply")),
        "{ended}"
    );
    let steps: Vec<&str> = in_job
        .iter()
        .filter(|l| l["span"]["name"] == "step" && l["fields"]["duration_ms"].is_u64())
        .map(|l| l["span"]["step"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["init", "plan", "apply"], "{text}");

    let records: Vec<&Value> = lines
        .iter()
        .filter(|l| l["metric"] == "terrace.job")
        .collect();
    assert_eq!(records.len(), 1, "{text}");
    let r = records[0];
    assert_eq!(
        (
            r["job_id"].as_str(),
            r["operation"].as_str(),
            r["outcome"].as_str()
        ),
        (Some("obs-1"), Some("apply"), Some("succeeded"))
    );
    let directive = &r["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(directive["Namespace"], "Terrace");
    let names: Vec<&str> = directive["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap())
        .collect();
    for name in [
        "duration_ms",
        "attempts",
        "lease_wait_ms",
        "state_bytes",
        "step_apply_ms",
    ] {
        assert!(names.contains(&name), "{name} not declared: {r}");
    }
    for name in &names {
        assert!(r[name].is_u64(), "{name}: {r}");
    }
    assert!(r["state_bytes"].as_u64().unwrap() > 100, "{r}");
    assert!(
        !text.contains("correct-horse-battery"),
        "no secret in the function's log"
    );

    // The same spans went to the OTLP collector, sent before the batch was answered.
    let exports = exports.lock().unwrap();
    assert!(!exports.is_empty(), "no spans were exported");
    let all: Vec<u8> = exports.iter().flat_map(|(_, body)| body.clone()).collect();
    for (content_type, _) in exports.iter() {
        assert_eq!(content_type, "application/x-protobuf");
    }
    // Protobuf keeps strings as they are: the service, the span names and the job's fields.
    for needle in ["terrace-aws", "job", "step", "obs-1", "apply"] {
        assert!(
            all.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{needle} is not in the exported spans"
        );
    }
    assert!(
        !all.windows(21).any(|w| w == b"correct-horse-battery"),
        "no secret in the exported spans"
    );
}

/// An OTLP/HTTP collector on loopback that keeps what is posted to `/v1/traces`: its URL
/// (the base an exporter adds `/v1/traces` to) and the (content type, body) of each export.
async fn otlp_collector() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>,
) {
    let exports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = exports.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: bytes::Bytes| {
            let content_type = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            kept.lock().unwrap().push((content_type, body.to_vec()));
            async { axum::http::StatusCode::OK }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, exports)
}

/// Approved plans on the Lambda's path: the plan job's result on the results queue carries the
/// plan's own key (the S3 store here has no key of its own), the stored result does not, and
/// the apply that gives it back applies that plan; a second apply of it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_plan_is_planned_then_applied_once_through_sqs() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let job = |id: &str, extra: Value| {
        let mut job = json!({
            "id": id, "tenant": "acme", "workspace": "lam-approved",
            "template": { "name": "approval", "version": "1.0.0" },
            "variables": { "token": "tok-lambda-1" }, "timeout": "5m",
        });
        for (k, v) in extra.as_object().unwrap() {
            job[k] = v.clone();
        }
        json!({ "job": job }).to_string()
    };
    let planned = w
        .answer(
            &api,
            &[job(
                "lp-1",
                json!({ "operation": "plan",
                        "variables": { "name": "from-lambda", "secret": "s3cret-lambda", "token": "tok-lambda-1" } }),
            )],
        )
        .await;
    assert_eq!(planned[0]["status"], "succeeded", "{planned:?}");
    let key = planned[0]["plan"]["key"]
        .as_str()
        .expect("the key")
        .to_owned();
    let store = w.store().await;
    let ws: WorkspaceId = "acme/lam-approved".parse().unwrap();
    let stored = store
        .artifact(&ws, "lp-1", "result.json")
        .await
        .unwrap()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&stored).contains(&key),
        "the stored result keeps the plan's key"
    );
    assert!(
        store.versions(&ws).await.unwrap().is_empty(),
        "a plan applies nothing"
    );

    let apply = |id: &str| {
        job(
            id,
            json!({ "operation": "apply", "plan": "lp-1", "plan_key": key }),
        )
    };
    let applied = w.answer(&api, &[apply("la-1")]).await;
    assert_eq!(applied[0]["status"], "succeeded", "{applied:?}");
    assert_eq!(applied[0]["approved_plan"], "lp-1", "{applied:?}");
    assert_eq!(
        applied[0]["outputs"]["name"]["value"], "from-lambda",
        "{applied:?}"
    );
    assert_eq!(store.versions(&ws).await.unwrap().len(), 1);
    let again = w.answer(&api, &[apply("la-2")]).await;
    assert_eq!(again[0]["error"]["category"], "plan-refused", "{again:?}");
    assert_eq!(
        store.versions(&ws).await.unwrap().len(),
        1,
        "refused: nothing ran"
    );
}

/// A FIFO jobs queue (`MessageGroupId` = the workspace): a busy workspace's request waits at
/// the head of its group, never copied behind later ones, and the later request of the same
/// group in the batch is returned unhandled; once the workspace is free both run, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_fifo_queue_a_busy_workspaces_requests_wait_in_order_and_are_never_copied() {
    use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
    let mut w = World::new().await;
    w.jobs = w
        .sqs
        .create_queue()
        .queue_name(format!("{}.fifo", aws::unique("jobs")))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::ContentBasedDeduplication, "true")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_owned();
    let api = RuntimeApi::start().await;
    let _function = w.start(&api);
    let store = w.store().await;
    let ws: WorkspaceId = "acme/fifo".parse().unwrap();
    let held = store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "another-job".into(),
                ttl: Duration::from_secs(4),
                info: Value::Null,
            },
        )
        .await
        .unwrap();
    let message = |id: &str, cluster: &str, sequence: u64| {
        let mut m: Value = serde_json::from_str(&w.envelope(id, "fifo", "3m")).unwrap();
        m["job"]["sequence"] = json!(sequence);
        m["job"]["variables"]["cluster_name"] = json!(cluster);
        m.to_string()
    };
    for (id, cluster, sequence) in [("fa", "alpha", 1), ("fb", "beta", 2)] {
        w.sqs
            .send_message()
            .queue_url(&w.jobs)
            .message_body(message(id, cluster, sequence))
            .message_group_id("acme/fifo")
            .send()
            .await
            .unwrap();
    }
    let receive = || async {
        let mut records = Vec::new();
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while records.len() < 2 {
            assert!(std::time::Instant::now() < give_up, "{records:?}");
            let got = w
                .sqs
                .receive_message()
                .queue_url(&w.jobs)
                .max_number_of_messages(10)
                .visibility_timeout(60)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            for m in got.messages() {
                records.push(json!({
                    "messageId": m.message_id(), "receiptHandle": m.receipt_handle(),
                    "body": m.body(),
                    "attributes": { "ApproximateReceiveCount": "1", "MessageGroupId": "acme/fifo" },
                    "messageAttributes": {}, "md5OfBody": m.md5_of_body(),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:jobs.fifo",
                    "awsRegion": "us-east-1",
                }));
            }
        }
        json!({ "Records": records })
    };
    let first = receive().await;
    let ids: Vec<String> = first["Records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["messageId"].as_str().unwrap().to_owned())
        .collect();
    let response = api.invoke(first, Duration::from_secs(300)).await.unwrap();
    let mut returned = failures(&response);
    returned.sort();
    let mut both = ids.clone();
    both.sort();
    assert_eq!(returned, both, "both returned: {response}");
    assert!(w.results().await.is_empty(), "nothing ran");
    // No copy: the queue holds the two messages and nothing else.
    let attrs = w
        .sqs
        .get_queue_attributes()
        .queue_url(&w.jobs)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap();
    let count = |name: QueueAttributeName| -> u64 {
        attrs
            .attributes()
            .and_then(|a| a.get(&name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(
        count(QueueAttributeName::ApproximateNumberOfMessages)
            + count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        2,
        "{attrs:?}"
    );

    // Free again: the two run, in their order, and the later configuration is the one left.
    store.release_lease(&ws, &held).await.unwrap();
    let again = receive().await;
    let order: Vec<String> = again["Records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
            body["job"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(order, ["fa", "fb"], "SQS keeps the group's order");
    let response = api.invoke(again, Duration::from_secs(300)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let results = w.results().await;
    let ran: Vec<&str> = results
        .iter()
        .filter_map(|r| r["job_id"].as_str())
        .collect();
    assert_eq!(
        ran,
        ["fa", "fb"],
        "one after the other, in order: {results:?}"
    );
    assert!(
        results.iter().all(|r| r["status"] == "succeeded"),
        "{results:?}"
    );
    assert_eq!(cluster_in(&store, &ws).await, "beta");
}

/// Cancel mid-apply on Lambda's path, with two function instances as Lambda runs them side by
/// side: one runs a slow apply, the other takes the cancel message; the apply stops within
/// seconds, its `on_failure: destroy-created` destroys what it made, and the result says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_message_stops_a_running_apply_and_its_clean_up_destroys_what_it_made() {
    let w = World::new().await;
    let api = Arc::new(RuntimeApi::start().await);
    let _running = w.start(&api);
    let _idle = w.start(&api);
    w.sb.faults(json!([{ "resource": "testcloud_cluster", "op": "create", "kind": "slow", "delay_ms": 90000, "times": 1 }]));
    let mut job: Value = serde_json::from_str(&w.envelope("cm-1", "lam-cancel-run", "3m")).unwrap();
    job["job"]["on_failure"] = json!("destroy-created");
    let (event, _) = w.batch(&[job.to_string()]).await;
    let apply = tokio::spawn({
        let api = api.clone();
        async move { api.invoke(event, Duration::from_secs(300)).await }
    });

    // Mid-apply: the cluster is being created (its log says so in the bucket).
    let store = w.store().await;
    let ws: WorkspaceId = "acme/lam-cancel-run".parse().unwrap();
    tests::wait_for_stored_log(
        &store,
        &ws,
        "cm-1",
        "testcloud_cluster.main: Creating",
        Duration::from_secs(120),
    )
    .await;
    let asked = std::time::Instant::now();
    let cancel =
        json!({ "cancel": { "job": "cm-1", "tenant": "acme", "workspace": "lam-cancel-run" } });
    let (event, _) = w.batch(&[cancel.to_string()]).await;
    let answered = api.invoke(event, Duration::from_secs(60)).await.unwrap();
    assert!(failures(&answered).is_empty(), "{answered}");

    let response = apply.await.unwrap().unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    assert!(
        asked.elapsed() < Duration::from_secs(60),
        "stopped after {:?}",
        asked.elapsed()
    );
    let results = w.results().await;
    let requested = results.iter().find(|r| r["status"] == "cancel-requested");
    assert!(requested.is_some(), "{results:?}");
    let result = results
        .iter()
        .find(|r| r["job_id"] == "cm-1")
        .unwrap_or_else(|| panic!("{results:?}"));
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["cleanup"]["policy"], "destroy-created", "{result}");
    let destroyed = result["cleanup"]["destroyed"].to_string();
    assert!(destroyed.contains("testcloud_network.main"), "{result}");
    let state = store.current(&ws).await.unwrap().unwrap();
    let state = String::from_utf8_lossy(&state.data).into_owned();
    assert!(!state.contains("testcloud_network"), "{state}");
}

/// A tenant whose registry entry lists senders: the Lambda runs a job put on the queue with
/// `terrace submit --sign`, refuses an unsigned one and a cancel signed by another key (nothing
/// runs), and answers a cancel sent signed with `terrace cancel --to sqs://…`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_senders_runs_only_signed_jobs_and_cancels_on_the_lambda() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let (key, public) = tests::keygen(&w.sb, "platform.pem");
    let (other, _) = tests::keygen(&w.sb, "other.pem");
    let mut registry: Value = serde_json::from_str(&w.tenants()).unwrap();
    registry["acme"]["senders"] = json!([public]);
    let registry = registry.to_string();
    let _function = w.start_with(&api, &[("TERRACE_TENANTS", &registry)]);
    let queue = format!("sqs://{}", w.jobs.split_once("://").unwrap().1);
    let (key, other) = (key.to_str().unwrap(), other.to_str().unwrap());
    let job = |id: &str, workspace: &str| {
        w.sb.job(
            &format!("{id}.yaml"),
            &tests::demo_job(id, workspace, "apply", "demo", 1)
                .replace("timeout: 5m", "timeout: 2m"),
        )
    };
    let (signed, unsigned) = (job("sig-sqs-1", "signed"), job("sig-sqs-2", "unsigned"));
    let send = |args: &[&str]| {
        let out =
            w.sb.terrace()
                .env("AWS_ENDPOINT_URL", aws::moto())
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
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
        "sig-sqs-8",
        "-w",
        "acme/signed",
        "--to",
        &queue,
        "--sign",
        other,
    ]);
    send(&[
        "cancel",
        "sig-sqs-9",
        "-w",
        "acme/signed",
        "--to",
        &queue,
        "--sign",
        key,
    ]);
    let event = w.receive(4, 60).await;
    let response = api.invoke(event, Duration::from_secs(300)).await.unwrap();
    assert!(failures(&response).is_empty(), "{response}");
    let results = w.results().await;
    assert_eq!(results.len(), 4, "{results:?}");
    let ran = results.iter().find(|r| r["job_id"] == "sig-sqs-1").unwrap();
    assert_eq!(ran["status"], "succeeded", "{ran}");
    let refusals: Vec<(&str, &str)> = results
        .iter()
        .filter(|r| r["kind"] == "rejection")
        .map(|r| {
            (
                r["errors"][0]["field"].as_str().unwrap(),
                r["errors"][0]["problem"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(refusals.len(), 2, "{results:?}");
    assert!(
        refusals
            .iter()
            .any(|(f, p)| *f == "signature" && p.starts_with("is missing")),
        "{refusals:?}"
    );
    assert!(
        refusals
            .iter()
            .any(|(f, p)| *f == "cancel.signature" && p.starts_with("is wrong")),
        "{refusals:?}"
    );
    let answered = results.iter().find(|r| r["kind"] == "cancel").unwrap();
    assert_eq!(answered["cancel"]["job_id"], "sig-sqs-9", "{answered}");
    assert_eq!(answered["status"], "cancel-requested", "{answered}");
    let store = w.store().await;
    let unsigned_ws: WorkspaceId = "acme/unsigned".parse().unwrap();
    assert!(
        store.versions(&unsigned_ws).await.unwrap().is_empty(),
        "the unsigned job ran"
    );
    let signed_ws: WorkspaceId = "acme/signed".parse().unwrap();
    let wrong = store.artifact(&signed_ws, "sig-sqs-8", "cancel.json").await;
    assert!(
        wrong.unwrap().is_none(),
        "a cancel signed by another key was recorded"
    );
    let right = store.artifact(&signed_ws, "sig-sqs-9", "cancel.json").await;
    assert!(right.unwrap().is_some());
}

/// A benchmark, not a test (`benches/start-latency.sh`): enqueue to terraform's first output
/// through a real SQS queue and the Lambda runtime API, one job at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: benches/start-latency.sh runs it"]
async fn start_latency() {
    let w = World::new().await;
    let api = RuntimeApi::start().await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let _function = Function(
        w.lambda_command(&api)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log.reopen().unwrap()))
            .spawn()
            .expect("terrace-aws starts"),
    );
    let store = w.store().await;
    let mut samples = tests::start::Samples::default();
    for i in 0..=tests::start::jobs() {
        let id = format!("start-{i}");
        let queued = std::time::SystemTime::now();
        // Sent and received as the event source mapping would, then invoked.
        let (event, _) = w.batch(&[w.envelope(&id, &id, "3m")]).await;
        let response = api
            .invoke(event, Duration::from_secs(5 * 60))
            .await
            .expect("the batch is answered");
        assert!(failures(&response).is_empty(), "{response}");
        if i == 0 {
            continue; // a warm-up: the function's first job opens its clients
        }
        let ws: WorkspaceId = format!("acme/{id}").parse().unwrap();
        let first = tests::start::first_output_ms(&store, &ws, &id, queued).await;
        let stderr = std::fs::read_to_string(log.path()).unwrap();
        samples.add(first, tests::start::share(&stderr, &id));
    }
    samples.report(
        "SQS -> Lambda (moto's SQS, the runtime API on loopback, a warm function)",
        "SendMessage and the ReceiveMessage the event source mapping makes (here the benchmark's, \
         on moto: in AWS the mapping long-polls, so a message is seen as it lands), the invoke, \
         reading the tenant's target, and terraform's start-up to its first line",
    );
}
