//! What the function does with one job message, wherever it came from (an SQS record on
//! Lambda, or the environment of a handed-off ECS task): validate, open the customer's store
//! through their role, run the job with the core runner, report.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use shared::runner::Runner;
use shared::trigger::{self, Handled};
use shared::validate::ValidatedJob;
use state_backends::StateStore;
use state_backends::s3::{LeaseMode, S3Config, S3Store};
use tokio_util::sync::CancellationToken;

use crate::access::{self, Target};
use crate::config::Config;
use crate::credentials;

/// A job message: the job and the customer account it runs against.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub job: serde_json::Map<String, Value>,
    pub target: Target,
}

/// The function's clients and settings, made once per container.
#[derive(Clone, Debug)]
pub struct App {
    pub config: Arc<Config>,
    pub aws: aws_config::SdkConfig,
    pub sqs: aws_sdk_sqs::Client,
    pub ecs: aws_sdk_ecs::Client,
}

/// What a handed-off ECS task gets in `TERRACE_JOB_REF`.
pub type JobRef = trigger::JobRef<Target>;

impl App {
    pub async fn new(config: Config) -> Self {
        let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self {
            sqs: aws_sdk_sqs::Client::new(&aws),
            ecs: aws_sdk_ecs::Client::new(&aws),
            config: Arc::new(config),
            aws,
        }
    }

    /// The customer's store, reached through their role.
    ///
    /// # Errors
    /// Why the role cannot be used, as a sentence.
    pub async fn store_for(
        &self,
        target: &Target,
        session: &str,
    ) -> Result<Arc<dyn StateStore>, String> {
        let customer = access::customer_config(&self.aws, target, session)
            .await
            .map_err(|e| e.to_string())?;
        self.store_with(&customer, target)
            .map_err(|e| e.to_string())
    }

    fn store_with(
        &self,
        customer: &aws_config::SdkConfig,
        target: &Target,
    ) -> Result<Arc<dyn StateStore>, state_backends::StoreError> {
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(customer)
                .force_path_style(self.config.s3_path_style)
                .build(),
        );
        let (lease, dynamodb) = match &target.lease_table {
            Some(table) => (
                LeaseMode::DynamoDb {
                    table: table.clone(),
                },
                Some(aws_sdk_dynamodb::Client::new(customer)),
            ),
            None => (LeaseMode::LockObject, None),
        };
        let store = S3Store::new(
            s3,
            dynamodb,
            S3Config {
                bucket: target.bucket.clone(),
                prefix: target.prefix.clone(),
                lease,
                kms_key_id: target.kms_key_id.clone(),
            },
        )?;
        Ok(Arc::new(store))
    }

    /// The job message a handed-off task was given a reference to.
    ///
    /// # Errors
    /// Why it cannot be read, as a sentence.
    pub async fn staged(&self, reference: &str) -> Result<String, String> {
        let r: JobRef = serde_json::from_str(reference)
            .map_err(|e| format!("TERRACE_JOB_REF is not a job reference: {e}"))?;
        let store = self.store_for(&r.target, &r.job_id).await?;
        String::from_utf8(r.staged(&*store).await?).map_err(|e| e.to_string())
    }

    /// Deletes the staged job message once the task's job has a final result.
    pub async fn unstage(&self, reference: &str, result: &Value) {
        let Ok(r) = serde_json::from_str::<JobRef>(reference) else {
            return;
        };
        match self.store_for(&r.target, &r.job_id).await {
            Ok(store) => r.unstage(&*store, result).await,
            Err(e) => tracing::warn!(error = %e, "could not delete the staged job message"),
        }
    }

    /// Sends a result or a rejection to the results queue, when there is one.
    pub async fn report(&self, body: &Value) {
        let Some(url) = &self.config.results_queue_url else {
            return;
        };
        if let Err(e) = self
            .sqs
            .send_message()
            .queue_url(url)
            .message_body(body.to_string())
            .send()
            .await
        {
            tracing::error!(error = %state_backends::s3::brief(&e), "could not send to the results queue");
        }
    }

    /// A message that will never be a job: answered with an error record, not retried.
    async fn reject(&self, message_id: &str, errors: Vec<Value>) -> Handled {
        let record = trigger::rejection(message_id, errors);
        tracing::warn!(message_id, record = %record, "job message rejected");
        self.report(&record).await;
        Handled::Done(record)
    }

    /// Parses and validates a message body.
    ///
    /// # Errors
    /// The rejection to send, when the message is not a valid job.
    pub async fn parse(
        &self,
        message_id: &str,
        body: &str,
    ) -> Result<(Envelope, ValidatedJob), Handled> {
        let envelope: Envelope = match serde_json::from_str(body) {
            Ok(e) => e,
            Err(e) => {
                let problem = trigger::problem(
                    "",
                    format!("the message is not a job envelope: {e}"),
                    "send {\"job\": {…}, \"target\": {\"role_arn\", \"external_id\", \"bucket\", …}}",
                );
                return Err(self.reject(message_id, vec![problem]).await);
            }
        };
        if let Err(e) = envelope.target.check() {
            let problem = trigger::problem(
                "target",
                e,
                "add the ExternalId of the customer's role to the job's target",
            );
            return Err(self.reject(message_id, vec![problem]).await);
        }
        match trigger::check_job(&envelope.job, &self.config.runtime.templates) {
            Ok(job) => Ok((envelope, job)),
            Err(errors) => Err(self.reject(message_id, errors).await),
        }
    }

    /// Runs a validated job against the customer's store. A job whose timeout exceeds
    /// `time_left` does not start here ([`Handled::TooLong`]): its own deadline then fits the
    /// platform's.
    pub async fn run(
        &self,
        envelope: &Envelope,
        job: ValidatedJob,
        time_left: Option<Duration>,
        cancel: CancellationToken,
    ) -> Handled {
        if let Some(left) = time_left
            && job.job.timeout > left
        {
            return match state_backends::WorkspaceId::new(&job.job.tenant, &job.job.workspace) {
                Ok(ws) => Handled::TooLong {
                    job_id: job.job.id.clone(),
                    ws,
                },
                Err(e) => Handled::Again {
                    why: e.to_string(),
                    delay: None,
                },
            };
        }
        let target = &envelope.target;
        let id = job.job.id.clone();
        let customer = match access::customer_config(&self.aws, target, &id).await {
            Ok(c) => c,
            Err(e) => {
                return Handled::Again {
                    why: e.to_string(),
                    delay: None,
                };
            }
        };
        let store = match self.store_with(&customer, target) {
            Ok(s) => s,
            Err(e) => {
                return Handled::Again {
                    why: e.to_string(),
                    delay: None,
                };
            }
        };
        // terraform's session and the store's are two AssumeRole calls, made side by side: the
        // store's by a read of the workspace's lease (one more call, off the job's path).
        let ws = state_backends::WorkspaceId::new(&job.job.tenant, &job.job.workspace);
        let (credentials, _) = tokio::join!(
            // Lives until the job ends: terraform's credential_process asks it for the session.
            credentials::for_terraform(
                &self.aws,
                target,
                &id,
                job.job.timeout,
                self.config.refresh_credentials_before,
            ),
            async {
                if let Ok(ws) = &ws {
                    let _ = store.lease(ws).await;
                }
            }
        );
        let credentials = match credentials {
            Ok(c) => c,
            Err(e) => {
                return Handled::Again {
                    why: e.to_string(),
                    delay: None,
                };
            }
        };
        let mut config = self.config.runtime.runner_config();
        config.terraform.env.clone_from(&credentials.env);
        config.terraform.settings.clone_from(&credentials.settings);
        config.terraform.late_secrets = credentials.late.clone();
        let runner = Runner::new(store, config);
        let (handled, fresh) = trigger::handled(runner.run(&job, cancel).await);
        if let (true, Handled::Done(result)) = (fresh, &handled) {
            self.report(result).await;
        }
        handled
    }

    /// Starts an ECS Fargate task of the same image that runs the job (`terrace-aws task`),
    /// for jobs longer than Lambda allows. The message is staged in the customer's bucket
    /// first, so its variables stay out of ECS's API; the task gets only a [`JobRef`]. The
    /// message is deleted once the task started.
    pub async fn hand_off(
        &self,
        target: &Target,
        body: &str,
        job_id: &str,
        ws: &state_backends::WorkspaceId,
    ) -> Result<Value, String> {
        use aws_sdk_ecs::types::{
            AssignPublicIp, AwsVpcConfiguration, ContainerOverride, KeyValuePair, LaunchType,
            NetworkConfiguration, TaskOverride,
        };
        let Some(h) = &self.config.handoff else {
            return Err(
                "the job's timeout is longer than this Lambda can run, and no ECS task is configured (TERRACE_ECS_CLUSTER, TERRACE_ECS_TASK_DEFINITION)".into(),
            );
        };
        let store = self.store_for(target, job_id).await?;
        let reference = JobRef::new(target.clone(), ws, job_id);
        reference.stage(&*store, body.as_bytes()).await?;
        let reference = serde_json::to_string(&reference).map_err(|e| e.to_string())?;
        let vpc = AwsVpcConfiguration::builder()
            .set_subnets(Some(h.subnets.clone()))
            .set_security_groups((!h.security_groups.is_empty()).then(|| h.security_groups.clone()))
            .assign_public_ip(AssignPublicIp::Disabled)
            .build()
            .map_err(|e| e.to_string())?;
        let container = ContainerOverride::builder()
            .name(&h.container)
            .command("terrace-aws")
            .command("task")
            .environment(
                KeyValuePair::builder()
                    .name("TERRACE_JOB_REF")
                    .value(reference)
                    .build(),
            )
            .build();
        let started_by: String = job_id.chars().take(36).collect();
        let out = self
            .ecs
            .run_task()
            .cluster(&h.cluster)
            .task_definition(&h.task_definition)
            .launch_type(LaunchType::Fargate)
            .network_configuration(
                NetworkConfiguration::builder()
                    .awsvpc_configuration(vpc)
                    .build(),
            )
            .overrides(
                TaskOverride::builder()
                    .container_overrides(container)
                    .build(),
            )
            .started_by(started_by)
            .send()
            .await
            .map_err(|e| state_backends::s3::brief(&e))?;
        if let Some(failure) = out.failures().first() {
            return Err(format!(
                "ECS did not start the task: {} {}",
                failure.reason().unwrap_or_default(),
                failure.detail().unwrap_or_default()
            ));
        }
        let task = out
            .tasks()
            .first()
            .and_then(|t| t.task_arn())
            .unwrap_or_default()
            .to_owned();
        Ok(json!({ "status": "handed-off", "job_id": job_id, "task_arn": task }))
    }
}
