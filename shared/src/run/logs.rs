//! The log of a job as a typed stream: every line of terraform's stdout and stderr, and the
//! runner's own messages, becomes a [`LogLine`], is redacted once, and flows over a bounded
//! channel to small [`LogSink`]s (the console, the store). A slow sink slows terraform down
//! (back-pressure through its pipes) rather than growing memory.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use state_backends::{StateStore, WorkspaceId};
use time::OffsetDateTime;
use tokio::sync::mpsc;

use crate::job::redact::Redactor;

/// Where a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
    /// The runner's own messages: steps, retries, results.
    Runner,
}

/// One line of a job's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LogLine {
    pub seq: u64,
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(schema_with = "crate::job::schema::date_time")]
    pub ts: OffsetDateTime,
    pub stream: Stream,
    /// The step the line belongs to (`init`, `plan`, …), empty outside a step.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub step: String,
    /// The line as a person reads it (rendered from `event` where there is one).
    pub text: String,
    /// The structured message behind the line: one of terraform's machine-readable UI
    /// (`-json`), redacted like the text, for a platform to show progress without parsing text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<serde_json::Value>,
}

/// A destination of log lines.
#[async_trait::async_trait]
pub trait LogSink: Send {
    /// Takes one line. May buffer.
    async fn write(&mut self, line: &LogLine);
    /// Makes everything written so far durable.
    async fn flush(&mut self);
}

/// Opens one more sink for each job's log: a trigger's live stream of it (the stored log stays
/// the record). Such a sink must not hold the pump up: one that cannot keep up drops lines.
pub trait LogTap: Send + Sync + std::fmt::Debug {
    fn open(&self, ws: &state_backends::WorkspaceId, job_id: &str) -> Box<dyn LogSink>;
}

/// What flows to the pump: a line, or a mark to answer once every line before it is handled.
#[derive(Debug)]
enum Msg {
    Line(LogLine),
    Mark(tokio::sync::oneshot::Sender<()>),
}

/// The sending side of a job's log; cheap to clone.
#[derive(Clone, Debug)]
pub struct Logger {
    tx: mpsc::Sender<Msg>,
    seq: Arc<AtomicU64>,
    redactor: Arc<Redactor>,
}

impl Logger {
    /// Redacts `text` and sends it. Waits when the sinks are behind.
    pub async fn line(&self, stream: Stream, step: &str, text: &str) {
        self.send(stream, step, text, None).await;
    }

    /// Redacts a line rendered from a structured `event`, and the event, and sends both.
    pub async fn event(&self, stream: Stream, step: &str, text: &str, event: &serde_json::Value) {
        let event = self.redactor.redact_json(event);
        self.send(stream, step, text, Some(event)).await;
    }

    async fn send(&self, stream: Stream, step: &str, text: &str, event: Option<serde_json::Value>) {
        let line = LogLine {
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            ts: OffsetDateTime::now_utc(),
            stream,
            step: step.to_owned(),
            text: self.redactor.redact(text),
            event,
        };
        // The pump only stops after every logger is dropped; a closed channel is a shutdown.
        let _ = self.tx.send(Msg::Line(line)).await;
    }

    /// Waits until the pump has handed every line sent before this call to every sink, so a
    /// line a sink stores at once ([`StoreSink`]: a create that starts, a change that errs)
    /// is stored, or its store call has failed. The state server waits for this before it
    /// writes a state: the evidence of a create always lands before the state that follows
    /// it. Returns at once when the pump has stopped.
    pub async fn caught_up(&self) {
        let (done, handled) = tokio::sync::oneshot::channel();
        if self.tx.send(Msg::Mark(done)).await.is_ok() {
            let _ = handled.await;
        }
    }

    /// A message of the runner itself.
    pub async fn runner(&self, step: &str, text: &str) {
        self.line(Stream::Runner, step, text).await;
    }

    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }
}

/// The running pump of a job's log.
#[derive(Debug)]
pub struct Pump {
    task: tokio::task::JoinHandle<()>,
    close: tokio_util::sync::CancellationToken,
}

impl Pump {
    /// Writes every line sent so far, flushes every sink and stops. Lines sent afterwards (by
    /// loggers still alive elsewhere) are dropped.
    pub async fn finish(self) {
        self.close.cancel();
        let _ = self.task.await;
    }
}

/// Starts the pump that feeds `sinks`; returns the logger and the pump. The pump ends, after
/// flushing every sink, on [`Pump::finish`] or when the last clone of the logger is dropped.
pub fn start(redactor: Redactor, mut sinks: Vec<Box<dyn LogSink>>) -> (Logger, Pump) {
    let (tx, mut rx) = mpsc::channel::<Msg>(1024);
    let close = tokio_util::sync::CancellationToken::new();
    let closed = close.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                msg = rx.recv() => {
                    let Some(msg) = msg else { break };
                    handle(&mut sinks, msg).await;
                }
                _ = tick.tick() => {
                    for sink in &mut sinks {
                        sink.flush().await;
                    }
                }
                () = closed.cancelled() => {
                    while let Ok(msg) = rx.try_recv() {
                        handle(&mut sinks, msg).await;
                    }
                    break;
                }
            }
        }
        for sink in &mut sinks {
            sink.flush().await;
        }
    });
    let logger = Logger {
        tx,
        seq: Arc::new(AtomicU64::new(0)),
        redactor: Arc::new(redactor),
    };
    (logger, Pump { task, close })
}

async fn handle(sinks: &mut [Box<dyn LogSink>], msg: Msg) {
    match msg {
        Msg::Line(line) => {
            for sink in sinks {
                sink.write(&line).await;
            }
        }
        Msg::Mark(done) => {
            let _ = done.send(());
        }
    }
}

/// Prints lines to the process's stderr, prefixed with the job id.
#[derive(Debug)]
pub struct ConsoleSink {
    prefix: String,
}

impl ConsoleSink {
    pub fn new(job_id: &str) -> Self {
        Self {
            prefix: format!("[{job_id}]"),
        }
    }
}

/// A line as a person reads it: `==>` before the runner's own, ` ! ` before terraform's
/// stderr, the text (progress events already rendered).
pub fn render(line: &LogLine) -> String {
    let marker = match line.stream {
        Stream::Runner => "==>",
        Stream::Stdout => "   ",
        Stream::Stderr => " ! ",
    };
    format!("{marker} {}", line.text)
}

#[async_trait::async_trait]
impl LogSink for ConsoleSink {
    async fn write(&mut self, line: &LogLine) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{} {}", self.prefix, render(line));
    }

    async fn flush(&mut self) {}
}

/// Writes lines as NDJSON chunks `runs/<job-id>/log/<n>.ndjson` into the store, one chunk per
/// flush (every second while lines arrive, and at the end). Object stores have no append, and
/// rewriting one growing object would cost O(n²); chunks keep each flush O(new lines).
#[derive(Debug)]
pub struct StoreSink {
    store: Arc<dyn StateStore>,
    ws: WorkspaceId,
    job_id: String,
    fence: u64,
    buf: Vec<u8>,
    chunk: u64,
}

impl StoreSink {
    /// A sink for the attempt of `job_id` holding the lease with `fence`.
    pub fn new(store: Arc<dyn StateStore>, ws: WorkspaceId, job_id: &str, fence: u64) -> Self {
        Self {
            store,
            ws,
            job_id: job_id.to_owned(),
            fence,
            buf: Vec::new(),
            chunk: 0,
        }
    }
}

/// The artifact name of log chunk `n` of the attempt with lease `fence`: attempts sort in the
/// order they held the workspace, chunks in the order they were written.
pub fn chunk_name(fence: u64, n: u64) -> String {
    format!("{}{n:06}.ndjson", chunk_prefix(fence))
}

/// What the names of every log chunk of the attempt with lease `fence` start with.
pub fn chunk_prefix(fence: u64) -> String {
    format!("log/{fence:010}-")
}

#[async_trait::async_trait]
impl LogSink for StoreSink {
    async fn write(&mut self, line: &LogLine) {
        serde_json::to_writer(&mut self.buf, line).expect("log lines serialize");
        self.buf.push(b'\n');
        // A create that starts, or a change that errs, is stored at once: if the runner dies
        // before terraform saves the object, these lines are the next run's evidence of what
        // this workspace may have made (`recover`), and of what it did not.
        let creating = line.event.as_ref().is_some_and(|e| {
            (e["type"] == "apply_start" && e["hook"]["action"] == "create")
                || e["type"] == "apply_errored"
        });
        if creating || self.buf.len() >= 256 * 1024 {
            self.flush().await;
        }
    }

    async fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        self.chunk += 1;
        let data = Bytes::from(std::mem::take(&mut self.buf));
        if let Err(e) = self
            .store
            .put_artifact(
                &self.ws,
                &self.job_id,
                &chunk_name(self.fence, self.chunk),
                data,
            )
            .await
        {
            // The console still has the lines; the run goes on without its durable log.
            tracing::warn!(error = %e, job_id = %self.job_id, "could not store a log chunk");
        }
    }
}

/// Why a job's log cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadLogError {
    #[error(transparent)]
    Store(#[from] state_backends::StoreError),
    #[error("log chunk {name} is not NDJSON: {source}")]
    Chunk {
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads a run's whole log back from the store, in order.
///
/// # Errors
/// Store failures, or a chunk that is not NDJSON.
pub async fn read_log(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
) -> Result<Vec<LogLine>, ReadLogError> {
    read_chunks(store, ws, job_id, |_| true).await
}

/// Reads the chunks of a run's log whose names `wanted` accepts, in order.
///
/// # Errors
/// Store failures, or a chunk that is not NDJSON.
pub async fn read_chunks(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
    wanted: impl Fn(&str) -> bool + Send,
) -> Result<Vec<LogLine>, ReadLogError> {
    let mut lines = Vec::new();
    for name in store.artifacts(ws, job_id).await? {
        if !is_chunk(&name) || !wanted(&name) {
            continue;
        }
        let Some(chunk) = store.artifact(ws, job_id, &name).await? else {
            continue;
        };
        lines.extend(parse_chunk(&name, &chunk)?);
    }
    Ok(lines)
}

/// Whether a run's artifact `name` is a chunk of its log.
pub fn is_chunk(name: &str) -> bool {
    name.starts_with("log/")
}

/// The lines of the log chunk `name`.
///
/// # Errors
/// A line that is not a [`LogLine`].
pub fn parse_chunk(name: &str, chunk: &[u8]) -> Result<Vec<LogLine>, ReadLogError> {
    chunk
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|raw| {
            serde_json::from_slice(raw).map_err(|source| ReadLogError::Chunk {
                name: name.to_owned(),
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use state_backends::memory::MemoryStore;

    use super::*;

    #[tokio::test]
    async fn lines_are_redacted_numbered_and_stored_in_order() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
        let ws = WorkspaceId::new("t", "w").unwrap();
        let sink = StoreSink::new(store.clone(), ws.clone(), "job", 7);
        let (logger, pump) = start(Redactor::new(["s3cr3t".to_owned()]), vec![Box::new(sink)]);
        for i in 0..3000 {
            logger
                .line(Stream::Stdout, "plan", &format!("line {i} s3cr3t"))
                .await;
        }
        let _still_alive = logger.clone();
        drop(logger);
        // A logger clone held elsewhere (the lease watchdog) must not keep the pump alive.
        pump.finish().await;
        let lines = read_log(&*store, &ws, "job").await.unwrap();
        assert_eq!(lines.len(), 3000);
        assert!(lines.iter().enumerate().all(|(i, l)| l.seq == i as u64 + 1));
        assert_eq!(lines[7].text, "line 7 (sensitive value)");
        // ~330 KB of NDJSON: more than one 256 KiB chunk, read back in order above.
        assert!(store.artifacts(&ws, "job").await.unwrap().len() >= 2);
    }

    /// A sink that takes a line only when the test lets it.
    struct Gated {
        gate: Arc<tokio::sync::Semaphore>,
        taken: Arc<std::sync::Mutex<Vec<String>>>,
    }

    #[async_trait::async_trait]
    impl LogSink for Gated {
        async fn write(&mut self, line: &LogLine) {
            self.gate.acquire().await.unwrap().forget();
            self.taken.lock().unwrap().push(line.text.clone());
        }
        async fn flush(&mut self) {}
    }

    #[tokio::test]
    async fn caught_up_waits_until_every_line_sent_before_is_taken() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let taken = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Gated {
            gate: gate.clone(),
            taken: taken.clone(),
        };
        let (logger, pump) = start(Redactor::new(Vec::<String>::new()), vec![Box::new(sink)]);
        logger.runner("apply", "one").await;
        logger.runner("apply", "two").await;
        let waiter = logger.clone();
        let mut caught_up = tokio::spawn(async move { waiter.caught_up().await });
        let early = tokio::time::timeout(Duration::from_millis(200), &mut caught_up).await;
        assert!(early.is_err(), "caught up before the sink took a line");
        gate.add_permits(1);
        let early = tokio::time::timeout(Duration::from_millis(200), &mut caught_up).await;
        assert!(early.is_err(), "caught up with a line still waiting");
        gate.add_permits(1);
        caught_up.await.unwrap();
        assert_eq!(*taken.lock().unwrap(), ["one", "two"]);
        // A stopped pump answers at once.
        pump.finish().await;
        logger.caught_up().await;
    }
}
