//! The command line: its flags and environment, its commands, and how each is reported.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use crate::store::{self, StoreUrl};
use crate::{ops, serve, state_cmd, template_cmd};
use clap::{Args, Parser, Subcommand};
use shared::host::settings::Runtime;
use shared::job::template::source::{Published, Templates};
use shared::job::validate::{ValidatedJob, ValidationError, fetch_and_validate};
use shared::job::{Operation, RawJob};
use shared::run::cost;
use shared::run::result::{JobResult, Status};
use shared::run::runner::{RunOutcome, Runner};
use shared::run::terraform::TerraformConfig;
use state_backends::{StateStore, WorkspaceId};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Exit codes, after sysexits(3) where one fits.
pub mod exit {
    pub const OK: u8 = 0;
    /// The job ran and failed.
    pub const FAILED: u8 = 1;
    /// A drift check found drift.
    pub const DRIFT: u8 = 2;
    /// The command line or a setting is wrong (EX_USAGE).
    pub const USAGE: u8 = 64;
    /// The job file is invalid (EX_DATAERR).
    pub const INVALID: u8 = 65;
    /// The runner itself failed (EX_SOFTWARE).
    pub const INTERNAL: u8 = 70;
    /// No such job or workspace (EX_NOINPUT).
    pub const NOT_FOUND: u8 = 66;
    /// The workspace is busy, or the job has not finished; try again later (EX_TEMPFAIL).
    pub const BUSY: u8 = 75;
}

const EXIT_CODES: &str = "Exit codes:
  0   done (a run succeeded, a check found no drift)
  1   the job ran and failed; a command could not do what was asked
  2   a drift check found drift
  64  the command line is wrong (an unknown command or flag, a bad --store or setting, a
      job id that is not one or is in several workspaces)
  65  the job file is invalid; nothing was run
  66  no such job (result, logs) or workspace (status)
  70  the runner itself failed (a store it cannot reach, a bug)
  75  the workspace is busy, or the job has not finished: try again later";

#[derive(Parser, Debug)]
#[command(
    name = "terrace",
    version,
    about = "Run Terraform/OpenTofu jobs with state in your own store",
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Cmd,
}

/// Settings shared by every command; each has an environment variable.
#[derive(Args, Debug, Clone)]
pub(crate) struct Global {
    /// The state store: a folder, s3://BUCKET/PREFIX[?lease_table=T&role_arn=A&external_id=X&region=R],
    /// gs://BUCKET/PREFIX[?impersonate=SA] or az://ACCOUNT/CONTAINER/PREFIX (README: "Operating a
    /// cloud store").
    // Parsed after clap, so a refused URL (which may hold a secret) is never echoed; its
    // value from the environment is never shown in --help either.
    #[arg(
        long,
        env = "TERRACE_STORE",
        default_value = ".terrace",
        hide_env_values = true,
        global = true
    )]
    pub(crate) store: String,
    /// Templates: a folder of `<name>/<version>/`, or a bucket they were published to
    /// (`terrace template publish`), as a store URL: s3://, gs://, az://.
    #[arg(
        long,
        env = "TERRACE_TEMPLATES",
        default_value = "templates",
        global = true
    )]
    pub(crate) templates: String,
    /// Where templates from a bucket are copied (default: `templates` in the cache folder,
    /// `--cache-dir`).
    #[arg(long, env = "TERRACE_TEMPLATE_CACHE", global = true)]
    pub(crate) template_cache: Option<PathBuf>,
    /// Folder of price books: plans are estimated when it exists (docs/templates.md).
    #[arg(
        long,
        env = "TERRACE_PRICE_BOOKS",
        default_value = "price-books",
        global = true
    )]
    pub(crate) price_books: PathBuf,
    /// The terraform or tofu binary.
    #[arg(
        long,
        env = "TERRACE_TERRAFORM",
        default_value = "terraform",
        global = true
    )]
    pub(crate) terraform: PathBuf,
    /// A terraform CLI configuration file (provider mirrors, credentials helpers).
    #[arg(long, env = "TERRACE_TF_CLI_CONFIG", global = true)]
    pub(crate) tf_cli_config: Option<PathBuf>,
    /// A provider plugin cache shared by jobs.
    #[arg(long, env = "TERRACE_PLUGIN_CACHE", global = true)]
    pub(crate) plugin_cache: Option<PathBuf>,
    /// Names of environment variables terraform may see (its provider credentials), comma-separated.
    #[arg(long, env = "TERRACE_PASS_ENV", value_delimiter = ',', global = true)]
    pub(crate) pass_env: Vec<String>,
    /// Seconds a workspace lease lasts without renewal (a crashed runner's lease frees itself after this).
    #[arg(long, env = "TERRACE_LEASE_TTL", default_value_t = 60, global = true,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) lease_ttl: u64,
    /// Seconds terraform has to stop after an interrupt before it is killed.
    #[arg(long, env = "TERRACE_GRACE", default_value_t = 30, global = true,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub(crate) grace: u64,
    /// A folder for what is worth keeping between runs (terraform's version); default
    /// `$XDG_CACHE_HOME/terrace` or `~/.cache/terrace`.
    #[arg(long, env = "TERRACE_CACHE_DIR", global = true)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// The largest state, in bytes, the runner's state server accepts from terraform.
    #[arg(long, env = "TERRACE_MAX_STATE_BYTES", global = true,
          default_value_t = shared::run::state_server::MAX_STATE_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(1024..))]
    pub(crate) max_state_bytes: u64,
    /// The address space each process of a job may use (terraform, providers, provisioners):
    /// `4g`, `512m`, bytes, or `off`.
    #[arg(long, env = "TERRACE_JOB_MEMORY", global = true, default_value = "8g",
          value_parser = |v: &str| shared::host::settings::memory_limit(v).map(Limit))]
    pub(crate) job_memory: Limit,
    /// The CPU time each process of a job may use, in seconds, or `off`.
    #[arg(long, env = "TERRACE_JOB_CPU_SECONDS", global = true, default_value = "3600",
          value_parser = |v: &str| shared::host::settings::cpu_limit(v).map(Limit))]
    pub(crate) job_cpu_seconds: Limit,
    /// A key file (32 bytes, base64: `openssl rand -base64 32`) whose key seals every state
    /// before it leaves this machine, and opens what it sealed (docs/SECURITY.md).
    #[arg(long, env = "TERRACE_STATE_KEY_FILE", global = true)]
    pub(crate) state_key_file: Option<PathBuf>,
    /// Key files rotated out: they still open what they sealed, comma-separated.
    #[arg(
        long,
        env = "TERRACE_STATE_OLD_KEY_FILES",
        value_delimiter = ',',
        global = true
    )]
    pub(crate) state_old_key_files: Vec<PathBuf>,
    /// Which of a template's per-cloud `defaults` apply here.
    #[arg(long, env = "TERRACE_CLOUD", default_value = "local", global = true,
          value_parser = clap::builder::PossibleValuesParser::new(shared::job::template::CLOUDS))]
    pub(crate) cloud: String,
    /// Print only the summary, not the live log.
    #[arg(long, short, global = true)]
    pub(crate) quiet: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run one job file (JSON or YAML) with a live log and a final summary.
    Run {
        job: PathBuf,
        /// Seconds to wait for a busy workspace before giving up.
        #[arg(long, default_value_t = 0)]
        wait: u64,
        /// Print the result as JSON (result.json's schema) instead of the summary.
        #[command(flatten)]
        out: ops::Output,
    },
    /// Check a job file without running it.
    Validate { job: PathBuf },
    /// Estimate a plan or apply job's monthly cost: plan it, price the plan with the price
    /// books, hold it to the job's budget, and apply nothing (exit 1 when over budget).
    Estimate {
        job: PathBuf,
        /// Seconds to wait for a busy workspace before giving up.
        #[arg(long, default_value_t = 0)]
        wait: u64,
        #[command(flatten)]
        out: ops::Output,
    },
    /// Process job files dropped into a folder, moving each to done/ or failed/ with its result.
    Serve(serve::ServeArgs),
    /// Inspect and repair a workspace's state.
    #[command(subcommand)]
    State(state_cmd::StateCmd),
    /// List and show the templates a runner here would load (docs/templates.md).
    #[command(subcommand)]
    Template(template_cmd::TemplateCmd),
    /// The module library's tools.
    #[command(subcommand)]
    Module(template_cmd::ModuleCmd),
    /// Back up every workspace whose state changed since the last backup (run it hourly).
    Backup {
        /// How many of the newest backups a workspace keeps.
        #[arg(long, default_value_t = 48)]
        hourly: usize,
        /// Beyond those, the newest backup of each of this many recent days.
        #[arg(long, default_value_t = 30)]
        daily: usize,
    },
    /// Queue a drift check for every workspace with a successful apply, as job files in a
    /// `terrace serve` queue folder (run it on a schedule). Workspaces whose last apply had
    /// sensitive variables are listed instead: send their checks with the secrets.
    Drift {
        /// The queue folder `terrace serve --queue` reads.
        #[arg(long)]
        queue: PathBuf,
    },
    /// List the store's workspaces, TENANT/WORKSPACE.
    Workspaces {
        #[command(flatten)]
        out: ops::Output,
    },
    /// List a workspace's runs, newest first: job, operation, status, start, duration.
    Runs {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        /// How many of the newest runs to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[command(flatten)]
        out: ops::Output,
    },
    /// Show a workspace's lifecycle status (provisioning, active, updating, deleting,
    /// deleted, failed, interrupted) and how it got there.
    Status {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        /// How many of the newest moves to show.
        #[arg(long, default_value_t = 20)]
        history: usize,
        #[command(flatten)]
        out: ops::Output,
    },
    /// Show a job's result (the exit code is the job's, as for `run`).
    Result {
        /// The job's id.
        job: String,
        /// The job's TENANT/WORKSPACE; without it every workspace is searched.
        #[arg(long, short)]
        workspace: Option<WorkspaceId>,
        #[command(flatten)]
        out: ops::Output,
    },
    /// Print a run's log from the store (the newest run unless JOB is given).
    Logs {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        /// The job's id; the workspace's newest run when left out.
        job: Option<String>,
        /// Keep printing as the running job writes its log, until its result is written.
        #[arg(long, short)]
        follow: bool,
        /// With --follow, milliseconds between looks at the store.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(100..=60_000))]
        interval_ms: u64,
        /// Print the stored lines as NDJSON (one log line object each).
        #[command(flatten)]
        out: ops::Output,
    },
}

/// A per-process limit of a job's (`off`: none), as a flag gives it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limit(Option<u64>);

/// Runs the command line: `terrace …`.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version are answers, not errors; clap's own code 2 is drift's.
            return ExitCode::from(if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            });
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TERRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Terraform runs as this process's user here: its provisioners must not read this
    // process's environment (the store's credentials), and what they leave running is found.
    shared::host::process::harden();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the runtime starts");
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            // A malformed setting (`TERRACE_CALL_TIMEOUT=abc`) is the caller's to fix, as a
            // malformed flag is: trying again cannot pass.
            if e.downcast_ref::<shared::host::settings::ConfigError>()
                .is_some()
            {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::from(exit::INTERNAL)
            }
        }
    }
}

impl Global {
    /// The templates `--templates` names: a folder, or a bucket reached with this machine's
    /// credentials.
    pub(crate) async fn open_templates(&self) -> anyhow::Result<Templates> {
        let url: StoreUrl = self
            .templates
            .parse()
            .map_err(|e| anyhow::anyhow!("--templates: {e}"))?;
        if let StoreUrl::Fs(path) = &url {
            return Ok(Templates::folder(path));
        }
        let (bucket, prefix) = store::open_bucket(&url)
            .await
            .map_err(|e| anyhow::anyhow!("--templates: {e}"))?;
        let cache = self
            .template_cache
            .clone()
            .or_else(|| {
                self.cache_dir
                    .clone()
                    .or_else(default_cache_dir)
                    .map(|d| d.join("templates"))
            })
            .unwrap_or_else(|| std::env::temp_dir().join("terrace-templates"));
        Ok(Templates::published(Published::new(
            bucket,
            &prefix,
            cache,
            url.to_string(),
        )))
    }

    /// The store `--store` names, with this machine's credentials.
    pub(crate) async fn open_store(&self) -> anyhow::Result<Arc<dyn StateStore>> {
        let url: StoreUrl = self
            .store
            .parse()
            .map_err(|e| anyhow::anyhow!("--store: {e}"))?;
        let keys = shared::host::settings::keyring(
            self.state_key_file.as_deref(),
            &self.state_old_key_files,
        )?;
        store::open(&url, keys).await
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    let g = cli.global;
    if let Err(e) = g.store.parse::<StoreUrl>() {
        eprintln!("error: --store (or TERRACE_STORE): {e}");
        return Ok(exit::USAGE);
    }
    match cli.command {
        Cmd::Validate { job } => Ok(
            match load_job(&job, &g, &g.open_templates().await?).await? {
                Ok(v) => {
                    outln!(
                        "{}: valid ({} {} in {}/{})",
                        job.display(),
                        v.job.operation,
                        v.job.template,
                        v.job.tenant,
                        v.job.workspace
                    );
                    exit::OK
                }
                Err(errors) => report_invalid(&job, &errors),
            },
        ),
        Cmd::Run { job, wait, out } => {
            let templates = g.open_templates().await?;
            let validated = match load_job(&job, &g, &templates).await? {
                Ok(v) => v,
                Err(errors) => return Ok(report_invalid(&job, &errors)),
            };
            let mut config = runtime(&g, templates).runner_config();
            config.lease_wait = Duration::from_secs(wait);
            take_user(&mut config).await?;
            let runner = Runner::new(g.open_store().await?, config);
            let cancel = CancellationToken::new();
            tokio::spawn(cancel_on_signal(cancel.clone()));
            match runner.run(&validated, cancel).await {
                Ok(outcome) => Ok(report_outcome(&outcome, out)),
                Err(e) => unrecorded(&e),
            }
        }
        Cmd::Estimate { job, wait, out } => estimate(&g, &job, wait, out).await,
        Cmd::Workspaces { out } => ops::workspaces(&*g.open_store().await?, out).await,
        Cmd::Runs {
            workspace,
            limit,
            out,
        } => ops::runs(&*g.open_store().await?, &workspace, limit, out).await,
        Cmd::Status {
            workspace,
            history,
            out,
        } => ops::status(&*g.open_store().await?, &workspace, history, out).await,
        Cmd::Result {
            job,
            workspace,
            out,
        } => ops::result(&*g.open_store().await?, &job, workspace.as_ref(), out).await,
        Cmd::Logs {
            workspace,
            job,
            follow,
            interval_ms,
            out,
        } => {
            let args = ops::LogsArgs {
                ws: workspace,
                job,
                follow,
                interval: Duration::from_millis(interval_ms),
                out,
            };
            ops::logs(g.open_store().await?, args).await
        }
        Cmd::Serve(args) => serve::serve(&g, args).await,
        Cmd::State(cmd) => state_cmd::run(&g, cmd).await,
        Cmd::Template(cmd) => template_cmd::run(&g, cmd).await,
        Cmd::Module(cmd) => Ok(template_cmd::module(cmd)),
        Cmd::Drift { queue } => drift(&g, &queue).await,
        Cmd::Backup { hourly, daily } => {
            let store = g.open_store().await?;
            let keep = shared::sweeps::backup::Retention { hourly, daily };
            let report =
                shared::sweeps::backup::sweep(&*store, time::OffsetDateTime::now_utc(), keep)
                    .await?;
            for (ws, b) in &report.backed_up {
                outln!("{ws}: backed up version {} as {}", b.version, b.label);
            }
            for (ws, label) in &report.pruned {
                outln!("{ws}: dropped backup {label} (retention)");
            }
            for (ws, why) in &report.failed {
                eprintln!("{ws}: not backed up: {why}");
            }
            outln!(
                "{} changed, {} backed up, {} unchanged, {} dropped, {} failed",
                report.changed,
                report.backed_up.len(),
                report.unchanged.len(),
                report.pruned.len(),
                report.failed.len()
            );
            Ok(if report.failed.is_empty() {
                exit::OK
            } else {
                exit::FAILED
            })
        }
    }
}

/// `terrace estimate`: the job planned under an id of its own (so the job itself can still
/// run), its plan priced, nothing applied.
async fn estimate(g: &Global, path: &Path, wait: u64, out: ops::Output) -> anyhow::Result<u8> {
    let templates = g.open_templates().await?;
    let mut validated = match load_job(path, g, &templates).await? {
        Ok(v) => v,
        Err(errors) => return Ok(report_invalid(path, &errors)),
    };
    let j = &mut validated.job;
    if !matches!(j.operation, Operation::Plan | Operation::Apply) {
        eprintln!(
            "error: {} is a {} job: estimate prices what a plan or apply job would leave running",
            path.display(),
            j.operation
        );
        return Ok(exit::USAGE);
    }
    if !g.price_books.is_dir() {
        eprintln!(
            "error: there are no price books at {}: point --price-books (or TERRACE_PRICE_BOOKS) at a folder of them (docs/templates.md)",
            g.price_books.display()
        );
        return Ok(exit::USAGE);
    }
    let base: String = j.id.chars().take(100).collect();
    j.id = format!("{base}.estimate-{:08x}", rand::random::<u32>());
    j.operation = Operation::Plan;
    let mut config = runtime(g, templates).runner_config();
    config.lease_wait = Duration::from_secs(wait);
    take_user(&mut config).await?;
    let runner = Runner::new(g.open_store().await?, config);
    let cancel = CancellationToken::new();
    tokio::spawn(cancel_on_signal(cancel.clone()));
    let outcome = match runner.run(&validated, cancel).await {
        Ok(outcome) => outcome,
        Err(e) => return unrecorded(&e),
    };
    let result = match outcome {
        RunOutcome::Finished(result) | RunOutcome::AlreadyDone(result) => result,
        busy @ RunOutcome::Busy { .. } => return Ok(report_outcome(&busy, out)),
    };
    let over = result
        .cost
        .as_ref()
        .and_then(|c| c.budget.as_ref())
        .is_some_and(|b| b.exceeded);
    if out.json {
        ops::print_json(&serde_json::json!({
            "schema": ops::JSON_SCHEMA,
            "job_id": result.job_id,
            "status": result.status,
            "changes": result.changes,
            "cost": result.cost,
            "error": result.error,
        }));
    } else if result.status == Status::Succeeded {
        if let Some(c) = &result.changes {
            outln!();
            outln!(
                "changes:    {} to add, {} to change, {} to destroy",
                c.add,
                c.change,
                c.destroy
            );
        }
        print_cost(&result);
        outln!("planned as job {}; nothing was applied", result.job_id);
    } else {
        print_summary(&result);
    }
    Ok(match result.status {
        Status::Succeeded if over => exit::FAILED,
        Status::Succeeded => exit::OK,
        _ => exit::FAILED,
    })
}

async fn drift(g: &Global, queue: &Path) -> anyhow::Result<u8> {
    let store = g.open_store().await?;
    let plan =
        shared::sweeps::drift::plan(&*store, time::OffsetDateTime::now_utc(), usize::MAX).await?;
    std::fs::create_dir_all(queue)
        .with_context(|| format!("cannot create the queue folder {}", queue.display()))?;
    for (ws, job) in &plan.jobs {
        let id = job.0["id"].as_str().unwrap_or("drift");
        let name = format!("{id}--{}--{}.json", ws.tenant(), ws.workspace());
        // Written under a hidden name first: `serve` never sees half a file.
        let partial = queue.join(format!(".{name}.partial"));
        std::fs::write(&partial, serde_json::to_vec_pretty(&job.0)?)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        std::fs::rename(&partial, queue.join(&name))?;
        outln!("{ws}: drift check queued as {name}");
    }
    for (ws, names) in &plan.needs_secrets {
        eprintln!(
            "{ws}: not queued: its last apply had sensitive variables ({}); send its drift check with their values",
            names.join(", ")
        );
    }
    for (ws, why) in &plan.failed {
        eprintln!("{ws}: not queued: {why}");
    }
    outln!(
        "{} queued, {} need secrets, {} never applied, {} failed",
        plan.jobs.len(),
        plan.needs_secrets.len(),
        plan.never_applied,
        plan.failed.len()
    );
    Ok(if plan.failed.is_empty() {
        exit::OK
    } else {
        exit::FAILED
    })
}

/// Terraform's user for the one job this command runs (`TERRACE_TERRAFORM_USER`: you by
/// default, `per-job` for a user of the job's own when root). What the job leaves running (a
/// detached provisioner) is killed when it ends, with the runner's configuration.
async fn take_user(config: &mut shared::run::runner::RunnerConfig) -> anyhow::Result<()> {
    config.terraform.run_one()?;
    config
        .terraform
        .take_user()
        .await
        .map_err(|why| anyhow::anyhow!("{why}"))
}

/// What runs a job here, from the flags and environment.
pub(crate) fn runtime(g: &Global, templates: Templates) -> Runtime {
    Runtime {
        templates,
        templates_bucket: None,
        price_books: g.price_books.clone(),
        // The CLI seals in `Global::open_store`, which every command opens its store with.
        keys: None,
        cloud: shared::job::template::CLOUDS
            .iter()
            .copied()
            .find(|c| *c == g.cloud),
        terraform: TerraformConfig {
            binary: g.terraform.clone(),
            plugin_cache: g.plugin_cache.clone(),
            cli_config: g.tf_cli_config.clone(),
            pass_env: g
                .pass_env
                .iter()
                .filter(|n| !n.is_empty())
                .cloned()
                .collect(),
            env: Vec::new(),
            settings: Vec::new(),
            late_secrets: shared::job::redact::LateSecrets::default(),
            grace: Duration::from_secs(g.grace),
            // On one machine terraform runs as you, with your own credentials.
            user: None,
            per_job_users: false,
            shared_user: shared::run::terraform::SharedUser::Unguarded,
            limits: shared::run::terraform::Limits {
                memory_bytes: g.job_memory.0,
                cpu_seconds: g.job_cpu_seconds.0,
            },
            job_user: None,
        },
        lease_ttl: Duration::from_secs(g.lease_ttl.max(1)),
        // The CLI's stores read `TERRACE_CALL_TIMEOUT` as they are opened (store.rs).
        call_timeout: state_backends::CALL_TIMEOUT,
        task_lease_wait: Duration::ZERO,
        client_cache: g.cache_dir.clone().or_else(default_cache_dir),
        console: !g.quiet,
        // The summary is what a person reads here; the functions write metrics records.
        metrics: None,
        max_state_bytes: usize::try_from(g.max_state_bytes).unwrap_or(usize::MAX),
        // One machine's own sweep (`terrace drift`) checks every workspace.
        drift_per_tenant: usize::MAX,
    }
}

/// A run whose end could not be recorded: a lost lease (another runner took the workspace over
/// while the job ran) or a store that failed is said as it is, with exit 75 when trying again
/// may pass; anything else is an internal error (70).
///
/// # Errors
/// The run's error, when it is neither.
fn unrecorded(e: &shared::run::runner::RunError) -> anyhow::Result<u8> {
    use shared::run::runner::RunError;
    use state_backends::StoreError;
    match e {
        RunError::Store(lost @ StoreError::LeaseLost { .. }) => {
            eprintln!(
                "error: {lost}: another runner took the workspace over while this job ran, so its end was not recorded (every state version it wrote is kept); see `terrace runs` and `terrace state versions`, then run the job again"
            );
            Ok(exit::BUSY)
        }
        e if e.is_retryable() => {
            eprintln!("error: {e}: the job's end was not recorded; run it again");
            Ok(exit::BUSY)
        }
        e => Err(anyhow::anyhow!("{e}")),
    }
}

/// `$XDG_CACHE_HOME/terrace`, else `$HOME/.cache/terrace`; none without either.
fn default_cache_dir() -> Option<PathBuf> {
    let nonempty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| nonempty("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .map(|dir| dir.join("terrace"))
}

/// Reads and validates a job file against `templates` (fetched from their bucket first, if
/// they come from one) and `g`'s cloud; the outer error is for an unreadable file or a bucket
/// that cannot be read.
pub(crate) async fn load_job(
    path: &Path,
    g: &Global,
    templates: &Templates,
) -> anyhow::Result<Result<ValidatedJob, Vec<ValidationError>>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read job file {}", path.display()))?;
    // Not text: an invalid job (exit 65, `failed/` in a queue), not a runner error.
    let Ok(text) = String::from_utf8(bytes) else {
        return Ok(Err(vec![ValidationError::new(
            "",
            "is not UTF-8 text",
            "save the job file as UTF-8 (YAML or JSON)",
        )]));
    };
    let raw = match RawJob::parse(&text) {
        Ok(raw) => raw,
        Err(e) => return Ok(Err(vec![e])),
    };
    Ok(fetch_and_validate(&raw, templates, Some(&g.cloud)).await?)
}

fn report_invalid(path: &Path, errors: &[ValidationError]) -> u8 {
    eprintln!(
        "{}: invalid job, {} problem(s), nothing was run:",
        path.display(),
        errors.len()
    );
    for e in errors {
        eprintln!("  - {e}");
    }
    exit::INVALID
}

/// Prints the summary of a run (or its result as JSON) and returns the exit code.
fn report_outcome(outcome: &RunOutcome, out: ops::Output) -> u8 {
    if out.json
        && let RunOutcome::AlreadyDone(result) | RunOutcome::Finished(result) = outcome
    {
        ops::print_json(&serde_json::to_value(result).expect("results serialize"));
        return exit_code(result);
    }
    match outcome {
        RunOutcome::Busy { holder } => {
            eprintln!(
                "workspace busy: leased by job {} (fence {}) until {}; try again later or use --wait",
                holder.owner,
                holder.fence,
                state_backends::display_time(holder.expires_at)
            );
            exit::BUSY
        }
        RunOutcome::AlreadyDone(result) => {
            outln!(
                "job {} already finished ({}); not run again",
                result.job_id,
                result.status.as_str()
            );
            print_summary(result);
            exit_code(result)
        }
        RunOutcome::Finished(result) => {
            print_summary(result);
            exit_code(result)
        }
    }
}

pub(crate) fn exit_code(result: &JobResult) -> u8 {
    match (result.status, result.drift) {
        (Status::Succeeded, Some(true)) => exit::DRIFT,
        (Status::Succeeded, _) => exit::OK,
        _ => exit::FAILED,
    }
}

pub(crate) fn print_summary(r: &JobResult) {
    outln!();
    outln!(
        "job:        {} ({} {} in {}/{})",
        r.job_id,
        r.operation,
        r.template,
        r.tenant,
        r.workspace
    );
    outln!(
        "status:     {} in {:.1}s",
        r.status.as_str(),
        r.duration_ms as f64 / 1000.0
    );
    let steps: Vec<String> = r
        .steps
        .iter()
        .map(|s| format!("{} {}ms", s.step, s.duration_ms))
        .collect();
    outln!("steps:      {}", steps.join(", "));
    if let Some(c) = &r.changes {
        outln!(
            "changes:    {} to add, {} to change, {} to destroy",
            c.add,
            c.change,
            c.destroy
        );
    }
    if let Some(t) = &r.terraform {
        outln!("terraform:  {} {}", t.flavour.name(), t.version);
    }
    print_cost(r);
    if let Some(drift) = r.drift {
        let what = match (drift, r.drifted.is_empty()) {
            (false, _) => "none",
            (true, false) => "yes: changed outside terraform since its last run",
            (true, true) => "yes: the infrastructure differs from the template",
        };
        outln!("drift:      {what}");
        let redactor = shared::job::redact::Redactor::default();
        for resource in &r.drifted {
            outln!("  {}", resource.describe(&redactor));
        }
    }
    if !r.state_versions.is_empty() {
        let v: Vec<String> = r.state_versions.iter().map(u64::to_string).collect();
        outln!("state:      wrote version(s) {}", v.join(", "));
    }
    if !r.outputs.is_empty() {
        outln!("outputs:");
        for (name, out) in &r.outputs {
            outln!("  {name} = {}", out.value);
        }
    }
    if r.attempts.len() > 1 {
        outln!("attempts:   {}", r.attempts.len());
        for a in &r.attempts {
            match (&a.error, a.retry_after_ms) {
                (Some(e), Some(wait)) => outln!(
                    "  {}: {:?} at {}: {} (retried after {wait} ms)",
                    a.attempt,
                    e.category,
                    e.step,
                    e.message
                ),
                (Some(e), None) => outln!(
                    "  {}: {:?} at {}: {}",
                    a.attempt,
                    e.category,
                    e.step,
                    e.message
                ),
                (None, _) => outln!("  {}: succeeded", a.attempt),
            }
        }
    }
    for rec in &r.recovered {
        outln!(
            "recovered:  {} {} as {} (it existed in the cloud but not in the state)",
            rec.action,
            rec.address,
            rec.id
        );
    }
    if let Some(u) = &r.unsaved_state {
        match (u.pushed_as, &u.error) {
            (Some(v), _) => outln!(
                "unsaved:    terraform could not save its state; the runner saved it as version {v} (kept as {})",
                u.artifact
            ),
            (None, Some(e)) => outln!("unsaved:    kept as {}; {e}", u.artifact),
            (None, None) => outln!("unsaved:    kept as {}", u.artifact),
        }
    }
    if let Some(c) = &r.cleanup
        && (!c.created.is_empty() || c.rolled_back_to.is_some())
    {
        outln!(
            "cleanup:    policy {}; created {}",
            c.policy,
            if c.created.is_empty() {
                "nothing".to_owned()
            } else {
                c.created.join(", ")
            }
        );
        if let Some(to) = &c.rolled_back_to {
            outln!("            rolled back to the configuration of {to}");
        }
        if !c.reverted.is_empty() {
            outln!("            reverted {}", c.reverted.join(", "));
        }
        if !c.destroyed.is_empty() {
            outln!("            destroyed {}", c.destroyed.join(", "));
        }
        if !c.left.is_empty() {
            outln!("            left in place {}", c.left.join(", "));
        }
        if let Some(e) = &c.error {
            outln!("            {e}");
        }
    }
    if let Some(t) = &r.lifecycle {
        outln!("workspace:  {} → {}", t.from_name(), t.to.as_str());
    }
    for a in &r.attention {
        outln!("attention:  [{}] {}", a.kind, a.message);
    }
    if let Some(e) = &r.error {
        outln!(
            "error:      [{:?}] at step {}: {}",
            e.category,
            e.step,
            e.message
        );
        outln!("hint:       {}", e.hint);
        outln!("retryable:  {}", e.retryable);
    }
}

/// The estimate of a result: the totals, the largest changes, what is not priced, the budget.
pub(crate) fn print_cost(r: &JobResult) {
    let Some(c) = &r.cost else {
        return;
    };
    let books: Vec<String> = c
        .price_books
        .iter()
        .map(|b| format!("{} {}", b.name, b.as_of))
        .collect();
    if books.is_empty() {
        outln!("cost:       {}", c.headline());
    } else {
        outln!(
            "cost:       {} (prices: {})",
            c.headline(),
            books.join(", ")
        );
    }
    for t in &c.top {
        outln!(
            "            {} {}",
            t.address,
            cost::show_delta(t.monthly_delta)
        );
    }
    for u in &c.not_priced {
        outln!("            not priced: {} ({})", u.address, u.reason);
    }
    if let Some(b) = &c.budget {
        match &b.reason {
            Some(why) if b.exceeded => outln!("budget:     exceeded: {why}"),
            _ => outln!(
                "budget:     within: at most {} {} more a month",
                cost::show(b.max_monthly_increase),
                c.currency
            ),
        }
    }
}

/// Fires `cancel` on SIGINT or SIGTERM, so terraform is interrupted, not killed.
pub(crate) async fn cancel_on_signal(cancel: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    eprintln!("interrupt received: stopping terraform gracefully, then releasing the workspace");
    cancel.cancel();
}
