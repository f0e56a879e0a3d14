//! One request: a Pub/Sub push of a job message, or a Cloud Scheduler call of a sweep.
//!
//! Pub/Sub takes any 2xx as an acknowledgement and redelivers after anything else, so the
//! answer is the message's fate (see `shared::host::pipeline`): 200 when the job finished (or had
//! already), the message is rejected for good (with the rejection in the body and the log), it
//! was handed off, or its workspace is busy and a fresh copy went back on the jobs topic; 429
//! when it is busy and no copy could be published; 503 for trouble that may pass (and when this
//! instance is shutting down). A request that is not a push envelope at all gets 400; one
//! without a valid token, 401 or 403.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use shared::host::message::{Message, TaskStarted};
use shared::host::pipeline::{self, Delivery, Fate, Keep, Trigger};
use shared::host::settings::Runtime;
use shared::host::sweep::sweep;
use shared::host::tenants::Tenants;
use shared::host::trigger;
use shared::host::trigger::TriggerError;
use shared::job::template::source::Location;
use shared::job::validate::{ValidatedJob, ValidationError};
use shared::run::terraform::TerraformConfig;
use shared::sweeps::report::SweepKind;
use state_backends::gcs::{GcsConfig, GcsStore};
use state_backends::objects::Bucket;
use state_backends::{StateStore, WorkspaceId};
use tokio_util::sync::CancellationToken;

use crate::access::{self, Target};
use crate::config::Config;
use crate::oidc::Verifier;
use crate::transport;

/// What Pub/Sub POSTs.
#[derive(Debug, Deserialize)]
struct Push {
    message: PushMessage,
    subscription: String,
}

/// Pub/Sub sends the id twice, as `messageId` and `message_id` (so a serde alias, which
/// refuses a field given twice, would refuse every real push).
#[derive(Debug, Deserialize)]
struct PushMessage {
    #[serde(default)]
    data: Option<String>,
    #[serde(default, rename = "messageId")]
    message_id: Option<String>,
    #[serde(default, rename = "message_id")]
    message_id_snake: Option<String>,
}

/// What Cloud Scheduler POSTs to a sweep: the registered tenants to sweep (all when none or
/// the body is empty). The buckets come from the tenant registry, never from the request.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    #[serde(default)]
    tenants: Vec<String>,
}

/// Each registered target, once, with the tenants registered to it.
type Targets = Vec<(Target, BTreeSet<String>)>;

pub struct App {
    pub config: Config,
    pub verifier: Verifier,
    /// This service's own credentials, for Cloud Run and Pub/Sub.
    pub own: transport::Own,
    /// Cancelled on SIGTERM: running jobs stop (and end `interrupted`, to run again).
    pub shutdown: CancellationToken,
}

/// What a Cloud Run Job execution gets in `TERRACE_JOB_REF`.
type JobRef = trigger::JobRef<Target>;

/// The Cloud Run Admin API's `jobs.run` body: one task, `terrace-gcp task` with the reference,
/// and a task timeout of the job's plus the task's wait for a busy workspace plus 5 minutes
/// for its result and lease.
fn run_job_request(reference: &str, job_timeout: Duration, lease_wait: Duration) -> Value {
    json!({
        "overrides": {
            "containerOverrides": [{
                "args": ["task"],
                "env": [{ "name": "TERRACE_JOB_REF", "value": reference }],
            }],
            "taskCount": 1,
            "timeout": format!("{}s", job_timeout.as_secs() + lease_wait.as_secs() + 300),
        }
    })
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

/// The bucket `TERRACE_TEMPLATES` names, reached as this service (anonymously against an
/// emulator).
///
/// # Errors
/// A place that is not a GCS bucket, or no credentials.
pub async fn templates_bucket(
    location: Location,
    anonymous: bool,
    endpoint: String,
    call_timeout: Duration,
) -> Result<Arc<dyn Bucket>, String> {
    let Location::Gcs { bucket, .. } = location else {
        return Err(format!(
            "{location} is not a GCS bucket: the Google Cloud runner reads templates from gs://BUCKET/PREFIX, or a folder"
        ));
    };
    let credentials = if anonymous {
        google_cloud_auth::credentials::anonymous::Builder::new().build()
    } else {
        google_cloud_auth::credentials::Builder::default()
            .build()
            .map_err(|e| format!("this service has no credentials of its own: {e}"))?
    };
    let storage = google_cloud_storage::client::Storage::builder()
        .with_retry_policy(state_backends::gcs::retry_policy())
        .with_endpoint(&endpoint)
        .with_credentials(credentials.clone())
        .build()
        .await
        .map_err(|e| format!("cannot make a GCS client: {e}"))?;
    let store = GcsStore::new(
        storage,
        credentials,
        GcsConfig {
            bucket,
            prefix: String::new(),
            kms_key: None,
            endpoint,
            call_timeout,
        },
    );
    Ok(Arc::new(store.into_bucket()))
}

impl App {
    /// The customer's store, through their service account.
    ///
    /// # Errors
    /// Why it cannot be reached, as a sentence.
    pub async fn store_for(&self, target: &Target) -> Result<Arc<dyn StateStore>, TriggerError> {
        let credentials =
            access::customer(target, Duration::from_secs(3600), self.config.anonymous)?;
        let call_timeout = self.config.runtime.call_timeout;
        let storage = google_cloud_storage::client::Storage::builder()
            .with_retry_policy(state_backends::gcs::retry_policy())
            .with_endpoint(&self.config.gcs_endpoint)
            .with_credentials(credentials.clone())
            .build()
            .await
            .map_err(|e| format!("cannot make a GCS client: {e}"))?;
        Ok(self.config.runtime.seal(Arc::new(GcsStore::new(
            storage,
            credentials,
            GcsConfig {
                bucket: target.bucket.clone(),
                prefix: target.prefix.clone(),
                kms_key: target.kms_key.clone(),
                endpoint: self.config.gcs_endpoint.clone(),
                call_timeout,
            },
        ))))
    }

    /// `POST /pubsub`.
    pub async fn push(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        if let Err(refusal) = self.verifier.verify(headers).await {
            tracing::warn!(status = %refusal.status, reason = %refusal.reason, "push refused");
            return answer(refusal.status, json!({ "error": refusal.reason }));
        }
        let push: Push = match serde_json::from_slice(body) {
            Ok(p) => p,
            Err(e) => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    json!({
                        "error": format!("not a Pub/Sub push envelope: {e}"),
                        "fix": "POST {\"message\": {\"data\": BASE64, \"messageId\": …}, \"subscription\": …}",
                    }),
                );
            }
        };
        let Some(id) = push.message.message_id.or(push.message.message_id_snake) else {
            return answer(
                StatusCode::BAD_REQUEST,
                json!({ "error": "message.messageId is missing: not a Pub/Sub push envelope" }),
            );
        };
        let data = match push
            .message
            .data
            .as_deref()
            .map(|d| base64::engine::general_purpose::STANDARD.decode(d))
        {
            Some(Ok(data)) => data,
            Some(Err(e)) => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    json!({ "error": format!("message.data is not base64: {e}") }),
                );
            }
            // A message of attributes only: delivered again it would never be a job, so it is
            // acknowledged with a rejection, like any message that cannot be one.
            None => {
                let record = Message::Rejection(trigger::rejection(
                    &id,
                    vec![trigger::problem(
                        "message.data",
                        "is missing: the message carries no job",
                        "publish the job envelope as the message's data",
                    )],
                ));
                self.report(&record).await;
                return answer(StatusCode::OK, record.to_value());
            }
        };
        tracing::info!(message_id = %id, subscription = %push.subscription, "job message");
        let left = self
            .config
            .request_timeout
            .saturating_sub(self.config.margin);
        let delivery = Delivery {
            message_id: &id,
            body: &data,
            time_left: Some(left),
            lease_wait: Duration::ZERO,
            cancel: self.shutdown.child_token(),
            receipt: None,
        };
        match pipeline::handle(self, delivery).await {
            Fate::Ran(body) | Fate::Rejected(body) | Fate::HandedOff(body) => {
                answer(StatusCode::OK, body)
            }
            Fate::Requeued { why, delay } => answer(
                StatusCode::OK,
                json!({ "status": "requeued", "why": why, "delay_s": delay.as_secs() }),
            ),
            Fate::Again { why, delay } => {
                tracing::warn!(message_id = %id, why, "job message to be delivered again");
                let status = if delay.is_some() {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let mut response = answer(status, json!({ "error": why }));
                if let Some(delay) = delay
                    && let Ok(v) = delay.as_secs().to_string().parse()
                {
                    response.headers_mut().insert(header::RETRY_AFTER, v);
                }
                response
            }
            // Stopped by this instance's shutdown: delivered again, to run again.
            Fate::Interrupted(_) => answer(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "this instance is shutting down; the job was interrupted and runs again" }),
            ),
        }
    }

    /// Publishes a result or a rejection to the results topic, when there is one.
    async fn publish_result(&self, record: &Value) {
        let Some(topic) = &self.config.results_topic else {
            return;
        };
        if let Err((_, e)) = transport::publish(
            &self.own,
            &self.config.pubsub_endpoint,
            topic,
            std::slice::from_ref(record),
        )
        .await
        {
            tracing::error!(error = %e, "could not publish to the results topic");
        }
    }

    /// `terrace-gcp task`: the job a Cloud Run Job execution was handed, by its reference.
    pub async fn task(&self, reference: &str) -> Fate {
        let wait = self.config.runtime.task_lease_wait;
        pipeline::task(self, reference, wait, self.shutdown.child_token()).await
    }

    /// `POST /sweeps/backup` (the hourly backups) and `POST /sweeps/drift` (a `drift-check`
    /// job for each applied workspace, published to the jobs topic): 500 when any bucket's
    /// report says something was not done (Cloud Scheduler then retries by its own policy).
    pub async fn sweep(&self, kind: SweepKind, headers: &HeaderMap, body: &[u8]) -> Response {
        let targets = match self.sweep_request(headers, body).await {
            Ok(s) => s,
            Err(refused) => return refused,
        };
        let report = sweep(self, kind, &targets, time::OffsetDateTime::now_utc()).await;
        let status = if report.failed() {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        answer(status, serde_json::to_value(report).unwrap_or_default())
    }

    /// A scheduler's call: its token, then its body; the registered targets it sweeps.
    async fn sweep_request(&self, headers: &HeaderMap, body: &[u8]) -> Result<Targets, Response> {
        if let Err(refusal) = self.verifier.verify(headers).await {
            return Err(answer(refusal.status, json!({ "error": refusal.reason })));
        }
        let fix = "POST {} to sweep every registered tenant, or {\"tenants\": [names]} for some";
        let sweep: Sweep = if body.iter().all(u8::is_ascii_whitespace) {
            Sweep::default()
        } else {
            serde_json::from_slice(body).map_err(|e| {
                answer(
                    StatusCode::BAD_REQUEST,
                    json!({ "error": format!("not a sweep request: {e}"), "fix": fix }),
                )
            })?
        };
        self.config
            .tenants
            .grouped(&sweep.tenants)
            .map_err(|e| answer(StatusCode::BAD_REQUEST, json!({ "error": e, "fix": fix })))
    }
}

#[async_trait]
impl Trigger for App {
    type Target = Target;

    fn envelope_fix(&self) -> &'static str {
        "publish {\"job\": {…}} for a tenant in the runner's registry (a \"target\" there must agree with the registry's)"
    }

    fn tenants(&self) -> Option<&Tenants<Target>> {
        Some(&self.config.tenants)
    }

    fn check_target(&self, target: &Target) -> Vec<ValidationError> {
        match target.check() {
            Ok(()) => Vec::new(),
            Err(e) => vec![trigger::problem(
                "target",
                e,
                "name the customer's service account this service may impersonate",
            )],
        }
    }

    fn runtime(&self) -> &Runtime {
        &self.config.runtime
    }

    fn shutdown(&self) -> Option<&CancellationToken> {
        Some(&self.shutdown)
    }

    async fn store(
        &self,
        target: &Target,
        _session: &str,
        _ws: Option<&WorkspaceId>,
    ) -> Result<Arc<dyn StateStore>, TriggerError> {
        self.store_for(target).await
    }

    /// Terraform's Google provider impersonates the customer itself (and refreshes).
    async fn terraform_access(
        &self,
        target: &Target,
        _job: &ValidatedJob,
        terraform: &mut TerraformConfig,
    ) -> Result<Keep, TriggerError> {
        terraform.settings = access::terraform_settings(target, self.config.anonymous);
        Ok(None)
    }

    async fn report(&self, message: &Message) {
        self.publish_result(&message.to_value()).await;
    }

    /// Publishes `body` to the jobs topic again. Pub/Sub cannot delay a message, so the
    /// answer is held first, for `delay` up to `TERRACE_REQUEUE_WAIT` (less on shutdown):
    /// that bounds how often a waiting job comes back, and a fresh message starts its delivery
    /// count at zero, so waiting never dead-letters it.
    async fn requeue(&self, body: &[u8], delay: Duration) -> Result<(), TriggerError> {
        let topic = self
            .config
            .jobs_topic
            .as_deref()
            .ok_or("TERRACE_JOBS_TOPIC is not set")?;
        let message: Value = shared::host::trigger::json_or_base64(body)
            .map_err(|e| format!("the message cannot be published again: {e}"))?;
        let wait = delay.min(self.config.requeue_wait);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = self.shutdown.cancelled() => {}
        }
        transport::publish(
            &self.own,
            &self.config.pubsub_endpoint,
            topic,
            std::slice::from_ref(&message),
        )
        .await
        .map(|_| ())
        .map_err(|(_, why)| TriggerError::again(why))
    }

    /// Published together, a thousand to a request.
    async fn enqueue(&self, bodies: &[String]) -> Vec<Option<String>> {
        let Some(topic) = self.config.jobs_topic.as_deref() else {
            let why = "TERRACE_JOBS_TOPIC is not set: the service has no jobs topic";
            return vec![Some(why.to_owned()); bodies.len()];
        };
        let messages: Vec<Value> = bodies
            .iter()
            .map(|body| serde_json::from_str(body).unwrap_or(Value::Null))
            .collect();
        let published =
            transport::publish(&self.own, &self.config.pubsub_endpoint, topic, &messages).await;
        // The messages before the failed request were published, in order.
        let (queued, why) = match published {
            Ok(queued) => (queued, None),
            Err((queued, why)) => (queued, Some(why)),
        };
        (0..bodies.len())
            .map(|i| if i < queued { None } else { why.clone() })
            .collect()
    }

    fn bucket_of(&self, target: &Target) -> String {
        target.bucket.clone()
    }

    fn cannot_hand_off(&self) -> Option<String> {
        self.config.cloud_run_job.is_none().then(|| {
            "shorten the job's timeout, raise the service's request timeout and TERRACE_REQUEST_TIMEOUT (up to 3600 s), or set TERRACE_CLOUD_RUN_JOB".to_owned()
        })
    }

    /// Starts an execution of the Cloud Run Job (the same image, `terrace-gcp task`) with the
    /// reference to the staged message, so the job's variables stay out of Cloud Run's API.
    async fn start_task(
        &self,
        reference: &JobRef,
        timeout: Duration,
    ) -> Result<TaskStarted, TriggerError> {
        let job = self
            .config
            .cloud_run_job
            .as_deref()
            .ok_or("no Cloud Run Job is configured")?;
        let request = run_job_request(
            &serde_json::to_string(reference).map_err(|e| e.to_string())?,
            timeout,
            self.config.runtime.task_lease_wait,
        );
        let url = format!(
            "{}/v2/{job}:run",
            self.config.run_endpoint.trim_end_matches('/')
        );
        let body = self
            .own
            .post(
                &format!("the Cloud Run Admin API, starting {job}"),
                &url,
                &request,
            )
            .await?;
        Ok(TaskStarted {
            cloud_run_job: Some(job.to_owned()),
            operation: body["name"].as_str().map(str::to_owned),
            ..TaskStarted::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_with_the_id_under_both_names_as_pubsub_sends_it_is_read() {
        let push: Push = serde_json::from_value(json!({
            "message": {
                "data": "e30=", "attributes": {}, "messageId": "42", "message_id": "42",
                "publishTime": "2026-11-24T00:00:00Z", "publish_time": "2026-11-24T00:00:00Z",
            },
            "subscription": "projects/p/subscriptions/s",
        }))
        .unwrap();
        assert_eq!(push.message.message_id.as_deref(), Some("42"));
        let snake: Push = serde_json::from_value(json!({
            "message": { "data": "e30=", "message_id": "7" },
            "subscription": "projects/p/subscriptions/s",
        }))
        .unwrap();
        assert_eq!(snake.message.message_id_snake.as_deref(), Some("7"));
    }

    #[test]
    fn the_run_request_carries_only_the_reference_and_a_fitting_timeout() {
        let request = run_job_request(
            r#"{"job_id":"j1"}"#,
            Duration::from_secs(7200),
            Duration::from_secs(240),
        );
        let overrides = &request["overrides"];
        assert_eq!(overrides["taskCount"], 1);
        assert_eq!(overrides["timeout"], "7740s");
        let container = &overrides["containerOverrides"][0];
        assert_eq!(container["args"], json!(["task"]));
        assert_eq!(
            container["env"],
            json!([{ "name": "TERRACE_JOB_REF", "value": "{\"job_id\":\"j1\"}" }])
        );
    }
}
