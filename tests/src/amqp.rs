//! The RabbitMQ node `scripts/with-emulators.sh` starts on loopback, and a platform's side of
//! it: publishing job messages, reading the results exchange, the delay and dead-letter queues.
//! Each test gets queues and exchanges of its own (`amqp://…?jobs=…&results=…&logs=…`).

use std::time::Duration;

use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::Value;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests through scripts/with-emulators.sh")
    })
}

/// The broker's `amqp://127.0.0.1:PORT`.
pub fn broker() -> String {
    var("TERRACE_TEST_AMQP")
}

/// The PEM file of the CA that signed the test node's TLS certificate.
pub fn ca() -> String {
    var("TERRACE_TEST_AMQP_CA")
}

/// The test user's name and password, as a worker's environment gives them.
pub fn credentials() -> [(String, String); 2] {
    [
        ("TERRACE_AMQP_USER".into(), var("TERRACE_TEST_AMQP_USER")),
        (
            "TERRACE_AMQP_PASSWORD".into(),
            var("TERRACE_TEST_AMQP_PASSWORD"),
        ),
    ]
}

/// Runs `rabbitmqctl ARGS` against the test node.
pub fn ctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl")
        .env("HOME", var("TERRACE_TEST_RABBITMQ_HOME"))
        .args(["-q", "-n", &var("TERRACE_TEST_RABBITMQ_NODE")])
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(out.status.success(), "rabbitmqctl {args:?}: {out:?}");
}

/// The test node, started again (`scripts/with-rabbitmq.sh`'s start script) after
/// `rabbitmqctl stop`, once it answers AMQP again. The node runs on when the child is dropped:
/// the script stops it by name at its end.
pub async fn start_node() -> std::process::Child {
    let child = std::process::Command::new(var("TERRACE_TEST_RABBITMQ_START"))
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("the node's start script runs");
    // Ready when it answers the AMQP 0-9-1 header with Connection.Start (a method frame).
    let address = broker().trim_start_matches("amqp://").to_owned();
    let answers = || async {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let Ok(mut s) = tokio::net::TcpStream::connect(&address).await else {
            return false;
        };
        let mut first = [0u8; 1];
        s.write_all(b"AMQP\x00\x00\x09\x01").await.is_ok()
            && matches!(
                tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut first)).await,
                Ok(Ok(_))
            )
            && first[0] == 1
    };
    let give_up = std::time::Instant::now() + Duration::from_secs(90);
    while !answers().await {
        assert!(
            std::time::Instant::now() < give_up,
            "the node did not answer again within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    child
}

/// A test's own names on the broker, and a platform's connection to it.
pub struct Names {
    pub jobs: String,
    pub results: String,
    pub logs: String,
    /// A queue bound to the results exchange (`#`): every record published.
    pub collected: String,
    pub channel: Channel,
    _connection: Connection,
}

impl Names {
    /// Connects as the platform and makes names of its own (the worker declares them with
    /// `--declare`; the results queue is bound once the exchange exists: [`Names::collect`]).
    pub async fn new(prefix: &str) -> Self {
        let base = crate::aws::unique(prefix);
        let connection = connect().await;
        let channel = connection.create_channel().await.expect("a channel");
        Self {
            jobs: format!("{base}.jobs"),
            results: format!("{base}.results"),
            logs: format!("{base}.logs"),
            collected: format!("{base}.collected"),
            channel,
            _connection: connection,
        }
    }

    /// The same names on a new connection (after the broker restarted).
    pub async fn reconnect(self) -> Self {
        let connection = connect().await;
        let channel = connection.create_channel().await.expect("a channel");
        Self {
            channel,
            _connection: connection,
            ..self
        }
    }

    /// `--queue` for a worker on these names.
    pub fn url(&self) -> String {
        format!(
            "{}/?jobs={}&results={}&logs={}",
            broker(),
            self.jobs,
            self.results,
            self.logs
        )
    }

    /// `--queue` for a worker on these names, over TLS (the node's TLS listener; its CA's
    /// certificate is [`ca`]).
    pub fn tls_url(&self) -> String {
        self.url().replace(&broker(), &var("TERRACE_TEST_AMQPS"))
    }

    /// Declares the results exchange (as `--declare` does) and binds the collecting queue.
    pub async fn collect(&self) {
        self.channel
            .exchange_declare(
                self.results.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("the results exchange");
        // Durable, with its binding: it outlives a restart of the broker.
        self.channel
            .queue_declare(
                self.collected.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("the collecting queue");
        self.channel
            .queue_bind(
                self.collected.as_str().into(),
                self.results.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bound");
    }

    /// A queue of this test's bound to `exchange` with `key` (the exchange must exist).
    pub async fn bind(&self, exchange: &str, key: &str) -> String {
        let queue = crate::aws::unique("bound");
        self.channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("a queue");
        self.channel
            .queue_bind(
                queue.as_str().into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bound");
        queue
    }

    /// Publishes `message` (JSON) to the jobs queue, persistent.
    pub async fn publish(&self, message: &Value) {
        self.publish_raw(message.to_string().as_bytes()).await;
    }

    pub async fn publish_raw(&self, body: &[u8]) {
        self.channel
            .basic_publish(
                "".into(),
                self.jobs.as_str().into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("published")
            .await
            .expect("confirmed");
    }

    /// Every message waiting on `queue` now, taken off it.
    pub async fn drain(&self, queue: &str) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            out.push(
                serde_json::from_slice(&m.delivery.data).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&m.delivery.data).into_owned())
                }),
            );
        }
        out
    }

    /// How many messages wait on `queue` (0 when it does not exist yet).
    pub async fn depth(&self, queue: &str) -> u32 {
        self.declared(queue).await.unwrap_or(0)
    }

    /// How many consumers `queue` has (0 when it does not exist).
    pub async fn consumers(&self, queue: &str) -> u32 {
        self.passive(queue).await.map_or(0, |q| q.consumer_count())
    }

    /// How many messages wait on `queue`, `None` when it does not exist.
    async fn declared(&self, queue: &str) -> Option<u32> {
        self.passive(queue).await.map(|q| q.message_count())
    }

    /// `queue` as the broker has it, `None` when it does not exist.
    async fn passive(&self, queue: &str) -> Option<lapin::Queue> {
        // A passive declare of a missing queue closes its channel: one of its own.
        let channel = self._connection.create_channel().await.expect("a channel");
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .ok()
    }

    /// Waits until the jobs queue and its delay queue are empty (every message settled).
    pub async fn drained(&self, within: Duration) {
        let give_up = std::time::Instant::now() + within;
        let delay = format!("{}.delay", self.jobs);
        loop {
            let depths = (self.depth(&self.jobs).await, self.depth(&delay).await);
            if depths == (0, 0) {
                return;
            }
            assert!(
                std::time::Instant::now() < give_up,
                "messages left after {within:?} (jobs, delay): {depths:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The first record published for `job_id`, with those collected before it, within
    /// `within` (panics with what came otherwise).
    pub async fn result_of(&self, job_id: &str, within: Duration) -> (Value, Vec<Value>) {
        let records = self
            .results_until(within, |got| got.iter().any(|r| r["job_id"] == job_id))
            .await;
        let first = records
            .iter()
            .find(|r| r["job_id"] == job_id)
            .cloned()
            .expect("the job's record");
        (first, records)
    }

    /// Waits until a worker started with `--declare` has declared the jobs queue (a message
    /// published before would be dropped by the broker), then binds the collecting queue.
    pub async fn ready(&self) {
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        // A worker declares its queues, then its exchanges: the last of them, the log
        // exchange, says it is done.
        while self.declared(&self.jobs).await.is_none() || !self.exchange(&self.logs).await {
            assert!(
                std::time::Instant::now() < give_up,
                "no worker declared {} and {} within 60 s",
                self.jobs,
                self.logs
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.collect().await;
    }

    /// Whether `exchange` exists.
    async fn exchange(&self, exchange: &str) -> bool {
        // A passive declare of a missing exchange closes its channel: one of its own.
        let channel = self._connection.create_channel().await.expect("a channel");
        let options = lapin::options::ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            )
            .await
            .is_ok()
    }

    /// Records from the results exchange until `done` holds for those collected so far, or
    /// `within` passes (then panics with what came).
    pub async fn results_until(
        &self,
        within: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let mut consumer = self
            .channel
            .basic_consume(
                self.collected.as_str().into(),
                crate::aws::unique("collector").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + within;
        while !done(&got) {
            let next = tokio::time::timeout_at(deadline, consumer.next())
                .await
                .unwrap_or_else(|_| panic!("within {within:?}, only: {got:#?}"));
            let delivery = next.expect("the consumer").expect("a delivery");
            delivery
                .ack(BasicAckOptions::default())
                .await
                .expect("acked");
            got.push(serde_json::from_slice(&delivery.data).expect("a JSON record"));
        }
        let _ = self
            .channel
            .basic_cancel(
                consumer.tag(),
                lapin::options::BasicCancelOptions::default(),
            )
            .await;
        got
    }
}

/// A connection as the test user.
pub async fn connect() -> Connection {
    let [(_, user), (_, password)] = credentials();
    let mut uri: lapin::uri::AMQPUri = broker().parse().expect("an AMQP URI");
    uri.authority.userinfo.username = user;
    uri.authority.userinfo.password = password;
    Connection::connect_uri(uri, ConnectionProperties::default())
        .await
        .expect("the test broker answers")
}

/// A worker process (`terrace serve --queue amqp://…`), killed when the test ends however it
/// ends.
pub struct Worker(pub std::process::Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Worker {
    /// `terrace serve --queue NAMES --declare EXTRA` in `sb` with the test user's credentials;
    /// its stderr inherited with `TERRACE_TEST_VERBOSE`, else dropped.
    pub fn start(sb: &crate::Sandbox, names: &Names, extra: &[&str]) -> Self {
        let stderr = if std::env::var_os("TERRACE_TEST_VERBOSE").is_some() {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        };
        Self::spawn(sb, names, extra, stderr)
    }

    /// As [`Worker::start`], its stderr read into what the returned thread ends with (once the
    /// worker is dropped or stopped).
    pub fn heard(
        sb: &crate::Sandbox,
        names: &Names,
        extra: &[&str],
    ) -> (Self, std::thread::JoinHandle<String>) {
        let mut worker = Self::spawn(sb, names, extra, std::process::Stdio::piped());
        let stderr = worker.0.stderr.take().expect("a piped stderr");
        let verbose = std::env::var_os("TERRACE_TEST_VERBOSE").is_some();
        let said = std::thread::spawn(move || {
            let said = std::io::read_to_string(stderr).unwrap_or_default();
            if verbose {
                eprint!("{said}");
            }
            said
        });
        (worker, said)
    }

    fn spawn(
        sb: &crate::Sandbox,
        names: &Names,
        extra: &[&str],
        stderr: std::process::Stdio,
    ) -> Self {
        let mut cmd = sb.terrace();
        cmd.envs(credentials())
            .args(["serve", "--queue", &names.url(), "--declare"])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(stderr);
        Self(cmd.spawn().expect("terrace serve starts"))
    }

    /// Stops the worker as an operator does (SIGTERM): it takes no more messages and settles
    /// those in hand before it exits. A SIGKILL right after a result was published would leave
    /// that job's message unacknowledged, to be delivered again.
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.0.wait().unwrap();
        assert!(status.success(), "the worker ended {status}");
    }
}

/// A job message for the demo apply `id` on `acme/WORKSPACE`, its cluster named `cluster`.
pub fn message(id: &str, workspace: &str, cluster: &str) -> Value {
    serde_json::json!({
        "job": {
            "id": id, "tenant": "acme", "workspace": workspace, "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" },
            "variables": {
                "cluster_name": cluster, "region": "eu-west-1",
                "admin_password": "correct-horse-battery-staple",
            },
            "timeout": "5m",
        }
    })
}
