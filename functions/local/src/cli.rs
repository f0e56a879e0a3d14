//! The command line: its flags and environment, its commands, and how each is reported.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use shared::host::settings::Runtime;
use shared::job::template::source::{Published, Templates};
use shared::run::terraform::TerraformConfig;
use state_backends::{StateStore, WorkspaceId};

use crate::store::StoreUrl;
use crate::{job_cmd, ops, serve, state_cmd, store, sweep_cmd, template_cmd};

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
    /// A policy (`--policies`) does not parse, or cannot be read (EX_CONFIG).
    pub const CONFIG: u8 = 78;
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
  75  the workspace is busy, or the job has not finished: try again later
  78  a policy (--policies) does not parse or cannot be read; nothing was run";

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
    /// One metrics record per finished job on stderr (`json` or `emf`, as the functions
    /// write them: duration, steps, lease wait, the runner's own share of the start), or `off`.
    #[arg(long, env = "TERRACE_METRICS", default_value = "off", value_parser = ["off", "json", "emf"], global = true)]
    pub(crate) metrics: String,
    /// Folder of price books: plans are estimated when it exists (docs/templates.md).
    #[arg(
        long,
        env = "TERRACE_PRICE_BOOKS",
        default_value = "price-books",
        global = true
    )]
    pub(crate) price_books: PathBuf,
    /// Rego policies (`deny` and `warn` rules, conftest's convention) every plan is held to
    /// before anything is applied (docs/policy.md): a folder, or a set published with
    /// `terrace policy publish` (BUCKET_URL/NAME/VERSION). Read when a command starts: a policy
    /// that does not parse, or a published file that differs from its listing, stops it
    /// (exit 78).
    #[arg(long, env = "TERRACE_POLICIES", global = true, value_name = "DIR|URL")]
    pub(crate) policies: Option<String>,
    /// Seconds one evaluation of the policies may take before it is stopped.
    #[arg(long, env = "TERRACE_POLICY_TIMEOUT", default_value_t = 10, global = true,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) policy_timeout: u64,
    /// MiB of address space one evaluation of the policies may use.
    #[arg(long, env = "TERRACE_POLICY_MEMORY_MB", default_value_t = 1024, global = true,
          value_parser = clap::value_parser!(u64).range(64..=1 << 20))]
    pub(crate) policy_memory_mb: u64,
    /// The policies, once read (`--policies`).
    #[arg(skip)]
    pub(crate) loaded_policies: Option<Arc<shared::run::policy::Policies>>,
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
    /// What the terraform binary answered to `version -json`, recorded with the file's path,
    /// size and modification time (`deploy/record-terraform-version.sh`; the images carry one):
    /// used instead of running it while the binary is that file.
    #[arg(long, env = "TERRACE_TERRAFORM_VERSION_FILE", global = true)]
    pub(crate) terraform_version_file: Option<PathBuf>,
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
    /// Seconds a plan job's plan may wait for its approval before it expires (docs/approval.md).
    #[arg(long, env = "TERRACE_PLAN_TTL", default_value_t = 86_400, global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) plan_ttl: u64,
    /// The platform's age public key (age1…) a job's sensitive outputs are sealed to, in its
    /// result's `sealed_outputs` (docs/outputs.md); without it they are only masked.
    /// (Checked before any command runs; an invalid one is never echoed: it may be a private
    /// key pasted by mistake.)
    #[arg(
        long,
        env = "TERRACE_OUTPUTS_RECIPIENT",
        global = true,
        value_name = "AGE_RECIPIENT",
        hide_env_values = true
    )]
    pub(crate) outputs_recipient: Option<String>,
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
    /// Put a job on a deployed runner's queue (sqs://, pubsub://, azqueue://, amqp[s]://, or a
    /// `serve` queue folder) after checking it against the templates, signed with --sign; with --follow,
    /// stream its log from the store and end with its result and exit code, as `run` does.
    Submit(crate::submit_cmd::SubmitArgs),
    /// Process job files dropped into a folder (each moved to done/ or failed/ with its result),
    /// or jobs from a RabbitMQ queue as one of several workers (docs/self-hosted.md).
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
    /// Policy sets: check one, or publish one to a bucket (docs/policy.md).
    #[command(subcommand)]
    Policy(crate::policy_cmd::PolicyCmd),
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
    /// `terrace serve` queue folder or messages on a broker's jobs queue (run it on a
    /// schedule). Workspaces whose last apply had sensitive variables are listed instead: send
    /// their checks with the secrets.
    Drift {
        /// The queue `terrace serve --queue` reads: a folder, or amqp[s]://… (docs/self-hosted.md)
        #[arg(long)]
        queue: PathBuf,
        /// Sign each check with this Ed25519 private key, for a `serve --senders` that lists
        /// its public key (docs/signing.md).
        #[arg(long, value_name = "KEY")]
        sign: Option<PathBuf>,
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
        /// Open the result's sealed sensitive outputs with this age identity file
        /// (`age-keygen`'s) and print them as one JSON object, name to value.
        #[arg(long, value_name = "FILE", conflicts_with = "json")]
        identity: Option<PathBuf>,
        #[command(flatten)]
        out: ops::Output,
    },
    /// Cancel a job: a queued one never runs, a running one is stopped within a few seconds
    /// (terraform is interrupted, then given its grace period); a finished one is left as it is.
    Cancel {
        /// The job's id.
        job: String,
        /// The job's TENANT/WORKSPACE; needed for a job that has not started yet, and with --to.
        #[arg(long, short)]
        workspace: Option<WorkspaceId>,
        /// Send the cancel to a deployed runner's jobs queue (as `submit --to` takes) instead of
        /// writing it to the store: the runner answers on its results channel.
        #[arg(
            long,
            value_name = "QUEUE",
            requires = "workspace",
            conflicts_with = "json"
        )]
        to: Option<String>,
        /// With --to, sign the cancel with this Ed25519 private key (docs/signing.md).
        #[arg(long, value_name = "KEY", requires = "to")]
        sign: Option<PathBuf>,
        #[command(flatten)]
        out: ops::Output,
    },
    /// Make an Ed25519 key for signing jobs (docs/signing.md): the private key goes to --out
    /// (PKCS#8 PEM, readable by you only), the public key, for the runner's tenant registry
    /// (`senders`), is printed.
    Keygen {
        /// Where to write the private key; an existing file is never overwritten.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Print the JSON Schema of a record Terrace reads or writes (job, job-message, result,
    /// message, each --json answer…); without NAME, list them. The same files are in
    /// docs/schema/.
    Schema {
        /// The schema's name; `terrace schema` lists them.
        name: Option<String>,
        /// Write every schema to this folder as NAME.schema.json instead.
        #[arg(long, conflicts_with = "name")]
        write: Option<PathBuf>,
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
    if let Some(code) = shared::run::policy::child::answer_if_asked() {
        return code;
    }
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
                // lapin logs each returned message whole (a record, bytes by bytes): Terrace
                // says what it means itself.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,lapin::returned_messages=error")
                }),
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
    let mut g = cli.global;
    // Read by the commands that plan (and `validate`, which says whether they parse) only:
    // a broken set must not stand between anyone and `result`, `logs` or `state`.
    let plans = matches!(
        cli.command,
        Cmd::Run { .. } | Cmd::Estimate { .. } | Cmd::Validate { .. } | Cmd::Serve(_)
    );
    if let Some(text) = g.policies.clone().filter(|_| plans) {
        match crate::policy_cmd::load(&g, &text).await {
            Ok(policies) => g.loaded_policies = Some(policies),
            Err(e) => {
                eprintln!("error: --policies (or TERRACE_POLICIES): {e}");
                return Ok(exit::CONFIG);
            }
        }
    }
    if let Err(e) = g.store.parse::<StoreUrl>() {
        eprintln!("error: --store (or TERRACE_STORE): {e}");
        return Ok(exit::USAGE);
    }
    if let Some(Err(why)) = g
        .outputs_recipient
        .as_deref()
        .map(str::parse::<shared::run::sealed_outputs::OutputsRecipient>)
    {
        eprintln!(
            "error: --outputs-recipient (or TERRACE_OUTPUTS_RECIPIENT) {why}: {}",
            shared::run::sealed_outputs::RECIPIENT_FIX
        );
        return Ok(exit::USAGE);
    }
    match cli.command {
        Cmd::Validate { job } => job_cmd::validate(&g, &job).await,
        Cmd::Run { job, wait, out } => job_cmd::run(&g, &job, wait, out).await,
        Cmd::Estimate { job, wait, out } => job_cmd::estimate(&g, &job, wait, out).await,
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
            identity,
            out,
        } => {
            let store = g.open_store().await?;
            let ask = ops::ResultAsk {
                job_id: &job,
                ws: workspace.as_ref(),
                identity: identity.as_deref(),
                out,
            };
            ops::result(&*store, ask).await
        }
        Cmd::Cancel {
            job,
            workspace,
            to: Some(to),
            sign,
            ..
        } => {
            let ask = crate::cancel_cmd::SendCancel {
                job: &job,
                ws: workspace.as_ref(),
                to: &to,
                sign: sign.as_deref(),
            };
            crate::cancel_cmd::send_cancel(ask).await
        }
        Cmd::Cancel {
            job,
            workspace,
            to: None,
            out,
            ..
        } => {
            crate::cancel_cmd::cancel(&*g.open_store().await?, &job, workspace.as_ref(), out).await
        }
        Cmd::Keygen { out } => crate::submit_cmd::keygen(&out),
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
        Cmd::Schema { name, write } => crate::output::schema_cmd(name.as_deref(), write.as_deref()),
        Cmd::Serve(args) => serve::serve(&g, args).await,
        Cmd::Submit(args) => crate::submit_cmd::submit(&g, args).await,
        Cmd::State(cmd) => state_cmd::run(&g, cmd).await,
        Cmd::Template(cmd) => template_cmd::run(&g, cmd).await,
        Cmd::Module(cmd) => Ok(template_cmd::module(cmd)),
        Cmd::Policy(cmd) => crate::policy_cmd::run(cmd).await,
        Cmd::Drift { queue, sign } => sweep_cmd::drift(&g, &queue, sign.as_deref()).await,
        Cmd::Backup { hourly, daily } => sweep_cmd::backup(&g, hourly, daily).await,
    }
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
            version_record: g.terraform_version_file.clone(),
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
            backend: Vec::new(),
        },
        lease_ttl: Duration::from_secs(g.lease_ttl.max(1)),
        plan_ttl: Duration::from_secs(g.plan_ttl),
        // The CLI's stores read `TERRACE_CALL_TIMEOUT` as they are opened (store.rs).
        call_timeout: state_backends::CALL_TIMEOUT,
        task_lease_wait: Duration::ZERO,
        client_cache: g.cache_dir.clone().or_else(default_cache_dir),
        console: !g.quiet,
        // The summary is what a person reads here; metrics records only when asked for.
        metrics: match g.metrics.as_str() {
            "json" => Some(shared::run::metrics::Format::Json),
            "emf" => Some(shared::run::metrics::Format::Emf),
            _ => None,
        },
        max_state_bytes: usize::try_from(g.max_state_bytes).unwrap_or(usize::MAX),
        // One machine's own sweep (`terrace drift`) checks every workspace.
        drift_per_tenant: usize::MAX,
        signature_window: shared::job::signature::DEFAULT_WINDOW,
        signing_key: None,
        log_tap: None,
        policy: shared::host::settings::PolicySettings {
            runner: g.loaded_policies.clone(),
            ..Default::default()
        },
        // Checked in `dispatch` before any command runs.
        outputs_recipient: g.outputs_recipient.as_deref().and_then(|r| r.parse().ok()),
    }
}

/// `$XDG_CACHE_HOME/terrace`, else `$HOME/.cache/terrace`; none without either.
pub(crate) fn default_cache_dir() -> Option<PathBuf> {
    let nonempty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| nonempty("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .map(|dir| dir.join("terrace"))
}
