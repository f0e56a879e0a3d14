//! The fate table, on an in-memory trigger and store: every outcome but a run of terraform
//! (which the functions' integration tests cover on every cloud).

use std::path::PathBuf;
use std::sync::Mutex;

use bytes::Bytes;
use serde_json::json;
use state_backends::memory::MemoryStore;
use state_backends::{LeaseRequest, StateStore, StateStoreExt};

use super::task::put_back;
use super::*;
use crate::host::message::{Message, TaskStarted};
use crate::host::trigger::TriggerError;
use crate::run::records::RESULT_FILE;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Bucket {
    bucket: String,
    /// Given only by the registry (like an ExternalId).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

/// A trigger whose queue, results channel and task starter are lists.
struct Fake {
    store: Arc<MemoryStore>,
    runtime: Runtime,
    reported: Mutex<Vec<Value>>,
    requeued: Mutex<Vec<(Value, Duration)>>,
    started: Mutex<Vec<String>>,
    store_fails: bool,
    requeue_fails: bool,
    hands_off: bool,
    task_fails: bool,
    /// Terraform's access can never be given (the target lacks what the cloud needs).
    access_never: bool,
    shutdown: CancellationToken,
    tenants: Option<Tenants<Bucket>>,
    /// The buckets the store was opened for.
    opened: Mutex<Vec<String>>,
}

impl Fake {
    fn new() -> Self {
        Self {
            store: Arc::new(MemoryStore::new()),
            runtime: Runtime {
                templates: crate::job::template::source::Templates::folder(
                    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates"),
                ),
                templates_bucket: None,
                price_books: PathBuf::from("/nonexistent/price-books"),
                // Never started by these tests: every run here stops before terraform.
                terraform: TerraformConfig {
                    binary: "/nonexistent/terraform".into(),
                    ..TerraformConfig::default()
                },
                lease_ttl: Duration::from_secs(60),
                plan_ttl: Duration::from_secs(3600),
                call_timeout: state_backends::CALL_TIMEOUT,
                task_lease_wait: Duration::from_secs(1),
                client_cache: None,
                console: false,
                metrics: None,
                max_state_bytes: crate::run::state_server::MAX_STATE_BYTES,
                drift_per_tenant: crate::sweeps::drift::PER_TENANT,
                signature_window: crate::job::signature::DEFAULT_WINDOW,
                signing_key: None,
                log_tap: None,
                policy: crate::host::settings::PolicySettings::default(),
                keys: None,
                cloud: None,
                outputs_recipient: None,
            },
            reported: Mutex::default(),
            requeued: Mutex::default(),
            started: Mutex::default(),
            store_fails: false,
            requeue_fails: false,
            hands_off: true,
            task_fails: false,
            access_never: false,
            shutdown: CancellationToken::new(),
            tenants: None,
            opened: Mutex::default(),
        }
    }

    fn reported(&self) -> Vec<Value> {
        self.reported.lock().unwrap().clone()
    }

    fn requeued(&self) -> Vec<(Value, Duration)> {
        self.requeued.lock().unwrap().clone()
    }
}

#[async_trait]
impl Trigger for Fake {
    type Target = Bucket;

    fn envelope_fix(&self) -> &'static str {
        "send {\"job\": {…}, \"target\": {\"bucket\"}}"
    }

    fn bucket_of(&self, target: &Bucket) -> String {
        target.bucket.clone()
    }

    fn check_target(&self, target: &Bucket) -> Vec<ValidationError> {
        if target.bucket.is_empty() {
            vec![problem("target.bucket", "is empty", "name the bucket")]
        } else {
            Vec::new()
        }
    }

    fn tenants(&self) -> Option<&Tenants<Bucket>> {
        self.tenants.as_ref()
    }

    fn registry_only(&self) -> &'static [&'static str] {
        &["key"]
    }

    fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn shutdown(&self) -> Option<&CancellationToken> {
        Some(&self.shutdown)
    }

    async fn store(
        &self,
        target: &Bucket,
        _: &str,
        _: Option<&WorkspaceId>,
    ) -> Result<Arc<dyn StateStore>, TriggerError> {
        self.opened.lock().unwrap().push(target.bucket.clone());
        if self.store_fails {
            return Err("the role cannot be assumed now".into());
        }
        Ok(self.store.clone())
    }

    async fn terraform_access(
        &self,
        _: &Bucket,
        _: &ValidatedJob,
        _: &mut TerraformConfig,
    ) -> Result<Keep, TriggerError> {
        if self.access_never {
            return Err(TriggerError::never(
                "target.identity",
                "the target names no identity for terraform",
                "give the tenant an identity in the registry",
            ));
        }
        Ok(None)
    }

    async fn report(&self, message: &Message) {
        self.reported.lock().unwrap().push(message.to_value());
    }

    async fn requeue(&self, body: &[u8], delay: Duration) -> Result<(), TriggerError> {
        if self.requeue_fails {
            return Err("the queue refused it".into());
        }
        let body = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        self.requeued.lock().unwrap().push((body, delay));
        Ok(())
    }

    fn cannot_hand_off(&self) -> Option<String> {
        (!self.hands_off).then(|| "shorten the job's timeout".to_owned())
    }

    async fn start_task(
        &self,
        reference: &JobRef<Bucket>,
        _: Duration,
    ) -> Result<TaskStarted, TriggerError> {
        if self.task_fails {
            return Err("the platform's API cannot be reached".into());
        }
        let reference = serde_json::to_string(reference).unwrap();
        self.started.lock().unwrap().push(reference);
        Ok(TaskStarted {
            task_arn: Some("arn:task/1".into()),
            ..TaskStarted::default()
        })
    }
}

fn message(id: &str, timeout: &str) -> Vec<u8> {
    json!({
        "job": {
            "id": id, "tenant": "acme", "workspace": "demo", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" },
            "variables": { "cluster_name": "demo", "region": "eu-west-1", "admin_password": "hunter2-hunter2" },
            "timeout": timeout,
        },
        "target": { "bucket": "b" },
    })
    .to_string()
    .into_bytes()
}

fn delivery<'a>(body: &'a [u8], time_left: Option<Duration>) -> Delivery<'a> {
    Delivery {
        message_id: "m1",
        body,
        time_left,
        lease_wait: Duration::ZERO,
        cancel: CancellationToken::new(),
        receipt: None,
    }
}

fn ws() -> WorkspaceId {
    WorkspaceId::new("acme", "demo").unwrap()
}

/// A finished run's result of job `id` (an apply of acme/demo), written under fence 1.
fn result_of(id: &str) -> crate::run::result::JobResult {
    let now = time::OffsetDateTime::now_utc();
    crate::run::result::JobResult {
        cost: None,
        policy: None,
        schema: crate::run::result::RESULT_SCHEMA,
        job_id: id.into(),
        tenant: "acme".into(),
        workspace: "demo".into(),
        operation: crate::job::Operation::Apply,
        template: "demo@1.0.0".into(),
        status: crate::run::result::Status::Succeeded,
        fence: Some(1),
        terraform: None,
        started_at: now,
        finished_at: now,
        duration_ms: 1,
        steps: Vec::new(),
        changes: None,
        drift: None,
        drifted: Vec::new(),
        outputs: Default::default(),
        sealed_outputs: None,
        state_versions: vec![1],
        attempts: Vec::new(),
        cleanup: None,
        recovered: Vec::new(),
        unsaved_state: None,
        error: None,
        lifecycle: None,
        attention: Vec::new(),
        sequence: None,
        superseded_by: None,
        plan: None,
        approved_plan: None,
    }
}

/// The `job.json` of job `id`'s run under fence 1.
fn record_of(id: &str) -> Bytes {
    Bytes::from(
        json!({
            "schema": 1, "id": id, "tenant": "acme", "workspace": "demo", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" }, "variables": {},
            "lease": { "fence": 1, "acquired_at": "2026-11-27T00:00:00Z" },
        })
        .to_string(),
    )
}

/// Stores job `id`'s records as a finished run (an apply of acme/demo) leaves them.
async fn finish(store: &dyn StateStore, id: &str) {
    store
        .put_artifact(&ws(), id, crate::run::records::JOB_FILE, record_of(id))
        .await
        .unwrap();
    let result = Bytes::from(serde_json::to_vec(&result_of(id)).unwrap());
    store
        .put_artifact(&ws(), id, RESULT_FILE, result)
        .await
        .unwrap();
}

async fn hold_lease(store: &MemoryStore, owner: &str) {
    let request = LeaseRequest {
        owner: owner.into(),
        ttl: Duration::from_secs(120),
        info: json!({}),
    };
    store.acquire_lease(&ws(), &request).await.unwrap();
}

#[tokio::test]
async fn a_message_that_is_not_an_envelope_is_rejected_and_reported_once() {
    let fake = Fake::new();
    let fate = handle(&fake, delivery(b"not json", None)).await;
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "rejected");
    assert_eq!(record["message_id"], "m1");
    assert!(
        record["errors"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("not a job envelope")
    );
    assert_eq!(fake.reported(), vec![record]);
    assert!(fake.requeued().is_empty());
}

#[tokio::test]
async fn every_problem_with_the_target_and_the_job_is_in_one_rejection() {
    let fake = Fake::new();
    let mut body: Value = serde_json::from_slice(&message("j1", "10m")).unwrap();
    body["target"]["bucket"] = json!("");
    body["job"]["variables"]["node_count"] = json!(99);
    let body = body.to_string();
    let Fate::Rejected(record) = handle(&fake, delivery(body.as_bytes(), None)).await else {
        panic!("not rejected")
    };
    let fields: Vec<&str> = record["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"target.bucket"), "{fields:?}");
    assert!(
        fields.iter().any(|f| f.contains("node_count")),
        "{fields:?}"
    );
    assert_eq!(fake.reported().len(), 1);
}

#[tokio::test]
async fn a_base64_message_is_decoded_like_a_json_one() {
    let fake = Fake::new();
    let encoded = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        message("j1", "10m"),
    );
    finish(&*fake.store, "j1").await;
    let fate = handle(&fake, delivery(encoded.as_bytes(), None)).await;
    assert!(matches!(fate, Fate::Ran(_)), "{fate:?}");
}

#[tokio::test]
async fn a_finished_job_delivered_again_reports_its_result_again_and_runs_nothing() {
    let fake = Fake::new();
    finish(&*fake.store, "j1").await;
    let body = message("j1", "10m");
    for delivery_number in 1..=2 {
        let fate = handle(&fake, delivery(&body, None)).await;
        let Fate::Ran(record) = fate else {
            panic!("{fate:?}")
        };
        assert_eq!(record["job_id"], "j1");
        assert_eq!(record["status"], "succeeded");
        assert_eq!(fake.reported().len(), delivery_number);
    }
    // Nothing ran: the job record is the finished run's.
    assert_eq!(
        fake.store
            .artifact(&ws(), "j1", crate::run::records::JOB_FILE)
            .await
            .unwrap(),
        Some(record_of("j1"))
    );
}

/// A job that can never run (a record of it Terrace cannot read) ends with a result a platform
/// parses as every other one: every field of the schema, the reason in `error`.
#[tokio::test]
async fn a_job_that_cannot_run_ends_with_a_complete_typed_result() {
    let fake = Fake::new();
    fake.store
        .put_artifact(
            &ws(),
            "j1",
            RESULT_FILE,
            Bytes::from_static(b"{ not a result"),
        )
        .await
        .unwrap();
    let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    let result: crate::run::result::JobResult =
        serde_json::from_value(record.clone()).expect("a complete result");
    assert_eq!(result.status, crate::run::result::Status::Failed);
    assert_eq!(
        (result.tenant.as_str(), result.workspace.as_str()),
        ("acme", "demo")
    );
    assert_eq!(result.template, "demo@1.0.0");
    let error = result.error.expect("why");
    assert_eq!(error.category.as_str(), "internal");
    assert!(error.message.contains("result.json"), "{}", error.message);
    assert_eq!(fake.reported(), vec![record]);
}

#[tokio::test]
async fn a_busy_workspace_puts_a_fresh_delayed_copy_on_the_queue_and_reports_nothing() {
    let fake = Fake::new();
    hold_lease(&fake.store, "other-job").await;
    let body = message("j1", "10m");
    let fate = handle(&fake, delivery(&body, None)).await;
    let Fate::Requeued { why, delay } = fate else {
        panic!("{fate:?}")
    };
    assert!(why.contains("other-job"), "{why}");
    // Until the holder's lease should end (120 s from now), give or take a second.
    assert!((110..=120).contains(&delay.as_secs()), "{delay:?}");
    let requeued = fake.requeued();
    assert_eq!(requeued.len(), 1);
    assert_eq!(
        requeued[0].0,
        serde_json::from_slice::<Value>(&body).unwrap()
    );
    assert!(fake.reported().is_empty());
}

#[tokio::test]
async fn a_busy_workspace_whose_copy_cannot_be_queued_is_delivered_again_with_its_delay() {
    let mut fake = Fake::new();
    fake.requeue_fails = true;
    hold_lease(&fake.store, "other-job").await;
    let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Again {
        delay: Some(delay), ..
    } = fate
    else {
        panic!("{fate:?}")
    };
    assert!(delay.as_secs() >= 110);
}

#[tokio::test]
async fn trouble_reaching_the_customer_is_delivered_again_and_not_reported() {
    let mut fake = Fake::new();
    fake.store_fails = true;
    let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Again { why, delay: None } = fate else {
        panic!("{fate:?}")
    };
    assert!(why.contains("cannot be assumed"), "{why}");
    assert!(fake.reported().is_empty());
    assert!(fake.requeued().is_empty());
}

/// A reason the job can never run (here: terraform's access cannot be given) rejects it with
/// the field and the fix, even while the store itself failed only for now, instead of
/// delivering it again until the queue dead-letters it without a word.
#[tokio::test]
async fn a_job_that_can_never_reach_the_customer_is_rejected_with_the_fix() {
    for store_fails in [false, true] {
        let mut fake = Fake::new();
        fake.access_never = true;
        fake.store_fails = store_fails;
        let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
        let Fate::Rejected(record) = fate else {
            panic!("{fate:?}")
        };
        assert_eq!(record["status"], "rejected");
        assert_eq!(record["errors"][0]["field"], "target.identity");
        assert_eq!(
            record["errors"][0]["fix"],
            "give the tenant an identity in the registry"
        );
        assert_eq!(fake.reported(), vec![record]);
        assert!(fake.requeued().is_empty());
        assert!(
            fake.store.lease(&ws()).await.unwrap().is_none(),
            "nothing ran"
        );
    }
}

#[tokio::test]
async fn a_job_longer_than_the_time_left_is_staged_and_handed_off_with_a_digest() {
    let fake = Fake::new();
    let body = message("long", "2h");
    let fate = handle(&fake, delivery(&body, Some(Duration::from_secs(600)))).await;
    assert!(matches!(fate, Fate::HandedOff(_)), "{fate:?}");
    let handed: Message = serde_json::from_value(fake.reported()[0].clone()).unwrap();
    let Message::HandedOff(handed) = handed else {
        panic!("not a hand-off: {handed:?}")
    };
    assert_eq!(
        (handed.job_id.as_str(), handed.workspace.as_str()),
        ("long", "acme/demo")
    );
    assert_eq!(handed.task.task_arn.as_deref(), Some("arn:task/1"));
    assert_eq!(fake.reported()[0]["kind"], "handed-off");
    let started = fake.started.lock().unwrap()[0].clone();
    let staged = fake
        .store
        .artifact(&ws(), "long", &name_in(&started))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&staged[..], &body[..]);
    let reference: Value = serde_json::from_str(&started).unwrap();
    assert_eq!(reference["sha256"], state_backends::sha256_hex(&body));
    assert_eq!(reference["job_id"], "long");
    assert!(
        name_in(&started).starts_with("request-"),
        "a name of its own per staging"
    );
}

#[tokio::test]
async fn a_job_longer_than_the_time_left_is_rejected_where_nothing_can_take_it() {
    let mut fake = Fake::new();
    fake.hands_off = false;
    let fate = handle(
        &fake,
        delivery(&message("long", "2h"), Some(Duration::from_secs(600))),
    )
    .await;
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["errors"][0]["field"], "timeout");
    assert_eq!(record["errors"][0]["fix"], "shorten the job's timeout");
}

/// The name a reference gives its staged message.
fn name_in(reference: &str) -> String {
    let reference: Value = serde_json::from_str(reference).unwrap();
    reference["staged"].as_str().unwrap().to_owned()
}

/// Stages `body` for a task, as a hand-off does, and returns the reference.
async fn staged(fake: &Fake, id: &str, body: &[u8]) -> String {
    let reference = JobRef::stage(
        Bucket {
            bucket: "b".into(),
            key: None,
        },
        &ws(),
        id,
        body,
        fake.store.as_ref(),
    )
    .await
    .unwrap();
    serde_json::to_string(&reference).unwrap()
}

#[tokio::test]
async fn a_staged_message_changed_after_staging_is_refused_reported_and_never_run() {
    let fake = Fake::new();
    let reference = staged(&fake, "j1", &message("j1", "10m")).await;
    // Someone with write access to the bucket swaps the job.
    let mut swapped: Value = serde_json::from_slice(&message("j1", "10m")).unwrap();
    swapped["job"]["operation"] = json!("destroy");
    fake.store
        .put_artifact(
            &ws(),
            "j1",
            &name_in(&reference),
            Bytes::from(swapped.to_string()),
        )
        .await
        .unwrap();
    let fate = task(&fake, &reference, Duration::ZERO, CancellationToken::new()).await;
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    let problem = record["errors"][0]["problem"].as_str().unwrap();
    assert!(problem.contains("changed after it was staged"), "{problem}");
    assert_eq!(record["job_id"], "j1");
    assert_eq!(fake.reported(), vec![record]);
    assert!(
        fake.store
            .artifact(&ws(), "j1", crate::run::records::JOB_FILE)
            .await
            .unwrap()
            .is_none(),
        "nothing ran"
    );
}

#[tokio::test]
async fn a_reference_without_a_digest_is_refused() {
    let fake = Fake::new();
    let reference = staged(&fake, "j1", &message("j1", "10m")).await;
    let mut reference: Value = serde_json::from_str(&reference).unwrap();
    reference.as_object_mut().unwrap().remove("sha256");
    let fate = task(
        &fake,
        &reference.to_string(),
        Duration::ZERO,
        CancellationToken::new(),
    )
    .await;
    assert!(matches!(fate, Fate::Rejected(_)), "{fate:?}");
}

#[tokio::test]
async fn a_task_that_finds_the_workspace_busy_puts_its_job_back_and_unstages_it() {
    let fake = Fake::new();
    hold_lease(&fake.store, "other-job").await;
    let body = message("j1", "2h");
    let reference = staged(&fake, "j1", &body).await;
    let fate = task(
        &fake,
        &reference,
        Duration::from_millis(300),
        CancellationToken::new(),
    )
    .await;
    assert!(matches!(fate, Fate::Requeued { .. }), "{fate:?}");
    let requeued = fake.requeued();
    assert_eq!(requeued.len(), 1);
    // Waiting is not trouble: the copy is the message as it was, not counted.
    assert_eq!(
        requeued[0].0,
        serde_json::from_slice::<Value>(&body).unwrap()
    );
    assert!(fake.reported().is_empty());
    assert!(
        fake.store
            .artifact(&ws(), "j1", &name_in(&reference))
            .await
            .unwrap()
            .is_none(),
        "the staged copy with the job's variables is gone"
    );
}

#[tokio::test]
async fn a_task_that_cannot_queue_its_job_again_keeps_it_staged_for_its_own_retry() {
    let mut fake = Fake::new();
    fake.requeue_fails = true;
    hold_lease(&fake.store, "other-job").await;
    let reference = staged(&fake, "j1", &message("j1", "2h")).await;
    let fate = task(&fake, &reference, Duration::ZERO, CancellationToken::new()).await;
    assert!(matches!(fate, Fate::Again { .. }), "{fate:?}");
    assert!(
        fake.store
            .artifact(&ws(), "j1", &name_in(&reference))
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_task_put_back_for_trouble_counts_and_gives_up_with_a_reported_error() {
    let fake = Fake::new();
    // A message already put back for trouble as often as a task may.
    let mut body: Value = serde_json::from_slice(&message("j1", "2h")).unwrap();
    body["requeued"] = json!(MAX_TASK_REQUEUES);
    let body = body.to_string().into_bytes();
    let again = put_back(
        &fake,
        &body,
        Duration::from_secs(60),
        true,
        Fate::again("the store is down"),
    )
    .await;
    let Fate::Ran(record) = again else {
        panic!("{again:?}")
    };
    assert_eq!(record["status"], "failed");
    assert_eq!(record["job_id"], "j1");
    assert!(
        record["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the store is down")
    );
    // A complete result, as a platform parses every other one.
    let result: crate::run::result::JobResult =
        serde_json::from_value(record.clone()).expect("a complete result");
    assert_eq!(result.operation, crate::job::Operation::Apply);
    assert_eq!(result.template, "demo@1.0.0");
    assert_eq!(fake.reported(), vec![record]);

    // Below the limit, the copy carries one more count.
    body_with(&fake, 1).await;
}

async fn body_with(fake: &Fake, count: u32) {
    let mut body: Value = serde_json::from_slice(&message("j2", "2h")).unwrap();
    body["requeued"] = json!(count);
    let fate = put_back(
        fake,
        body.to_string().as_bytes(),
        Duration::from_secs(60),
        true,
        Fate::again("the store is down"),
    )
    .await;
    assert!(matches!(fate, Fate::Requeued { .. }), "{fate:?}");
    let requeued = fake.requeued();
    assert_eq!(requeued.last().unwrap().0["requeued"], count + 1);
    assert_eq!(requeued.last().unwrap().1, Duration::from_secs(60));
}

#[tokio::test]
async fn a_task_run_again_after_its_job_finished_reports_the_result_again() {
    let fake = Fake::new();
    let reference = staged(&fake, "j1", &message("j1", "2h")).await;
    // The job finished and its staged copy went; then the task runs once more (a retry).
    finish(&*fake.store, "j1").await;
    fake.store
        .delete_artifact(&ws(), "j1", &name_in(&reference))
        .await
        .unwrap();
    let fate = task(&fake, &reference, Duration::ZERO, CancellationToken::new()).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["job_id"], "j1");
    assert_eq!(record["status"], "succeeded");
    assert_eq!(fake.reported(), vec![record]);
}

#[tokio::test]
async fn a_task_whose_staged_job_is_gone_and_never_ran_is_refused() {
    let fake = Fake::new();
    let reference = staged(&fake, "j1", &message("j1", "2h")).await;
    fake.store
        .delete_artifact(&ws(), "j1", &name_in(&reference))
        .await
        .unwrap();
    let fate = task(&fake, &reference, Duration::ZERO, CancellationToken::new()).await;
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    assert!(
        record["errors"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("is not in"),
        "{record}"
    );
}

/// A stand-in for terraform (these are unit tests: the real one runs in the integration tests):
/// answers `version -json`, and plans and applies nothing; with a file `slow` beside it, its
/// plan runs until interrupted, as terraform stops on SIGINT.
const FAKE_TERRAFORM: &str = r#"#!/bin/sh
case "$1" in
  version) echo '{"terraform_version":"1.11.4","platform":"linux_amd64","provider_selections":{}}' ;;
  init) ;;
  plan)
    if [ -e "$(dirname "$0")/slow" ]; then trap 'exit 1' INT; sleep 60 & wait; exit 1; fi
    echo '{"type":"change_summary","changes":{"add":0,"change":0,"import":0,"remove":0,"operation":"plan"}}' ;;
  apply)
    echo '{"type":"change_summary","changes":{"add":0,"change":0,"import":0,"remove":0,"operation":"apply"}}'
    echo '{"type":"outputs","outputs":{}}' ;;
  output) echo '{}' ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"#;

fn with_fake_terraform(fake: &mut Fake, slow: bool) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("terraform");
    std::fs::write(&bin, FAKE_TERRAFORM).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    if slow {
        std::fs::write(dir.path().join("slow"), "").unwrap();
    }
    fake.runtime.terraform.binary = bin;
    fake.runtime.terraform.grace = Duration::from_secs(5);
    dir
}

#[tokio::test]
async fn a_job_that_runs_to_its_end_is_ran_and_reported_once() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, false);
    let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["job_id"], "j1");
    assert_eq!(fake.reported(), vec![record]);
    assert!(fake.requeued().is_empty());
    assert!(fake.store.lease(&ws()).await.unwrap().is_none(), "released");
}

#[tokio::test]
async fn a_job_stopped_by_the_hosts_shutdown_is_interrupted_and_not_reported() {
    let mut fake = Fake::new();
    let _bin = with_fake_terraform(&mut fake, true);
    let shutdown = fake.shutdown.clone();
    let body = message("j1", "10m");
    let mut d = delivery(&body, None);
    d.cancel = shutdown.child_token();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        shutdown.cancel();
    });
    let fate = handle(&fake, d).await;
    stopper.await.unwrap();
    let Fate::Interrupted(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "interrupted", "{record}");
    assert!(fake.reported().is_empty(), "not final: the job runs again");
    assert!(fake.store.lease(&ws()).await.unwrap().is_none(), "released");
}

#[tokio::test]
async fn a_task_deletes_only_its_own_staged_message_never_a_later_staging() {
    let fake = Fake::new();
    hold_lease(&fake.store, "other-job").await;
    let first = staged(&fake, "j1", &message("j1", "2h")).await;
    // The job is staged again (a redelivery handed off anew) before the first task ends.
    let second = staged(&fake, "j1", &message("j1", "2h")).await;
    assert_ne!(name_in(&first), name_in(&second));
    let fate = task(&fake, &first, Duration::ZERO, CancellationToken::new()).await;
    assert!(matches!(fate, Fate::Requeued { .. }), "{fate:?}");
    let names = fake.store.artifacts(&ws(), "j1").await.unwrap();
    assert!(!names.contains(&name_in(&first)), "{names:?}");
    assert!(names.contains(&name_in(&second)), "{names:?}");
}

#[tokio::test]
async fn a_reference_naming_anything_but_a_staged_message_is_refused() {
    let fake = Fake::new();
    let reference = staged(&fake, "j1", &message("j1", "2h")).await;
    let mut reference: Value = serde_json::from_str(&reference).unwrap();
    reference["staged"] = json!("../../other/runs/x/result.json");
    let fate = task(
        &fake,
        &reference.to_string(),
        Duration::ZERO,
        CancellationToken::new(),
    )
    .await;
    assert!(matches!(fate, Fate::Rejected(_)), "{fate:?}");
}

#[tokio::test]
async fn a_job_whose_records_cannot_be_read_ends_with_a_reported_failure_not_endless_retries() {
    let fake = Fake::new();
    fake.store
        .put_artifact(&ws(), "j1", RESULT_FILE, Bytes::from_static(b"{ not json"))
        .await
        .unwrap();
    let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "failed");
    assert!(
        record["error"]["message"]
            .as_str()
            .unwrap()
            .contains("result.json"),
        "{record}"
    );
    assert_eq!(fake.reported(), vec![record]);
}

#[tokio::test]
async fn a_finished_long_job_delivered_again_gets_its_result_not_another_task() {
    let fake = Fake::new();
    finish(&*fake.store, "long").await;
    let fate = handle(
        &fake,
        delivery(&message("long", "2h"), Some(Duration::from_secs(600))),
    )
    .await;
    assert!(matches!(fate, Fate::Ran(_)), "{fate:?}");
    assert!(fake.started.lock().unwrap().is_empty(), "no task started");
    assert!(
        !fake
            .store
            .artifacts(&ws(), "long")
            .await
            .unwrap()
            .iter()
            .any(|a| a.starts_with("request")),
        "nothing staged"
    );
}

#[tokio::test]
async fn a_hand_off_that_fails_leaves_no_staged_copy_behind() {
    let mut fake = Fake::new();
    fake.task_fails = true;
    let fate = handle(
        &fake,
        delivery(&message("long", "2h"), Some(Duration::from_secs(600))),
    )
    .await;
    assert!(matches!(fate, Fate::Again { delay: None, .. }), "{fate:?}");
    let left = fake.store.artifacts(&ws(), "long").await.unwrap();
    assert!(!left.iter().any(|a| a.starts_with("request")), "{left:?}");
}

#[tokio::test]
async fn a_final_result_removes_every_staging_of_the_job() {
    let fake = Fake::new();
    let first = staged(&fake, "j1", &message("j1", "2h")).await;
    let second = staged(&fake, "j1", &message("j1", "2h")).await;
    finish(&*fake.store, "j1").await;
    let fate = task(&fake, &second, Duration::ZERO, CancellationToken::new()).await;
    assert!(matches!(fate, Fate::Ran(_)), "{fate:?}");
    let left = fake.store.artifacts(&ws(), "j1").await.unwrap();
    assert!(!left.contains(&name_in(&first)), "{left:?}");
    assert!(!left.contains(&name_in(&second)), "{left:?}");
}

mod cancel;
mod cleanup;
mod fencing;
mod order;
mod registry;
mod sweep;

/// A result that anyone with access to the bucket put under `runs/<job>/` (terraform's session
/// as the customer's role, say) is never reported as the job's: it must name the job, its
/// tenant, workspace and operation, and carry the fence its run's `job.json` records. Else
/// the job runs (here it fails at once: these tests have no terraform) and its own result is
/// reported.
#[tokio::test]
async fn a_stored_result_that_is_not_the_jobs_own_is_never_reported_and_the_job_runs() {
    /// Changes a result; false: no `job.json` is stored beside it.
    type Forge = fn(&mut crate::run::result::JobResult) -> bool;
    let forgeries: [(&str, Forge); 6] = [
        ("another tenant", |r| {
            r.tenant = "other".into();
            true
        }),
        ("another job id", |r| {
            r.job_id = "j0".into();
            true
        }),
        ("another operation", |r| {
            r.operation = crate::job::Operation::Destroy;
            true
        }),
        ("no fence", |r| {
            r.fence = None;
            true
        }),
        ("another fence", |r| {
            r.fence = Some(7);
            true
        }),
        ("no job.json", |_| false),
    ];
    for (what, forge) in forgeries {
        let fake = Fake::new();
        let mut forged = result_of("j1");
        forged.outputs.insert(
            "stolen".into(),
            serde_json::from_value(json!({ "value": "forged", "sensitive": false })).unwrap(),
        );
        if forge(&mut forged) {
            fake.store
                .put_artifact(&ws(), "j1", crate::run::records::JOB_FILE, record_of("j1"))
                .await
                .unwrap();
        }
        fake.store
            .put_artifact(
                &ws(),
                "j1",
                RESULT_FILE,
                Bytes::from(serde_json::to_vec(&forged).unwrap()),
            )
            .await
            .unwrap();
        let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
        let Fate::Ran(record) = fate else {
            panic!("{what}: {fate:?}")
        };
        assert_eq!(record["job_id"], "j1", "{what}: {record}");
        assert_eq!(record["tenant"], "acme", "{what}: {record}");
        assert_eq!(
            record["status"], "failed",
            "{what}: the job ran (and failed without terraform): {record}"
        );
        assert!(
            !record.to_string().contains("forged"),
            "{what}: the forged result was reported: {record}"
        );
    }
    // The job's own records, as its run leaves them, are its result.
    let fake = Fake::new();
    finish(&*fake.store, "j1").await;
    let fate = handle(&fake, delivery(&message("j1", "10m"), None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "succeeded", "{record}");
}

/// A job encoded twice (its JSON as a string where the job goes) is rejected without being
/// quoted: serde's own error would quote the string whole, secrets and all.
#[tokio::test]
async fn a_job_encoded_twice_is_rejected_without_quoting_it() {
    let fake = Fake::new();
    let inner = json!({ "id": "j1", "variables": { "pw": "canary-twice" } }).to_string();
    let body = json!({ "job": inner }).to_string();
    let fate = handle(&fake, delivery(body.as_bytes(), None)).await;
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    assert!(!record.to_string().contains("canary"), "{record}");
    assert!(
        record.to_string().contains("invalid type: string"),
        "it says what is wrong: {record}"
    );
    // A key given twice is refused, as in a job file, rather than the last one winning.
    let twice = br#"{"job": {"id": "j1", "tenant": "acme", "tenant": "other"}}"#;
    let fate = handle(&fake, delivery(twice, None)).await;
    let Fate::Rejected(record) = fate else {
        panic!("{fate:?}")
    };
    assert!(record.to_string().contains("given twice"), "{record}");
}

/// Jobs that share a user run one at a time. A job that waited for its turn (the jobs before it
/// in one Lambda batch, say) until it no longer fits in its delivery's time is handed off then,
/// not run out of time.
#[tokio::test]
async fn a_job_that_waited_for_its_turn_past_its_time_is_handed_off() {
    use crate::run::terraform::{JobUser, RunAs, SharedUser};
    // A uid nothing runs as: the turn's sweep kills nothing of this test process.
    let nobody = RunAs {
        uid: 59_999,
        gid: 59_999,
    };
    let mut fake = Fake::new();
    fake.runtime.terraform.shared_user = SharedUser::OneAtATime { sole_user: false };
    fake.runtime.terraform.user = Some(nobody);
    let fake = Arc::new(fake);
    let held = JobUser::take_turn(Some(nobody), false).await.unwrap();
    let waiting = tokio::spawn({
        let fake = fake.clone();
        async move {
            let body = message("j1", "10m");
            handle(&*fake, delivery(&body, Some(Duration::from_secs(601)))).await
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "it waits for the turn");
    drop(held);
    let fate = waiting.await.unwrap();
    assert!(matches!(fate, Fate::HandedOff(_)), "{fate:?}");
    assert_eq!(fake.started.lock().unwrap().len(), 1, "one task started");
}

/// A fake whose registry gives tenant acme the sender key `key`.
fn signing_fake(key: &crate::job::signature::SenderSecret) -> Fake {
    let mut fake = Fake::new();
    let registry = json!({ "acme": { "bucket": "b", "senders": [key.public().to_string()] } });
    fake.tenants = Some(Tenants::parse(&registry.to_string(), "registry", |_| Vec::new()).unwrap());
    fake
}

/// `body`'s job (or cancel) signed by `key` as of `at`.
fn signed(
    body: &[u8],
    member: &str,
    key: &crate::job::signature::SenderSecret,
    at: time::OffsetDateTime,
) -> Vec<u8> {
    let kind = if member == "job" {
        Kind::Job
    } else {
        Kind::Cancel
    };
    let mut body: Value = serde_json::from_slice(body).unwrap();
    key.sign(kind, body[member].as_object_mut().unwrap(), at)
        .unwrap();
    body.to_string().into_bytes()
}

/// The single rejection's one error: (field, problem).
fn refused(fate: &Fate) -> (String, String) {
    let Fate::Rejected(record) = fate else {
        panic!("not rejected: {fate:?}")
    };
    let errors = record["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{record}");
    (
        errors[0]["field"].as_str().unwrap().to_owned(),
        errors[0]["problem"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn a_tenant_with_sender_keys_runs_only_jobs_they_signed_and_says_what_is_wrong() {
    use crate::job::signature::SenderSecret;
    let key = SenderSecret::generate();
    let fake = signing_fake(&key);
    let now = time::OffsetDateTime::now_utc();
    let left = Some(Duration::from_secs(600));

    let unsigned = message("s1", "2h");
    let (field, problem) = refused(&handle(&fake, delivery(&unsigned, left)).await);
    assert_eq!(field, "signature");
    assert!(
        problem.starts_with("is missing: tenant \"acme\""),
        "{problem}"
    );

    let by_another = signed(&unsigned, "job", &SenderSecret::generate(), now);
    let (_, problem) = refused(&handle(&fake, delivery(&by_another, left)).await);
    assert!(problem.starts_with("is wrong"), "{problem}");

    // Changed after it was signed: a variable raised on the way.
    let mut changed: Value = serde_json::from_slice(&signed(&unsigned, "job", &key, now)).unwrap();
    changed["job"]["variables"]["node_count"] = json!(9);
    let changed = changed.to_string().into_bytes();
    let (_, problem) = refused(&handle(&fake, delivery(&changed, left)).await);
    assert!(problem.starts_with("is wrong"), "{problem}");

    let old = signed(&unsigned, "job", &key, now - time::Duration::hours(25));
    let (_, problem) = refused(&handle(&fake, delivery(&old, left)).await);
    assert!(
        problem.starts_with("is replayed") && problem.contains("24 h"),
        "{problem}"
    );

    // Nothing of the refused ones reached a task or the store (the old one's only read: is
    // it a job the store knows?).
    assert!(fake.started.lock().unwrap().is_empty());
    assert_eq!(fake.opened.lock().unwrap().len(), 1);
    assert!(fake.store.artifacts(&ws(), "s1").await.unwrap().is_empty());
    assert_eq!(fake.reported().len(), 4);

    let good = signed(&unsigned, "job", &key, now);
    let fate = handle(&fake, delivery(&good, left)).await;
    assert!(matches!(fate, Fate::HandedOff(_)), "{fate:?}");
    // The task reads the staged message, signature and all, and checks it again.
    assert_eq!(fake.started.lock().unwrap().len(), 1);

    // Another tenant, with no keys, takes unsigned jobs as before.
    let registry = json!({ "acme": { "bucket": "b" } });
    let mut open = Fake::new();
    open.tenants = Some(Tenants::parse(&registry.to_string(), "registry", |_| Vec::new()).unwrap());
    let fate = handle(&open, delivery(&unsigned, left)).await;
    assert!(matches!(fate, Fate::HandedOff(_)), "{fate:?}");
}

#[tokio::test]
async fn a_tenant_with_sender_keys_takes_only_signed_cancels() {
    use crate::job::signature::SenderSecret;
    let key = SenderSecret::generate();
    let fake = signing_fake(&key);
    let cancel = json!({ "cancel": { "job": "c1", "tenant": "acme", "workspace": "demo" } })
        .to_string()
        .into_bytes();
    let (field, problem) = refused(&handle(&fake, delivery(&cancel, None)).await);
    assert_eq!(field, "cancel.signature");
    assert!(problem.starts_with("is missing"), "{problem}");
    // A job's signature does not sign a cancel.
    let now = time::OffsetDateTime::now_utc();
    let mut as_job: Value = serde_json::from_slice(&cancel).unwrap();
    key.sign(Kind::Job, as_job["cancel"].as_object_mut().unwrap(), now)
        .unwrap();
    let as_job = as_job.to_string().into_bytes();
    let (_, problem) = refused(&handle(&fake, delivery(&as_job, None)).await);
    assert!(problem.starts_with("is wrong"), "{problem}");
    assert!(
        fake.store
            .artifact(&ws(), "c1", "cancel.json")
            .await
            .unwrap()
            .is_none(),
        "a refused cancel recorded nothing"
    );

    let good = signed(&cancel, "cancel", &key, now);
    let fate = handle(&fake, delivery(&good, None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(record["status"], "cancel-requested");
}

#[tokio::test]
async fn drift_checks_for_a_tenant_that_takes_only_signed_jobs_are_signed_by_the_runner_or_not_sent()
 {
    use crate::job::signature::SenderSecret;
    let platform = SenderSecret::generate();
    let runner = Arc::new(SenderSecret::generate());
    let mut fake = Fake::new();
    let registry = json!({ "acme": { "bucket": "b", "senders": [platform.public().to_string(), runner.public().to_string()] } });
    fake.tenants = Some(Tenants::parse(&registry.to_string(), "registry", |_| Vec::new()).unwrap());
    let job = json!({
        "id": "drift-2026112800", "tenant": "acme", "workspace": "demo", "operation": "drift-check",
        "template": { "name": "demo", "version": "1.0.0" }, "variables": {},
    });
    let plan = crate::sweeps::drift::DriftPlan {
        jobs: vec![(ws(), crate::job::RawJob(job.as_object().unwrap().clone()))],
        ..Default::default()
    };

    let report = crate::host::sweep::queue(&fake, "b", &plan).await;
    let report = serde_json::to_value(&report).unwrap();
    assert!(fake.requeued().is_empty(), "an unsigned check was sent");
    assert!(
        report.to_string().contains("TERRACE_SIGNING_KEY"),
        "{report}"
    );

    // A key of the runner's that the tenant does not list would only be refused: not sent.
    fake.runtime.signing_key = Some(Arc::new(SenderSecret::generate()));
    let report = crate::host::sweep::queue(&fake, "b", &plan).await;
    let report = serde_json::to_value(&report).unwrap();
    assert!(
        fake.requeued().is_empty(),
        "a check signed by an unlisted key was sent"
    );
    assert!(report.to_string().contains("is not among them"), "{report}");

    fake.runtime.signing_key = Some(runner.clone());
    crate::host::sweep::queue(&fake, "b", &plan).await;
    let sent = fake.requeued();
    assert_eq!(sent.len(), 1);
    let keys = [runner.public()];
    crate::job::signature::verify(
        Kind::Job,
        sent[0].0["job"].as_object().unwrap(),
        &keys,
        time::OffsetDateTime::now_utc(),
        Duration::from_secs(60),
    )
    .unwrap();
}

#[tokio::test]
async fn a_task_checks_its_staged_jobs_signature_again() {
    use crate::job::signature::SenderSecret;
    let key = SenderSecret::generate();
    let fake = signing_fake(&key);
    // Staged unsigned (a hand-off by a runner whose registry had no senders then).
    let reference = staged(&fake, "s2", &message("s2", "2h")).await;
    let fate = task(&fake, &reference, Duration::ZERO, CancellationToken::new()).await;
    let (field, problem) = refused(&fate);
    assert_eq!(field, "signature");
    assert!(problem.starts_with("is missing"), "{problem}");
    assert!(
        fake.store
            .artifact(&ws(), "s2", crate::run::records::JOB_FILE)
            .await
            .unwrap()
            .is_none(),
        "nothing ran"
    );
}

#[tokio::test]
async fn the_runners_own_key_signs_drift_checks_only() {
    use crate::job::signature::SenderSecret;
    let runner = Arc::new(SenderSecret::generate());
    let mut fake = signing_fake(&runner);
    fake.runtime.signing_key = Some(runner.clone());
    let now = time::OffsetDateTime::now_utc();
    let apply = signed(&message("own-1", "2h"), "job", &runner, now);
    let (field, problem) =
        refused(&handle(&fake, delivery(&apply, Some(Duration::from_secs(600)))).await);
    assert_eq!(field, "signature");
    assert!(problem.contains("runner's own key"), "{problem}");
    let cancel = json!({ "cancel": { "job": "own-1", "tenant": "acme", "workspace": "demo" } });
    let cancel = signed(cancel.to_string().as_bytes(), "cancel", &runner, now);
    let (_, problem) = refused(&handle(&fake, delivery(&cancel, None)).await);
    assert!(problem.contains("runner's own key"), "{problem}");
    // Its drift check gets past the signature (and is handed off, as any job too long here).
    let mut drift: Value = serde_json::from_slice(&message("drift-1", "2h")).unwrap();
    drift["job"]["operation"] = json!("drift-check");
    let drift = signed(drift.to_string().as_bytes(), "job", &runner, now);
    let fate = handle(&fake, delivery(&drift, Some(Duration::from_secs(600)))).await;
    assert!(matches!(fate, Fate::HandedOff(_)), "{fate:?}");
}

#[tokio::test]
async fn an_old_signature_gets_a_known_jobs_result_and_refuses_an_unknown_one() {
    use crate::job::signature::SenderSecret;
    let key = SenderSecret::generate();
    let fake = signing_fake(&key);
    let old = time::OffsetDateTime::now_utc() - time::Duration::hours(30);
    // A job that ran, delivered again past the window: its result, reported again.
    finish(fake.store.as_ref(), "known-1").await;
    let again = signed(&message("known-1", "10m"), "job", &key, old);
    let fate = handle(&fake, delivery(&again, None)).await;
    let Fate::Ran(record) = fate else {
        panic!("{fate:?}")
    };
    assert_eq!(
        (record["job_id"].as_str(), record["status"].as_str()),
        (Some("known-1"), Some("succeeded"))
    );
    // One the store does not know: a replay.
    let unknown = signed(&message("unknown-1", "10m"), "job", &key, old);
    let (_, problem) = refused(&handle(&fake, delivery(&unknown, None)).await);
    assert!(problem.starts_with("is replayed"), "{problem}");
    assert!(
        fake.store
            .artifacts(&ws(), "unknown-1")
            .await
            .unwrap()
            .is_empty()
    );
}
