//! The service's settings, from its environment (set by the deployment).

use std::time::Duration;

use shared::host::settings::{ConfigError, Runtime, flag, list, seconds, var};
use shared::host::tenants::Tenants;

use crate::access::Target;

use crate::oidc::OidcConfig;

#[derive(Clone, Debug)]
pub struct Config {
    pub runtime: Runtime,
    /// `TERRACE_TENANTS`: each tenant's service account and bucket (see `shared::host::tenants`).
    pub tenants: Tenants<Target>,
    /// `PORT`, set by Cloud Run (default 8080).
    pub port: u16,
    pub oidc: OidcConfig,
    /// `TERRACE_REQUEST_TIMEOUT`: the service's request timeout (Cloud Run's default, 300 s). A
    /// job must finish within it, less `TERRACE_DEADLINE_MARGIN` (30 s) for its result.
    pub request_timeout: Duration,
    pub margin: Duration,
    /// `TERRACE_GCS_ENDPOINT`: GCS's JSON API (an emulator's in tests).
    pub gcs_endpoint: String,
    /// `TERRACE_GCS_ANONYMOUS=1`: no credentials and no impersonation, for an emulator only.
    pub anonymous: bool,
    /// `TERRACE_CLOUD_RUN_JOB`: the Cloud Run Job (`projects/P/locations/L/jobs/J`, same image)
    /// that runs jobs too long for a request; unset: such jobs are rejected.
    pub cloud_run_job: Option<String>,
    /// `TERRACE_CLOUD_RUN_ENDPOINT`: the Cloud Run Admin API (default `https://run.googleapis.com`).
    pub run_endpoint: String,
    /// `TERRACE_JOBS_TOPIC` (`projects/P/topics/T`): the topic whose push subscription calls
    /// this service, where the drift sweep puts its checks and a busy job's message goes back.
    pub jobs_topic: Option<String>,
    /// `TERRACE_REQUEUE_WAIT` (60 s): how long the answer to a push whose workspace is busy is
    /// held before the message goes back on the jobs topic (Pub/Sub cannot delay a message).
    pub requeue_wait: Duration,
    /// `TERRACE_RESULTS_TOPIC`: where results and rejections are published, when set.
    pub results_topic: Option<String>,
    /// `TERRACE_PUBSUB_ENDPOINT` (default `https://pubsub.googleapis.com`).
    pub pubsub_endpoint: String,
}

impl Config {
    /// Reads the settings. A task (`serving` false) takes no requests, so it needs no token
    /// settings; its verifier accepts nothing.
    ///
    /// # Errors
    /// A missing or malformed setting, named.
    pub fn from_env(serving: bool) -> Result<Self, ConfigError> {
        let audience = match var("TERRACE_PUSH_AUDIENCE") {
            Some(a) => a,
            None if !serving => String::new(),
            None => return Err("TERRACE_PUSH_AUDIENCE is not set: set it to the audience of the push subscription's and the scheduler's OIDC tokens (usually this service's URL)".into()),
        };
        let mut issuers = list("TERRACE_OIDC_ISSUERS");
        if issuers.is_empty() {
            issuers = vec![
                "https://accounts.google.com".into(),
                "accounts.google.com".into(),
            ];
        }
        let port = match var("PORT") {
            None => 8080,
            Some(p) => p
                .parse()
                .map_err(|_| format!("PORT={p:?} is not a port number"))?,
        };
        Ok(Self {
            runtime: Runtime::from_env()?.isolate_terraform()?.on_cloud("gcp"),
            tenants: Tenants::from_env(
                |t: &Target| t.check().err().into_iter().collect(),
                r#"{"acme": {"service_account": "terrace@acme-prod.iam.gserviceaccount.com", "bucket": "acme-states"}}"#,
            )?,
            port,
            oidc: OidcConfig {
                audience,
                issuers,
                jwks_url: var("TERRACE_OIDC_JWKS_URL")
                    .unwrap_or_else(|| "https://www.googleapis.com/oauth2/v3/certs".into()),
                service_accounts: {
                    let allowed = list("TERRACE_PUSH_SERVICE_ACCOUNTS");
                    if allowed.is_empty() && serving {
                        return Err("TERRACE_PUSH_SERVICE_ACCOUNTS is not set: name the service accounts of the push subscription and the scheduler jobs (anyone can get a Google-signed token for this audience)".into());
                    }
                    allowed
                },
                keys_max_age: seconds("TERRACE_OIDC_KEYS_MAX_AGE", 3600)?
                    .max(Duration::from_secs(1)),
            },
            request_timeout: seconds("TERRACE_REQUEST_TIMEOUT", 300)?,
            margin: seconds("TERRACE_DEADLINE_MARGIN", 30)?,
            gcs_endpoint: var("TERRACE_GCS_ENDPOINT")
                .unwrap_or_else(|| state_backends::gcs::GcsConfig::ENDPOINT.into()),
            anonymous: flag("TERRACE_GCS_ANONYMOUS"),
            cloud_run_job: var("TERRACE_CLOUD_RUN_JOB"),
            run_endpoint: var("TERRACE_CLOUD_RUN_ENDPOINT")
                .unwrap_or_else(|| "https://run.googleapis.com".into()),
            jobs_topic: var("TERRACE_JOBS_TOPIC"),
            requeue_wait: seconds("TERRACE_REQUEUE_WAIT", 60)?,
            results_topic: var("TERRACE_RESULTS_TOPIC"),
            pubsub_endpoint: var("TERRACE_PUBSUB_ENDPOINT")
                .unwrap_or_else(|| "https://pubsub.googleapis.com".into()),
        })
    }
}
