//! `terrace serve --queue amqp[s]://HOST[:PORT][/VHOST][?jobs=Q&results=X&logs=L]`: jobs from a
//! RabbitMQ queue (AMQP 0-9-1), so that workers on several machines share one broker. Every
//! job goes through the one pipeline (validate, lease, run, report); the broker only carries
//! messages.
//!
//! - **Jobs**: the queue `Q` (default `terrace.jobs`), consumed with a prefetch of
//!   `--concurrency`. A message is acknowledged once its fate is settled: its result stored
//!   and published (with the broker's confirm), its copy on the delay queue, or its masked copy
//!   on the dead-letter queue. A message whose record could not be published is returned to
//!   the queue: its next delivery reports the stored result again (a job id runs once).
//! - **Busy workspaces**: a fresh copy goes to `Q.delay`, whose messages expire (their TTL is
//!   the wait) and are dead-lettered back to `Q`: a job waiting behind another is never a hot
//!   redelivery loop.
//! - **Never a job**: the rejection is published, and the message, its values masked, goes to
//!   `Q.dead`.
//! - **Results**: each record (a result, a rejection, a cancel's answer) is published to the
//!   topic exchange `X` (default `terrace.results`), routing key `<kind>.<tenant>.<workspace>`
//!   (or `<kind>` for a message that names none).
//!
//! The user and password come from `TERRACE_AMQP_USER` and `TERRACE_AMQP_PASSWORD` (or
//! `TERRACE_AMQP_PASSWORD_FILE`), never from the URL: a command line is seen by every user of
//! the machine. They are never printed. `amqps://` speaks TLS (rustls): the broker's certificate
//! is checked against the system's roots (`SSL_CERT_FILE` names a bundle) and, with
//! `TERRACE_AMQP_CA_FILE`, the CA certificates in that PEM file too (a private CA).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::Value;
use shared::host::message::{DeadLetter, DeadLetterKind, Message, TaskStarted};
use shared::host::pipeline::{self, Delivery, Fate, Keep, Trigger};
use shared::host::settings::Runtime;
use shared::host::trigger::{JobRef, TriggerError};
use shared::job::signature::SenderKey;
use shared::job::validate::{ValidatedJob, ValidationError};
use shared::run::logs::{LogLine, LogSink, LogTap};
use shared::run::terraform::TerraformConfig;
use state_backends::{StateStore, WorkspaceId};
use tokio::sync::RwLock;
use tokio_util::sync::CancellationToken;

use super::Here;
use crate::exit;

/// The default jobs queue, results exchange and log exchange.
pub const JOBS: &str = "terrace.jobs";
pub const RESULTS: &str = "terrace.results";
pub const LOGS: &str = "terrace.logs";

/// The longest a job waits on the delay queue before it is tried again.
pub const BUSY_WAIT: Duration = Duration::from_secs(5);

/// The heartbeat asked of the broker unless the URL says otherwise (`heartbeat=SECONDS`): a
/// broker, or a network to it, gone silent is taken as lost after about twice this, rather
/// than after RabbitMQ's own 60 s (or never, where the broker's heartbeats are off).
pub const HEARTBEAT: u16 = 20;

/// How long connecting (TCP, TLS, the AMQP handshake) may take before it is given up and tried
/// again: a broker behind a silent network accepts nothing and refuses nothing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// The broker and Terrace's queues and exchanges on it, as `--queue` names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broker {
    /// `amqps://`: TLS, the broker's certificate checked.
    tls: bool,
    host: String,
    port: u16,
    vhost: String,
    /// Seconds: the heartbeat asked of the broker (the lower of this and the broker's is used).
    heartbeat: u16,
    pub jobs: String,
    pub results: String,
    pub logs: String,
}

impl Broker {
    /// Reads `amqp[s]://HOST[:PORT][/VHOST][?jobs=Q&results=X&logs=L&heartbeat=SECONDS]`.
    ///
    /// # Errors
    /// What is wrong with the URL and how to write it, as a sentence.
    pub fn parse(text: &str) -> Result<Self, String> {
        const FORM: &str = "write the broker as amqp[s]://HOST[:PORT][/VHOST][?jobs=QUEUE&results=EXCHANGE&logs=EXCHANGE&heartbeat=SECONDS]";
        let url = url::Url::parse(text).map_err(|e| format!("not a URL ({e}): {FORM}"))?;
        let tls = match url.scheme() {
            "amqp" => false,
            "amqps" => true,
            other => return Err(format!("{other}:// is not AMQP: {FORM}")),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err("the URL carries a user or password: put them in TERRACE_AMQP_USER and TERRACE_AMQP_PASSWORD (or TERRACE_AMQP_PASSWORD_FILE) instead, since a command line is seen by every user of the machine".into());
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("no broker host: {FORM}"))?
            .to_owned();
        let path = url.path().trim_start_matches('/');
        let vhost = if path.is_empty() {
            "/".to_owned()
        } else {
            percent_decode(path).ok_or_else(|| format!("the vhost {path:?} is not UTF-8"))?
        };
        let mut broker = Self {
            tls,
            host,
            port: url.port().unwrap_or(if tls { 5671 } else { 5672 }),
            vhost,
            heartbeat: HEARTBEAT,
            jobs: JOBS.into(),
            results: RESULTS.into(),
            logs: LOGS.into(),
        };
        for (key, value) in url.query_pairs() {
            if key == "heartbeat" {
                broker.heartbeat = value
                    .parse()
                    .ok()
                    .filter(|s| (1..=600).contains(s))
                    .ok_or_else(|| {
                        format!("heartbeat={value:?} is not a number of seconds from 1 to 600")
                    })?;
                continue;
            }
            let slot = match key.as_ref() {
                "jobs" => &mut broker.jobs,
                "results" => &mut broker.results,
                "logs" => &mut broker.logs,
                other => {
                    return Err(format!(
                        "unknown setting {other:?}: the URL takes jobs, results, logs and heartbeat"
                    ));
                }
            };
            if value.is_empty() || value.len() > 200 || value.starts_with("amq.") {
                return Err(format!(
                    "{key}={value:?} is not a name Terrace can use: 1 to 200 characters, not starting with amq. (the broker's own)"
                ));
            }
            *slot = value.into_owned();
        }
        Ok(broker)
    }

    /// Where busy jobs wait: its messages expire and go back to the jobs queue.
    pub fn delay_queue(&self) -> String {
        format!("{}.delay", self.jobs)
    }

    /// Where messages that can never be jobs go, their values masked.
    pub fn dead_queue(&self) -> String {
        format!("{}.dead", self.jobs)
    }

    /// The broker as it may be printed (no credentials).
    pub fn shown(&self) -> String {
        let vhost = if self.vhost == "/" {
            String::new()
        } else {
            format!("/{}", self.vhost)
        };
        let scheme = if self.tls { "amqps" } else { "amqp" };
        format!("{scheme}://{}:{}{vhost}", self.host, self.port)
    }

    /// Opens a connection to the broker as `credentials`' user, over TLS for `amqps://`, within
    /// [`CONNECT_TIMEOUT`].
    async fn connect(&self, credentials: &Credentials) -> Result<Connection, lapin::Error> {
        let tls = lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain: credentials.ca.clone(),
        };
        let connecting = Connection::connect_uri_with_config(
            self.uri(credentials),
            ConnectionProperties::default(),
            tls,
            lapin::runtime::default_runtime()?,
        );
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
                )
                .into())
            })
    }

    /// Why connecting failed, as a sentence with the fix; `None` when it may pass.
    fn refused(&self, credentials: &Credentials, e: &lapin::Error) -> Option<String> {
        let text = e.to_string();
        if text.contains("ACCESS_REFUSED") || text.contains("authentication") {
            return Some(format!(
                "broker {} refused the user {}: check TERRACE_AMQP_USER and its password, and the user's access to the vhost {}",
                self.shown(),
                credentials.user,
                self.vhost
            ));
        }
        // rustls's verdicts on the broker's certificate: no retry changes them.
        if self.tls
            && ["certificate", "UnknownIssuer", "NotValidForName", "Expired"]
                .iter()
                .any(|w| text.contains(w))
        {
            return Some(format!(
                "broker {}: its TLS certificate is not trusted ({text}): set TERRACE_AMQP_CA_FILE to the PEM of the CA that signed it (or add that CA to the system's roots), and name the broker as its certificate does",
                self.shown()
            ));
        }
        if self.tls
            && (text.contains("WRONG_VERSION_NUMBER") || text.contains("InvalidContentType"))
        {
            return Some(format!(
                "broker {}: the port does not speak TLS: use amqp:// for it, or the broker's TLS port (5671 by default)",
                self.shown()
            ));
        }
        None
    }

    fn uri(&self, credentials: &Credentials) -> lapin::uri::AMQPUri {
        let mut uri = lapin::uri::AMQPUri::default();
        if self.tls {
            uri.scheme = lapin::uri::AMQPScheme::AMQPS;
        }
        uri.authority.host.clone_from(&self.host);
        uri.authority.port = self.port;
        uri.authority
            .userinfo
            .username
            .clone_from(&credentials.user);
        uri.authority
            .userinfo
            .password
            .clone_from(&credentials.password);
        uri.vhost.clone_from(&self.vhost);
        uri.query.heartbeat = Some(self.heartbeat);
        uri
    }
}

/// `text` with its `%XX` escapes decoded; `None` when that is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    // form_urlencoded decodes `%XX` (and `+` as a space, which a path keeps as `+`).
    let escaped = text.replace('+', "%2B").replace('&', "%26");
    let query = format!("v={escaped}");
    let (_, value) = url::form_urlencoded::parse(query.as_bytes()).next()?;
    Some(value.into_owned()).filter(|v| !v.contains('\u{fffd}'))
}

/// Sends one message to the broker's jobs queue (`terrace submit --to amqp://…`), persistent,
/// and waits for the broker's confirm.
///
/// # Errors
/// Why it was not sent, as a sentence with the fix.
pub async fn send(broker: &Broker, credentials: &Credentials, body: &[u8]) -> Result<(), String> {
    let connection = broker.connect(credentials).await.map_err(|e| {
        broker
            .refused(credentials, &e)
            .unwrap_or_else(|| format!("cannot reach the broker {}: {e}", broker.shown()))
    })?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let published = publish_confirmed(&channel, "", &broker.jobs, body, None).await;
    let _ = connection.close(200, "sent".into()).await;
    published.map_err(|why| {
        format!(
            "broker {}: {why}: start a worker with --declare, or create it (docs/self-hosted.md)",
            broker.shown()
        )
    })
}

/// Publishes `body` (persistent, JSON, expiring after `expiration` if given) on `channel`, which
/// has confirms on, and waits for the broker's confirm. To the default exchange (a queue by
/// name) it is mandatory: a missing queue is an error. A record on a named exchange that no
/// queue is bound for is dropped by the broker, as AMQP does.
async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    expiration: Option<Duration>,
) -> Result<(), String> {
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    if let Some(after) = expiration {
        properties = properties.with_expiration(after.as_millis().max(1).to_string().into());
    }
    let confirm = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions {
                mandatory: exchange.is_empty(),
                ..BasicPublishOptions::default()
            },
            body,
            properties,
        )
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    if confirm.is_nack() {
        return Err(format!(
            "the broker refused the message for {exchange} {routing_key}"
        ));
    }
    if confirm.take_message().is_some() {
        return Err(format!("the broker has no queue {routing_key}"));
    }
    Ok(())
}

/// The broker user's name and password (never printed), and the CA certificates its TLS
/// certificate may be signed by beside the system's roots.
pub struct Credentials {
    user: String,
    password: String,
    /// PEM, from `TERRACE_AMQP_CA_FILE`.
    ca: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// From `TERRACE_AMQP_USER` and `TERRACE_AMQP_PASSWORD` or `TERRACE_AMQP_PASSWORD_FILE`, and
    /// `TERRACE_AMQP_CA_FILE`.
    ///
    /// # Errors
    /// Which setting is missing or unreadable, and the fix.
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let user = var("TERRACE_AMQP_USER").ok_or(
            "TERRACE_AMQP_USER is not set: the broker's user for this worker (its password in TERRACE_AMQP_PASSWORD or TERRACE_AMQP_PASSWORD_FILE)",
        )?;
        let password = match (
            var("TERRACE_AMQP_PASSWORD"),
            var("TERRACE_AMQP_PASSWORD_FILE"),
        ) {
            (Some(_), Some(_)) => {
                return Err(
                    "both TERRACE_AMQP_PASSWORD and TERRACE_AMQP_PASSWORD_FILE are set: keep one"
                        .into(),
                );
            }
            (Some(password), None) => password,
            (None, Some(path)) => std::fs::read_to_string(&path)
                .map_err(|e| format!("TERRACE_AMQP_PASSWORD_FILE: cannot read {path}: {e}"))?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
            (None, None) => {
                return Err(format!(
                    "no password for the broker user {user}: set TERRACE_AMQP_PASSWORD, or TERRACE_AMQP_PASSWORD_FILE to a file holding it"
                ));
            }
        };
        let ca = match var("TERRACE_AMQP_CA_FILE") {
            None => None,
            Some(path) => {
                let pem = std::fs::read_to_string(&path)
                    .map_err(|e| format!("TERRACE_AMQP_CA_FILE: cannot read {path}: {e}"))?;
                if !pem.contains("-----BEGIN CERTIFICATE-----") {
                    return Err(format!(
                        "TERRACE_AMQP_CA_FILE: {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the CA's certificate in PEM"
                    ));
                }
                Some(pem)
            }
        };
        Ok(Self { user, password, ca })
    }
}

/// What a worker needs besides the broker.
pub struct Worker {
    pub runtime: Runtime,
    pub store: Arc<dyn StateStore>,
    pub senders: BTreeMap<String, Vec<SenderKey>>,
    pub concurrency: usize,
    /// Declare the queues and exchanges (else they must exist).
    pub declare: bool,
}

/// Why a connection ended.
enum Ended {
    /// Shut down by a signal: every job in hand has ended.
    Stopped,
    /// The broker went away or refused something that may pass: connect again.
    Lost(String),
    /// Nothing will change by trying again (credentials refused, a queue missing).
    Fatal(String),
}

/// Runs the worker until a signal stops it: connects (again, with backoff, whenever the
/// connection is lost) and consumes the jobs queue.
///
/// # Errors
/// None beyond the exit code: a fatal broker answer is printed and exits `exit::USAGE`.
pub async fn serve(broker: Broker, credentials: Credentials, worker: Worker) -> anyhow::Result<u8> {
    let cancel = CancellationToken::new();
    tokio::spawn(crate::cancel_on_signal(cancel.clone()));
    let publisher: Publisher = Arc::default();
    let mut worker = worker;
    worker.runtime.log_tap = Some(Arc::new(LogExchange {
        exchange: broker.logs.clone(),
        publisher: publisher.clone(),
    }));
    let trigger = Arc::new(Amqp {
        worker,
        broker,
        publisher,
    });
    let mut backoff = Backoff::default();
    // Jobs in hand outlive a lost connection: they run on while the worker connects again,
    // and publish their records on the new connection.
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        match connected(&trigger, &credentials, &cancel, &mut backoff, &mut tasks).await {
            Ended::Stopped => {
                while tasks.join_next().await.is_some() {}
                return Ok(exit::OK);
            }
            Ended::Fatal(why) => {
                eprintln!("error: {why}");
                return Ok(exit::USAGE);
            }
            Ended::Lost(why) => {
                let wait = backoff.next();
                eprintln!(
                    "broker {}: {why}; connecting again in {} s",
                    trigger.broker.shown(),
                    wait.as_secs_f32()
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = cancel.cancelled() => {
                        while tasks.join_next().await.is_some() {}
                        return Ok(exit::OK);
                    }
                }
            }
        }
    }
}

/// Waits between connection attempts: 0.5 s doubling to 30 s, reset once connected.
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(Duration::from_secs(30));
        now
    }

    fn reset(&mut self) {
        *self = Self::default();
    }
}

/// A broker's answer that no retry changes: refused credentials, a missing queue or exchange,
/// no access to the vhost.
fn is_fatal(e: &lapin::Error) -> bool {
    let text = e.to_string();
    [
        "ACCESS_REFUSED",
        "NOT_FOUND",
        "NOT_ALLOWED",
        "PRECONDITION_FAILED",
    ]
    .iter()
    .any(|code| text.contains(code))
}

fn lost_or_fatal(doing: &str, e: &lapin::Error) -> Ended {
    let why = format!("{doing}: {e}");
    if is_fatal(e) {
        Ended::Fatal(why)
    } else {
        Ended::Lost(why)
    }
}

/// One connection's life: topology checked (or declared), then consume until the connection
/// is lost or a signal comes. Jobs in hand when it is lost run on (in `tasks`): their
/// messages return to the queue with the connection, and whichever delivery comes next
/// finds the workspace busy until the run ends, then its stored result, and reports it.
async fn connected(
    trigger: &Arc<Amqp>,
    credentials: &Credentials,
    cancel: &CancellationToken,
    backoff: &mut Backoff,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Ended {
    let broker = &trigger.broker;
    let connection = match broker.connect(credentials).await {
        Ok(c) => c,
        Err(e) => {
            if let Some(why) = broker.refused(credentials, &e) {
                return Ended::Fatal(why);
            }
            return lost_or_fatal("cannot connect", &e);
        }
    };
    let channels = async {
        let consume = connection.create_channel().await?;
        let publish = connection.create_channel().await?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok::<_, lapin::Error>((consume, publish))
    };
    let (consume, publish) = match channels.await {
        Ok(c) => c,
        Err(e) => return lost_or_fatal("cannot open a channel", &e),
    };
    if let Err(ended) = topology(broker, &connection, trigger.worker.declare).await {
        return ended;
    }
    let prefetch = u16::try_from(trigger.worker.concurrency.max(1)).unwrap_or(u16::MAX);
    if let Err(e) = consume
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
    {
        return lost_or_fatal("cannot set the prefetch", &e);
    }
    let mut deliveries = match consume
        .basic_consume(
            broker.jobs.as_str().into(),
            ShortString::from(format!("terrace-{}", std::process::id())),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
    {
        Ok(c) => c,
        Err(e) => return lost_or_fatal(&format!("cannot consume {}", broker.jobs), &e),
    };
    *trigger.publisher.write().await = Some(publish);
    backoff.reset();
    eprintln!(
        "serving queue {} on {} ({} at once)",
        broker.jobs,
        broker.shown(),
        prefetch
    );
    let ended = loop {
        tokio::select! {
            next = deliveries.next() => match next {
                Some(Ok(delivery)) => {
                    let (trigger, cancel) = (trigger.clone(), cancel.child_token());
                    tasks.spawn(async move { trigger.settle(delivery, cancel).await });
                }
                Some(Err(e)) => break Ended::Lost(format!("the connection was lost: {e}")),
                None => break Ended::Lost("the broker cancelled the consumer".into()),
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = cancel.cancelled() => break Ended::Stopped,
        }
    };
    if matches!(ended, Ended::Stopped) {
        // No more deliveries; jobs in hand end `interrupted` and go back to the queue.
        let _ = consume
            .basic_cancel(
                ShortString::from(format!("terrace-{}", std::process::id())),
                lapin::options::BasicCancelOptions::default(),
            )
            .await;
    }
    if matches!(ended, Ended::Stopped) {
        // Their records go out on this connection before it closes.
        while tasks.join_next().await.is_some() {}
    }
    *trigger.publisher.write().await = None;
    let _ = connection.close(200, "bye".into()).await;
    ended
}

/// Checks that the jobs queue, its delay and dead-letter queues and the two exchanges exist, or
/// declares them (`--declare`).
async fn topology(broker: &Broker, connection: &Connection, declare: bool) -> Result<(), Ended> {
    let durable = |passive| QueueDeclareOptions {
        passive,
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let mut back = FieldTable::default();
    back.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    back.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(broker.jobs.as_str().into()),
    );
    let queues = [
        (broker.jobs.clone(), FieldTable::default()),
        (broker.delay_queue(), back),
        (broker.dead_queue(), FieldTable::default()),
    ];
    let fix = "start one worker with --declare to create Terrace's queues and exchanges, or create them as deploy/self-hosted/README.md shows";
    // A failed passive declare closes its channel: each check gets its own.
    for (name, args) in queues {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| lost_or_fatal("cannot open a channel", &e))?;
        let args = if declare { args } else { FieldTable::default() };
        if let Err(e) = channel
            .queue_declare(name.as_str().into(), durable(!declare), args)
            .await
        {
            return Err(if e.to_string().contains("NOT_FOUND") {
                Ended::Fatal(format!("the broker has no queue {name}: {fix}"))
            } else {
                lost_or_fatal(&format!("cannot declare the queue {name}"), &e)
            });
        }
        let _ = channel.close(200, "checked".into()).await;
    }
    for name in [&broker.results, &broker.logs] {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| lost_or_fatal("cannot open a channel", &e))?;
        let options = ExchangeDeclareOptions {
            passive: !declare,
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        if let Err(e) = channel
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            )
            .await
        {
            return Err(if e.to_string().contains("NOT_FOUND") {
                Ended::Fatal(format!("the broker has no exchange {name}: {fix}"))
            } else {
                lost_or_fatal(&format!("cannot declare the exchange {name}"), &e)
            });
        }
        let _ = channel.close(200, "checked".into()).await;
    }
    Ok(())
}

/// The channel records, copies and log lines are published on (with confirms), while
/// connected.
type Publisher = Arc<RwLock<Option<Channel>>>;

/// The broker as a trigger of the one pipeline; the store is the worker's own (`--store`).
struct Amqp {
    worker: Worker,
    broker: Broker,
    publisher: Publisher,
}

/// Each job's log lines, published live to the log exchange as they are written (routing key
/// `<tenant>.<workspace>.<job>`, the stored log's JSON lines), as the seeds' runner streams
/// its output to its controller. Best effort: a line the broker cannot take at once is left
/// out of this copy (the stored log keeps every line), so a slow broker never holds a job up.
#[derive(Debug)]
struct LogExchange {
    exchange: String,
    publisher: Publisher,
}

/// Lines waiting to be published; more than this and new lines are left out of the live copy.
const LIVE_LINES: usize = 1024;

impl LogTap for LogExchange {
    fn open(&self, ws: &WorkspaceId, job_id: &str) -> Box<dyn LogSink> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(LIVE_LINES);
        let key = format!("{}.{}.{job_id}", ws.tenant(), ws.workspace());
        let (exchange, publisher) = (self.exchange.clone(), self.publisher.clone());
        tokio::spawn(async move {
            while let Some(body) = rx.recv().await {
                let guard = publisher.read().await;
                let Some(channel) = guard.as_ref() else {
                    continue;
                };
                let properties =
                    BasicProperties::default().with_content_type("application/json".into());
                // Sent without waiting for the broker's confirm: the next line follows at once.
                let _ = channel
                    .basic_publish(
                        exchange.as_str().into(),
                        key.as_str().into(),
                        BasicPublishOptions::default(),
                        &body,
                        properties,
                    )
                    .await;
            }
        });
        Box::new(LiveLines { tx })
    }
}

struct LiveLines {
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
}

#[async_trait]
impl LogSink for LiveLines {
    async fn write(&mut self, line: &LogLine) {
        if let Ok(body) = serde_json::to_vec(line) {
            let _ = self.tx.try_send(body);
        }
    }

    async fn flush(&mut self) {}
}

tokio::task_local! {
    /// Set when a record of the delivery being handled could not be published: its message
    /// is then returned to the queue instead of acknowledged.
    static UNREPORTED: std::cell::Cell<bool>;
}

impl Amqp {
    /// Publishes `body` on the connection's channel ([`publish_confirmed`]).
    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        expiration: Option<Duration>,
    ) -> Result<(), String> {
        let guard = self.publisher.read().await;
        let channel = guard.as_ref().ok_or("not connected to the broker")?;
        publish_confirmed(channel, exchange, routing_key, body, expiration).await
    }

    /// Sees one delivery through the pipeline and settles its message: acknowledged when its
    /// fate is recorded, returned to the queue when it is not.
    async fn settle(&self, delivery: lapin::message::Delivery, cancel: CancellationToken) {
        let message_id = delivery.properties.message_id().as_ref().map_or_else(
            || format!("delivery-{}", delivery.delivery_tag),
            ToString::to_string,
        );
        let d = Delivery {
            message_id: &message_id,
            body: &delivery.data,
            time_left: None,
            lease_wait: Duration::ZERO,
            cancel,
            receipt: None,
        };
        let (fate, unreported) = UNREPORTED
            .scope(std::cell::Cell::new(false), async {
                let fate = pipeline::handle(self, d).await;
                (fate, UNREPORTED.with(std::cell::Cell::get))
            })
            .await;
        let settled = match fate {
            _ if unreported => Err("its record could not be published".to_owned()),
            Fate::Ran(_) | Fate::HandedOff(_) | Fate::Requeued { .. } => Ok(()),
            Fate::Rejected(record) => self.dead_letter(&delivery, record).await,
            Fate::Again { why, delay } => {
                // The same message later, through the delay queue (never straight back:
                // a hot loop).
                let delay = delay.unwrap_or(Duration::from_secs(5));
                eprintln!(
                    "{message_id}: {why}; delivered again in {} s",
                    delay.as_secs()
                );
                self.publish("", &self.broker.delay_queue(), &delivery.data, Some(delay))
                    .await
            }
            Fate::Interrupted(_) => Err("interrupted by the worker's shutdown".to_owned()),
        };
        let acked = match settled {
            Ok(()) => delivery.ack(BasicAckOptions::default()).await,
            Err(why) => {
                eprintln!("{message_id}: returned to the queue: {why}");
                // Not straight back: a trouble that lasts would make a hot loop of it.
                tokio::time::sleep(Duration::from_secs(1)).await;
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await
            }
        };
        if let Err(e) = acked {
            // The connection is gone: the broker returns the message itself.
            eprintln!("{message_id}: could not settle it with the broker: {e}");
        }
    }

    /// Moves a message that can never run to the dead-letter queue, values masked, with its
    /// rejection (published already).
    async fn dead_letter(
        &self,
        delivery: &lapin::message::Delivery,
        record: Value,
    ) -> Result<(), String> {
        let Ok(Message::Rejection(rejection)) = serde_json::from_value::<Message>(record) else {
            return Err("the pipeline's rejection is not one".into());
        };
        let text = String::from_utf8_lossy(&delivery.data);
        let masked =
            shared::host::trigger::masked_message(&text, self.worker.runtime.templates.root());
        let dead = DeadLetter {
            kind: DeadLetterKind::Rejection,
            rejection,
            dequeue_count: u64::from(delivery.redelivered) + 1,
            message: masked,
            message_truncated: false,
        };
        let body = serde_json::to_vec(&dead).map_err(|e| e.to_string())?;
        self.publish("", &self.broker.dead_queue(), &body, None)
            .await
    }
}

/// The routing key of a record on the results exchange: `<kind>.<tenant>.<workspace>`, or
/// `<kind>` when it names no workspace.
fn routing_key(record: &Value) -> String {
    let kind = record["kind"].as_str().unwrap_or("record");
    match (record["tenant"].as_str(), record["workspace"].as_str()) {
        (Some(tenant), Some(workspace)) => format!("{kind}.{tenant}.{workspace}"),
        _ => kind.to_owned(),
    }
}

#[async_trait]
impl Trigger for Amqp {
    type Target = Here;

    fn envelope_fix(&self) -> &'static str {
        "send a job message: JSON {\"job\": {id, tenant, workspace, operation, template, variables}} (docs/schema/job-message.schema.json)"
    }

    fn bucket_of(&self, _: &Here) -> String {
        "the worker's store".into()
    }

    fn check_target(&self, _: &Here) -> Vec<ValidationError> {
        Vec::new()
    }

    /// The target is the worker's own store: a message names no account.
    fn tenants(&self) -> Option<&shared::host::tenants::Tenants<Here>> {
        None
    }

    fn own_target(&self) -> Option<Here> {
        Some(Here {})
    }

    fn senders(&self, tenant: &str) -> &[SenderKey] {
        self.worker.senders.get(tenant).map_or(&[], Vec::as_slice)
    }

    fn runtime(&self) -> &Runtime {
        &self.worker.runtime
    }

    async fn store(
        &self,
        _: &Here,
        _: &str,
        _: Option<&WorkspaceId>,
    ) -> Result<Arc<dyn StateStore>, TriggerError> {
        Ok(self.worker.store.clone())
    }

    async fn terraform_access(
        &self,
        _: &Here,
        _: &ValidatedJob,
        _: &mut TerraformConfig,
    ) -> Result<Keep, TriggerError> {
        Ok(None)
    }

    async fn report(&self, message: &Message) {
        let record = message.to_value();
        let body = record.to_string();
        let key = routing_key(&record);
        if let Err(why) = self
            .publish(&self.broker.results, &key, body.as_bytes(), None)
            .await
        {
            eprintln!(
                "could not publish a {key} record to {}: {why}",
                self.broker.results
            );
            let _ = UNREPORTED.try_with(|failed| failed.set(true));
        }
    }

    /// A busy workspace's job waits on the delay queue for at most [`BUSY_WAIT`]: the lease's
    /// expiry is when its holder would be given up for lost, while most jobs end well before.
    async fn requeue(&self, body: &[u8], delay: Duration) -> Result<(), TriggerError> {
        let delay = delay.min(BUSY_WAIT);
        let publish = if delay.is_zero() {
            self.publish("", &self.broker.jobs, body, None).await
        } else {
            self.publish("", &self.broker.delay_queue(), body, Some(delay))
                .await
        };
        publish.map_err(TriggerError::again)
    }

    fn cannot_hand_off(&self) -> Option<String> {
        Some("a worker has no time limit but the job's own timeout".into())
    }

    async fn start_task(&self, _: &JobRef<Here>, _: Duration) -> Result<TaskStarted, TriggerError> {
        Err("a worker hands nothing off".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_broker_vhost_and_queues_and_never_credentials() {
        let b = Broker::parse("amqp://mq.internal/").unwrap();
        assert_eq!(
            (
                b.port,
                b.vhost.as_str(),
                b.jobs.as_str(),
                b.results.as_str(),
                b.logs.as_str()
            ),
            (5672, "/", JOBS, RESULTS, LOGS)
        );
        assert_eq!(b.delay_queue(), "terrace.jobs.delay");
        assert_eq!(b.heartbeat, HEARTBEAT);
        assert_eq!(
            Broker::parse("amqp://mq/?heartbeat=5").unwrap().heartbeat,
            5
        );
        assert_eq!(b.dead_queue(), "terrace.jobs.dead");
        let b = Broker::parse("amqp://mq:5673/prod?jobs=a.jobs&results=a.out&logs=a.logs").unwrap();
        assert_eq!(
            (
                b.port,
                b.vhost.as_str(),
                b.jobs.as_str(),
                b.results.as_str(),
                b.logs.as_str()
            ),
            (5673, "prod", "a.jobs", "a.out", "a.logs")
        );
        assert_eq!(b.shown(), "amqp://mq:5673/prod");
        assert_eq!(Broker::parse("amqp://mq/%2f").unwrap().vhost, "/");
        let b = Broker::parse("amqps://mq.internal/prod").unwrap();
        assert!(b.tls);
        assert_eq!(
            (b.port, b.shown().as_str()),
            (5671, "amqps://mq.internal:5671/prod")
        );
        assert_eq!(
            b.uri(&Credentials {
                user: "u".into(),
                password: "p".into(),
                ca: None
            })
            .scheme,
            lapin::uri::AMQPScheme::AMQPS
        );

        let err = Broker::parse("amqp://u:s3cret@mq/").unwrap_err();
        assert!(err.contains("TERRACE_AMQP_PASSWORD"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
        for (bad, said) in [
            ("amqp://mq/?queue=x", "unknown setting"),
            ("amqp://mq/?jobs=", "not a name"),
            ("amqp://mq/?jobs=amq.x", "not a name"),
            ("amqp://mq/?heartbeat=0", "from 1 to 600"),
            ("amqp://mq/?heartbeat=soon", "from 1 to 600"),
            ("http://mq/", "is not AMQP"),
            ("mq:5672", "is not AMQP"),
        ] {
            let err = Broker::parse(bad).unwrap_err();
            assert!(err.contains(said), "{bad}: {err}");
        }
    }

    #[test]
    fn records_are_routed_by_kind_tenant_and_workspace() {
        let result = serde_json::json!({"kind": "result", "tenant": "acme", "workspace": "net"});
        assert_eq!(routing_key(&result), "result.acme.net");
        let rejection = serde_json::json!({"kind": "rejection", "message_id": "m"});
        assert_eq!(routing_key(&rejection), "rejection");
    }

    #[test]
    fn the_backoff_doubles_to_thirty_seconds_and_starts_over_once_connected() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(500));
    }
}
