//! `terrace serve --queue DIR`: a folder as a job queue. Job files dropped into `DIR` are claimed
//! by renaming them into `DIR/running/`, run several at once but one at a time per workspace, and
//! moved to `DIR/done/` or `DIR/failed/` beside their result (`<file>.result.json`). An invalid
//! job goes straight to `failed/` with its validation errors. A job whose workspace is leased by
//! another process goes back to the queue and is tried again later.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use shared::runner::{RunOutcome, Runner};
use state_backends::fs::FsStore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{Global, exit, load_job, runner_config};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The queue folder.
    #[arg(long)]
    queue: PathBuf,
    /// How many jobs run at once (never two for the same workspace).
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Exit once the queue is empty and no job runs.
    #[arg(long)]
    once: bool,
    /// How often the folder is scanned, in milliseconds.
    #[arg(long, default_value_t = 500)]
    poll_ms: u64,
}

/// Where a finished job file goes.
enum Verdict {
    Done,
    Failed,
    /// Back to the queue, not before the instant.
    Retry(Instant),
}

struct Finished {
    name: String,
    workspace: String,
    verdict: Verdict,
    result: Option<serde_json::Value>,
}

pub async fn serve(g: &Global, args: ServeArgs) -> anyhow::Result<u8> {
    let q = &args.queue;
    for sub in ["running", "done", "failed"] {
        std::fs::create_dir_all(q.join(sub))?;
    }
    recover_orphans(q)?;
    let runner = Runner::new(Arc::new(FsStore::new(&g.store)), runner_config(g));
    let cancel = CancellationToken::new();
    tokio::spawn(crate::cancel_on_signal(cancel.clone()));
    eprintln!(
        "serving queue {} ({} at once)",
        q.display(),
        args.concurrency.max(1)
    );

    let mut tasks: JoinSet<Finished> = JoinSet::new();
    let mut active: HashSet<String> = HashSet::new();
    let mut not_before: HashMap<String, Instant> = HashMap::new();
    let poll = Duration::from_millis(args.poll_ms.max(10));
    loop {
        let mut pending = 0;
        if !cancel.is_cancelled() {
            for name in queued_files(q)? {
                if not_before.get(&name).is_some_and(|t| Instant::now() < *t) {
                    pending += 1;
                    continue;
                }
                let path = q.join(&name);
                let validated = match load_job(&path, &g.templates) {
                    Ok(Ok(v)) => v,
                    Ok(Err(errors)) => {
                        let report = serde_json::json!({
                            "status": "rejected",
                            "errors": errors,
                        });
                        finish(q, &path, "failed", &report)?;
                        eprintln!(
                            "{name}: invalid job, moved to failed/ ({} problem(s))",
                            errors.len()
                        );
                        continue;
                    }
                    Err(e) => {
                        eprintln!("{name}: {e:#}");
                        continue;
                    }
                };
                let ws = format!("{}/{}", validated.job.tenant, validated.job.workspace);
                if active.contains(&ws) || tasks.len() >= args.concurrency.max(1) {
                    pending += 1;
                    continue;
                }
                let running = q.join("running").join(&name);
                if std::fs::rename(&path, &running).is_err() {
                    continue; // another server claimed it
                }
                active.insert(ws.clone());
                let (runner, cancel) = (runner.clone(), cancel.child_token());
                tasks.spawn(async move {
                    let outcome = runner.run(&validated, cancel).await;
                    let (verdict, result) = match outcome {
                        Ok(RunOutcome::Finished(r)) | Ok(RunOutcome::AlreadyDone(r)) => {
                            let ok = r.status == shared::result::Status::Succeeded;
                            let verdict = if ok { Verdict::Done } else { Verdict::Failed };
                            (verdict, serde_json::to_value(&*r).ok())
                        }
                        Ok(RunOutcome::Busy { holder }) => {
                            let wait = (holder.expires_at - time::OffsetDateTime::now_utc()).clamp(
                                time::Duration::milliseconds(200),
                                time::Duration::seconds(30),
                            );
                            let wait = Duration::from_millis(wait.whole_milliseconds() as u64);
                            (Verdict::Retry(Instant::now() + wait), None)
                        }
                        Err(e) => {
                            eprintln!("{name}: runner error: {e:#}");
                            (
                                Verdict::Retry(Instant::now() + Duration::from_secs(5)),
                                None,
                            )
                        }
                    };
                    Finished {
                        name,
                        workspace: ws,
                        verdict,
                        result,
                    }
                });
            }
        }

        if tasks.is_empty() && (cancel.is_cancelled() || (args.once && pending == 0)) {
            return Ok(exit::OK);
        }
        tokio::select! {
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                let done = joined?;
                active.remove(&done.workspace);
                let running = q.join("running").join(&done.name);
                match done.verdict {
                    Verdict::Retry(at) => {
                        std::fs::rename(&running, q.join(&done.name))?;
                        not_before.insert(done.name, at);
                    }
                    Verdict::Done | Verdict::Failed => {
                        let folder = if matches!(done.verdict, Verdict::Done) { "done" } else { "failed" };
                        let result = done.result.unwrap_or(serde_json::Value::Null);
                        finish(q, &running, folder, &result)?;
                        eprintln!("{}: {}", done.name, folder);
                    }
                }
            }
            () = tokio::time::sleep(poll) => {}
            () = cancel.cancelled(), if !cancel.is_cancelled() => {}
        }
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
fn finish(q: &Path, from: &Path, folder: &str, result: &serde_json::Value) -> anyhow::Result<()> {
    let name = from.file_name().expect("job files have names");
    let to = q.join(folder).join(name);
    let mut result_name = name.to_owned();
    result_name.push(".result.json");
    std::fs::write(
        q.join(folder).join(result_name),
        serde_json::to_vec_pretty(result)?,
    )?;
    std::fs::rename(from, to)?;
    Ok(())
}

/// Jobs left in `running/` by a server that died go back to the queue; their runs are either
/// finished (and will not run again) or will run again once their lease expires.
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
