//! `terrace serve --queue DIR`: a folder as a job queue (or a RabbitMQ broker: [`amqp`]). Job files dropped into `DIR` are claimed
//! by renaming them into `DIR/running/`, run several at once but one at a time per workspace, and
//! moved to `DIR/done/` or `DIR/failed/` beside their result (`<file>.result.json`). An invalid
//! job goes straight to `failed/` with its validation errors. A job whose workspace is leased by
//! another process goes back to the queue and is tried again later.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Args;
use serde_json::Value;
use shared::host::message::{Message, Rejection, TaskStarted};
use shared::host::pipeline::{self, Delivery, Envelope, Fate, Keep, Trigger};
use shared::host::settings::Runtime;
use shared::host::trigger::JobRef;
use shared::host::trigger::TriggerError;
use shared::job::signature::SenderKey;
use shared::job::template::source::Templates;
use shared::job::validate::{ValidatedJob, ValidationError};
use shared::run::terraform::TerraformConfig;
use state_backends::{StateStore, WorkspaceId};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{Global, exit, load_job, runtime};

#[cfg(feature = "amqp")]
pub(crate) mod amqp;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The queue: a folder, or a RabbitMQ broker as
    /// amqp://HOST[:PORT][/VHOST][?jobs=QUEUE&results=EXCHANGE&logs=EXCHANGE], its user and
    /// password in TERRACE_AMQP_USER and TERRACE_AMQP_PASSWORD (or TERRACE_AMQP_PASSWORD_FILE)
    /// (docs/self-hosted.md)
    #[arg(long)]
    queue: String,
    /// How many jobs run at once (never two for the same workspace); on a broker, the prefetch.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Exit once the queue is empty and no job runs (a folder only).
    #[arg(long)]
    once: bool,
    /// How often the folder is scanned, in milliseconds.
    #[arg(long, default_value_t = 500)]
    poll_ms: u64,
    /// On a broker: declare the jobs queue, its delay and dead-letter queues and the results
    /// and log exchanges (durable) if they do not exist; without it they must.
    #[arg(long)]
    declare: bool,
    /// Run only signed jobs and cancels for the tenants this file names: YAML or JSON mapping
    /// each tenant to the Ed25519 public keys allowed to send its jobs (docs/signing.md).
    #[arg(long, value_name = "FILE")]
    senders: Option<PathBuf>,
}

/// The first folder above `path` that users other than its owner cannot search (no `o+x`),
/// if any: a job's own user cannot reach `path` through it.
fn unsearchable(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    // A bare name (`terraform`) is found on PATH.
    if !path.is_absolute() {
        return None;
    }
    path.ancestors()
        .skip(1)
        .filter(|dir| !dir.as_os_str().is_empty())
        .find(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
        .map(Path::to_owned)
}

/// Whether the file is a cancel message (`{"cancel": …}`) rather than a job.
fn is_cancel(path: &Path) -> bool {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .is_some_and(|v| v.get("cancel").is_some())
}

/// `--senders`: tenant → the keys allowed to send its jobs.
///
/// # Errors
/// A file that cannot be read, is not a mapping, or holds an entry that is not a list of keys:
/// named, with the fix.
fn read_senders(path: &Path) -> Result<BTreeMap<String, Vec<SenderKey>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--senders {}: cannot read it: {e}", path.display()))?;
    let doc = shared::job::RawJob::parse(&text).map_err(|e| {
        format!(
            "--senders {}: {}: map each tenant to a list of public keys",
            path.display(),
            e.problem
        )
    })?;
    doc.0
        .into_iter()
        .map(|(tenant, keys)| {
            if let Err(e) = state_backends::check_name(&tenant) {
                return Err(format!(
                    "--senders {}: tenant {tenant:?} {}",
                    path.display(),
                    e.reason
                ));
            }
            shared::host::tenants::parse_senders(&keys)
                .map(|keys| (tenant.clone(), keys))
                .map_err(|why| {
                    format!(
                        "--senders {}: tenant {tenant:?} {why}: {}",
                        path.display(),
                        shared::job::signature::SENDER_FIX
                    )
                })
        })
        .collect()
}

/// Where a finished job file goes.
enum Verdict {
    Done,
    Failed,
    /// Back to the queue, not before the instant.
    Retry(Instant),
}

struct Finished {
    verdict: Verdict,
    result: Option<serde_json::Value>,
}

pub async fn serve(g: &Global, args: ServeArgs) -> anyhow::Result<u8> {
    if args.queue.contains("://") {
        return serve_broker(g, &args).await;
    }
    let q = &PathBuf::from(&args.queue);
    for sub in ["running", "done", "failed"] {
        std::fs::create_dir_all(q.join(sub))?;
    }
    // One server per queue folder: the lock is held until the process ends.
    let lock = std::fs::File::create(q.join(".serve.lock"))?;
    if lock.try_lock().is_err() {
        eprintln!(
            "another `terrace serve` is using the queue {}; stop it first",
            q.display()
        );
        return Ok(exit::BUSY);
    }
    recover_orphans(q)?;
    let (runtime, senders, templates) = match setup(g, &args).await? {
        Ok(set) => set,
        Err(code) => return Ok(code),
    };
    let folder = Arc::new(Folder {
        runtime,
        store: g.open_store().await?,
        senders,
    });
    let cancel = CancellationToken::new();
    tokio::spawn(crate::cancel_on_signal(cancel.clone()));
    eprintln!(
        "serving queue {} ({} at once)",
        q.display(),
        args.concurrency.max(1)
    );
    run_folder(g, &args, q, folder, &templates, cancel).await
}

/// `--queue amqp://…`: a worker on a RabbitMQ broker.
#[cfg(feature = "amqp")]
async fn serve_broker(g: &Global, args: &ServeArgs) -> anyhow::Result<u8> {
    let broker = match amqp::Broker::parse(&args.queue) {
        Ok(broker) => broker,
        Err(why) => {
            eprintln!("error: --queue: {why}");
            return Ok(exit::USAGE);
        }
    };
    let credentials = match amqp::Credentials::from_env() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(exit::USAGE);
        }
    };
    if args.once {
        eprintln!(
            "error: --once is for a folder queue: a broker's queue is never known to be empty for good"
        );
        return Ok(exit::USAGE);
    }
    let (runtime, senders, _) = match setup(g, args).await? {
        Ok(set) => set,
        Err(code) => return Ok(code),
    };
    let worker = amqp::Worker {
        runtime,
        store: g.open_store().await?,
        senders,
        concurrency: args.concurrency,
        declare: args.declare,
    };
    amqp::serve(broker, credentials, worker).await
}

#[cfg(not(feature = "amqp"))]
async fn serve_broker(_: &Global, args: &ServeArgs) -> anyhow::Result<u8> {
    eprintln!(
        "error: --queue {}: this terrace was built without the amqp feature (a folder queue works)",
        args.queue
    );
    Ok(exit::USAGE)
}

/// What every queue's worker needs: the runtime (templates, terraform, its users) and the
/// tenants that take only signed jobs; `Err` with the exit code once the problem is printed.
async fn setup(
    g: &Global,
    args: &ServeArgs,
) -> anyhow::Result<Result<(Runtime, BTreeMap<String, Vec<SenderKey>>, Templates), u8>> {
    let senders = match args.senders.as_deref().map(read_senders).transpose() {
        Ok(senders) => senders.unwrap_or_default(),
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(Err(exit::USAGE));
        }
    };
    let templates = g.open_templates().await?;
    let mut runtime = runtime(g, templates.clone());
    runtime.warm_client();
    runtime.signature_window = match shared::host::settings::signature_window() {
        Ok(window) => window,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Err(exit::USAGE));
        }
    };
    if !senders.is_empty() {
        let names: Vec<&str> = senders.keys().map(String::as_str).collect();
        eprintln!(
            "only signed jobs and cancels run for tenant(s) {}; any other tenant's run unsigned",
            names.join(", ")
        );
    }
    runtime.terraform.serve_jobs(false)?;
    if runtime.terraform.per_job_users {
        let t = &runtime.terraform;
        let paths = t.cli_config.iter().chain(std::iter::once(&t.binary));
        for (path, hidden) in paths.filter_map(|p| unsearchable(p).map(|h| (p, h))) {
            eprintln!(
                "warning: each job's terraform runs as a user of its own, which cannot reach {} ({} is not searchable by other users): `chmod o+x {}` (scripts/searchable-checkout.sh does it for a checkout), or run jobs as yourself with TERRACE_TERRAFORM_USER=root",
                path.display(),
                hidden.display(),
                hidden.display()
            );
        }
    }
    if !runtime.terraform.per_job_users && args.concurrency > 1 {
        let side_by_side = if std::env::var_os("TERRACE_TERRAFORM_USER").is_some() {
            "run as root with TERRACE_TERRAFORM_USER unset"
        } else {
            "run as root"
        };
        eprintln!(
            "terraform runs as one user for every job, so jobs run one at a time (what a job leaves running must never meet the next): {side_by_side} for jobs side by side, each as a user of its own"
        );
    }
    Ok(Ok((runtime, senders, templates)))
}

/// The folder queue's loop: scans, claims and runs job files until a signal (or `--once`).
async fn run_folder(
    g: &Global,
    args: &ServeArgs,
    q: &Path,
    folder: Arc<Folder>,
    templates: &Templates,
    cancel: CancellationToken,
) -> anyhow::Result<u8> {
    let mut tasks: JoinSet<Finished> = JoinSet::new();
    let mut claimed: HashMap<tokio::task::Id, (String, String)> = HashMap::new();
    let mut active: HashSet<String> = HashSet::new();
    let mut not_before: HashMap<String, Instant> = HashMap::new();
    let poll = Duration::from_millis(args.poll_ms.max(10));
    loop {
        let mut pending = 0;
        if !cancel.is_cancelled() {
            let names = queued_files(q).unwrap_or_else(|e| {
                eprintln!("cannot list the queue {}: {e:#}", q.display());
                Vec::new()
            });
            for name in names {
                if not_before.get(&name).is_some_and(|t| Instant::now() < *t) {
                    pending += 1;
                    continue;
                }
                let path = q.join(&name);
                // A cancel (`terrace cancel --to FOLDER`) goes straight to the pipeline.
                let ws = if is_cancel(&path) {
                    format!("cancel:{name}")
                } else {
                    let validated = match load_job(&path, g, templates).await {
                        Ok(Ok(v)) => v,
                        Ok(Err(errors)) => {
                            let report = Message::Rejection(Rejection::new(&name, errors.clone()))
                                .to_value();
                            match finish(q, &path, "failed", &report, templates.root()) {
                                Ok(()) => eprintln!(
                                    "{name}: invalid job, moved to failed/ ({} problem(s))",
                                    errors.len()
                                ),
                                Err(e) => {
                                    eprintln!(
                                        "{name}: invalid job, and it could not be moved: {e:#}"
                                    )
                                }
                            }
                            continue;
                        }
                        Err(e) => {
                            eprintln!("{name}: {e:#}");
                            continue;
                        }
                    };
                    format!("{}/{}", validated.job.tenant, validated.job.workspace)
                };
                if active.contains(&ws) || tasks.len() >= args.concurrency.max(1) {
                    pending += 1;
                    continue;
                }
                let running = q.join("running").join(&name);
                if let Err(e) = std::fs::rename(&path, &running) {
                    eprintln!("{name}: cannot claim it: {e}");
                    continue;
                }
                active.insert(ws.clone());
                let (folder, cancel) = (folder.clone(), cancel.child_token());
                let handle = tasks.spawn(async move {
                    let body = match std::fs::read(&running) {
                        Ok(body) => body,
                        Err(e) => {
                            eprintln!("{}: cannot read it: {e}", running.display());
                            return Finished {
                                verdict: Verdict::Retry(Instant::now() + Duration::from_secs(5)),
                                result: None,
                            };
                        }
                    };
                    let message_id = running
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let delivery = Delivery {
                        message_id: &message_id,
                        body: &body,
                        time_left: None,
                        lease_wait: Duration::ZERO,
                        cancel,
                        receipt: None,
                    };
                    settled(pipeline::handle(&*folder, delivery).await)
                });
                claimed.insert(handle.id(), (name, ws));
            }
        }

        if tasks.is_empty() && (cancel.is_cancelled() || (args.once && pending == 0)) {
            return Ok(exit::OK);
        }
        tokio::select! {
            Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let (id, done) = match joined {
                    Ok((id, done)) => (id, done),
                    Err(e) => {
                        // The job's task panicked; its lease frees itself, the file goes back.
                        (e.id(), Finished { verdict: Verdict::Retry(Instant::now() + Duration::from_secs(5)), result: None })
                    }
                };
                let Some((name, ws)) = claimed.remove(&id) else { continue };
                active.remove(&ws);
                if let Err(e) = settle(q, &name, done, &mut not_before, templates.root()) {
                    eprintln!("{name}: could not move it out of running/: {e:#}");
                }
            }
            () = tokio::time::sleep(poll) => {}
            () = cancel.cancelled(), if !cancel.is_cancelled() => {}
        }
    }
}

/// Moves a finished job file out of `running/`: to done/ or failed/ with its result, or back to
/// the queue to be tried again.
fn settle(
    q: &Path,
    name: &str,
    done: Finished,
    not_before: &mut HashMap<String, Instant>,
    templates: &Path,
) -> anyhow::Result<()> {
    let running = q.join("running").join(name);
    match done.verdict {
        Verdict::Retry(at) => {
            std::fs::rename(&running, q.join(name))?;
            not_before.insert(name.to_owned(), at);
        }
        Verdict::Done | Verdict::Failed => {
            let folder = if matches!(done.verdict, Verdict::Done) {
                "done"
            } else {
                "failed"
            };
            finish(
                q,
                &running,
                folder,
                &done.result.unwrap_or(serde_json::Value::Null),
                templates,
            )?;
            eprintln!("{name}: {folder}");
        }
    }
    Ok(())
}

/// Where a job file goes for its fate: done/ or failed/ with its result, or back to the queue.
fn settled(fate: Fate) -> Finished {
    let retry = |after: Duration| Verdict::Retry(Instant::now() + after);
    let (verdict, result) = match fate {
        Fate::Ran(result) => {
            // A cancel that was answered is done too.
            let ok = result["status"] == "succeeded" || result["kind"] == "cancel";
            let verdict = if ok { Verdict::Done } else { Verdict::Failed };
            (verdict, Some(result))
        }
        Fate::Rejected(record) => (Verdict::Failed, Some(record)),
        // Another process holds the workspace: tried again when its lease should end.
        Fate::Again {
            delay: Some(delay), ..
        }
        | Fate::Requeued { delay, .. } => (retry(delay.min(Duration::from_secs(30))), None),
        Fate::Again { why, delay: None } => {
            eprintln!("runner error: {why}");
            (retry(Duration::from_secs(5)), None)
        }
        Fate::Interrupted(_) => (retry(Duration::ZERO), None),
        Fate::HandedOff(record) => (Verdict::Done, Some(record)),
    };
    Finished { verdict, result }
}

/// The folder queue as a trigger of the one pipeline: a message is a job file (YAML or JSON),
/// the store is the local folder, and the result is written beside the file.
struct Folder {
    runtime: Runtime,
    store: Arc<dyn StateStore>,
    /// `--senders`: the tenants that take only signed jobs, with their keys.
    senders: BTreeMap<String, Vec<SenderKey>>,
}

/// A job file names no customer: the store is this machine's.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
struct Here {}

#[async_trait]
impl Trigger for Folder {
    type Target = Here;

    fn envelope_fix(&self) -> &'static str {
        "write a job: YAML or JSON with id, tenant, workspace, operation, template and variables"
    }

    /// `terrace backup` and `terrace drift` sweep the store `--store` names themselves.
    fn bucket_of(&self, _: &Here) -> String {
        "the runner's store".into()
    }

    fn decode(&self, body: &[u8]) -> Result<Envelope<Here>, String> {
        let text = std::str::from_utf8(body).map_err(|e| format!("is not text: {e}"))?;
        let job = shared::job::RawJob::parse(text).map_err(|e| e.to_string())?;
        Ok(Envelope {
            job: job.0,
            target: Some(Here {}),
            requeued: 0,
        })
    }

    fn check_target(&self, _: &Here) -> Vec<ValidationError> {
        Vec::new()
    }

    /// The target is this machine: there is no other account a message could name.
    fn tenants(&self) -> Option<&shared::host::tenants::Tenants<Here>> {
        None
    }

    fn own_target(&self) -> Option<Here> {
        Some(Here {})
    }

    fn senders(&self, tenant: &str) -> &[SenderKey] {
        self.senders.get(tenant).map_or(&[], Vec::as_slice)
    }

    fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    async fn store(
        &self,
        _: &Here,
        _: &str,
        _: Option<&WorkspaceId>,
    ) -> Result<Arc<dyn StateStore>, TriggerError> {
        Ok(self.store.clone())
    }

    async fn terraform_access(
        &self,
        _: &Here,
        _: &ValidatedJob,
        _: &mut TerraformConfig,
    ) -> Result<Keep, TriggerError> {
        Ok(None)
    }

    /// The result goes beside the job file (see [`settled`]).
    async fn report(&self, _: &Message) {}

    /// The serve loop puts the job file back in the folder, not to be tried before the delay
    /// (see [`settled`]).
    async fn requeue(&self, _: &[u8], _: Duration) -> Result<(), TriggerError> {
        Ok(())
    }

    fn cannot_hand_off(&self) -> Option<String> {
        Some("a local job has no time limit but its own timeout".into())
    }

    async fn start_task(&self, _: &JobRef<Here>, _: Duration) -> Result<TaskStarted, TriggerError> {
        Err("a local runner hands nothing off".into())
    }
}

/// Job files waiting in the queue folder, oldest name first.
fn queued_files(q: &Path) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(q)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            !n.starts_with('.')
                && [".json", ".yaml", ".yml"]
                    .iter()
                    .any(|ext| n.ends_with(ext))
        })
        .collect();
    names.sort();
    Ok(names)
}

/// Moves a job file to `folder` and writes its result beside it.
fn finish(
    q: &Path,
    from: &Path,
    folder: &str,
    result: &serde_json::Value,
    templates: &Path,
) -> anyhow::Result<()> {
    let name = from.file_name().expect("job files have names");
    let to = q.join(folder).join(name);
    let mut result_name = name.to_owned();
    result_name.push(".result.json");
    std::fs::write(
        q.join(folder).join(result_name),
        serde_json::to_vec_pretty(result)?,
    )?;
    // The job's sensitive values do not stay in the folder once it is done with.
    let masked = match String::from_utf8(std::fs::read(from)?) {
        Ok(text) => masked_job(&text, templates, from),
        Err(bytes) => Some(unreadable(bytes.as_bytes())),
    };
    if let Some(masked) = masked {
        std::fs::write(from, masked)?;
    }
    std::fs::rename(from, to)?;
    Ok(())
}

/// A job file's text with what a record must not keep masked ([`shared::host::trigger::mask_job`]),
/// as JSON for a `.json` file, YAML otherwise; `None` when nothing is to be masked. A file that
/// is not a job Terrace can read (a key given twice, not YAML) cannot be searched for secrets:
/// only a note with its size and SHA-256 stays.
fn masked_job(text: &str, templates: &Path, path: &Path) -> Option<String> {
    let Ok(mut job) = shared::job::RawJob::parse(text) else {
        return Some(unreadable(text.as_bytes()));
    };
    if !shared::host::trigger::mask_job(&mut job.0, templates) {
        return None;
    }
    let doc = Value::Object(job.0);
    if path.extension().is_some_and(|e| e == "json") {
        serde_json::to_string_pretty(&doc).ok()
    } else {
        serde_norway::to_string(&doc).ok()
    }
}

/// What stays of a job file Terrace could not read (not text, not a job): a note with its size
/// and SHA-256, since it cannot be searched for secrets.
fn unreadable(data: &[u8]) -> String {
    format!(
        "# Not a job Terrace could read (its result beside this file says why). Its text is\n# not kept: it may hold secrets. {} bytes, sha256 {}\n",
        data.len(),
        state_backends::sha256_hex(data)
    )
}

/// Jobs left in `running/` by a server that died go back to the queue; their runs are either
/// finished (and will not run again) or will run again once their lease expires. Safe because
/// the queue's lock says no other server is using the folder.
fn recover_orphans(q: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(q.join("running"))? {
        let entry = entry?;
        let target = q.join(entry.file_name());
        if !target.exists() {
            std::fs::rename(entry.path(), target)?;
        }
    }
    Ok(())
}
