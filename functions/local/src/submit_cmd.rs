//! `terrace submit JOB_FILE --to QUEUE [--follow]`: puts a job on a deployed runner's queue, as a
//! platform would, after checking it against the templates `--templates` names; with `--follow`,
//! streams its log from the customer's store (`--store`) as `terrace logs --follow` does, then
//! prints its result and exits with the job's code, as `run` does.
//!
//! Queues: `sqs://HOST/ACCOUNT/QUEUE` (the queue's URL without `https://`; FIFO queues get the
//! workspace as the message group and the job id as the deduplication id),
//! `pubsub://projects/P/topics/T` (`TERRACE_PUBSUB_ENDPOINT` for an emulator),
//! `azqueue://ACCOUNT/QUEUE` (`TERRACE_AZURE_QUEUE_ENDPOINT` for an emulator), or a `terrace
//! serve` queue folder (a path). The message is `{"job": …}`: the runner's tenant registry names the
//! customer's side, never the sender.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use state_backends::WorkspaceId;

use serde_json::Value;
use shared::host::message::{Message, Rejection};
use shared::job::signature::{Kind, SenderSecret};
use shared::job::validate::ValidationError;

use crate::cli::Global;
use crate::job_cmd::{read_job, report_invalid};
use crate::{exit, ops};

#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// The job file (YAML or JSON).
    job: PathBuf,
    /// The runner's jobs queue: sqs://HOST/ACCOUNT/QUEUE, pubsub://projects/P/topics/T,
    /// azqueue://ACCOUNT/QUEUE, amqp[s]://HOST[:PORT][/VHOST][?jobs=QUEUE] (self-hosted workers), or
    /// a `terrace serve` queue folder.
    #[arg(long, value_name = "QUEUE")]
    to: String,
    /// Stream the job's log from the store (--store) until it ends, then print its result; the
    /// exit code is the job's.
    #[arg(long, short)]
    follow: bool,
    /// With --follow, milliseconds between looks at the store.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    interval_ms: u64,
    /// Sign the job with this Ed25519 private key (PKCS#8 PEM, `terrace keygen`'s), for a
    /// tenant whose runner takes only signed jobs (docs/signing.md).
    #[arg(long, value_name = "KEY")]
    sign: Option<PathBuf>,
}

/// `terrace keygen --out FILE`: a new Ed25519 key for signing jobs. The private key is written
/// to `out` (mode 0600, never over an existing file); the public key is printed for the runner's
/// tenant registry.
pub(crate) fn keygen(out: &Path) -> anyhow::Result<u8> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let key = SenderSecret::generate();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out);
    let mut file = match file {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "error: {} already exists: a key is never overwritten; choose another --out",
                out.display()
            );
            return Ok(exit::USAGE);
        }
        Err(e) => anyhow::bail!("cannot write {}: {e}", out.display()),
    };
    file.write_all(key.to_pem().as_bytes())?;
    file.sync_all()?;
    println!("{}", key.public());
    eprintln!(
        "private key written to {} (keep it secret); the public key above goes in the tenant's `senders` in the runner's registry (docs/signing.md)",
        out.display()
    );
    Ok(exit::OK)
}

/// Reads `--sign`'s key.
///
/// # Errors
/// A file that cannot be read or is not an Ed25519 private key, with the fix; the key is never
/// quoted.
pub(crate) fn signing_key(path: &Path) -> Result<SenderSecret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--sign {}: cannot read it: {e}", path.display()))?;
    SenderSecret::from_pem(&text).map_err(|why| format!("--sign {}: {why}", path.display()))
}

/// Where a job is sent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Queue {
    /// A `terrace serve --queue` folder.
    Folder(PathBuf),
    /// An SQS queue, by URL.
    Sqs(String),
    /// A Pub/Sub topic, `projects/P/topics/T`.
    PubSub(String),
    /// An Azure Storage queue: its account and name.
    Azure { account: String, queue: String },
    /// A RabbitMQ broker's jobs queue (`terrace serve --queue amqp://…` workers).
    #[cfg(feature = "amqp")]
    Amqp(crate::serve::amqp::Broker),
}

const SCHEMES: &str = "use sqs://HOST/ACCOUNT/QUEUE (the queue URL without https://), pubsub://projects/PROJECT/topics/TOPIC, azqueue://ACCOUNT/QUEUE, amqp[s]://HOST[:PORT][/VHOST][?jobs=QUEUE] (its user and password in TERRACE_AMQP_USER and TERRACE_AMQP_PASSWORD), or the path of a `terrace serve` queue folder";

impl Queue {
    /// Reads `--to`.
    ///
    /// # Errors
    /// An unknown scheme or a malformed queue, with the forms that work.
    pub(crate) fn parse(to: &str) -> Result<Self, String> {
        match to.split_once("://") {
            None => Ok(Self::Folder(PathBuf::from(to))),
            Some(("sqs", rest)) => {
                let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
                match parts.as_slice() {
                    [host, account, queue]
                        if !host.is_empty()
                            && !account.is_empty()
                            && account.chars().all(|c| c.is_ascii_digit())
                            && !queue.is_empty() =>
                    {
                        Ok(Self::Sqs(format!("{}://{rest}", sqs_scheme())))
                    }
                    _ => Err(format!("{to:?} is not an SQS queue: {SCHEMES}")),
                }
            }
            Some(("pubsub", rest)) => {
                match rest.trim_end_matches('/').split('/').collect::<Vec<_>>()[..] {
                    ["projects", project, "topics", topic]
                        if !project.is_empty() && !topic.is_empty() =>
                    {
                        Ok(Self::PubSub(format!("projects/{project}/topics/{topic}")))
                    }
                    _ => Err(format!("{to:?} is not a Pub/Sub topic: {SCHEMES}")),
                }
            }
            Some(("azqueue", rest)) => match rest.trim_end_matches('/').split_once('/') {
                Some((account, queue))
                    if !account.is_empty() && !queue.is_empty() && !queue.contains('/') =>
                {
                    Ok(Self::Azure {
                        account: account.to_owned(),
                        queue: queue.to_owned(),
                    })
                }
                _ => Err(format!("{to:?} is not an Azure Storage queue: {SCHEMES}")),
            },
            #[cfg(feature = "amqp")]
            Some(("amqp" | "amqps", _)) => crate::serve::amqp::Broker::parse(to).map(Self::Amqp),
            Some((scheme, _)) => Err(format!(
                "{scheme}:// is not a queue terrace can send to: {SCHEMES}"
            )),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Folder(dir) => format!("the queue folder {}", dir.display()),
            Self::Sqs(url) => format!("SQS queue {url}"),
            Self::PubSub(topic) => format!("Pub/Sub topic {topic}"),
            Self::Azure { account, queue } => format!("Azure queue {queue} of {account}"),
            #[cfg(feature = "amqp")]
            Self::Amqp(broker) => format!("queue {} on {}", broker.jobs, broker.shown()),
        }
    }
}

/// `https`, unless `AWS_ENDPOINT_URL` points the SDK at a plain-HTTP endpoint (an emulator).
fn sqs_scheme() -> &'static str {
    match std::env::var("AWS_ENDPOINT_URL") {
        Ok(endpoint) if endpoint.starts_with("http://") => "http",
        _ => "https",
    }
}

/// `terrace submit`.
pub async fn submit(g: &Global, a: SubmitArgs) -> anyhow::Result<u8> {
    let queue = match Queue::parse(&a.to) {
        Ok(queue) => queue,
        Err(why) => {
            eprintln!("error: --to: {why}");
            return Ok(exit::USAGE);
        }
    };
    // The key, and a store to follow the job in, are checked before anything is sent.
    let key = match a.sign.as_deref().map(signing_key).transpose() {
        Ok(key) => key,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(exit::USAGE);
        }
    };
    let store = if a.follow {
        Some(g.open_store().await?)
    } else {
        None
    };
    let templates = g.open_templates().await?;
    let mut raw = match read_job(&a.job)? {
        Ok(raw) => raw,
        Err(errors) => return Ok(report_invalid(&a.job, &errors)),
    };
    let validated =
        match shared::job::validate::fetch_and_validate(&raw, &templates, Some(&g.cloud)).await? {
            Ok(v) => v,
            Err(errors) => return Ok(report_invalid(&a.job, &errors)),
        };
    let job = &validated.job;
    let ws = WorkspaceId::new(&job.tenant, &job.workspace)?;
    if let Some(key) = &key
        && let Err(why) = key.sign(Kind::Job, &mut raw.0, time::OffsetDateTime::now_utc())
    {
        eprintln!("error: --sign: {why}");
        return Ok(exit::INVALID);
    }
    let envelope = serde_json::json!({ "job": raw.0 });
    if let Err(why) = send(&queue, &ws, &job.id, &envelope).await {
        eprintln!(
            "error: job {} was not sent to {}: {why}",
            job.id,
            queue.describe()
        );
        return Ok(exit::FAILED);
    }
    eprintln!(
        "job {} sent to {} ({} in {ws})",
        job.id,
        queue.describe(),
        job.operation
    );
    let Some(store) = store else {
        return Ok(exit::OK);
    };
    let logs = ops::LogsArgs {
        ws: ws.clone(),
        job: Some(job.id.clone()),
        follow: true,
        interval: Duration::from_millis(a.interval_ms),
        out: ops::Output { json: false },
    };
    let code = match &queue {
        // A job the folder's runner refuses never starts: its rejection is in failed/.
        Queue::Folder(dir) => {
            tokio::select! {
                code = ops::logs(store.clone(), logs) => code?,
                errors = rejected_in(dir, &job.id, Duration::from_millis(a.interval_ms)) => {
                    eprintln!("job {} was rejected by the runner, nothing ran:", job.id);
                    for e in errors {
                        eprintln!("  - {e}");
                    }
                    return Ok(exit::INVALID);
                }
            }
        }
        _ => {
            eprintln!(
                "following job {} in the store; a job the runner rejects never starts: its rejection is on the runner's results channel",
                job.id
            );
            ops::logs(store.clone(), logs).await?
        }
    };
    if code != exit::OK {
        return Ok(code);
    }
    let ask = ops::ResultAsk {
        job_id: &job.id,
        ws: Some(&ws),
        identity: None,
        out: ops::Output { json: false },
    };
    ops::result(&*store, ask).await
}

/// Waits until a `terrace serve` folder holds the rejection of job `id` (beside
/// `failed/ID.json`), looking every `interval`; its errors.
async fn rejected_in(dir: &Path, id: &str, interval: Duration) -> Vec<ValidationError> {
    let path = dir.join("failed").join(format!("{id}.json"));
    loop {
        if let Some(rejection) = rejection_of(&path) {
            return rejection.errors;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Sends a message (`{"job": …}` or `{"cancel": …}`) to `queue`; `id` names it (the job's id,
/// or `cancel-JOB`): a FIFO queue's deduplication id, a folder's file name.
///
/// # Errors
/// Why it was not sent, with the fix.
pub(crate) async fn send(
    queue: &Queue,
    ws: &WorkspaceId,
    id: &str,
    message: &Value,
) -> Result<(), String> {
    let body = message.to_string();
    match queue {
        Queue::Folder(dir) => to_folder(dir, id, message),
        Queue::Sqs(url) => {
            // A FIFO queue keeps the workspace's jobs in order. A cancel has a group of its own:
            // behind its job's, it would wait for the job to end.
            let group = if message.get("cancel").is_some() {
                format!("{ws}/cancel")
            } else {
                ws.to_string()
            };
            to_sqs(url, &group, id, body).await
        }
        Queue::PubSub(topic) => to_pubsub(topic, &body).await,
        Queue::Azure { account, queue } => to_azqueue(account, queue, &body).await,
        #[cfg(feature = "amqp")]
        Queue::Amqp(broker) => {
            let credentials = crate::serve::amqp::Credentials::from_env()?;
            crate::serve::amqp::send(broker, &credentials, body.as_bytes()).await
        }
    }
}

/// Puts the message in a `terrace serve` queue folder, whole or not at all: written aside under
/// a name of its own, then linked as `<id>.json` (which fails if that name is taken, so two
/// submits of one id cannot both land) and the aside copy removed. A message of that id
/// waiting, running or finished in the folder is not sent again.
fn to_folder(dir: &Path, id: &str, message: &Value) -> Result<(), String> {
    if !dir.is_dir() {
        return Err(format!(
            "{} is not a folder: give the folder `terrace serve --queue` reads",
            dir.display()
        ));
    }
    // A cancel answered before may be sent again; a job only when it was rejected (it never
    // ran: a job id runs once).
    let cancel = message.get("cancel").is_some();
    for sub in ["", "running", "done", "failed"] {
        for ext in ["json", "yaml", "yml"] {
            let there = dir.join(sub).join(format!("{id}.{ext}"));
            let settled = sub == "done" || sub == "failed";
            if !there.exists() || (settled && (cancel || rejection_of(&there).is_some())) {
                continue;
            }
            return Err(if cancel {
                format!("{} is already waiting there", there.display())
            } else {
                format!(
                    "{} is already there: a job id runs once (give the job a new id to send it again)",
                    there.display()
                )
            });
        }
    }
    // The queue reads a job file as the job itself, not its envelope; a cancel as it is.
    let file = message.get("job").unwrap_or(message);
    let text = serde_json::to_vec_pretty(file).map_err(|e| e.to_string())?;
    let aside = dir.join(format!(".{id}.{:016x}.sending", rand::random::<u64>()));
    std::fs::write(&aside, text).map_err(|e| format!("cannot write {}: {e}", aside.display()))?;
    let to = dir.join(format!("{id}.json"));
    let linked = std::fs::hard_link(&aside, &to);
    let _ = std::fs::remove_file(&aside);
    linked.map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => format!(
            "{} is already queued there: a job id runs once (give the job a new id to send it again)",
            to.display()
        ),
        _ => format!("cannot queue {}: {e}", to.display()),
    })
}

/// The rejection `serve` settled the message file at `path` with (its `.result.json`), if
/// that is how it ended.
fn rejection_of(path: &Path) -> Option<Rejection> {
    let mut result = path.as_os_str().to_owned();
    result.push(".result.json");
    let bytes = std::fs::read(result).ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Message::Rejection(rejection) => Some(rejection),
        _ => None,
    }
}

#[cfg(feature = "aws")]
async fn to_sqs(url: &str, group: &str, id: &str, body: String) -> Result<(), String> {
    use aws_config::BehaviorVersion;
    let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let fifo = url.ends_with(".fifo");
    // A FIFO queue takes an id once.
    sqs.send_message()
        .queue_url(url)
        .message_body(body)
        .set_message_group_id(fifo.then(|| group.to_owned()))
        .set_message_deduplication_id(fifo.then(|| id.to_owned()))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            format!(
                "{}: check the queue URL and that these credentials may send to it",
                state_backends::s3::brief(&e)
            )
        })
}

#[cfg(not(feature = "aws"))]
async fn to_sqs(_: &str, _: &str, _: &str, _: String) -> Result<(), String> {
    Err("this terrace was built without the `aws` feature".into())
}

/// Publishes to a Pub/Sub topic: to `TERRACE_PUBSUB_ENDPOINT` when it is set (an emulator over
/// plain http is called without credentials), else Google's, with the machine's credentials
/// (Application Default Credentials).
#[cfg(feature = "gcp")]
async fn to_pubsub(topic: &str, body: &str) -> Result<(), String> {
    use base64::Engine as _;
    use google_cloud_auth::credentials::{Builder, CacheableResource};
    let endpoint = std::env::var("TERRACE_PUBSUB_ENDPOINT")
        .unwrap_or_else(|_| "https://pubsub.googleapis.com".into());
    let url = format!("{}/v1/{topic}:publish", endpoint.trim_end_matches('/'));
    let data = base64::engine::general_purpose::STANDARD.encode(body);
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    let mut request = http
        .post(&url)
        .json(&serde_json::json!({ "messages": [{ "data": data }] }));
    if !endpoint.starts_with("http://") {
        let credentials = Builder::default()
            .build()
            .map_err(|e| format!("no Google credentials on this machine ({e}): run `gcloud auth application-default login`"))?;
        match credentials.headers(http::Extensions::new()).await {
            Ok(CacheableResource::New { data, .. }) => request = request.headers(data),
            Ok(CacheableResource::NotModified) => {}
            Err(e) => return Err(format!("no token for Pub/Sub: {e}")),
        }
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach {endpoint}: {e}"))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let answer: serde_json::Value = response.json().await.unwrap_or_default();
    Err(format!(
        "{status}: {}: check the topic and that these credentials may publish to it",
        answer["error"]["message"]
            .as_str()
            .unwrap_or("no reason given")
    ))
}

#[cfg(not(feature = "gcp"))]
async fn to_pubsub(_: &str, _: &str) -> Result<(), String> {
    Err("this terrace was built without the `gcp` feature".into())
}

/// Sends to an Azure Storage queue: at `TERRACE_AZURE_QUEUE_ENDPOINT` (an emulator's
/// `http://HOST:PORT/ACCOUNT`) or the account's own endpoint, with the SAS in
/// `AZURE_STORAGE_SAS_TOKEN` or the machine's `az login`, never a credential over plain http.
#[cfg(feature = "azure")]
async fn to_azqueue(account: &str, queue: &str, body: &str) -> Result<(), String> {
    use azure_core::credentials::TokenCredential;
    use azure_storage_queue::QueueClient;
    use azure_storage_queue::models::QueueMessage;
    let base = std::env::var("TERRACE_AZURE_QUEUE_ENDPOINT")
        .unwrap_or_else(|_| format!("https://{account}.queue.core.windows.net"));
    let sas = std::env::var("AZURE_STORAGE_SAS_TOKEN")
        .ok()
        .map(|s| s.trim().trim_start_matches('?').to_owned())
        .filter(|s| !s.is_empty());
    let mut url = format!("{}/{queue}", base.trim_end_matches('/'));
    let credential: Option<std::sync::Arc<dyn TokenCredential>> = match sas {
        Some(sas) => {
            url = format!("{url}?{sas}");
            None
        }
        None if url.starts_with("http://") => {
            return Err("a credential is never sent over plain http: for an emulator, set its SAS in AZURE_STORAGE_SAS_TOKEN".into());
        }
        None => Some(
            azure_identity::DeveloperToolsCredential::new(None)
                .map_err(|e| format!("cannot use `az login`: {e}"))?,
        ),
    };
    let scrub = |e: &dyn std::fmt::Display| state_backends::azure::scrub(&e.to_string());
    let parsed = url::Url::parse(&url).map_err(|e| format!("not a queue URL: {}", scrub(&e)))?;
    let client = QueueClient::new(parsed, credential, None).map_err(|e| scrub(&e))?;
    // `QueueMessage` is non-exhaustive: it cannot be built with a struct literal.
    #[allow(clippy::field_reassign_with_default)]
    let message = {
        let mut message = QueueMessage::default();
        message.message_text = Some(body.to_owned());
        message
    };
    let content = message
        .try_into()
        .map_err(|e: azure_core::Error| scrub(&e))?;
    match client.send_message(content, None).await {
        Ok(_) => Ok(()),
        Err(e) if e.http_status().map(u16::from) == Some(404) => Err(format!(
            "the account has no queue {queue}: check the name (the runner's TERRACE_QUEUE_URL)"
        )),
        Err(e) => Err(format!(
            "{}: check the account, the queue and that these credentials may send to it",
            scrub(&e)
        )),
    }
}

#[cfg(not(feature = "azure"))]
async fn to_azqueue(_: &str, _: &str, _: &str) -> Result<(), String> {
    Err("this terrace was built without the `azure` feature".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_a_folder_or_an_sqs_url_and_anything_else_says_which_work() {
        assert_eq!(
            Queue::parse("/var/terrace/queue"),
            Ok(Queue::Folder("/var/terrace/queue".into()))
        );
        let Ok(Queue::Sqs(url)) =
            Queue::parse("sqs://sqs.eu-west-1.amazonaws.com/123456789012/jobs.fifo")
        else {
            panic!("an SQS queue")
        };
        assert!(
            url.ends_with("://sqs.eu-west-1.amazonaws.com/123456789012/jobs.fifo"),
            "{url}"
        );
        let e = Queue::parse("kafka://broker/jobs").unwrap_err();
        assert!(
            e.starts_with("kafka:// is not a queue") && e.contains("sqs://"),
            "{e}"
        );
        let e = Queue::parse("sqs://jobs").unwrap_err();
        assert!(e.contains("is not an SQS queue"), "{e}");
        assert_eq!(
            Queue::parse("pubsub://projects/acme/topics/terrace-jobs"),
            Ok(Queue::PubSub("projects/acme/topics/terrace-jobs".into()))
        );
        let e = Queue::parse("pubsub://acme/terrace-jobs").unwrap_err();
        assert!(e.contains("is not a Pub/Sub topic"), "{e}");
        assert_eq!(
            Queue::parse("azqueue://acmestates/terrace-jobs"),
            Ok(Queue::Azure {
                account: "acmestates".into(),
                queue: "terrace-jobs".into()
            })
        );
        let e = Queue::parse("azqueue://acmestates").unwrap_err();
        assert!(e.contains("is not an Azure Storage queue"), "{e}");
    }
}
