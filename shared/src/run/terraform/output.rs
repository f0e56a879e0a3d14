//! Terraform's output as the runner reads it: lines (each at most [`MAX_LINE`]) rendered into
//! the job's log as they come, what is captured bounded by [`MAX_CAPTURE`], and its error lines.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::run::logs::{Logger, Stream};
use crate::run::ui::Events;

/// Collects terraform's diagnostics from its output: each `Error: …` line with the line after
/// it (terraform's detail or the source location), box-drawing stripped, redacted.
#[derive(Debug, Default)]
pub struct ErrorLines {
    pub errors: Vec<String>,
    take_next: bool,
}

impl ErrorLines {
    /// Takes one line of output (without its newline).
    pub fn push(&mut self, line: &str, redactor: &crate::job::redact::Redactor) {
        let trimmed = line.trim_start_matches(['│', '╷', '╵', ' ']);
        if let Some(rest) = trimmed.strip_prefix("Error: ") {
            self.errors.push(redactor.redact(&format!("Error: {rest}")));
            self.take_next = true;
        } else if self.take_next && !trimmed.is_empty() {
            if let Some(last) = self.errors.last_mut() {
                last.push_str(" — ");
                last.push_str(&redactor.redact(trimmed));
            }
            self.take_next = false;
        }
    }
}

/// The errors and UI messages of a whole recorded output, gathered as [`super::run`] gathers them (for
/// fixtures of real terraform output).
pub fn read_output(text: &str) -> (Vec<String>, Events) {
    let mut lines = ErrorLines::default();
    let mut events = Events::default();
    let redactor = crate::job::redact::Redactor::default();
    for line in text.lines() {
        if events.take(line).is_none() {
            lines.push(line, &redactor);
        }
    }
    let mut errors: Vec<String> = events.errors().map(|d| d.render()).collect();
    errors.extend(lines.errors);
    (errors, events)
}

/// How a pump treats the lines it reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// Log each line as text.
    Log,
    /// Messages of the machine-readable UI: rendered, gathered, logged with the event.
    Ui,
    /// Keep the bytes (data for the runner, such as `show -json`), log nothing.
    Capture,
}

/// What a pump read from one stream.
#[derive(Default)]
pub(super) struct Pumped {
    pub(super) captured: Vec<u8>,
    pub(super) errors: Vec<String>,
    pub(super) events: Events,
}

/// The longest line of terraform's output the log keeps; the rest of a longer one is dropped,
/// and the line says how much.
pub const MAX_LINE: usize = 64 * 1024;

/// The most output a captured command (`show -json`, `output -json`) may print: its data beyond
/// it is dropped and the log says so (a plan's JSON is megabytes; this is a bound, not a size).
pub const MAX_CAPTURE: usize = 512 << 20;

/// Reads lines until EOF and logs, gathers or captures them per `mode`. Memory stays bounded
/// whatever terraform prints: a line is kept up to [`MAX_LINE`], a capture up to
/// [`MAX_CAPTURE`].
pub(super) async fn pump(
    reader: impl AsyncRead + Unpin,
    logger: Logger,
    stream: Stream,
    step: &'static str,
    mode: Read,
) -> Pumped {
    use tokio::io::AsyncReadExt;
    let mut reader = BufReader::new(reader);
    let mut pumped = Pumped::default();
    let mut errors = ErrorLines::default();
    let mut buf = Vec::new();
    let mut dropped = 0_u64;
    loop {
        buf.clear();
        let room = if mode == Read::Capture {
            MAX_CAPTURE.saturating_sub(pumped.captured.len())
        } else {
            MAX_LINE
        };
        // One byte more than there is room for says whether the line goes on.
        match (&mut reader)
            .take(room as u64 + 1)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let cut = if buf.len() > room && buf.last() != Some(&b'\n') {
            buf.truncate(room);
            skip_line(&mut reader).await + 1
        } else {
            0
        };
        if mode == Read::Capture {
            pumped.captured.extend_from_slice(&buf);
            dropped += cut;
            continue;
        }
        let text = String::from_utf8_lossy(&buf);
        let text = text.trim_end_matches(['\n', '\r']);
        if mode == Read::Ui
            && cut == 0
            && let Some((rendered, event)) = pumped.events.take(text)
        {
            logger.event(stream, step, &rendered, &event).await;
            continue;
        }
        errors.push(text, logger.redactor());
        if cut == 0 {
            logger.line(stream, step, text).await;
        } else {
            let kept = format!("{text} … [{cut} more bytes of this line not kept]");
            logger.line(stream, step, &kept).await;
        }
    }
    if dropped > 0 {
        let said = format!(
            "terraform {step} printed more than {MAX_CAPTURE} bytes: the {dropped} bytes after them were not kept"
        );
        logger.runner(step, &said).await;
    }
    pumped.errors = errors.errors;
    pumped
}

/// Reads and drops the rest of a line (through its newline): how many bytes.
async fn skip_line(reader: &mut (impl AsyncBufReadExt + Unpin)) -> u64 {
    let mut skipped = 0_u64;
    loop {
        let (used, done) = match reader.fill_buf().await {
            Ok([]) | Err(_) => return skipped,
            Ok(data) => match data.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (data.len(), false),
            },
        };
        reader.consume(used);
        skipped += used as u64;
        if done {
            // The newline is the line's end, not one of its bytes.
            return skipped - 1;
        }
    }
}
