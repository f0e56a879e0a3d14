//! The child process that evaluates a plan's policies: the runner's own binary, started with
//! [`ARG`], reads a request on stdin and writes its answer on stdout. Its address space
//! and CPU time are limited before it starts, and it is killed at its deadline: whatever a
//! policy does, the runner gets an answer or a reason, in time.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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
    /// A rule's own error.
    Error(String),
    /// The evaluator's (an input it could not read).
    Broken(String),
}

/// The most of the child's answer, and of what it says on stderr, the runner reads: whatever
/// a policy makes, the runner's memory is not its to fill.
const MAX_ANSWER: u64 = 16 << 20;
const MAX_STDERR: u64 = 64 << 10;

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
                Err(PolicyError::Eval(e)) => Answer::Error(e),
                Err(PolicyError::Evaluator(e)) => Answer::Broken(e),
                Err(e) => Answer::Error(e.to_string()),
            }
        }
        Err(e) => Answer::Broken(format!("the request: {e}")),
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
    .map_err(|e| PolicyError::Evaluator(e.to_string()))?;
    let mut cmd = tokio::process::Command::new(binary);
    cmd.arg(ARG)
        .env_clear()
        .current_dir(std::env::temp_dir())
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
    no_core_dumps(&mut cmd);
    let started = std::time::Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| PolicyError::Evaluator(format!("{} did not start: {e}", binary.display())))?;
    let (mut stdin, stdout, stderr) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let write = async move {
        // A child that stops reading (it died) is told by its exit, below.
        let _ = stdin.write_all(&request).await;
    };
    let read = |from: Box<dyn tokio::io::AsyncRead + Unpin + Send>, cap: u64| async move {
        let mut got = Vec::new();
        let _ = from.take(cap + 1).read_to_end(&mut got).await;
        got
    };
    let waited = tokio::time::timeout(bounds.time + KILL_AFTER, async {
        let ((), answer, said, status) = tokio::join!(
            write,
            read(Box::new(stdout), MAX_ANSWER),
            read(Box::new(stderr), MAX_STDERR),
            child.wait()
        );
        (answer, said, status)
    })
    .await;
    let (answer, said, status) = match waited {
        // Dropped on the way out: `kill_on_drop` kills it.
        Err(_) => return Err(PolicyError::Time { limit: bounds.time }),
        Ok((answer, said, status)) => (
            answer,
            said,
            status.map_err(|e| PolicyError::Evaluator(e.to_string()))?,
        ),
    };
    if answer.len() as u64 > MAX_ANSWER {
        return Err(PolicyError::Eval(format!(
            "the verdicts are over {} MiB",
            MAX_ANSWER >> 20
        )));
    }
    let said = String::from_utf8_lossy(&said);
    if !status.success() {
        use std::os::unix::process::ExitStatusExt as _;
        let signal = status.signal();
        // Rust aborts on a failed allocation with "memory allocation of … failed".
        if said.contains("memory allocation of") {
            return Err(PolicyError::Memory {
                limit_bytes: bounds.memory_bytes,
            });
        }
        // Its CPU time (SIGXCPU, then SIGKILL at the hard limit) or its deadline: the time
        // bound, only once that much time went by (another's SIGKILL is not ours to explain).
        if matches!(signal, Some(nix::libc::SIGXCPU | nix::libc::SIGKILL))
            && started.elapsed() >= bounds.time
        {
            return Err(PolicyError::Time { limit: bounds.time });
        }
        let line = said
            .lines()
            .find(|l| l.contains("panicked at") || l.contains("overflowed its stack"))
            .or_else(|| said.lines().rfind(|l| !l.trim().is_empty()))
            .unwrap_or_default();
        return Err(PolicyError::Evaluator(format!(
            "the evaluator stopped ({status}){}",
            if line.is_empty() {
                String::new()
            } else {
                format!(": {line}")
            }
        )));
    }
    match serde_json::from_slice::<Answer>(&answer) {
        Ok(Answer::Verdicts(verdicts)) => Ok(verdicts),
        Ok(Answer::Time) => Err(PolicyError::Time { limit: bounds.time }),
        Ok(Answer::Error(e)) => Err(PolicyError::Eval(e)),
        Ok(Answer::Broken(e)) => Err(PolicyError::Evaluator(e)),
        Err(e) => Err(PolicyError::Evaluator(format!(
            "its answer: {e} (is {} a runner binary that answers {ARG}?)",
            binary.display()
        ))),
    }
}

/// No core dump of the child (SIGXCPU and SIGABRT would write one, holding the plan).
#[allow(unsafe_code)]
fn no_core_dumps(cmd: &mut tokio::process::Command) {
    use nix::sys::resource::{Resource, setrlimit};
    // SAFETY: the closure runs in the forked child before exec and only makes one system call
    // (setrlimit), which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            setrlimit(Resource::RLIMIT_CORE, 0, 0)
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
        });
    }
}
