//! The function's settings, from its environment (set by the deployment).

use std::time::Duration;

use shared::host::settings::{ConfigError, Runtime, flag, list, seconds, var};
use shared::host::tenants::Tenants;

use crate::access::Target;

/// Where a job too long for Lambda runs instead: an ECS Fargate task of the same image.
#[derive(Clone, Debug)]
pub struct Handoff {
    pub cluster: String,
    pub task_definition: String,
    /// The container in the task definition that runs `terrace-aws task`.
    pub container: String,
    pub subnets: Vec<String>,
    pub security_groups: Vec<String>,
    /// `TERRACE_ECS_START_WINDOW` ([`START_WINDOW`]): how long a handed-off job's message
    /// stays out of sight for its task to start and take it; past that it is delivered again.
    pub start_window: Duration,
}

/// The default start window: Fargate pulls the image and starts a task in about a minute,
/// several with a cold image cache.
pub const START_WINDOW: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
pub struct Config {
    pub runtime: Runtime,
    /// `TERRACE_TENANTS`: each tenant's role, ExternalId and bucket (see `shared::host::tenants`).
    pub tenants: Tenants<Target>,
    /// The jobs queue, to keep a running job's message invisible and to delay a busy one.
    pub jobs_queue_url: Option<String>,
    /// Where every result and every rejection is sent.
    pub results_queue_url: Option<String>,
    /// Path-style S3 addressing (S3-compatible endpoints and emulators).
    pub s3_path_style: bool,
    pub handoff: Option<Handoff>,
    /// Time kept back from the Lambda deadline for the result, the lease and the response.
    pub margin: Duration,
    /// How often a running job's message is made invisible again (for four times as long).
    pub keep_invisible_every: Duration,
    /// Terraform's session for the customer account is replaced when it has less than this
    /// left (see `credentials`).
    pub refresh_credentials_before: Duration,
    /// `TERRACE_CALL_TIMEOUT` (60 s): how long one attempt of an AWS call may take (the SDK
    /// tries up to three times).
    pub call_timeout: Duration,
}

/// Whether a queue is an SQS FIFO queue (its name ends in `.fifo`).
pub fn is_fifo(url: Option<&str>) -> bool {
    url.is_some_and(|u| u.ends_with(".fifo"))
}

impl Config {
    /// Whether the jobs queue is FIFO: each workspace's messages are one group, delivered in
    /// order and one at a time (see `transport`).
    pub fn jobs_fifo(&self) -> bool {
        is_fifo(self.jobs_queue_url.as_deref())
    }

    /// Reads the settings.
    ///
    /// # Errors
    /// A setting that is present but malformed, or a half-configured handoff, named.
    pub fn from_env() -> Result<Self, ConfigError> {
        let handoff = match (
            var("TERRACE_ECS_CLUSTER"),
            var("TERRACE_ECS_TASK_DEFINITION"),
        ) {
            (Some(cluster), Some(task_definition)) => Some(Handoff {
                cluster,
                task_definition,
                container: var("TERRACE_ECS_CONTAINER").unwrap_or_else(|| "terrace".into()),
                subnets: list("TERRACE_ECS_SUBNETS"),
                security_groups: list("TERRACE_ECS_SECURITY_GROUPS"),
                start_window: seconds("TERRACE_ECS_START_WINDOW", START_WINDOW.as_secs())?
                    .clamp(Duration::from_secs(1), Duration::from_secs(43_200)),
            }),
            (None, None) => None,
            _ => {
                return Err(
                    "set both TERRACE_ECS_CLUSTER and TERRACE_ECS_TASK_DEFINITION for long jobs to be handed to ECS, or neither".into(),
                );
            }
        };
        Ok(Self {
            runtime: Runtime::from_env()?
                .isolate_terraform()?
                .metrics_default(shared::run::metrics::Format::Emf)
                .on_cloud("aws"),
            tenants: Tenants::from_env(
                |t: &Target| t.check().err().map(|e| e.to_string()).into_iter().collect(),
                r#"{"acme": {"role_arn": "arn:aws:iam::123456789012:role/terrace", "external_id": "…", "bucket": "acme-states"}}"#,
            )?,
            jobs_queue_url: var("TERRACE_JOBS_QUEUE_URL"),
            results_queue_url: var("TERRACE_RESULTS_QUEUE_URL"),
            s3_path_style: flag("TERRACE_S3_FORCE_PATH_STYLE"),
            handoff,
            margin: seconds("TERRACE_DEADLINE_MARGIN", 45)?,
            keep_invisible_every: seconds("TERRACE_KEEP_INVISIBLE_EVERY", 30)?
                .max(Duration::from_secs(1)),
            refresh_credentials_before: seconds("TERRACE_REFRESH_CREDENTIALS_BEFORE", 600)?,
            call_timeout: shared::host::settings::call_timeout()?,
        })
    }
}
