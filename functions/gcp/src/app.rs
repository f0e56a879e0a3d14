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
    /// Cancelled on SIGTERM: running jobs stop (and end `interrupted`, to run again).
    pub shutdown: CancellationToken,
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
        match self.handle(&id, &data).await {
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
            Handled::TooLong { job_id, ws } => {
                let record = trigger::rejection(
                    &id,
                    vec![trigger::problem(
                        "timeout",
                        format!(
                            "job {job_id} for {ws} may run longer than this service's request timeout ({} s) allows, and handing jobs off to a Cloud Run Job is not built yet",
                            self.config.request_timeout.as_secs()
                        ),
                        "shorten the job's timeout, or raise the service's request timeout and TERRACE_REQUEST_TIMEOUT (up to 3600 s)",
                    )],
                );
                tracing::warn!(message_id = %id, record = %record, "job message rejected");
                answer(StatusCode::OK, record)
            }
        }
    }

    fn reject(message_id: &str, errors: Vec<Value>) -> Handled {
        let record = trigger::rejection(message_id, errors);
        tracing::warn!(message_id, record = %record, "job message rejected");
        Handled::Done(record)
    }

    async fn handle(&self, message_id: &str, data: &[u8]) -> Handled {
        let envelope: Envelope = match serde_json::from_slice(data) {
            Ok(e) => e,
            Err(e) => {
                let problem = trigger::problem(
                    "",
                    format!("the message is not a job envelope: {e}"),
                    "publish {\"job\": {…}, \"target\": {\"service_account\", \"bucket\", …}}",
                );
                return Self::reject(message_id, vec![problem]);
            }
        };
        if let Err(e) = envelope.target.check() {
            let problem = trigger::problem(
                "target",
                e,
                "name the customer's service account this service may impersonate",
            );
            return Self::reject(message_id, vec![problem]);
        }
        let job = match trigger::check_job(&envelope.job, &self.config.runtime.templates) {
            Ok(job) => job,
            Err(errors) => return Self::reject(message_id, errors),
        };
        let left = self
            .config
            .request_timeout
            .saturating_sub(self.config.margin);
        if job.job.timeout > left {
            return match state_backends::WorkspaceId::new(&job.job.tenant, &job.job.workspace) {
                Ok(ws) => Handled::TooLong {
                    job_id: job.job.id.clone(),
                    ws,
                },
                Err(e) => Self::reject(message_id, vec![trigger::problem("workspace", e, "")]),
            };
        }
        let target = &envelope.target;
        let again = |why: String| Handled::Again { why, delay: None };
        let store = match self.store_for(target).await {
            Ok(s) => s,
            Err(e) => return again(e),
        };
        let env = match access::terraform_env(target, job.job.timeout, self.config.anonymous).await
        {
            Ok(env) => env,
            Err(e) => return again(e),
        };
        let mut config = self.config.runtime.runner_config();
        config.terraform.env = env;
        config.shutdown = Some(self.shutdown.clone());
        let runner = Runner::new(store, config);
        let (handled, _) = trigger::handled(runner.run(&job, self.shutdown.child_token()).await);
        match handled {
            // Stopped by this instance's shutdown: not final, so deliver it again.
            Handled::Done(result) if result["status"] == "interrupted" => Handled::Again {
                why: "this instance is shutting down; the job was interrupted and runs again"
                    .into(),
                delay: None,
            },
            other => other,
        }
    }

    /// `POST /sweeps/backup`: the hourly backup sweep over each customer's bucket.
    pub async fn backup_sweep(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        if let Err(refusal) = self.verifier.verify(headers).await {
            return answer(refusal.status, json!({ "error": refusal.reason }));
        }
        let sweep: Sweep = match serde_json::from_slice(body) {
            Ok(s) => s,
            Err(e) => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    json!({ "error": format!("not a sweep request: {e}"), "fix": "POST {\"targets\": [{\"service_account\", \"bucket\", …}]}" }),
                );
            }
        };
        let mut reports = Vec::new();
        let mut failed = false;
        for target in &sweep.targets {
            let report = match self.store_for(target).await {
                Ok(store) => match shared::backup::sweep(
                    &*store,
                    time::OffsetDateTime::now_utc(),
                    shared::backup::Retention::default(),
                )
                .await
                {
                    Ok(r) => {
                        failed |= !r.failed.is_empty();
                        json!({
                            "bucket": target.bucket, "changed": r.changed,
                            "backed_up": r.backed_up.len(), "pruned": r.pruned.len(),
                            "failed": r.failed,
                        })
                    }
                    Err(e) => {
                        failed = true;
                        json!({ "bucket": target.bucket, "error": e.to_string() })
                    }
                },
                Err(e) => {
                    failed = true;
                    json!({ "bucket": target.bucket, "error": e })
                }
            };
            tracing::info!(report = %report, "backup sweep");
            reports.push(report);
        }
        // Cloud Scheduler retries a failed call by its own policy.
        let status = if failed {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        answer(status, json!({ "backup_sweep": reports }))
    }
}
