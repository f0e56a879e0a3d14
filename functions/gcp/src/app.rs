//! One request: a Pub/Sub push of a job message, or a Cloud Scheduler call of a sweep.
//!
//! Pub/Sub takes any 2xx as an acknowledgement and redelivers after anything else, so the
//! answer is the message's fate: 200 when the job finished (or had already) or the message is
//! rejected for good (with the rejection in the body and the log), 429 when the workspace is
//! busy, 503 for trouble that may pass (and when this instance is shutting down). A request
//! that is not a push envelope at all gets 400; one without a valid token, 401 or 403.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use shared::runner::Runner;
use shared::trigger::{self, Handled};
use state_backends::StateStore;
use state_backends::gcs::{GcsConfig, GcsStore};
use tokio_util::sync::CancellationToken;

use crate::access::{self, Target};
use crate::config::Config;
use crate::google;
use crate::oidc::Verifier;

/// A job message: the job and the customer project it runs against.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    job: serde_json::Map<String, Value>,
    target: Target,
}

/// What Pub/Sub POSTs.
#[derive(Debug, Deserialize)]
struct Push {
    message: PushMessage,
    subscription: String,
}

#[derive(Debug, Deserialize)]
struct PushMessage {
    #[serde(default)]
    data: Option<String>,
    #[serde(rename = "messageId", alias = "message_id")]
    message_id: String,
}

/// What Cloud Scheduler POSTs to a sweep.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    targets: Vec<Target>,
}

pub struct App {
    pub config: Config,
    pub verifier: Verifier,
    /// This service's own credentials, for Cloud Run and Pub/Sub.
    pub own: google::Own,
    /// Cancelled on SIGTERM: running jobs stop (and end `interrupted`, to run again).
    pub shutdown: CancellationToken,
}

/// What a Cloud Run Job execution gets in `TERRACE_JOB_REF`.
type JobRef = trigger::JobRef<Target>;

/// The Cloud Run Admin API's `jobs.run` body: one task, `terrace-gcp task` with the reference,
/// and a task timeout of the job's plus 5 minutes for its result and lease.
fn run_job_request(reference: &str, job_timeout: Duration) -> Value {
    json!({
        "overrides": {
            "containerOverrides": [{
                "args": ["task"],
                "env": [{ "name": "TERRACE_JOB_REF", "value": reference }],
            }],
            "taskCount": 1,
            "timeout": format!("{}s", job_timeout.as_secs() + 300),
        }
    })
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

impl App {
    /// The customer's store, through their service account.
    ///
    /// # Errors
    /// Why it cannot be reached, as a sentence.
    pub async fn store_for(&self, target: &Target) -> Result<Arc<dyn StateStore>, String> {
        let credentials =
            access::customer(target, Duration::from_secs(3600), self.config.anonymous)?;
        let storage = google_cloud_storage::client::Storage::builder()
            .with_endpoint(&self.config.gcs_endpoint)
            .with_credentials(credentials.clone())
            .build()
            .await
            .map_err(|e| format!("cannot make a GCS client: {e}"))?;
        Ok(Arc::new(GcsStore::new(
            storage,
            credentials,
            GcsConfig {
                bucket: target.bucket.clone(),
                prefix: target.prefix.clone(),
                kms_key: target.kms_key.clone(),
                endpoint: self.config.gcs_endpoint.clone(),
            },
        )))
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
        let id = push.message.message_id;
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
            None => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    json!({ "error": "message.data is missing: the message carries no job" }),
                );
            }
        };
        tracing::info!(message_id = %id, subscription = %push.subscription, "job message");
        let left = self
            .config
            .request_timeout
            .saturating_sub(self.config.margin);
        match self.handle(&id, &data, Some(left)).await {
            Handled::Done(body) => answer(StatusCode::OK, body),
            Handled::Again { why, delay } => {
                tracing::warn!(message_id = %id, why, "job message to be delivered again");
                let busy = delay.is_some();
                let status = if busy {
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
            Handled::TooLong { job_id, ws } if self.config.cloud_run_job.is_some() => {
                match self.hand_off(&data, &job_id, &ws).await {
                    Ok(record) => answer(StatusCode::OK, record),
                    Err(why) => {
                        tracing::error!(message_id = %id, why, "handoff to the Cloud Run Job failed");
                        answer(StatusCode::SERVICE_UNAVAILABLE, json!({ "error": why }))
                    }
                }
            }
            Handled::TooLong { job_id, ws } => {
                let record = trigger::rejection(
                    &id,
                    vec![trigger::problem(
                        "timeout",
                        format!(
                            "job {job_id} for {ws} may run longer than this service's request timeout ({} s) allows, and no Cloud Run Job is configured to run it",
                            self.config.request_timeout.as_secs()
                        ),
                        "shorten the job's timeout, raise the service's request timeout and TERRACE_REQUEST_TIMEOUT (up to 3600 s), or set TERRACE_CLOUD_RUN_JOB",
                    )],
                );
                tracing::warn!(message_id = %id, record = %record, "job message rejected");
                self.report(&record).await;
                answer(StatusCode::OK, record)
            }
        }
    }

    /// Publishes a result or a rejection to the results topic, when there is one.
    async fn report(&self, record: &Value) {
        let Some(topic) = &self.config.results_topic else {
            return;
        };
        if let Err((_, e)) = google::publish(
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

    /// A message that will never be a job: answered with an error record, not retried.
    async fn reject(&self, message_id: &str, errors: Vec<Value>) -> Handled {
        let record = trigger::rejection(message_id, errors);
        tracing::warn!(message_id, record = %record, "job message rejected");
        self.report(&record).await;
        Handled::Done(record)
    }

    /// One job message. A job whose timeout exceeds `time_left` does not start here
    /// ([`Handled::TooLong`]).
    async fn handle(&self, message_id: &str, data: &[u8], time_left: Option<Duration>) -> Handled {
        let envelope: Envelope = match serde_json::from_slice(data) {
            Ok(e) => e,
            Err(e) => {
                let problem = trigger::problem(
                    "",
                    format!("the message is not a job envelope: {e}"),
                    "publish {\"job\": {…}, \"target\": {\"service_account\", \"bucket\", …}}",
                );
                return self.reject(message_id, vec![problem]).await;
            }
        };
        if let Err(e) = envelope.target.check() {
            let problem = trigger::problem(
                "target",
                e,
                "name the customer's service account this service may impersonate",
            );
            return self.reject(message_id, vec![problem]).await;
        }
        let job = match trigger::check_job(&envelope.job, &self.config.runtime.templates) {
            Ok(job) => job,
            Err(errors) => return self.reject(message_id, errors).await,
        };
        if time_left.is_some_and(|left| job.job.timeout > left) {
            return match state_backends::WorkspaceId::new(&job.job.tenant, &job.job.workspace) {
                Ok(ws) => Handled::TooLong {
                    job_id: job.job.id.clone(),
                    ws,
                },
                Err(e) => {
                    self.reject(message_id, vec![trigger::problem("workspace", e, "")])
                        .await
                }
            };
        }
        let target = &envelope.target;
        let again = |why: String| Handled::Again { why, delay: None };
        let store = match self.store_for(target).await {
            Ok(s) => s,
            Err(e) => return again(e),
        };
        let mut config = self.config.runtime.runner_config();
        config.terraform.settings = access::terraform_settings(target, self.config.anonymous);
        config.shutdown = Some(self.shutdown.clone());
        let runner = Runner::new(store, config);
        let (handled, fresh) =
            trigger::handled(runner.run(&job, self.shutdown.child_token()).await);
        match handled {
            // Stopped by this instance's shutdown: not final, so deliver it again.
            Handled::Done(result) if result["status"] == "interrupted" => Handled::Again {
                why: "this instance is shutting down; the job was interrupted and runs again"
                    .into(),
                delay: None,
            },
            Handled::Done(result) => {
                if fresh {
                    self.report(&result).await;
                }
                Handled::Done(result)
            }
            other => other,
        }
    }

    /// Starts an execution of the Cloud Run Job (the same image, `terrace-gcp task`) for a job
    /// too long for a request. The message is staged in the customer's bucket first, so its
    /// variables stay out of Cloud Run's API; the execution gets only a [`JobRef`].
    ///
    /// # Errors
    /// Why the execution was not started, as a sentence (the push is then delivered again).
    async fn hand_off(
        &self,
        data: &[u8],
        job_id: &str,
        ws: &state_backends::WorkspaceId,
    ) -> Result<Value, String> {
        let job = self
            .config
            .cloud_run_job
            .as_deref()
            .ok_or("no Cloud Run Job is configured")?;
        let envelope: Envelope = serde_json::from_slice(data).map_err(|e| e.to_string())?;
        let timeout = trigger::check_job(&envelope.job, &self.config.runtime.templates)
            .map_err(|_| "the job is no longer valid")?
            .job
            .timeout;
        let store = self.store_for(&envelope.target).await?;
        let reference = JobRef::new(envelope.target, ws, job_id);
        reference.stage(&*store, data).await?;
        let request = run_job_request(
            &serde_json::to_string(&reference).map_err(|e| e.to_string())?,
            timeout,
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
        let operation = body["name"].as_str().unwrap_or_default().to_owned();
        tracing::info!(job_id, operation, "handed off to the Cloud Run Job");
        Ok(json!({
            "status": "handed-off", "job_id": job_id, "workspace": ws.to_string(),
            "cloud_run_job": job, "operation": operation,
        }))
    }

    /// `terrace-gcp task`: the job a Cloud Run Job execution was handed, by its reference.
    ///
    /// # Errors
    /// Why it could not run, as a sentence.
    pub async fn task(&self, reference: &str) -> Result<Value, String> {
        let r: JobRef = serde_json::from_str(reference)
            .map_err(|e| format!("TERRACE_JOB_REF is not a job reference: {e}"))?;
        let store = self.store_for(&r.target).await?;
        let data = r.staged(&*store).await?;
        match self
            .handle(&format!("task-{}", r.job_id), &data, None)
            .await
        {
            Handled::Done(result) => {
                r.unstage(&*store, &result).await;
                Ok(result)
            }
            Handled::Again { why, .. } => Err(why),
            Handled::TooLong { .. } => Err("unreachable: a task has no time limit".into()),
        }
    }

    /// `POST /sweeps/drift`: a `drift-check` job for each applied workspace of each customer's
    /// bucket, published to the jobs topic, so each runs like any other job.
    pub async fn drift_sweep(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        let sweep = match self.sweep_request(headers, body).await {
            Ok(s) => s,
            Err(refused) => return refused,
        };
        let mut reports = Vec::new();
        for target in &sweep.targets {
            let report = match self.drift_target(target).await {
                Ok(report) => report,
                Err(e) => json!({ "bucket": target.bucket, "error": e }),
            };
            tracing::info!(report = %report, "drift sweep");
            reports.push(report);
        }
        sweep_answer("drift_sweep", reports)
    }

    async fn drift_target(&self, target: &Target) -> Result<Value, String> {
        let topic = self
            .config
            .jobs_topic
            .as_deref()
            .ok_or("TERRACE_JOBS_TOPIC is not set: the drift checks have no topic")?;
        let store = self.store_for(target).await?;
        let plan = shared::drift::plan(&*store, time::OffsetDateTime::now_utc())
            .await
            .map_err(|e| e.to_string())?;
        let messages: Vec<Value> = plan
            .jobs
            .iter()
            .map(|(_, job)| json!({ "job": job.0, "target": target }))
            .collect();
        let published =
            google::publish(&self.own, &self.config.pubsub_endpoint, topic, &messages).await;
        Ok(match published {
            Ok(queued) => plan.report(&target.bucket, queued, Vec::new()),
            // The messages before the failed request were published, in order.
            Err((queued, why)) => {
                let unqueued = plan.jobs[queued..]
                    .iter()
                    .map(|(ws, _)| (ws.to_string(), why.clone()))
                    .collect();
                plan.report(&target.bucket, queued, unqueued)
            }
        })
    }

    /// A scheduler's call: its token, then its body.
    async fn sweep_request(&self, headers: &HeaderMap, body: &[u8]) -> Result<Sweep, Response> {
        if let Err(refusal) = self.verifier.verify(headers).await {
            return Err(answer(refusal.status, json!({ "error": refusal.reason })));
        }
        serde_json::from_slice(body).map_err(|e| {
            answer(
                StatusCode::BAD_REQUEST,
                json!({ "error": format!("not a sweep request: {e}"), "fix": "POST {\"targets\": [{\"service_account\", \"bucket\", …}]}" }),
            )
        })
    }

    /// `POST /sweeps/backup`: the hourly backup sweep over each customer's bucket.
    pub async fn backup_sweep(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        let sweep = match self.sweep_request(headers, body).await {
            Ok(s) => s,
            Err(refused) => return refused,
        };
        let mut reports = Vec::new();
        for target in &sweep.targets {
            let store = self.store_for(target).await;
            let report = shared::backup::bucket_report(
                &target.bucket,
                store,
                time::OffsetDateTime::now_utc(),
            )
            .await;
            tracing::info!(report = %report, "backup sweep");
            reports.push(report);
        }
        sweep_answer("backup_sweep", reports)
    }
}

/// A sweep's answer: 500 when any bucket's report says something was not done (Cloud
/// Scheduler then retries by its own policy).
fn sweep_answer(name: &str, reports: Vec<Value>) -> Response {
    let status = if reports.iter().any(shared::backup::report_failed) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    answer(status, json!({ name: reports }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_request_carries_only_the_reference_and_a_fitting_timeout() {
        let request = run_job_request(r#"{"job_id":"j1"}"#, Duration::from_secs(7200));
        let overrides = &request["overrides"];
        assert_eq!(overrides["taskCount"], 1);
        assert_eq!(overrides["timeout"], "7500s");
        let container = &overrides["containerOverrides"][0];
        assert_eq!(container["args"], json!(["task"]));
        assert_eq!(
            container["env"],
            json!([{ "name": "TERRACE_JOB_REF", "value": "{\"job_id\":\"j1\"}" }])
        );
    }
}
