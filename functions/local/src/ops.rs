//! What an operator reads about a workspace's runs, on any store: `terrace workspaces`,
//! `runs`, `result` and `logs` (with `--follow`), each with `--json` (the schema is in
//! docs/cli-json.md; `schema` is raised when a field changes meaning or goes away).

use std::collections::BTreeSet;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use futures::StreamExt as _;
use serde::Serialize;
use shared::run::records::{JOB_FILE, JobRecord, RESULT_FILE};
use shared::run::result::JobResult;
use state_backends::{StateStore, WorkspaceId, display_time};
use time::OffsetDateTime;

use crate::exit;
use crate::output;

/// The format of every `--json` answer of this CLI.
pub const JSON_SCHEMA: u32 = 1;

/// `--json` on a read command.
#[derive(Args, Debug, Clone, Copy)]
pub struct Output {
    /// Print JSON (the schema is in docs/cli-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One run of a workspace, as `terrace runs` lists it.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct RunSummary {
    pub job_id: String,
    /// `succeeded`, `failed`, `cancelled`, `timed-out`, `interrupted`, `superseded` (from the result);
    /// `running` (its lease is live), `unfinished` (no result, no live lease: its runner
    /// stopped; the next job on the workspace records it as interrupted), `queued` (handed to
    /// a task that has not started), `unreadable`, `unknown` (none of those records).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The lease's fencing token: later runs of a workspace have larger ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// `category at step: message` of a failed run, or why the run cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The runs of `ws`, newest first: one listing, then the job and result records of each run
/// (read 16 at a time).
///
/// # Errors
/// Store failures.
pub async fn runs_of(store: &dyn StateStore, ws: &WorkspaceId) -> anyhow::Result<Vec<RunSummary>> {
    let ids: Vec<String> = store
        .runs(ws)
        .await?
        .into_iter()
        .filter(|id| !id.starts_with('_'))
        .collect();
    let live = live_owner(store, ws).await?;
    let mut runs: Vec<RunSummary> = futures::stream::iter(ids)
        .map(|id| read_run(store, ws, id, live.as_deref()))
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|read| read.map(|(run, _)| run))
        .collect::<anyhow::Result<_>>()?;
    // A job that took the workspace while the records were read is running, not unfinished.
    if runs.iter().any(|r| r.status == "unfinished")
        && let Some(owner) = live_owner(store, ws).await?
        && let Some(run) = runs.iter_mut().find(|r| r.job_id == owner)
        && run.status == "unfinished"
    {
        run.status = "running".into();
    }
    // Newest first: runs not started yet (no fence), then by the lease's fence, which grows
    // with each run of the workspace.
    runs.sort_by(|a, b| {
        let key = |r: &RunSummary| (r.fence.is_none(), r.fence, r.started_at.clone());
        key(b).cmp(&key(a)).then_with(|| a.job_id.cmp(&b.job_id))
    });
    Ok(runs)
}

/// A run's summary from its records, and its result as read (or why it is not one).
async fn read_run(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: String,
    live_owner: Option<&str>,
) -> anyhow::Result<(RunSummary, Option<Result<JobResult, String>>)> {
    let (record, result) = tokio::try_join!(
        store.artifact(ws, &job_id, JOB_FILE),
        store.artifact(ws, &job_id, RESULT_FILE)
    )?;
    let mut run = RunSummary {
        status: String::new(),
        operation: None,
        template: None,
        fence: None,
        started_at: None,
        finished_at: None,
        duration_ms: None,
        error: None,
        job_id,
    };
    let mut problems = Vec::new();
    if let Some(bytes) = &record {
        match JobRecord::parse(bytes) {
            Ok(r) => {
                run.operation = Some(r.operation.to_string());
                run.template = Some(r.template.to_string());
                if let Some(lease) = r.lease {
                    run.fence = Some(lease.fence);
                    run.started_at = Some(lease.acquired_at);
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    let mut parsed = None;
    match result.as_deref().map(serde_json::from_slice::<JobResult>) {
        Some(Ok(r)) => {
            run.status = r.status.as_str().to_owned();
            run.operation = Some(r.operation.to_string());
            run.started_at = Some(display_time(r.started_at));
            run.finished_at = Some(display_time(r.finished_at));
            run.duration_ms = Some(r.duration_ms);
            run.error = r.error.as_ref().map(shared::run::result::JobError::summary);
            // An interrupted job runs again under its own id: it is running if it holds the
            // workspace now.
            if r.status == shared::run::result::Status::Interrupted
                && live_owner == Some(run.job_id.as_str())
            {
                run.status = "running".into();
            }
            parsed = Some(Ok(r));
        }
        Some(Err(e)) => {
            problems.push(format!("{RESULT_FILE} is not a result: {e}"));
            parsed = Some(Err(e.to_string()));
        }
        None if live_owner == Some(run.job_id.as_str()) => run.status = "running".into(),
        None if record.is_some() => run.status = "unfinished".into(),
        None => {
            let names = store.artifacts(ws, &run.job_id).await?;
            run.status = if names
                .iter()
                .any(|n| shared::host::trigger::is_staged_name(n))
            {
                "queued".into()
            } else {
                "unknown".into()
            };
        }
    }
    if !problems.is_empty() {
        run.status = "unreadable".into();
        run.error = Some(problems.join("; "));
    }
    Ok((run, parsed))
}

/// `terrace workspaces`.
pub async fn workspaces(store: &dyn StateStore, out: Output) -> anyhow::Result<u8> {
    let list = store.workspaces().await?;
    if out.json {
        let names: Vec<String> = list.iter().map(ToString::to_string).collect();
        print_json(&output::Workspaces {
            schema: JSON_SCHEMA,
            workspaces: names,
        });
    } else if list.is_empty() {
        eprintln!("the store holds no workspaces");
    } else {
        for ws in &list {
            outln!("{ws}");
        }
    }
    Ok(exit::OK)
}

/// `terrace runs`.
pub async fn runs(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    limit: usize,
    out: Output,
) -> anyhow::Result<u8> {
    let mut runs = runs_of(store, ws).await?;
    let total = runs.len();
    runs.truncate(limit);
    if out.json {
        print_json(&output::Runs {
            schema: JSON_SCHEMA,
            workspace: ws.to_string(),
            total,
            runs,
        });
        return Ok(exit::OK);
    }
    if runs.is_empty() {
        eprintln!("{ws} has no runs");
        return Ok(exit::OK);
    }
    let paint = Paint::stdout();
    outln!(
        "{:<28}  {:<11}  {:<12}  {:<20}  {:>9}  ERROR",
        "JOB",
        "OPERATION",
        "STATUS",
        "STARTED",
        "DURATION"
    );
    for r in &runs {
        let status = format!("{:<12}", r.status);
        outln!(
            "{:<28}  {:<11}  {}  {:<20}  {:>9}  {}",
            r.job_id,
            r.operation.as_deref().unwrap_or("-"),
            paint.status(&r.status, &status),
            r.started_at.as_deref().unwrap_or("-"),
            r.duration_ms.map_or_else(
                || "-".to_owned(),
                |ms| format!("{:.1}s", ms as f64 / 1000.0)
            ),
            r.error.as_deref().unwrap_or("")
        );
    }
    if total > runs.len() {
        eprintln!("({} older runs not shown; use --limit)", total - runs.len());
    }
    Ok(exit::OK)
}

/// Checks a job id from the command line: `None` when it is one, else why not.
pub(crate) fn bad_job_id(job_id: &str) -> Option<String> {
    if job_id.starts_with('_') || state_backends::check_artifact_name(job_id, "x").is_err() {
        Some(format!(
            "{job_id:?} is not a job id: a job id has no `/` and is not `.` or `..`, and `_` \
             starts the workspace's own records"
        ))
    } else {
        None
    }
}

/// Where a job id is.
pub(crate) enum Found {
    One(WorkspaceId),
    None,
    Several(Vec<WorkspaceId>),
}

/// Finds the workspace holding `job_id`: `ws` when given, else every workspace is looked at
/// (one listing per workspace).
pub(crate) async fn locate(
    store: &dyn StateStore,
    job_id: &str,
    ws: Option<&WorkspaceId>,
) -> anyhow::Result<Found> {
    let candidates = match ws {
        Some(ws) => vec![ws.clone()],
        None => store.workspaces().await?,
    };
    let mut found = Vec::new();
    for ws in candidates {
        if !store.artifacts(&ws, job_id).await?.is_empty() {
            found.push(ws);
        }
    }
    Ok(match found.len() {
        0 => Found::None,
        1 => Found::One(found.remove(0)),
        _ => Found::Several(found),
    })
}

/// `terrace result`.
/// What `terrace result` is asked.
pub struct ResultAsk<'a> {
    pub job_id: &'a str,
    pub ws: Option<&'a WorkspaceId>,
    /// Open the sealed sensitive outputs with this age identity file.
    pub identity: Option<&'a std::path::Path>,
    pub out: Output,
}

/// `terrace result`.
pub async fn result(store: &dyn StateStore, ask: ResultAsk<'_>) -> anyhow::Result<u8> {
    let ResultAsk {
        job_id,
        ws,
        identity,
        out,
    } = ask;
    // A bad identity file is found before the store is read.
    let identities = match identity.map(read_identities).transpose() {
        Ok(identities) => identities,
        Err(why) => {
            eprintln!("error: --identity: {why}");
            return Ok(exit::USAGE);
        }
    };
    if let Some(why) = bad_job_id(job_id) {
        eprintln!("error: {why}");
        return Ok(exit::USAGE);
    }
    let ws = match locate(store, job_id, ws).await? {
        Found::One(ws) => ws,
        Found::None => {
            eprintln!("no job {job_id} in {}", where_(ws));
            return Ok(exit::NOT_FOUND);
        }
        Found::Several(all) => {
            let names: Vec<String> = all.iter().map(ToString::to_string).collect();
            eprintln!(
                "job {job_id} is in {}: name one with -w TENANT/WORKSPACE",
                names.join(", ")
            );
            return Ok(exit::USAGE);
        }
    };
    let live = live_owner(store, &ws).await?;
    let (run, result) = read_run(store, &ws, job_id.to_owned(), live.as_deref()).await?;
    match result {
        Some(Ok(result)) if run.status != "running" => {
            if let Some(identities) = identities {
                return Ok(open_outputs(&ws, &result, &identities));
            }
            if out.json {
                print_json(&serde_json::to_value(&result)?);
            } else {
                crate::summary::print_summary(&result);
            }
            Ok(crate::summary::exit_code(&result))
        }
        Some(Err(e)) if run.status != "running" => {
            anyhow::bail!("{ws}: job {job_id}'s {RESULT_FILE} is not a result: {e}")
        }
        _ => {
            eprintln!(
                "{ws}: job {job_id} has no result yet: it is {}{}",
                run.status,
                match run.status.as_str() {
                    "unfinished" =>
                        " (its runner stopped; the next job on the workspace records it as interrupted)",
                    _ => "",
                }
            );
            Ok(exit::BUSY)
        }
    }
}

async fn live_owner(store: &dyn StateStore, ws: &WorkspaceId) -> anyhow::Result<Option<String>> {
    let now = OffsetDateTime::now_utc();
    Ok(store
        .lease(ws)
        .await?
        .filter(|l| !l.is_expired_at(now))
        .map(|l| l.owner))
}

fn where_(ws: Option<&WorkspaceId>) -> String {
    ws.map_or_else(|| "any workspace".to_owned(), ToString::to_string)
}

/// `terrace status`: the workspace's lifecycle record, with its newest `history` moves.
pub async fn status(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    history: usize,
    out: Output,
) -> anyhow::Result<u8> {
    let Some(record) = shared::run::lifecycle::read(store, ws).await? else {
        // No record: no apply or destroy has started since runners kept one. A workspace with
        // a state is older than records; one with runs only is waiting for its first.
        let (has_state, runs) = (
            store.current_version(ws).await?.is_some(),
            runs_of(store, ws).await?,
        );
        let (status, why) = match (has_state, runs.is_empty()) {
            (true, _) => (
                "unknown",
                "it has a state but no status record yet: the next apply or destroy writes one",
            ),
            (false, false) => ("pending", "no apply or destroy has started in it"),
            (false, true) => {
                eprintln!("{ws}: no such workspace in this store");
                return Ok(exit::NOT_FOUND);
            }
        };
        if out.json {
            print_json(&output::WorkspaceAnswer::without_record(
                ws.to_string(),
                status,
            ));
        } else {
            outln!("{ws}: {status} ({why}; {} run(s) recorded)", runs.len());
        }
        return Ok(exit::OK);
    };
    let skip = record.history.len().saturating_sub(history);
    if out.json {
        print_json(&output::WorkspaceAnswer::of(
            ws.to_string(),
            &record,
            history,
        ));
        return Ok(exit::OK);
    }
    let paint = Paint::stdout();
    let phase = record.status.as_str();
    outln!(
        "{ws}: {} since {} (job {})",
        paint.status(lifecycle_colour(phase), phase),
        display_time(record.since),
        record.job_id
    );
    if let Some(reason) = &record.reason {
        outln!("reason:   {reason}");
    }
    if record.consecutive_failures > 0 {
        outln!(
            "failed:   the last {} run(s) in a row",
            record.consecutive_failures
        );
    }
    outln!("history (newest last):");
    for t in &record.history[skip..] {
        outln!(
            "  {}  {:>12} → {:<12}  {:<11}  {}{}",
            display_time(t.at),
            t.from_name(),
            t.to.as_str(),
            t.operation.as_str(),
            t.job_id,
            t.reason
                .as_ref()
                .map(|r| format!("  ({r})"))
                .unwrap_or_default()
        );
    }
    Ok(exit::OK)
}

/// A lifecycle phase in the colour of the run status it resembles.
fn lifecycle_colour(phase: &str) -> &str {
    match phase {
        "active" | "deleted" => "succeeded",
        "provisioning" | "updating" | "deleting" | "pending" => "running",
        "failed" => "failed",
        _ => "interrupted",
    }
}

/// `terrace logs`.
pub struct LogsArgs {
    pub ws: WorkspaceId,
    pub job: Option<String>,
    pub follow: bool,
    pub interval: Duration,
    pub out: Output,
}

/// Prints a run's log from the store; with `follow`, keeps printing the chunks the running
/// job writes (it stores one a second) until its result is written.
pub async fn logs(store: Arc<dyn StateStore>, a: LogsArgs) -> anyhow::Result<u8> {
    let job_id = match a.job {
        Some(id) => id,
        // The newest run that has started; the newest queued one when none has.
        None => {
            let runs = runs_of(&*store, &a.ws).await?;
            match runs.iter().find(|r| r.fence.is_some()).or(runs.first()) {
                Some(newest) => newest.job_id.clone(),
                None => {
                    eprintln!("{} has no runs", a.ws);
                    return Ok(exit::NOT_FOUND);
                }
            }
        }
    };
    if let Some(why) = bad_job_id(&job_id) {
        eprintln!("error: {why}");
        return Ok(exit::USAGE);
    }
    let json = a.out.json;
    let mut seen = BTreeSet::new();
    let waiting_since = tokio::time::Instant::now();
    let mut waiting_said = false;
    let mut stopped_polls = 0;
    // Set once the run is seen to have ended: one more listing then prints the chunks stored
    // after the last one (the runner stores its last chunk and its result side by side, and
    // lets the lease go only after both).
    let mut ended = false;
    loop {
        let names = store.artifacts(&a.ws, &job_id).await?;
        for name in names.iter().filter(|n| shared::run::logs::is_chunk(n)) {
            if seen.contains(name) {
                continue;
            }
            if let Some(chunk) = store.artifact(&a.ws, &job_id, name).await? {
                for line in shared::run::logs::parse_chunk(name, &chunk)? {
                    if json {
                        outln!(
                            "{}",
                            serde_json::to_string(&line).expect("log lines serialize")
                        );
                    } else {
                        outln!("{}", shared::run::logs::render(&line));
                    }
                }
                if crate::stdout_closed() {
                    return Ok(exit::OK); // `| head` has what it wanted
                }
            }
            seen.insert(name.clone());
        }
        if ended {
            return Ok(exit::OK);
        }
        if !a.follow {
            if names.is_empty() {
                eprintln!("{}: no job {job_id}", a.ws);
                return Ok(exit::NOT_FOUND);
            }
            return Ok(exit::OK);
        }
        if names.is_empty() {
            if waiting_since.elapsed() >= WAIT_TO_START {
                eprintln!(
                    "{}: job {job_id} did not start within {} minutes (is the id right?)",
                    a.ws,
                    WAIT_TO_START.as_secs() / 60
                );
                return Ok(exit::NOT_FOUND);
            }
            if !waiting_said {
                eprintln!("{}: waiting for job {job_id} to start…", a.ws);
                waiting_said = true;
            }
        } else {
            let live = live_owner(&*store, &a.ws).await?;
            let holds = live.as_deref() == Some(job_id.as_str());
            if names.iter().any(|n| n == RESULT_FILE) {
                // Done, unless an interrupted job is running again under its own id.
                if !holds {
                    ended = true;
                    continue;
                }
            } else if names.iter().any(|n| n == JOB_FILE) && !holds {
                // No result and no live lease: the runner may be between its result and its
                // release, so look twice before saying it stopped.
                stopped_polls += 1;
                if stopped_polls >= 2 {
                    eprintln!(
                        "{}: job {job_id}'s runner stopped without a result (the next job on the \
                         workspace records it as interrupted)",
                        a.ws
                    );
                    return Ok(exit::FAILED);
                }
                tokio::time::sleep(a.interval).await;
                continue;
            }
            stopped_polls = 0;
        }
        tokio::time::sleep(a.interval).await;
    }
}

/// The identities of an age identity file, or why not (naming the file, never a key).
fn read_identities(
    path: &std::path::Path,
) -> Result<Vec<shared::run::sealed_outputs::Identity>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    shared::run::sealed_outputs::identities(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Prints a result's sealed outputs, opened, as one JSON object; the job's exit code, or 1
/// when they cannot be opened.
fn open_outputs(
    ws: &WorkspaceId,
    result: &JobResult,
    identities: &[shared::run::sealed_outputs::Identity],
) -> u8 {
    let Some(sealed) = &result.sealed_outputs else {
        let sensitive = result.outputs.values().any(|o| o.sensitive);
        eprintln!(
            "error: {ws}: job {}'s result has no sealed outputs: {}",
            result.job_id,
            if result.status != shared::run::result::Status::Succeeded {
                format!(
                    "the job ended {} (outputs are sealed after a successful apply only)",
                    result.status.as_str()
                )
            } else if sensitive {
                "its runner had no key to seal them to; give the tenant an outputs_recipient in the registry, or the runner TERRACE_OUTPUTS_RECIPIENT, and run the job again".to_owned()
            } else {
                "it has no sensitive output".to_owned()
            }
        );
        return exit::FAILED;
    };
    match shared::run::sealed_outputs::open(sealed, identities) {
        Ok(values) => {
            print_json(&values);
            crate::summary::exit_code(result)
        }
        Err(e) => {
            eprintln!("error: {ws}: job {}'s sealed outputs: {e}", result.job_id);
            exit::FAILED
        }
    }
}

/// How long `logs --follow` waits for a job that has not started.
const WAIT_TO_START: Duration = Duration::from_secs(600);

/// Prints `value` (one of [`crate::output`]'s answers, or a record) as pretty JSON with a
/// final newline.
pub fn print_json(value: &impl Serialize) {
    // Maps with string keys, strings, numbers and lists only: serializing cannot fail.
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    outln!("{text}");
}

/// Colour on a terminal only, and never with `NO_COLOR` set (no-color.org).
pub struct Paint(bool);

impl Paint {
    pub fn stdout() -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Self(!no_color && std::io::stdout().is_terminal())
    }

    /// `text` in the colour of `status`.
    pub fn status(&self, status: &str, text: &str) -> String {
        let code = match status {
            _ if !self.0 => return text.to_owned(),
            "succeeded" => "32",
            "running" | "queued" => "36",
            "failed" | "timed-out" | "unreadable" => "31",
            _ => "33",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }
}
