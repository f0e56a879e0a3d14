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

use azure_core::credentials::TokenCredential;
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use shared::runner::Runner;
use shared::trigger::{self, Handled};
use state_backends::StateStore;
use state_backends::azure::{AzureConfig, AzureStore};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::access::{self, Target};
use crate::config::Config;
use crate::queue::{Queue, Received};

/// A job message: the job and the customer's side it runs against.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    job: serde_json::Map<String, Value>,
    target: Target,
}

/// What a timer execution gets in `TERRACE_SWEEP_TARGETS`.
pub type Targets = Vec<Target>;

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

/// The message's text as a job envelope: JSON, or JSON in base64 (what many senders,
/// Azure Functions among them, put on queues).
fn decode(text: &str) -> Result<Envelope, String> {
    match serde_json::from_str::<Envelope>(text) {
        Ok(e) => Ok(e),
        Err(json_error) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Envelope>(&bytes).ok());
            decoded.ok_or_else(|| format!("the message is not a job envelope: {json_error}"))
        }
    }
}

/// The poison queue's record: the rejection, with the original text, cut until the record
/// fits in a queue message.
fn poison_record(record: &Value, text: &str) -> String {
    let mut keep = text.len();
    loop {
        let mut poisoned = record.clone();
        let mut end = keep;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        poisoned["message"] = json!(&text[..end]);
        if end < text.len() {
            poisoned["message_truncated"] = json!(true);
        }
        let serialized = poisoned.to_string();
        if serialized.len() <= MAX_RECORD || end == 0 {
            return serialized;
        }
        // Shrink in proportion (escaping may double a character), a little more each round.
        keep = (end * (MAX_RECORD - 256) / serialized.len()).min(end - 1);
    }
}

impl App {
    /// A queue of the job's own.
    ///
    /// # Errors
    /// Why not, as a sentence.
    pub fn queue(&self, url: &str) -> Result<Queue, String> {
        Queue::new(&self.config.storage_url(url), self.own.clone())
    }

    /// The customer's store: as their app registration, or with the SAS against an emulator.
    ///
    /// # Errors
    /// Why not, as a sentence.
    pub fn store_for(&self, target: &Target) -> Result<Arc<dyn StateStore>, String> {
        let credential = match (&self.config.sas, &self.own) {
            (Some(_), _) => None,
            (None, Some(own)) => Some(access::customer(target, own.clone())?),
            (None, None) => return Err("this job has no identity to reach the customer".into()),
        };
        let config = AzureConfig {
            container_url: self.config.storage_url(target.container_url.trim()),
            prefix: target.prefix.clone(),
        };
        Ok(Arc::new(
            AzureStore::new(&config, credential).map_err(|e| e.to_string())?,
        ))
    }

    /// Sends a result or a rejection to the results queue, when there is one.
    async fn report(&self, record: &Value) {
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
            return self.poison(&jobs, &message, vec![problem]).await;
        }
        let (envelope, job) = match self.check(&message.text) {
            Ok(checked) => checked,
            Err(errors) => return self.poison(&jobs, &message, errors).await,
        };
        // The message stays invisible while the job runs; the keeper holds its pop receipt.
        let receipt = Arc::new(Mutex::new(message.pop_receipt.clone()));
        let keeper = self.keep_invisible(&jobs, &id, receipt.clone());
        let handled = self.run(&envelope, job).await;
        keeper.cancel();
        let receipt = receipt.lock().await.clone();
        match handled {
            Handled::Done(result) if trigger::is_final(&result) => {
                jobs.delete(&id, &receipt).await?;
                tracing::info!(message_id = %id, status = %result["status"], "done");
                Ok(Outcome::Done)
            }
            Handled::Done(_) => {
                // Interrupted (SIGTERM): a fresh copy, visible at once, for the next execution.
                self.requeue(&jobs, &message, &receipt, Duration::ZERO)
                    .await?;
                tracing::warn!(message_id = %id, "interrupted; the message is queued again");
                Ok(Outcome::Later)
            }
            // Busy: a fresh copy, invisible until the holder's lease ends. Waiting is not a
            // failed delivery, so it must not count towards the poison queue.
            Handled::Again {
                why,
                delay: Some(delay),
            } => {
                self.requeue(&jobs, &message, &receipt, delay).await?;
                tracing::info!(message_id = %id, why, delay_s = delay.as_secs(), "queued again for later");
                Ok(Outcome::Later)
            }
            // Trouble that may pass: the same message, later; it counts as a delivery.
            Handled::Again { why, delay: None } => {
                let delay = self.config.retry_delay;
                jobs.keep(&id, &receipt, delay).await?;
                tracing::warn!(message_id = %id, why, delay_s = delay.as_secs(), "left for later");
                Ok(Outcome::Later)
            }
            Handled::TooLong { .. } => unreachable!("checked before the run"),
        }
    }

    /// The envelope and its validated job, or every problem with them.
    fn check(&self, text: &str) -> Result<(Envelope, shared::validate::ValidatedJob), Vec<Value>> {
        let envelope = decode(text).map_err(|e| {
            vec![trigger::problem(
                "",
                e,
                "send {\"job\": {…}, \"target\": {\"container_url\", \"tenant_id\", \"client_id\", …}} as JSON (or base64 of it)",
            )]
        })?;
        let mut errors: Vec<Value> = envelope
            .target
            .check(self.config.sas.is_some())
            .into_iter()
            .map(|(field, problem, fix)| trigger::problem(field, problem, fix))
            .collect();
        let job = match trigger::check_job(&envelope.job, &self.config.runtime.templates) {
            Ok(job) => Some(job),
            Err(more) => {
                errors.extend(more);
                None
            }
        };
        let room = self
            .config
            .replica_timeout
            .saturating_sub(self.config.margin);
        if let Some(job) = &job
            && job.job.timeout > room
        {
            errors.push(trigger::problem(
                "timeout",
                format!(
                    "{} s is longer than this job's replica timeout allows ({} s)",
                    job.job.timeout.as_secs(),
                    room.as_secs()
                ),
                "shorten the job's timeout, or raise the Container Apps job's replicaTimeout and TERRACE_REPLICA_TIMEOUT with it",
            ));
        }
        match job {
            Some(job) if errors.is_empty() => Ok((envelope, job)),
            _ => Err(errors),
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

    /// Moves a message that can never run to the poison queue, with why, then deletes it.
    async fn poison(
        &self,
        jobs: &Queue,
        message: &Received,
        errors: Vec<Value>,
    ) -> Result<Outcome, String> {
        let mut record = trigger::rejection(&message.id, errors);
        record["dequeue_count"] = json!(message.dequeue_count);
        self.report(&record).await;
        let poisoned = poison_record(&record, &message.text);
        let poison = self.queue(&self.config.poison_queue_url)?;
        poison.send(&poisoned, Duration::ZERO).await?;
        jobs.delete(&message.id, &message.pop_receipt).await?;
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

    /// Runs a checked job against the customer's store.
    async fn run(&self, envelope: &Envelope, job: shared::validate::ValidatedJob) -> Handled {
        let target = &envelope.target;
        let again = |why: String| Handled::Again { why, delay: None };
        let store = match self.store_for(target) {
            Ok(s) => s,
            Err(e) => return again(e),
        };
        let mut config = self.config.runtime.runner_config();
        if self.config.sas.is_none() {
            let Some(own) = &self.own else {
                return again("this job has no identity".into());
            };
            match access::terraform(target, own).await {
                Ok((settings, secrets)) => {
                    config.terraform.settings = settings;
                    config.terraform.env = secrets;
                }
                Err(e) => return again(e),
            }
        }
        config.shutdown = Some(self.shutdown.clone());
        let runner = Runner::new(store, config);
        let (handled, fresh) =
            trigger::handled(runner.run(&job, self.shutdown.child_token()).await);
        if let Handled::Done(result) = &handled
            && fresh
            && trigger::is_final(result)
        {
            self.report(result).await;
        }
        handled
    }

    /// `terrace-azure sweep backup`: the hourly backup sweep over each customer's container.
    pub async fn backup_sweep(&self, targets: &Targets) -> Vec<Value> {
        let mut reports = Vec::new();
        for target in targets {
            let store = self.store_for(target);
            let report = shared::backup::bucket_report(
                &target.container_url,
                store,
                time::OffsetDateTime::now_utc(),
            )
            .await;
            tracing::info!(report = %report, "backup sweep");
            reports.push(report);
        }
        reports
    }

    /// `terrace-azure sweep drift`: a `drift-check` job for each applied workspace, sent to the
    /// jobs queue so each runs like any other job.
    pub async fn drift_sweep(&self, targets: &Targets) -> Vec<Value> {
        let mut reports = Vec::new();
        for target in targets {
            let report = match self.drift_target(target).await {
                Ok(report) => report,
                Err(e) => json!({ "bucket": target.container_url, "error": e }),
            };
            tracing::info!(report = %report, "drift sweep");
            reports.push(report);
        }
        reports
    }

    async fn drift_target(&self, target: &Target) -> Result<Value, String> {
        let store = self.store_for(target)?;
        let plan = shared::drift::plan(&*store, time::OffsetDateTime::now_utc())
            .await
            .map_err(|e| e.to_string())?;
        let jobs = self.queue(&self.config.queue_url)?;
        let mut queued = 0;
        let mut unqueued = Vec::new();
        for (ws, job) in &plan.jobs {
            let message = json!({ "job": job.0, "target": target });
            match jobs.send(&message.to_string(), Duration::ZERO).await {
                Ok(()) => queued += 1,
                Err(e) => unqueued.push((ws.to_string(), e)),
            }
        }
        Ok(plan.report(&target.container_url, queued, unqueued))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poison_record_fits_in_a_queue_message_whatever_the_text() {
        let record = json!({ "status": "rejected", "errors": [] });
        let short = poison_record(&record, "not json");
        assert!(short.contains("\"message\":\"not json\""), "{short}");
        assert!(!short.contains("message_truncated"));
        // Quotes double in JSON: 60 KiB of them is far more than 64 KiB once escaped.
        let long = "\"".repeat(60 * 1024);
        let cut = poison_record(&record, &long);
        assert!(cut.len() <= MAX_RECORD, "{}", cut.len());
        let back: Value = serde_json::from_str(&cut).unwrap();
        assert_eq!(back["message_truncated"], true);
        assert!(!back["message"].as_str().unwrap().is_empty());
    }

    #[test]
    fn a_message_is_json_or_base64_json() {
        let text = r#"{"job": {"id": "j"}, "target": {"container_url": "https://a.blob.core.windows.net/s"}}"#;
        assert_eq!(decode(text).unwrap().job["id"], "j");
        let encoded = base64::engine::general_purpose::STANDARD.encode(text);
        assert_eq!(decode(&encoded).unwrap().job["id"], "j");
        let e = decode("not json").unwrap_err();
        assert!(e.contains("not a job envelope"), "{e}");
    }
}
