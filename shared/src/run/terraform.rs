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
use tokio_util::sync::CancellationToken;

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
    /// A record of what [`TerraformConfig::binary`] answered to `version -json`, made when the
    /// image was built (`deploy/record-terraform-version.sh`): used instead of running it while
    /// the binary is the file recorded ([`crate::run::client::probe_cached`]).
    pub version_record: Option<PathBuf>,
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
    /// The run's state server as terraform's `http` backend sees it, `TF_HTTP_*` (see
    /// [`crate::run::state_server::Endpoint::backend_env`]): set per run, never inherited.
    pub backend: Vec<(String, String)>,
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
            version_record: None,
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
            backend: Vec::new(),
        }
    }
}

/// How long the output of a finished terraform is still read.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Variables that change how terraform itself behaves; never passed through from the runner.
const NEVER_PASS: [&str; 9] = [
    "TF_LOG",
    "TF_HTTP_",
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
    /// `init` with the `http` backend, configured by [`TerraformConfig::backend`].
    Init,
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
            Command::Init => "init",
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
            Command::Init => {
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

/// Confines terraform before it starts. The kernel SIGKILLs it when the runner dies
/// (`PR_SET_PDEATHSIG`), so a runner killed outright leaves no terraform changing the cloud with
/// no state server to save to; no setuid program it runs gains privileges
/// (`PR_SET_NO_NEW_PRIVS`); and its [`Limits`] are set, never above the runner's own.
/// (Its providers, in terraform's process group, lose their host and are stopped by the next
/// job's lease takeover at the latest.) The signal follows the death of the *thread* that
/// spawned terraform: tokio's worker threads live as long as the runtime, and the runner never
/// spawns terraform from a blocking thread.
#[allow(unsafe_code)]
pub(crate) fn confine(cmd: &mut tokio::process::Command, limits: Limits) {
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
    env.extend(config.backend.iter().cloned());
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

mod output;
mod user;

pub use output::{ErrorLines, MAX_CAPTURE, MAX_LINE, read_output};
use output::{Pumped, Read, pump};
pub use user::{FIRST_JOB_UID, JOB_USERS, JobUser, RunAs, SharedUser};

#[cfg(test)]
mod tests;
