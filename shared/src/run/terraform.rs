//! Running the terraform (or OpenTofu) binary: one [`Command`] at a time, in the job's workdir,
//! with a scrubbed environment, in its own process group, its output streamed line by line.
//! Every command puts its options before its positional arguments (Terraform 1.x stops reading
//! options at the first positional). `plan` and `apply` speak the machine-readable UI (`-json`):
//! their messages are rendered into the log and gathered in [`Outcome::events`] (see
//! [`crate::run::ui`]).
//!
//! # Cancellation
//! When the job's token fires, terraform gets SIGINT (it then stops cleanly, persists its state
//! through the backend and releases its lock); after the grace period the whole process group
//! (terraform and its provider plugins) gets SIGKILL. Both pipes are drained before `wait()`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio_util::sync::CancellationToken;

use crate::run::leftovers::{self, Leftovers, Survivors};
use crate::run::logs::{Logger, Stream};
use crate::run::ui::Events;

/// The saved plan's file name in the workdir.
pub const PLAN_FILE: &str = "terrace.tfplan";

/// How to run terraform on this machine.
#[derive(Clone, Debug)]
pub struct TerraformConfig {
    /// `terraform`, `tofu`, or a path to either.
    pub binary: PathBuf,
    /// A plugin cache shared by jobs (`TF_PLUGIN_CACHE_DIR`).
    pub plugin_cache: Option<PathBuf>,
    /// A CLI configuration file (`TF_CLI_CONFIG_FILE`), e.g. for a provider mirror.
    pub cli_config: Option<PathBuf>,
    /// Names of variables of the runner's environment that terraform may see (its provider
    /// credentials, e.g. `AWS_PROFILE`); nothing else is inherited.
    pub pass_env: Vec<String>,
    /// Variables set for terraform by the runner itself, such as the provider credentials a
    /// function obtained for the customer's account. Their values are treated as secrets:
    /// redacted from every log line. Variables that change terraform's own behaviour
    /// (`TF_LOG`, `TF_CLI_ARGS`, …) are refused here too.
    pub env: Vec<(String, String)>,
    /// Variables set for terraform by the runner that are not secret (a config file's path, a
    /// region): not redacted, and filtered like [`TerraformConfig::env`].
    pub settings: Vec<(String, String)>,
    /// Secrets terraform may come to see that are not in its environment (the keys of a
    /// session its credential process hands out), masked from the job's log as they appear.
    pub late_secrets: crate::job::redact::LateSecrets,
    /// How long terraform has to stop after SIGINT before the process group is killed.
    pub grace: Duration,
    /// The user terraform runs as, when not the runner's own: a runner running as root runs
    /// terraform (and every provider and provisioner) as an unprivileged user, which cannot
    /// read the runner's memory, environment or files.
    pub user: Option<RunAs>,
    /// Each job takes a user of its own ([`JobUser`]) and sets [`TerraformConfig::user`] to it:
    /// what a cloud function running as root does, so jobs side by side cannot reach each
    /// other, and whatever a job leaves running is killed when it ends.
    pub per_job_users: bool,
    /// When jobs share a user (the runner's own, or the one `TERRACE_TERRAFORM_USER` names):
    /// whether they run one at a time, with what each leaves running killed before the next
    /// ([`JobUser::take_turn`]). The binaries turn it on; off, jobs run side by side unguarded
    /// (the library's own tests, and programs that embed the runner).
    pub shared_user: SharedUser,
    /// What each process of a job may use (terraform, its providers, their provisioners).
    pub limits: Limits,
    /// The job's user while it holds one: shared by every copy of this configuration (the
    /// runner's task under the lease included), so it is given back only once the last of them
    /// is done, even when whoever started the job stopped waiting for it.
    pub job_user: Option<std::sync::Arc<JobUser>>,
}

/// What each process of a job may use, set as resource limits (`setrlimit`) on terraform before
/// it starts, and so inherited by its providers and provisioners: a job that allocates without
/// bound fails (`resource-limit`) rather than taking the runner and the jobs beside it down.
/// Per process, not per job: a job may start several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Address space, bytes (`RLIMIT_AS`).
    pub memory_bytes: Option<u64>,
    /// CPU time, seconds (`RLIMIT_CPU`): past it the process gets SIGXCPU.
    pub cpu_seconds: Option<u64>,
}

impl Default for Limits {
    /// 8 GiB of address space (terraform and each provider reserve about 1 GiB at start) and an
    /// hour of CPU time per process.
    fn default() -> Self {
        Self {
            memory_bytes: Some(8 << 30),
            cpu_seconds: Some(3600),
        }
    }
}

/// What a runner does between jobs that share a user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SharedUser {
    /// Nothing: jobs run side by side, and what one leaves may meet the next.
    #[default]
    Unguarded,
    /// One job at a time; what a job leaves is killed before the next starts. `sole_user`:
    /// nothing but the runner runs as its uid on this machine (a cloud function's sandbox when
    /// it is not root, as on Lambda), so every other process of that uid is a job's leftover;
    /// otherwise the runner's descendants are.
    OneAtATime { sole_user: bool },
}

/// The users jobs take, one each at a time: `FIRST_JOB_UID` and the next `JOB_USERS - 1`,
/// each with a group of the same number. (Within 65536, so they exist in a container's user
/// namespace too.)
pub const FIRST_JOB_UID: u32 = 61000;
pub const JOB_USERS: usize = 64;

/// The user a job's terraform runs as, held for as long as the job runs: what it leaves
/// running is killed when it is given back, and again before the next job may take it (see
/// [`crate::run::leftovers`]). Either a user of the job's own, from the [`FIRST_JOB_UID`] range
/// ([`JobUser::claim`], the runner is root), or this runner's one turn for a user every job
/// shares ([`JobUser::take_turn`]: the runner's own, or `TERRACE_TERRAFORM_USER`'s), since
/// jobs of one user cannot be kept apart while they run side by side.
#[derive(Debug)]
pub struct JobUser {
    /// `None`: the runner's own user.
    pub run_as: Option<RunAs>,
    leftovers: Leftovers,
    _held: Held,
}

/// What keeps a [`JobUser`] to one job.
#[derive(Debug)]
enum Held {
    /// A user of the job's own: a lock file per user, in the temp folder, machine-wide (several
    /// runners may share a machine), which the kernel frees if the runner dies.
    Lock(#[allow(dead_code, reason = "held for its lock, never read")] std::fs::File),
    /// A shared user: the runner's turn, one job at a time.
    Turn(
        #[allow(dead_code, reason = "held for its turn, never read")]
        tokio::sync::OwnedMutexGuard<()>,
    ),
}

/// The one turn of this process's jobs that share a user.
static TURN: std::sync::LazyLock<std::sync::Arc<tokio::sync::Mutex<()>>> =
    std::sync::LazyLock::new(Default::default);

impl JobUser {
    /// A free user of the job's own, or `None` when [`JOB_USERS`] jobs run on this machine
    /// already. A user whose leftovers (a dead runner's job's) cannot all be killed is passed
    /// over.
    ///
    /// # Errors
    /// When the users' lock folder cannot be made.
    pub fn claim() -> std::io::Result<Option<Self>> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join("terrace-job-users");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        for slot in 0..JOB_USERS {
            let id = FIRST_JOB_UID + u32::try_from(slot).unwrap_or(0);
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(format!("{id}.lock")))?;
            if lock.try_lock().is_err() {
                continue;
            }
            let leftovers = Leftovers::User(id);
            if let Err(e) = leftovers::kill_all(leftovers, leftovers::WAIT) {
                tracing::error!(uid = id, error = %e, "a job's user is passed over");
                continue;
            }
            return Ok(Some(Self {
                run_as: Some(RunAs { uid: id, gid: id }),
                leftovers,
                _held: Held::Lock(lock),
            }));
        }
        Ok(None)
    }

    /// This runner's turn to run a job as `user` (`None`: its own), which every job shares:
    /// waits for the job before to be done, then kills what it left. `sole_user`: nothing but
    /// the runner runs as its own uid here, so every other process of that uid is a leftover.
    ///
    /// # Errors
    /// [`Survivors`] when what the job before left cannot all be killed: no job may run then.
    pub async fn take_turn(user: Option<RunAs>, sole_user: bool) -> Result<Self, Survivors> {
        let turn = TURN.clone().lock_owned().await;
        let leftovers = match user {
            Some(user) => Leftovers::User(user.uid),
            None => Leftovers::Mine {
                whole_uid: sole_user,
            },
        };
        // Walked here, as `claim` and the drop do: a /proc walk, blocking only while something
        // is still dying.
        leftovers::kill_all(leftovers, leftovers::WAIT)?;
        Ok(Self {
            run_as: user,
            leftovers,
            _held: Held::Turn(turn),
        })
    }
}

impl Drop for JobUser {
    fn drop(&mut self) {
        // The user (or the turn) goes with `self` after this; the next taker kills again, and
        // runs nothing while anything survives.
        let whose = match self.run_as {
            Some(user) => format!("uid {}", user.uid),
            None => "the runner's user".to_owned(),
        };
        match leftovers::kill_all(self.leftovers, leftovers::WAIT) {
            Ok(0) => {}
            Ok(n) => tracing::info!("killed {n} process(es) the job left running as {whose}"),
            Err(e) => tracing::error!(error = %e, "the job left processes running as {whose}"),
        }
    }
}

/// An unprivileged user and group terraform runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    /// `nobody:nogroup` on Debian and most images.
    pub const NOBODY: RunAs = RunAs {
        uid: 65534,
        gid: 65534,
    };

    /// Gives `path`, and everything under it, to this user (symbolic links themselves, never
    /// what they point to), except the names in `keep`.
    ///
    /// # Errors
    /// The first file that cannot be given.
    pub fn give(self, path: &Path, keep: &[&str]) -> std::io::Result<()> {
        // Deepest first: a folder stays the runner's (and closed to the user) until everything
        // in it is given, so the user cannot swap an entry for a link while it is walked.
        if std::fs::symlink_metadata(path)?.is_dir() {
            for entry in std::fs::read_dir(path)? {
                let entry = entry?;
                if keep.iter().any(|k| entry.file_name() == *k) {
                    continue;
                }
                self.give(&entry.path(), &[])?;
            }
        }
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))
    }
}

impl TerraformConfig {
    /// Makes `path` (and everything under it) terraform's, when terraform runs as a user of
    /// its own; `keep`: names directly under `path` that stay the runner's.
    ///
    /// # Errors
    /// The first file that cannot be given.
    pub fn give(&self, path: &Path, keep: &[&str]) -> std::io::Result<()> {
        match self.user {
            Some(user) => user.give(path, keep),
            None => Ok(()),
        }
    }
}

impl Default for TerraformConfig {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("terraform"),
            plugin_cache: None,
            cli_config: None,
            pass_env: Vec::new(),
            env: Vec::new(),
            settings: Vec::new(),
            late_secrets: crate::job::redact::LateSecrets::default(),
            grace: Duration::from_secs(30),
            user: None,
            per_job_users: false,
            shared_user: SharedUser::Unguarded,
            limits: Limits::default(),
            job_user: None,
        }
    }
}

/// How long the output of a finished terraform is still read.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Variables that change how terraform itself behaves; never passed through from the runner.
const NEVER_PASS: [&str; 8] = [
    "TF_LOG",
    "TF_CLI_ARGS",
    "TF_WORKSPACE",
    "TF_DATA_DIR",
    "TF_CLI_CONFIG_FILE",
    "TF_PLUGIN_CACHE_DIR",
    "TF_IN_AUTOMATION",
    "HOME",
];

/// Whether `name` may be passed through (`TF_LOG_PATH`, `TF_CLI_ARGS_plan` are refused too).
fn may_pass(name: &str) -> bool {
    !NEVER_PASS.iter().any(|never| name.starts_with(never))
}

/// The variables of the runner's environment terraform always inherits (not credentials).
const BASE_ENV: [&str; 6] = ["PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "SSL_CERT_FILE"];

/// What a plan plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanMode {
    /// Make the infrastructure match the configuration.
    Normal,
    /// Destroy everything in the state (`-destroy`).
    Destroy,
    /// Only bring the state up to date with the infrastructure (`-refresh-only`): what changed
    /// outside terraform.
    RefreshOnly,
}

/// A terraform subcommand, with the flags Terrace always uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Init {
        backend_config: PathBuf,
    },
    Plan {
        mode: PlanMode,
        detailed_exitcode: bool,
        /// Resource addresses to limit the plan to (`-target`); empty for all.
        targets: Vec<String>,
    },
    ShowPlan,
    Apply,
    Output,
    /// Brings an existing object into the state.
    Import {
        address: String,
        id: String,
    },
}

impl Command {
    /// The step name used in logs and results.
    pub fn step(&self) -> &'static str {
        match self {
            Command::Init { .. } => "init",
            Command::Plan { .. } => "plan",
            Command::ShowPlan => "show",
            Command::Apply => "apply",
            Command::Output => "output",
            Command::Import { .. } => "import",
        }
    }

    /// The subcommand (named like its step), its options, then its positional arguments.
    fn args(&self) -> Vec<String> {
        let mut args = vec![self.step().to_owned()];
        if self.json_ui() || matches!(self, Command::ShowPlan | Command::Output) {
            args.push("-json".into());
        }
        if !matches!(self, Command::ShowPlan | Command::Output) {
            args.push("-input=false".into());
        }
        args.push("-no-color".into());
        let positional = match self {
            Command::Init { backend_config } => {
                args.push(format!("-backend-config={}", backend_config.display()));
                args.push("-reconfigure".into());
                vec![]
            }
            Command::Plan {
                mode,
                detailed_exitcode,
                targets,
            } => {
                args.push(format!("-out={PLAN_FILE}"));
                args.extend(targets.iter().map(|t| format!("-target={t}")));
                match mode {
                    PlanMode::Normal => {}
                    PlanMode::Destroy => args.push("-destroy".into()),
                    PlanMode::RefreshOnly => args.push("-refresh-only".into()),
                }
                if *detailed_exitcode {
                    args.push("-detailed-exitcode".into());
                }
                vec![]
            }
            Command::ShowPlan | Command::Apply => vec![PLAN_FILE.to_owned()],
            Command::Output => vec![],
            Command::Import { address, id } => vec![address.clone(), id.clone()],
        };
        args.extend(positional);
        args
    }

    /// Whether the command prints terraform's machine-readable UI on stdout.
    pub fn json_ui(&self) -> bool {
        matches!(self, Command::Plan { .. } | Command::Apply)
    }

    /// Whether stdout is data for the runner (JSON) rather than log lines.
    fn captures_stdout(&self) -> bool {
        matches!(self, Command::ShowPlan | Command::Output)
    }
}

/// Why a command did not run to its own end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupted {
    /// Stopped within the grace period after SIGINT.
    Gracefully,
    /// Killed with SIGKILL after the grace period.
    Killed,
}

/// How a command ended.
#[derive(Debug)]
pub struct Outcome {
    /// The exit code, `None` when killed by a signal.
    pub exit_code: Option<i32>,
    /// stdout, for commands whose output is data.
    pub stdout: Vec<u8>,
    /// Terraform's errors, one line each: the error diagnostics of a `-json` command, and the
    /// `Error:` lines of plain output (with the line after).
    pub errors: Vec<String>,
    /// What a `-json` command's messages said (empty for the others).
    pub events: Events,
    pub interrupted: Option<Interrupted>,
    pub duration: Duration,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && self.interrupted.is_none()
    }
}

/// Why terraform could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start {binary}: {source}")]
pub struct SpawnError {
    pub binary: String,
    #[source]
    pub source: std::io::Error,
}

/// Runs `command` in `workdir`, streaming its output to `logger`, until it ends or `cancel`
/// fires (then SIGINT, grace, SIGKILL).
///
/// # Errors
/// [`SpawnError`] when the binary cannot be started.
pub async fn run(
    config: &TerraformConfig,
    workdir: &Path,
    command: &Command,
    logger: &Logger,
    cancel: &CancellationToken,
) -> Result<Outcome, SpawnError> {
    let step = command.step();
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(&config.binary);
    cmd.args(command.args())
        .current_dir(workdir)
        .env_clear()
        .envs(environment(config, workdir))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(user) = config.user {
        // Set in the child before exec; std drops the supplementary groups too, as root.
        cmd.uid(user.uid).gid(user.gid);
    }
    confine(&mut cmd, config.limits);
    let mut child = cmd.spawn().map_err(|source| SpawnError {
        binary: config.binary.display().to_string(),
        source,
    })?;
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);

    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let stdout_mode = if command.captures_stdout() {
        Read::Capture
    } else if command.json_ui() {
        Read::Ui
    } else {
        Read::Log
    };
    let out_task = tokio::spawn(pump(
        stdout,
        logger.clone(),
        Stream::Stdout,
        step,
        stdout_mode,
    ));
    let err_task = tokio::spawn(pump(
        stderr,
        logger.clone(),
        Stream::Stderr,
        step,
        Read::Log,
    ));

    let mut interrupted = None;
    let status = tokio::select! {
        status = child.wait() => status,
        () = cancel.cancelled() => {
            // Signal first: logging may wait on a slow sink.
            signal(pgid, Signal::SIGINT);
            logger.runner(step, "interrupting terraform (SIGINT)").await;
            match tokio::time::timeout(config.grace, child.wait()).await {
                Ok(status) => {
                    interrupted = Some(Interrupted::Gracefully);
                    status
                }
                Err(_) => {
                    signal(pgid, Signal::SIGKILL);
                    logger
                        .runner(step, &format!("terraform did not stop within {:?}; killed it", config.grace))
                        .await;
                    interrupted = Some(Interrupted::Killed);
                    child.wait().await
                }
            }
        }
    };
    // Plugins share the process group; none may outlive terraform holding the pipes open.
    signal(pgid, Signal::SIGKILL);
    let drain = |task: tokio::task::JoinHandle<Pumped>| async move {
        match tokio::time::timeout(DRAIN_TIMEOUT, task).await {
            Ok(Ok(drained)) => drained,
            _ => Pumped::default(),
        }
    };
    let out = drain(out_task).await;
    let err = drain(err_task).await;
    // The UI's error diagnostics first, then plain `Error:` lines from either stream.
    let redactor = logger.redactor();
    let mut errors: Vec<String> = out
        .events
        .errors()
        .map(|d| redactor.redact(&d.render()))
        .collect();
    errors.extend(err.errors);
    errors.extend(out.errors);
    let exit_code = status.ok().and_then(|s| s.code());
    Ok(Outcome {
        exit_code,
        stdout: out.captured,
        errors,
        events: out.events,
        interrupted,
        duration: started.elapsed(),
    })
}

fn signal(pgid: Option<Pid>, sig: Signal) {
    if let Some(pgid) = pgid {
        // The group may already be gone; that is the outcome we want.
        let _ = killpg(pgid, sig);
    }
}

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

/// The errors and UI messages of a whole recorded output, gathered as [`run`] gathers them (for
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

/// Confines terraform before it starts. The kernel SIGKILLs it when the runner dies
/// (`PR_SET_PDEATHSIG`), so a runner killed outright leaves no terraform changing the cloud with
/// no state server to save to; no setuid program it runs gains privileges
/// (`PR_SET_NO_NEW_PRIVS`); and its [`Limits`] are set, never above the runner's own.
/// (Its providers, in terraform's process group, lose their host and are stopped by the next
/// job's lease takeover at the latest.) The signal follows the death of the *thread* that
/// spawned terraform: tokio's worker threads live as long as the runtime, and the runner never
/// spawns terraform from a blocking thread.
#[allow(unsafe_code)]
fn confine(cmd: &mut tokio::process::Command, limits: Limits) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let runner = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec. It only makes system calls
    // (prctl, getppid, setrlimit), all async-signal-safe, and allocates nothing, not even on
    // error.
    unsafe {
        cmd.pre_exec(move || {
            let os = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(os)?;
            // No setuid binary terraform or a provisioner runs gains privileges.
            nix::sys::prctl::set_no_new_privs().map_err(os)?;
            // Lowered only: a limit above the hard one in force cannot be set.
            let lower = |resource, soft: u64, hard: u64| {
                let (_, now) = getrlimit(resource)?;
                setrlimit(resource, soft.min(now), hard.min(now))
            };
            if let Some(bytes) = limits.memory_bytes {
                lower(Resource::RLIMIT_AS, bytes, bytes).map_err(os)?;
            }
            if let Some(seconds) = limits.cpu_seconds {
                // SIGXCPU at the soft limit; the hard one, a little later, kills.
                lower(Resource::RLIMIT_CPU, seconds, seconds.saturating_add(5)).map_err(os)?;
            }
            // The runner may have died between fork and prctl: then do not start at all.
            if nix::unistd::getppid() != runner {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// How a pump treats the lines it reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Log each line as text.
    Log,
    /// Messages of the machine-readable UI: rendered, gathered, logged with the event.
    Ui,
    /// Keep the bytes (data for the runner, such as `show -json`), log nothing.
    Capture,
}

/// What a pump read from one stream.
#[derive(Default)]
struct Pumped {
    captured: Vec<u8>,
    errors: Vec<String>,
    events: Events,
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
async fn pump(
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

/// The whole environment terraform sees.
pub(crate) fn environment(config: &TerraformConfig, workdir: &Path) -> Vec<(String, String)> {
    let passed = config
        .pass_env
        .iter()
        .map(String::as_str)
        .filter(|n| may_pass(n));
    let mut env: Vec<(String, String)> = BASE_ENV
        .into_iter()
        .chain(passed)
        .filter_map(|name| std::env::var(name).ok().map(|v| (name.to_owned(), v)))
        .collect();
    env.extend(
        config
            .env
            .iter()
            .chain(&config.settings)
            .filter(|(name, _)| may_pass(name))
            .cloned(),
    );
    env.extend([
        ("TF_IN_AUTOMATION".to_owned(), "1".to_owned()),
        ("TF_INPUT".to_owned(), "0".to_owned()),
        ("CHECKPOINT_DISABLE".to_owned(), "1".to_owned()),
        // Each job has its own home, so no user's ~/.terraformrc or credentials leak in.
        (
            "HOME".to_owned(),
            workdir.join(".home").display().to_string(),
        ),
    ]);
    // And its own temp folder, deleted with the workdir: nothing it writes there outlives the
    // job for the next job of its user to read.
    if workdir.join(".tmp").is_dir() {
        env.retain(|(name, _)| name != "TMPDIR");
        env.push((
            "TMPDIR".to_owned(),
            workdir.join(".tmp").display().to_string(),
        ));
    }
    if let Some(cache) = &config.plugin_cache {
        env.push((
            "TF_PLUGIN_CACHE_DIR".to_owned(),
            cache.display().to_string(),
        ));
    }
    if let Some(cli) = &config.cli_config {
        env.push(("TF_CLI_CONFIG_FILE".to_owned(), cli.display().to_string()));
    }
    env
}

#[cfg(test)]
mod tests;
