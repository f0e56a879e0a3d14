//! One execution of the Container Apps job: one message from the jobs queue, or one sweep.
//!
//! The message stays in the queue until its fate is known. It is deleted once its job has a
//! final result (or had one already: the same job id runs once), or once it is moved to the
//! poison queue with an error record (it can never run, or it was received more than
//! `TERRACE_MAX_DEQUEUES` times). While the job runs, the message is kept invisible. A busy
//! workspace or trouble that may pass leaves it, invisible until it should be tried again; a
//! job interrupted by SIGTERM leaves it visible at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use serde_json::Value;
use shared::host::message::{DeadLetter, DeadLetterKind, Message, Rejection, TaskStarted};
use shared::host::pipeline::{self, Delivery, Fate, Keep, Trigger};
use shared::host::settings::Runtime;
use shared::host::tenants::Tenants;
use shared::host::trigger;
use shared::host::trigger::TriggerError;
use shared::job::template::source::Location;
use shared::job::validate::{ValidatedJob, ValidationError};
use shared::run::terraform::TerraformConfig;
use state_backends::azure::{AzureConfig, AzureStore};
use state_backends::objects::Bucket;
use state_backends::{StateStore, WorkspaceId};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::access::{self, Target};
use crate::config::Config;
use crate::transport::{Queue, Received};

/// The largest poison record sent: a queue message holds 64 KiB, and the client escapes the
/// text for XML.
const MAX_RECORD: usize = 48 * 1024;

pub struct App {
    pub config: Config,
    /// The job's own identity (none against an emulator).
    pub own: Option<Arc<dyn TokenCredential>>,
    /// Cancelled on SIGTERM.
    pub shutdown: CancellationToken,
}

/// How an execution ended, for its exit code and log.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The queue was empty.
    NoMessage,
    /// Deleted after its job's final result.
    Done,
    /// Moved to the poison queue.
    Poisoned,
    /// Left for later.
    Later,
}

/// The poison queue's record: the rejection, with the original text, cut until the record
/// fits in a queue message.
fn poison_record(record: &Rejection, dequeue_count: u64, text: &str) -> String {
    let mut keep = text.len();
    loop {
        let mut end = keep;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let poisoned = DeadLetter {
            kind: DeadLetterKind::Rejection,
            rejection: record.clone(),
            dequeue_count,
            message: text[..end].to_owned(),
            message_truncated: end < text.len(),
        };
        let serialized = serde_json::to_string(&poisoned).unwrap_or_default();
        if serialized.len() <= MAX_RECORD || end == 0 {
            return serialized;
        }
        // Shrink in proportion (escaping may double a character), a little more each round.
        keep = (end * (MAX_RECORD - 256) / serialized.len()).min(end - 1);
    }
}

/// The container `TERRACE_TEMPLATES` names, reached as this job (its managed identity), or
/// with the SAS against an emulator.
///
/// # Errors
/// A place that is not an Azure Blob container.
pub fn templates_bucket(
    location: &Location,
    config: &Config,
    own: Option<Arc<dyn TokenCredential>>,
) -> Result<Arc<dyn Bucket>, String> {
    let Location::Azure { container_url, .. } = location else {
        return Err(format!(
            "{location} is not an Azure Blob container: the Azure runner reads templates from az://ACCOUNT/CONTAINER/PREFIX, https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX, or a folder"
        ));
    };
    let config = AzureConfig {
        container_url: config.storage_url(container_url),
        prefix: String::new(),
        call_timeout: config.runtime.call_timeout,
    };
    let store = AzureStore::new(&config, own).map_err(|e| e.to_string())?;
    Ok(Arc::new(store.into_bucket()))
}

impl App {
    /// A queue of the job's own.
    ///
    /// # Errors
    /// Why not, as a sentence.
    pub fn queue(&self, url: &str) -> Result<Queue, String> {
        Queue::new(
            &self.config.storage_url(url),
            self.own.clone(),
            self.config.runtime.call_timeout,
        )
    }

    /// The customer's store: as their app registration, or with the SAS against an emulator.
    ///
    /// # Errors
    /// Why not, as a sentence.
    pub fn store_for(&self, target: &Target) -> Result<Arc<dyn StateStore>, TriggerError> {
        let credential = match (&self.config.sas, &self.own) {
            (Some(_), _) => None,
            (None, Some(own)) => Some(access::customer(target, own.clone())?),
            (None, None) => return Err("this job has no identity to reach the customer".into()),
        };
        let config = AzureConfig {
            container_url: self.config.storage_url(target.container_url.trim()),
            prefix: target.prefix.clone(),
            call_timeout: self.config.runtime.call_timeout,
        };
        Ok(self.config.runtime.seal(Arc::new(
            AzureStore::new(&config, credential).map_err(|e| e.to_string())?,
        )))
    }

    /// Sends a result or a rejection to the results queue, when there is one.
    async fn send_result(&self, record: &Value) {
        let Some(url) = &self.config.results_queue_url else {
            return;
        };
        let sent = match self.queue(url) {
            Ok(q) => q.send(&record.to_string(), Duration::ZERO).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            tracing::error!(error = %e, "could not send to the results queue");
        }
    }

    /// Takes one message from the jobs queue and sees it through.
    ///
    /// # Errors
    /// Why the queue could not be used, as a sentence (the message, if any, stays).
    pub async fn run_one(&self) -> Result<Outcome, String> {
        let jobs = self.queue(&self.config.queue_url)?;
        let Some(message) = jobs.receive(self.config.visibility).await? else {
            tracing::info!(queue = %jobs.name, "no message");
            return Ok(Outcome::NoMessage);
        };
        let id = message.id.clone();
        tracing::info!(message_id = %id, dequeue_count = message.dequeue_count, "received");
        if message.dequeue_count > self.config.max_dequeues {
            let problem = trigger::problem(
                "",
                format!(
                    "received {} times without finishing (TERRACE_MAX_DEQUEUES is {})",
                    message.dequeue_count, self.config.max_dequeues
                ),
                "see this job's earlier executions' logs; send it again once the cause is fixed",
            );
            let record = trigger::rejection(&message.id, vec![problem]);
            self.report(&Message::Rejection(record.clone())).await;
            let receipt = message.pop_receipt.clone();
            return self.poison(&jobs, &message, &receipt, record).await;
        }
        // The message stays invisible while the job runs; the keeper holds its pop receipt.
        let receipt = Arc::new(Mutex::new(message.pop_receipt.clone()));
        let keeper = self.keep_invisible(&jobs, &id, receipt.clone());
        let room = self
            .config
            .replica_timeout
            .saturating_sub(self.config.margin);
        let delivery = Delivery {
            message_id: &id,
            body: message.text.as_bytes(),
            time_left: Some(room),
            lease_wait: Duration::ZERO,
            cancel: self.shutdown.child_token(),
            receipt: None,
        };
        let fate = pipeline::handle(self, delivery).await;
        keeper.cancel();
        let receipt = receipt.lock().await.clone();
        match fate {
            Fate::Ran(result) | Fate::HandedOff(result) => {
                jobs.delete(&id, &receipt).await?;
                tracing::info!(message_id = %id, status = %result["status"], "done");
                Ok(Outcome::Done)
            }
            Fate::Rejected(record) => {
                // The pipeline's record is a rejection (its `Message`), as it was reported.
                let Ok(Message::Rejection(record)) = serde_json::from_value(record) else {
                    return Err("the pipeline's rejection is not one".into());
                };
                self.poison(&jobs, &message, &receipt, record).await
            }
            // Busy: a fresh copy is on the queue, invisible until the holder's lease ends.
            // Waiting is not a failed delivery, so it must not count towards the poison queue.
            Fate::Requeued { why, delay } => {
                jobs.delete(&id, &receipt).await?;
                tracing::info!(message_id = %id, why, delay_s = delay.as_secs(), "queued again for later");
                Ok(Outcome::Later)
            }
            Fate::Interrupted(_) => {
                // Interrupted (SIGTERM): a fresh copy, visible at once, for the next execution.
                self.requeue(&jobs, &message, &receipt, Duration::ZERO)
                    .await?;
                tracing::warn!(message_id = %id, "interrupted; the message is queued again");
                Ok(Outcome::Later)
            }
            // Trouble that may pass (or a busy workspace whose copy could not be sent): the
            // same message, later; it counts as a delivery.
            Fate::Again { why, delay } => {
                let delay = delay.unwrap_or(self.config.retry_delay);
                jobs.keep(&id, &receipt, delay).await?;
                tracing::warn!(message_id = %id, why, delay_s = delay.as_secs(), "left for later");
                Ok(Outcome::Later)
            }
        }
    }

    /// Puts a fresh copy of the message on the queue, invisible for `delay`, then deletes the
    /// one received (a copy left over if the deletion fails runs nothing: a job id runs once).
    async fn requeue(
        &self,
        jobs: &Queue,
        message: &Received,
        receipt: &str,
        delay: Duration,
    ) -> Result<(), String> {
        jobs.send(&message.text, delay).await?;
        jobs.delete(&message.id, receipt).await
    }

    /// Moves a message that can never run to the poison queue, with its rejection record
    /// (reported already), then deletes it.
    async fn poison(
        &self,
        jobs: &Queue,
        message: &Received,
        receipt: &str,
        record: Rejection,
    ) -> Result<Outcome, String> {
        // Identifiers and errors stay; the job's secrets do not.
        let text = shared::host::trigger::masked_message(
            &message.text,
            self.config.runtime.templates.root(),
        );
        let count = u64::try_from(message.dequeue_count).unwrap_or(0);
        let poisoned = poison_record(&record, count, &text);
        let poison = self.queue(&self.config.poison_queue_url)?;
        poison.send(&poisoned, Duration::ZERO).await?;
        jobs.delete(&message.id, receipt).await?;
        let record = Message::Rejection(record).to_value();
        tracing::warn!(message_id = %message.id, record = %record, "moved to the poison queue");
        Ok(Outcome::Poisoned)
    }

    /// Extends the message's invisibility every third of it until cancelled.
    fn keep_invisible(
        &self,
        jobs: &Queue,
        id: &str,
        receipt: Arc<Mutex<String>>,
    ) -> CancellationToken {
        let stop = CancellationToken::new();
        let Ok(queue) = self.queue(&self.config.queue_url) else {
            return stop;
        };
        let (visibility, id, done) = (self.config.visibility, id.to_owned(), stop.clone());
        let name = jobs.name.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(visibility / 3);
            every.tick().await;
            loop {
                tokio::select! {
                    () = done.cancelled() => return,
                    _ = every.tick() => {}
                }
                // Held across the call, so the run's end waits for a new receipt.
                let mut current = receipt.lock().await;
                if done.is_cancelled() {
                    return;
                }
                match tokio::time::timeout(visibility / 3, queue.keep(&id, &current, visibility))
                    .await
                {
                    Ok(Ok(next)) => *current = next,
                    Ok(Err(e)) => {
                        tracing::error!(queue = %name, error = %e, "could not keep the message invisible")
                    }
                    Err(_) => {
                        tracing::error!(queue = %name, "keeping the message invisible timed out")
                    }
                }
            }
        });
        stop
    }
}

#[async_trait]
impl Trigger for App {
    type Target = Target;

    fn envelope_fix(&self) -> &'static str {
        "send {\"job\": {…}} for a tenant in the runner's registry (a \"target\" there must agree with the registry's), as JSON or base64 of it"
    }

    fn tenants(&self) -> Option<&Tenants<Target>> {
        Some(&self.config.tenants)
    }

    fn bucket_of(&self, target: &Target) -> String {
        target.container_url.clone()
    }

    fn check_target(&self, target: &Target) -> Vec<ValidationError> {
        target
            .check(self.config.sas.is_some())
            .into_iter()
            .map(|(field, problem, fix)| trigger::problem(field, problem, fix))
            .collect()
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
        self.store_for(target)
    }

    /// As the customer's app registration, by federation (nothing against an emulator).
    async fn terraform_access(
        &self,
        target: &Target,
        _job: &ValidatedJob,
        terraform: &mut TerraformConfig,
    ) -> Result<Keep, TriggerError> {
        if self.config.sas.is_some() {
            return Ok(None);
        }
        let own = self.own.as_ref().ok_or("this job has no identity")?;
        let (Some(tenant), Some(client)) = (&target.tenant_id, &target.client_id) else {
            return Err(TriggerError::never(
                "target",
                "target.tenant_id and target.client_id are required for terraform to sign in to the customer's app",
                "give the tenant's tenant_id and client_id in the tenant registry",
            ));
        };
        // Tokens of the customer's app, from this job's broker: never the job's own assertion,
        // which could sign in to any customer's app that trusts this runner.
        let access = crate::broker::for_terraform(
            access::customer(target, own.clone())?,
            tenant,
            client,
            target.subscription_id.as_deref(),
        )
        .await?;
        terraform.settings.clone_from(&access.settings);
        terraform.env.clone_from(&access.env);
        terraform.late_secrets = access.late.clone();
        Ok(Some(Box::new(access)))
    }

    async fn report(&self, message: &Message) {
        self.send_result(&message.to_value()).await;
    }

    /// A fresh copy on the jobs queue, invisible for `delay` (the received one is deleted
    /// once this returns: see [`Fate::Requeued`]).
    async fn requeue(&self, body: &[u8], delay: Duration) -> Result<(), TriggerError> {
        let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
        Ok(self
            .queue(&self.config.queue_url)?
            .send(text, delay)
            .await?)
    }

    fn cannot_hand_off(&self) -> Option<String> {
        Some("shorten the job's timeout, or raise the Container Apps job's replicaTimeout and TERRACE_REPLICA_TIMEOUT with it".to_owned())
    }

    async fn start_task(
        &self,
        _reference: &trigger::JobRef<Target>,
        _timeout: Duration,
    ) -> Result<TaskStarted, TriggerError> {
        Err(
            "a Container Apps job runs each job in its own execution: nothing to hand off to"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poison_record_fits_in_a_queue_message_whatever_the_text() {
        let record = shared::host::trigger::rejection("m1", Vec::new());
        let short = poison_record(&record, 1, "not json");
        assert!(short.contains("\"message\":\"not json\""), "{short}");
        assert!(!short.contains("message_truncated"));
        // Quotes double in JSON: 60 KiB of them is far more than 64 KiB once escaped.
        let long = "\"".repeat(60 * 1024);
        let cut = poison_record(&record, 1, &long);
        assert!(cut.len() <= MAX_RECORD, "{}", cut.len());
        let back: Value = serde_json::from_str(&cut).unwrap();
        assert_eq!(back["message_truncated"], true);
        assert_eq!(back["kind"], "rejection");
        assert_eq!(back["dequeue_count"], 1);
        assert!(!back["message"].as_str().unwrap().is_empty());
    }
}
