//! What the function does with one job message, wherever it came from (an SQS record on
//! Lambda, or the environment of a handed-off ECS task): validate, open the customer's store
//! through their role, run the job with the core runner, report.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use shared::host::message::{Message, TaskStarted};
use shared::host::pipeline::{Keep, Trigger};
use shared::host::settings::Runtime;
use shared::host::tenants::Tenants;
use shared::host::trigger;
use shared::host::trigger::TriggerError;
use shared::job::template::source::Location;
use shared::job::validate::{ValidatedJob, ValidationError};
use shared::run::terraform::TerraformConfig;
use state_backends::objects::Bucket;
use state_backends::s3::{LeaseMode, S3Config, S3Store};
use state_backends::{StateStore, WorkspaceId};
use tokio_util::sync::CancellationToken;

use crate::access::{self, Target};
use crate::broker;
use crate::config::Config;

/// The function's clients and settings, made once per container.
#[derive(Clone, Debug)]
pub struct App {
    pub config: Arc<Config>,
    pub aws: aws_config::SdkConfig,
    pub sqs: aws_sdk_sqs::Client,
    pub ecs: aws_sdk_ecs::Client,
    /// Cancelled when the process is stopped (an ECS task's SIGTERM): a job stopped by it ends
    /// `interrupted` and goes back on the queue.
    pub shutdown: CancellationToken,
}

/// What a handed-off ECS task gets in `TERRACE_JOB_REF`.
pub type JobRef = trigger::JobRef<Target>;

impl App {
    /// The clients, and the templates bucket `TERRACE_TEMPLATES` names (reached as the
    /// function itself).
    ///
    /// # Errors
    /// `TERRACE_TEMPLATES` naming a place that is not an S3 bucket or a folder.
    pub async fn new(mut config: Config) -> Result<Self, shared::host::settings::ConfigError> {
        // Every AWS call gives up in time: a store that stops answering must not hold a job
        // (its result, its lease's release, its message's return) forever. The runner fences
        // itself long before, whatever the calls do.
        let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .timeout_config(state_backends::s3::timeouts(config.call_timeout))
            .load()
            .await;
        let path_style = config.s3_path_style;
        let own = &aws;
        let open = |location| async move {
            let Location::S3 { bucket, .. } = location else {
                return Err(format!(
                    "{location} is not an S3 bucket: the AWS runner reads templates and policies from s3://BUCKET/PREFIX, or a folder"
                ));
            };
            let store = S3Store::from_sdk(
                own,
                path_style,
                S3Config {
                    bucket,
                    prefix: String::new(),
                    lease: LeaseMode::from_table(None),
                    kms_key_id: None,
                },
            )
            .map_err(|e| e.to_string())?;
            Ok(Arc::new(store.into_bucket()) as Arc<dyn Bucket>)
        };
        let tenant_sets = config.tenants.policy_sets().clone();
        config.runtime.open_buckets(&tenant_sets, open).await?;
        Ok(Self {
            sqs: aws_sdk_sqs::Client::new(&aws),
            ecs: aws_sdk_ecs::Client::new(&aws),
            config: Arc::new(config),
            aws,
            shutdown: CancellationToken::new(),
        })
    }

    /// The customer's store, reached through their role.
    ///
    /// # Errors
    /// Why the role cannot be used, as a sentence.
    pub async fn store_for(
        &self,
        target: &Target,
        session: &str,
    ) -> Result<Arc<dyn StateStore>, TriggerError> {
        let customer = access::customer_config(&self.aws, target, session)
            .await
            .map_err(|e| e.to_string())?;
        self.store_with(&customer, target)
            .map_err(|e| TriggerError::again(e.to_string()))
    }

    fn store_with(
        &self,
        customer: &aws_config::SdkConfig,
        target: &Target,
    ) -> Result<Arc<dyn StateStore>, state_backends::StoreError> {
        let store = S3Store::from_sdk(
            customer,
            self.config.s3_path_style,
            S3Config {
                bucket: target.bucket.clone(),
                prefix: target.prefix.clone(),
                lease: LeaseMode::from_table(target.lease_table.clone()),
                kms_key_id: target.kms_key_id.clone(),
            },
        )?;
        let store: Arc<dyn StateStore> = Arc::new(store);
        let runtime = &self.config.runtime;
        Ok(match &target.client_side_kms_key {
            // The customer's key, reached as the customer; the runner's key files still open
            // what they sealed before.
            Some(key) => {
                use state_backends::sealed::{Keyring, SealedStore};
                let kms = Arc::new(state_backends::kms::KmsKey::new(customer, key));
                let keys = Keyring::new(kms).then(runtime.keys.clone());
                SealedStore::wrap(store, Some(keys))
            }
            None => runtime.seal(store),
        })
    }

    /// Sends a result or a rejection to the results queue, when there is one.
    pub async fn send_result(&self, body: &Value) {
        let Some(url) = &self.config.results_queue_url else {
            return;
        };
        // A FIFO results queue keeps each workspace's records in order.
        let group = crate::config::is_fifo(Some(url)).then(|| message_group(body));
        if let Err(e) = self
            .sqs
            .send_message()
            .queue_url(url)
            .message_body(body.to_string())
            .set_message_group_id(group)
            .send()
            .await
        {
            tracing::error!(error = %state_backends::s3::brief(&e), "could not send to the results queue");
        }
    }

    /// Starts an ECS Fargate task of the same image that runs the job (`terrace-aws task`),
    /// for jobs longer than Lambda allows. The task gets only the [`JobRef`] to the message
    /// staged in the customer's bucket, so the job's variables stay out of ECS's API.
    async fn run_task(&self, reference: &JobRef) -> Result<TaskStarted, String> {
        use aws_sdk_ecs::types::{
            AssignPublicIp, AwsVpcConfiguration, ContainerOverride, KeyValuePair, LaunchType,
            NetworkConfiguration, TaskOverride,
        };
        let Some(h) = &self.config.handoff else {
            return Err("no ECS task is configured".into());
        };
        let job_id = &reference.job_id;
        let reference = serde_json::to_string(reference).map_err(|e| e.to_string())?;
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
        // ECS takes up to 36 letters, digits, '-' and '_' here; a job id may have more.
        let started_by: String = job_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .take(36)
            .collect();
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
        Ok(TaskStarted {
            task_arn: Some(task),
            ..TaskStarted::default()
        })
    }
}

#[async_trait]
impl Trigger for App {
    type Target = Target;

    fn envelope_fix(&self) -> &'static str {
        "send {\"job\": {…}} for a tenant in the runner's registry (a \"target\" there must agree with the registry's)"
    }

    fn tenants(&self) -> Option<&Tenants<Target>> {
        Some(&self.config.tenants)
    }

    /// The ExternalId is the customer's guard against a confused deputy: it must come from
    /// the operator, never from whoever can enqueue.
    fn registry_only(&self) -> &'static [&'static str] {
        &["external_id"]
    }

    fn check_target(&self, target: &Target) -> Vec<ValidationError> {
        match target.check() {
            Ok(_) => Vec::new(),
            Err(e) => vec![trigger::problem(
                "target",
                e,
                "name the customer's role (arn:aws:iam::ACCOUNT:role/NAME) and its ExternalId",
            )],
        }
    }

    fn runtime(&self) -> &Runtime {
        &self.config.runtime
    }

    fn shutdown(&self) -> Option<&CancellationToken> {
        Some(&self.shutdown)
    }

    /// The customer's store. For a job's workspace, its lease is read at once: the role is
    /// assumed then, side by side with terraform's own session (see [`Self::terraform_access`]),
    /// instead of on the job's path.
    async fn store(
        &self,
        target: &Target,
        session: &str,
        ws: Option<&WorkspaceId>,
    ) -> Result<Arc<dyn StateStore>, TriggerError> {
        let store = self.store_for(target, session).await?;
        if let Some(ws) = ws {
            let _ = store.lease(ws).await;
        }
        Ok(store)
    }

    async fn terraform_access(
        &self,
        target: &Target,
        job: &ValidatedJob,
        terraform: &mut TerraformConfig,
    ) -> Result<Keep, TriggerError> {
        // Lives until the job ends: terraform's credential_process asks it for the session.
        let credentials = broker::for_terraform(
            &self.aws,
            target,
            &job.job.id,
            job.job.timeout,
            self.config.refresh_credentials_before,
        )
        .await
        .map_err(|e| e.to_string())?;
        terraform
            .give(credentials.dir(), &[])
            .map_err(|e| format!("cannot give terraform its AWS config: {e}"))?;
        terraform.env.clone_from(&credentials.env);
        terraform.settings.clone_from(&credentials.settings);
        terraform.late_secrets = credentials.late.clone();
        Ok(Some(Box::new(credentials)))
    }

    async fn report(&self, message: &Message) {
        self.send_result(&message.to_value()).await;
    }

    /// Sends `body` to the jobs queue again, delayed by `delay` (SQS allows 15 minutes at most).
    /// Never on a FIFO queue: a copy would go to the back of its workspace's group, behind
    /// later requests, and FIFO queues delay no single message; the message itself waits
    /// instead, at the head of its group.
    async fn requeue(&self, body: &[u8], delay: Duration) -> Result<(), TriggerError> {
        let url = self
            .config
            .jobs_queue_url
            .as_ref()
            .ok_or("TERRACE_JOBS_QUEUE_URL is not set")?;
        if self.config.jobs_fifo() {
            return Err(TriggerError::never(
                "queue",
                "the jobs queue is FIFO: the message waits at the head of its workspace's group instead of a copy going behind later requests",
                "nothing to do: it is delivered again when it is visible",
            ));
        }
        let body = std::str::from_utf8(body).map_err(|e| e.to_string())?;
        let seconds = i32::try_from(delay.as_secs().min(900)).unwrap_or(900);
        self.sqs
            .send_message()
            .queue_url(url)
            .message_body(body)
            .delay_seconds(seconds)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| TriggerError::again(state_backends::s3::brief(&e)))
    }

    /// Ten to an SQS batch.
    async fn enqueue(&self, bodies: &[String]) -> Vec<Option<String>> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        let Some(queue) = &self.config.jobs_queue_url else {
            let why = "TERRACE_JOBS_QUEUE_URL is not set: the function has no jobs queue";
            return vec![Some(why.to_owned()); bodies.len()];
        };
        let mut out = Vec::with_capacity(bodies.len());
        for chunk in bodies.chunks(10) {
            let entries: Result<Vec<_>, _> = chunk
                .iter()
                .enumerate()
                .map(|(i, body)| {
                    let group = self
                        .config
                        .jobs_fifo()
                        .then(|| message_group(&serde_json::from_str(body).unwrap_or_default()));
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(body)
                        .set_message_group_id(group)
                        .build()
                })
                .collect();
            let sent = match entries {
                Ok(entries) => self
                    .sqs
                    .send_message_batch()
                    .queue_url(queue)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| state_backends::s3::brief(&e)),
                Err(e) => Err(e.to_string()),
            };
            let mut fates = vec![None; chunk.len()];
            match sent {
                Ok(sent) => {
                    for failed in sent.failed() {
                        if let Some(fate) = failed
                            .id()
                            .parse::<usize>()
                            .ok()
                            .and_then(|i| fates.get_mut(i))
                        {
                            *fate = Some(failed.message().unwrap_or("refused").to_owned());
                        }
                    }
                }
                Err(why) => fates = vec![Some(why); chunk.len()],
            }
            out.extend(fates);
        }
        out
    }

    fn bucket_of(&self, target: &Target) -> String {
        target.bucket.clone()
    }

    fn cannot_hand_off(&self) -> Option<String> {
        self.config.handoff.is_none().then(|| {
            "shorten the job's timeout, or configure the ECS hand-off (TERRACE_ECS_CLUSTER, TERRACE_ECS_TASK_DEFINITION)".to_owned()
        })
    }

    async fn start_task(
        &self,
        reference: &JobRef,
        _timeout: Duration,
    ) -> Result<TaskStarted, TriggerError> {
        Ok(self.run_task(reference).await?)
    }
}

/// The FIFO message group of a job or a record: its workspace (`tenant/workspace`), so a
/// workspace's messages keep their order and different workspaces do not wait for each other.
/// A body that names none goes to the group `terrace`.
pub fn message_group(body: &Value) -> String {
    let of = |v: &Value| {
        let (t, w) = (v["tenant"].as_str()?, v["workspace"].as_str()?);
        Some(format!("{t}/{w}"))
    };
    of(&body["job"])
        .or_else(|| of(&body["cancel"]))
        .or_else(|| of(body))
        .unwrap_or_else(|| "terrace".to_owned())
}

#[cfg(test)]
mod tests {
    use super::message_group;
    use serde_json::json;

    #[test]
    fn a_fifo_group_is_the_messages_workspace() {
        let job = json!({ "job": { "id": "j", "tenant": "acme", "workspace": "web" } });
        assert_eq!(message_group(&job), "acme/web");
        let cancel = json!({ "cancel": { "job": "j", "tenant": "acme", "workspace": "db" } });
        assert_eq!(message_group(&cancel), "acme/db");
        let result =
            json!({ "job_id": "j", "tenant": "acme", "workspace": "api", "status": "succeeded" });
        assert_eq!(message_group(&result), "acme/api");
        assert_eq!(message_group(&json!({ "status": "rejected" })), "terrace");
    }
}
