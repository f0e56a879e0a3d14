//! The child process that evaluates a plan's policies: the runner's own binary, started with
//! [`ARG`], reads a request on stdin and writes its answer on stdout. Its address space
//! and CPU time are limited before it starts, and it is killed at its deadline: whatever a
//! policy does, the runner gets an answer or a reason, in time.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

use super::{Bounds, PolicyError, PolicyFile, PolicySet, Verdicts, evaluate_here};

/// The first argument that makes a runner's binary evaluate policies instead.
pub const ARG: &str = "__terrace-policy-eval";

/// How long past its own deadline the child is given before it is killed: the interpreter
/// checks its time between steps, and one step (a builtin on a large value) may take a while.
const KILL_AFTER: Duration = Duration::from_secs(2);

#[derive(Serialize, Deserialize)]
struct Request {
    files: Vec<PolicyFile>,
    digest: String,
    /// The input, as JSON text.
    input: String,
    limit_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Verdicts(Verdicts),
    Time,
    Error(String),
}

/// First thing in a runner binary's `main`: when this process was started to evaluate
/// policies, does so and gives the exit code to return.
pub fn answer_if_asked() -> Option<ExitCode> {
    if std::env::args_os().nth(1).as_deref() != Some(std::ffi::OsStr::new(ARG)) {
        return None;
    }
    let mut raw = Vec::new();
    if std::io::stdin().read_to_end(&mut raw).is_err() {
        return Some(ExitCode::from(74));
    }
    let answer = match serde_json::from_slice::<Request>(&raw) {
        Ok(request) => {
            let limit = Duration::from_millis(request.limit_ms);
            match evaluate_here(&request.files, &request.digest, &request.input, limit) {
                Ok(verdicts) => Answer::Verdicts(verdicts),
                Err(PolicyError::Time { .. }) => Answer::Time,
                Err(e) => Answer::Error(e.to_string()),
            }
        }
        Err(e) => Answer::Error(format!("the request: {e}")),
    };
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &answer).is_ok() && out.flush().is_ok();
    Some(if written {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(74)
    })
}

/// Evaluates `set` on `input` in a child process of `binary`.
pub(super) async fn evaluate(
    binary: &Path,
    set: &PolicySet,
    input: &serde_json::Value,
    bounds: Bounds,
) -> Result<Verdicts, PolicyError> {
    let request = serde_json::to_vec(&Request {
        files: set.files.clone(),
        digest: set.digest.clone(),
        input: input.to_string(),
        limit_ms: bounds.time.as_millis() as u64,
    })
    .map_err(|e| PolicyError::Eval(e.to_string()))?;
    let mut cmd = tokio::process::Command::new(binary);
    cmd.arg(ARG)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    crate::run::terraform::confine(
        &mut cmd,
        crate::run::terraform::Limits {
            memory_bytes: Some(bounds.memory_bytes),
            cpu_seconds: Some(bounds.time.as_secs() + 1),
        },
    );
    let mut child = cmd.spawn().map_err(|e| {
        PolicyError::Eval(format!(
            "the evaluator ({}) did not start: {e}",
            binary.display()
        ))
    })?;
    let mut stdin = child.stdin.take().expect("piped");
    let write = async move {
        // A child that stops reading (it died) is told by its exit, below.
        let _ = stdin.write_all(&request).await;
    };
    let waited = tokio::time::timeout(bounds.time + KILL_AFTER, async {
        let ((), output) = tokio::join!(write, child.wait_with_output());
        output
    })
    .await;
    let output = match waited {
        // Dropped on the way out: `kill_on_drop` kills it.
        Err(_) => return Err(PolicyError::Time { limit: bounds.time }),
        Ok(output) => output.map_err(|e| PolicyError::Eval(e.to_string()))?,
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        use std::os::unix::process::ExitStatusExt as _;
        let signal = output.status.signal();
        // Rust aborts on a failed allocation (SIGABRT) with "memory allocation of … failed".
        if stderr.contains("memory allocation") || stderr.contains("out of memory") {
            return Err(PolicyError::Memory {
                limit_bytes: bounds.memory_bytes,
            });
        }
        if matches!(signal, Some(nix::libc::SIGXCPU | nix::libc::SIGKILL)) {
            return Err(PolicyError::Time { limit: bounds.time });
        }
        if signal == Some(nix::libc::SIGABRT) {
            return Err(PolicyError::Memory {
                limit_bytes: bounds.memory_bytes,
            });
        }
        let said = stderr.lines().last().unwrap_or_default();
        return Err(PolicyError::Eval(format!(
            "the evaluator stopped ({}){}",
            output.status,
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        )));
    }
    match serde_json::from_slice::<Answer>(&output.stdout) {
        Ok(Answer::Verdicts(verdicts)) => Ok(verdicts),
        Ok(Answer::Time) => Err(PolicyError::Time { limit: bounds.time }),
        Ok(Answer::Error(e)) => Err(PolicyError::Eval(e)),
        Err(e) => Err(PolicyError::Eval(format!(
            "the evaluator's answer: {e} ({} is a binary that answers {ARG}?)",
            binary.display()
        ))),
    }
}
