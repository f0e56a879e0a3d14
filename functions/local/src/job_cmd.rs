//! The commands that run or check one job: `validate`, `run`, `estimate`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use shared::job::template::source::Templates;
use shared::job::validate::{ValidatedJob, ValidationError, fetch_and_validate};
use shared::job::{Operation, RawJob};
use shared::run::result::Status;
use shared::run::runner::{RunOutcome, Runner};
use tokio_util::sync::CancellationToken;

use crate::cli::{Global, runtime};
use crate::summary::{exit_code, print_cost, print_policy, print_summary};
use crate::{exit, ops};

/// `terrace validate`: every problem of the job, or what it would run.
pub(crate) async fn validate(g: &Global, job: &Path) -> anyhow::Result<u8> {
    Ok(match load_job(job, g, &g.open_templates().await?).await? {
        Ok(v) => {
            outln!(
                "{}: valid ({} {} in {}/{})",
                job.display(),
                v.job.operation,
                v.job.template,
                v.job.tenant,
                v.job.workspace
            );
            // Read and parsed as the command started; judging needs a plan: `estimate`.
            if let Some(p) = &g.loaded_policies {
                outln!(
                    "policies: {} ({} files, {}) parse; `terrace estimate` holds this job's plan to them",
                    p.set.origin,
                    p.set.files.len(),
                    p.set.digest
                );
            }
            exit::OK
        }
        Err(errors) => report_invalid(job, &errors),
    })
}

/// `terrace run`: the job, here, to its end.
pub(crate) async fn run(g: &Global, job: &Path, wait: u64, out: ops::Output) -> anyhow::Result<u8> {
    let templates = g.open_templates().await?;
    let validated = match load_job(job, g, &templates).await? {
        Ok(v) => v,
        Err(errors) => return Ok(report_invalid(job, &errors)),
    };
    let runtime = runtime(g, templates);
    let mut config = runtime.runner_config();
    config.lease_wait = Duration::from_secs(wait);
    take_user(&mut config).await?;
    // Read while the store is opened (from the cache folder, usually); after the user is
    // taken, whose sweep of what the job before left would end it.
    runtime.warm_client();
    let runner = Runner::new(g.open_store().await?, config);
    let cancel = CancellationToken::new();
    tokio::spawn(cancel_on_signal(cancel.clone()));
    match runner.run(&validated, cancel).await {
        Ok(outcome) => Ok(report_outcome(&outcome, out)),
        Err(e) => unrecorded(&e),
    }
}

/// `terrace estimate`: the job planned under an id of its own (so the job itself can still
/// run), its plan priced and held to the policies, nothing applied.
pub(crate) async fn estimate(
    g: &Global,
    path: &Path,
    wait: u64,
    out: ops::Output,
) -> anyhow::Result<u8> {
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
    // Without price books, an estimate still holds the plan to the policies.
    if !g.price_books.is_dir() && g.loaded_policies.is_none() {
        eprintln!(
            "error: there are no price books at {}: point --price-books (or TERRACE_PRICE_BOOKS) at a folder of them (docs/templates.md), or --policies at policies to hold the plan to",
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
        ops::print_json(&crate::output::Estimated {
            schema: ops::JSON_SCHEMA,
            job_id: result.job_id.clone(),
            status: result.status,
            changes: result.changes.clone(),
            cost: result.cost.clone(),
            policy: result.policy.clone(),
            error: result.error.clone(),
        });
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
        print_policy(&result);
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

/// Terraform's user for the one job this command runs (`TERRACE_TERRAFORM_USER`: you by
/// default, `per-job` for a user of the job's own when root). What the job leaves running (a
/// detached provisioner) is killed when it ends, with the runner's configuration.
pub(crate) async fn take_user(
    config: &mut shared::run::runner::RunnerConfig,
) -> anyhow::Result<()> {
    config.terraform.run_one()?;
    config
        .terraform
        .take_user()
        .await
        .map_err(|why| anyhow::anyhow!("{why}"))
}

/// A run whose end could not be recorded: a lost lease (another runner took the workspace over
/// while the job ran) or a store that failed is said as it is, with exit 75 when trying again
/// may pass; anything else is an internal error (70).
///
/// # Errors
/// The run's error, when it is neither.
pub(crate) fn unrecorded(e: &shared::run::runner::RunError) -> anyhow::Result<u8> {
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

/// Reads and validates a job file against `templates` (fetched from their bucket first, if
/// they come from one) and `g`'s cloud; the outer error is for an unreadable file or a bucket
/// that cannot be read.
pub(crate) async fn load_job(
    path: &Path,
    g: &Global,
    templates: &Templates,
) -> anyhow::Result<Result<ValidatedJob, Vec<ValidationError>>> {
    let raw = match read_job(path)? {
        Ok(raw) => raw,
        Err(errors) => return Ok(Err(errors)),
    };
    Ok(fetch_and_validate(&raw, templates, Some(&g.cloud)).await?)
}

/// A job file as written, before its fields are checked.
///
/// # Errors
/// The file cannot be read (the outer error), or is not a YAML or JSON mapping (the inner one:
/// an invalid job, exit 65, `failed/` in a queue, not a runner error).
pub(crate) fn read_job(path: &Path) -> anyhow::Result<Result<RawJob, Vec<ValidationError>>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read job file {}", path.display()))?;
    let Ok(text) = String::from_utf8(bytes) else {
        return Ok(Err(vec![ValidationError::new(
            "",
            "is not UTF-8 text",
            "save the job file as UTF-8 (YAML or JSON)",
        )]));
    };
    Ok(RawJob::parse(&text).map_err(|e| vec![e]))
}

pub(crate) fn report_invalid(path: &Path, errors: &[ValidationError]) -> u8 {
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
pub(crate) fn report_outcome(outcome: &RunOutcome, out: ops::Output) -> u8 {
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
