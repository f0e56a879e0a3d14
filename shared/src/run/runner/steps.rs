//! Terraform's steps for each operation, with attempts and retries of transient failures,
//! imports after "already exists", unsaved states pushed back, drift, and what the steps found
//! (`Report`); how a stopped job's error reads.

use super::*;

impl Runner {
    /// `init` once, then attempts of the operation; a transient failure is retried with
    /// backoff, each attempt planning afresh from the current state.
    pub(super) async fn steps(
        &self,
        op: Operation,
        retry: RetryPolicy,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let backend_config = s.dir.join(BACKEND_CONFIG);
        s.run(&Command::Init { backend_config }, report)
            .await?
            .ok()?;
        let mut attempt = 1;
        loop {
            let error = match self.attempt(op, s, report).await {
                Ok(()) => {
                    report.attempts.push(Attempt {
                        attempt,
                        error: None,
                        retry_after_ms: None,
                        max_retry_after_ms: None,
                    });
                    return Ok(());
                }
                Err(e) => e,
            };
            let mut error = error;
            if error.category == Category::ProviderConflict
                && op == Operation::Apply
                && report.recovered.len() < MAX_IMPORTS
                && !s.stop.is_cancelled()
            {
                match self.import_existing(&error, s, report).await {
                    Ok(()) => {
                        report.attempts.push(Attempt {
                            attempt,
                            error: Some(error),
                            retry_after_ms: Some(0),
                            max_retry_after_ms: None,
                        });
                        attempt += 1;
                        continue;
                    }
                    Err(NotImported::Why(why)) => {
                        error.hint = format!("{} ({why})", error.hint);
                    }
                    Err(NotImported::NotOurs(hint)) => error.hint = hint,
                }
            }
            let retryable = error.category == Category::Transient && error.retryable;
            if !retryable || attempt >= retry.attempts || s.stop.is_cancelled() {
                report.attempts.push(Attempt {
                    attempt,
                    error: Some(error.clone()),
                    retry_after_ms: None,
                    max_retry_after_ms: None,
                });
                if retryable && attempt >= retry.attempts && attempt > 1 {
                    error.message = format!("{} (gave up after {attempt} attempts)", error.message);
                }
                return Err(error);
            }
            let (delay, ceiling) = (retry.delay(attempt), retry.ceiling(attempt));
            report.attempts.push(Attempt {
                attempt,
                error: Some(error.clone()),
                retry_after_ms: Some(delay.as_millis() as u64),
                max_retry_after_ms: Some(ceiling.as_millis() as u64),
            });
            s.logger
                .runner(
                    &error.step,
                    &format!(
                        "attempt {attempt} of {} failed ({:?}): {}; retrying in {} ms",
                        retry.attempts,
                        error.category,
                        error.message,
                        delay.as_millis()
                    ),
                )
                .await;
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = s.stop.cancelled() => return Err(error),
            }
            attempt += 1;
        }
    }

    /// After "already exists": imports the object into the state when the error and the plan
    /// say unambiguously which planned create met it and the object's id.
    pub(super) async fn import_existing(
        &self,
        error: &JobError,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), NotImported> {
        // The saved plan of the attempt that failed is still in the workdir.
        let shown = s
            .run(&Command::ShowPlan, report)
            .await
            .and_then(Ran::ok)
            .map_err(|e| {
                NotImported::Why(format!(
                    "there is no plan to find the resource in: {}",
                    e.message
                ))
            })?;
        let in_state = self.addresses(s.ws).await.map_err(NotImported::Why)?;
        let import =
            recover::import_for(error, &shown.stdout, &in_state).map_err(NotImported::Why)?;
        // Only what this workspace was making: an object of the same name may be another
        // workspace's, or made by hand, and importing it would hand it to this workspace (whose
        // destroy would delete it).
        if report.earlier.made.is_none() {
            let made = self.made_before(s.ws, &report.earlier).await;
            report.earlier.made = Some(made);
        }
        let earlier = report.earlier.made.as_ref();
        if !report.creating.contains(&import.address)
            && !earlier.is_some_and(|made| made.contains(&import.address))
        {
            return Err(NotImported::NotOurs(format!(
                "no run of this workspace was creating {address}, so {id} may be another workspace's object or one made by hand, and it was not imported: if it is this workspace's, import it (`terraform import {address} {id}`); if not, give this workspace's object another name or delete that one; then run the job again",
                address = import.address,
                id = import.id,
            )));
        }
        s.logger
            .runner(
                "import",
                &format!(
                    "{} already exists in the cloud as {} but not in the state (a create that failed after the cloud made it); importing it",
                    import.address, import.id
                ),
            )
            .await;
        let command = Command::Import {
            address: import.address.clone(),
            id: import.id.clone(),
        };
        s.run(&command, report)
            .await
            .and_then(Ran::ok)
            .map_err(|e| {
                NotImported::Why(format!(
                    "importing {} {} failed: {}",
                    import.address, import.id, e.message
                ))
            })?;
        report.recovered.push(Recovery {
            action: "imported".into(),
            address: import.address,
            id: import.id,
            after: error.message.clone(),
        });
        Ok(())
    }

    /// What earlier runs of `ws` that did not finish may have made, by their stored logs
    /// (this attempt's own chunks left out). A log that cannot be read is no evidence.
    async fn made_before(&self, ws: &WorkspaceId, earlier: &Earlier) -> BTreeSet<String> {
        let own = logs::chunk_prefix(earlier.fence);
        let mut made = BTreeSet::new();
        for run in &earlier.runs {
            let read =
                logs::read_chunks(self.store.as_ref(), ws, run, |name| !name.starts_with(&own));
            match read.await {
                Ok(lines) => made.extend(recover::made_in_log(&lines)),
                Err(e) => {
                    tracing::warn!(job_id = %run, error = %e, "an earlier run's log cannot be read");
                }
            }
        }
        made
    }

    /// Terraform's own copy of a state it could not save (`errored.tfstate`): kept as a run
    /// artifact first, then pushed as a new version with the checks and the fence of any write
    /// from terraform. True when it is now the workspace's current state.
    pub(super) async fn keep_unsaved_state(&self, s: &Steps<'_>, report: &mut Report) -> bool {
        let path = s.dir.join(ERRORED_STATE);
        // The workdir is terraform's (its user's, when it has one): what is there is read as
        // terraform left it, never through a link it made, never beyond a state's size.
        let read = {
            let (path, cap) = (path.clone(), self.config.max_state_bytes);
            tokio::task::spawn_blocking(move || read_own_file(&path, cap)).await
        };
        let data = match read {
            Ok(Ok(Some(data))) => Bytes::from(data),
            Ok(Ok(None)) | Err(_) => return false,
            Ok(Err(why)) => {
                s.logger
                    .runner("apply", &format!("{ERRORED_STATE} is not kept: {why}"))
                    .await;
                return false;
            }
        };
        let mut unsaved = UnsavedState {
            artifact: format!("runs/{}/{ERRORED_STATE}", s.job_id),
            pushed_as: None,
            error: None,
        };
        s.logger
            .runner(
                "apply",
                &format!(
                    "terraform could not save its state ({} bytes in {ERRORED_STATE}); keeping it and pushing it",
                    data.len()
                ),
            )
            .await;
        let mut errors = Vec::new();
        // While the job runs, every wait; once it is stopped, 3 tries in all, so that a store
        // that does not answer cannot hold a stopped job much longer.
        let tries = Tries::after(&UNSAVED_WAITS).until(s.stop, 3);
        let kept = tries
            .run(
                "could not keep the unsaved state",
                StoreError::is_retryable,
                || {
                    self.store
                        .put_artifact(s.ws, s.job_id, ERRORED_STATE, data.clone())
                },
            )
            .await;
        if let Err(e) = kept {
            // The workdir is kept so the file is not lost with it.
            errors.push(format!(
                "cannot keep it in the store ({e}); it stays in {}",
                path.display()
            ));
            unsaved.artifact = path.display().to_string();
            report.keep_workdir = true;
        }
        let push = || async {
            s.server
                .push(data.clone())
                .await
                .map_err(|(why, retryable)| Refused { why, retryable })
        };
        let pushed = match tries
            .run("could not push the unsaved state", |e| e.retryable, push)
            .await
        {
            Ok(version) => {
                unsaved.pushed_as = version;
                let saved = version.map_or_else(
                    || "it was already the current state".to_owned(),
                    |v| format!("saved as state version {v}"),
                );
                s.logger
                    .runner("apply", &format!("the unsaved state is {saved}"))
                    .await;
                true
            }
            Err(Refused { why, .. }) => {
                errors.push(format!("cannot push it: {why}"));
                s.logger
                    .runner(
                        "apply",
                        &format!(
                            "the unsaved state cannot be pushed ({why}); it is kept as {}",
                            unsaved.artifact
                        ),
                    )
                    .await;
                false
            }
        };
        if errors.is_empty() || pushed {
            // Handled: a later step in this workdir must not see it again.
            let _ = tokio::fs::remove_file(&path).await;
        }
        unsaved.error = (!errors.is_empty()).then(|| errors.join("; "));
        report.unsaved_state = Some(unsaved);
        pushed
    }

    /// A drift check's first plan: `plan -refresh-only`, what changed in the infrastructure
    /// since terraform last saw it, attribute by attribute (from `show -json` of that plan,
    /// values terraform or the template mark sensitive masked).
    pub(super) async fn check_drift(
        &self,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let refresh = Command::Plan {
            mode: PlanMode::RefreshOnly,
            detailed_exitcode: true,
            targets: Vec::new(),
        };
        let refreshed = s.run(&refresh, report).await?;
        if !matches!(refreshed.exit_code, Some(0 | 2)) || refreshed.interrupted.is_some() {
            refreshed.ok()?;
            return Ok(());
        }
        // Drift is what terraform names in `resource_drift` messages. Exit 2 alone is not: a
        // refresh-only plan also exits 2 when the state would only be rewritten (an apply's
        // refreshed state after a restore, say) with no resource changed.
        let drifted = !refreshed.events.drifted.is_empty();
        report.drift = Some(drifted);
        if drifted {
            let shown = s.run(&Command::ShowPlan, report).await?.ok()?;
            let drifted = DriftedResource::from_plan_json(&shown.stdout)
                .map_err(|e| JobError::internal("show", e))?;
            for resource in &drifted {
                s.logger
                    .runner("drift", &resource.describe(s.logger.redactor()))
                    .await;
            }
            report.drifted = drifted;
        }
        Ok(())
    }

    /// Prices the saved plan, logs the estimate and holds the job's budget against it: an
    /// apply over budget stops here, before anything is applied.
    pub(super) async fn estimate(
        &self,
        op: Operation,
        costing: &Costing,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let estimated = match s.run(&Command::ShowPlan, report).await.and_then(Ran::ok) {
            Ok(shown) => cost::estimate(&shown.stdout, &costing.books)
                .map_err(|e| JobError::internal("estimate", e)),
            Err(e) => Err(e),
        };
        let mut estimate = match estimated {
            Ok(estimate) => estimate,
            // Without a budget, the estimate is only information: the job goes on.
            Err(e) if costing.budget.is_none() && !s.stop.is_cancelled() => {
                let line = format!("no cost estimate: {}", e.message);
                s.logger.runner("estimate", &line).await;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let mut lines = vec![format!("cost: {}", estimate.headline())];
        lines.extend(
            estimate
                .top
                .iter()
                .map(|t| format!("cost: {} {}", t.address, cost::show_delta(t.monthly_delta))),
        );
        lines.extend(
            estimate
                .not_priced
                .iter()
                .map(|u| format!("cost: not priced: {} ({})", u.address, u.reason)),
        );
        let check = match &costing.budget {
            Some(budget) => Some(
                estimate
                    .check(budget)
                    .map_err(|e| JobError::budget(e, BUDGET_CURRENCY_HINT))?
                    .clone(),
            ),
            None => None,
        };
        match &check {
            Some(c) if c.exceeded => lines.push(format!(
                "budget: exceeded: {}",
                c.reason.as_deref().unwrap_or_default()
            )),
            Some(c) => lines.push(format!(
                "budget: within the max_monthly_increase of {} {}",
                cost::show(c.max_monthly_increase),
                estimate.currency
            )),
            None => {}
        }
        for line in &lines {
            s.logger.runner("estimate", line).await;
        }
        report.cost = Some(estimate);
        match check {
            Some(c) if c.exceeded && op == Operation::Apply => Err(JobError::budget(
                c.reason.unwrap_or_default(),
                "nothing was applied: raise budget.max_monthly_increase if the increase is meant, or change the job's variables so it costs less, and send it again under a new job id",
            )),
            _ => Ok(()),
        }
    }

    /// One attempt: plan, and for apply and destroy, apply the plan; changes and outputs come
    /// from terraform's messages.
    pub(super) async fn attempt(
        &self,
        op: Operation,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        if op == Operation::DriftCheck {
            self.check_drift(s, report).await?;
        }
        let plan = Command::Plan {
            mode: if op == Operation::Destroy {
                PlanMode::Destroy
            } else {
                PlanMode::Normal
            },
            detailed_exitcode: op == Operation::DriftCheck,
            targets: Vec::new(),
        };
        let planned = s.run(&plan, report).await?;
        let planned = match (op, planned.exit_code) {
            // Exit 2: the plan has changes (with -detailed-exitcode).
            (Operation::DriftCheck, Some(0 | 2)) if planned.interrupted.is_none() => {
                if planned.exit_code == Some(2) {
                    report.drift = Some(true);
                }
                planned.outcome
            }
            _ => planned.ok()?,
        };
        let changes = s.changes(planned, report).await?;
        s.logger
            .runner(
                "show",
                &format!(
                    "plan: {} to add, {} to change, {} to destroy",
                    changes.add, changes.change, changes.destroy
                ),
            )
            .await;
        report.changes = Some(changes);
        if let Some(costing) = s.costing {
            self.estimate(op, costing, s, report).await?;
        }
        if !op.mutates() {
            return Ok(());
        }
        let applied = s.run(&Command::Apply, report).await?;
        let saved_by_runner = self.keep_unsaved_state(s, report).await;
        let applied = if saved_by_runner && applied.errors.iter().all(|e| is_state_save_error(e)) {
            // Terraform finished the apply but could not save; the runner saved its state.
            s.logger
                .runner("apply", "the apply itself succeeded; its state is saved")
                .await;
            applied.outcome
        } else {
            applied.ok().map_err(|mut e| {
                if let Some(unsaved) = report.unsaved_state.as_ref().filter(|_| !saved_by_runner) {
                    // In the store (sealed, when the runner seals), or in the kept workdir.
                    let push = if unsaved.artifact.starts_with("runs/") {
                        format!("terrace state push {} --from-run {}", s.ws, s.job_id)
                    } else {
                        format!("terrace state push {} {}", s.ws, unsaved.artifact)
                    };
                    e.hint = format!(
                        "terraform's final state is kept as {}: nothing it made is lost. Push it with `{push}` once the store is reachable, before any other job runs in this workspace",
                        unsaved.artifact
                    );
                }
                e
            })?
        };
        // The apply's `outputs` message has them; `output -json` when it printed none (a state
        // the runner saved for it).
        let outputs = match applied.events.outputs {
            Some(outputs) => outputs,
            None => {
                let output = s.run(&Command::Output, report).await?.ok()?;
                outputs_from_json(&output.stdout).map_err(|e| JobError::internal("output", e))?
            }
        };
        report.outputs = outputs
            .into_iter()
            .map(|(k, mut v)| {
                v.value = s.logger.redactor().redact_json(&v.value);
                (k, v)
            })
            .collect();
        Ok(())
    }
}

/// At most this many objects are imported after "already exists" in one job.
pub(super) const MAX_IMPORTS: usize = 5;

/// Whether a diagnostic is terraform failing to save its state (and nothing else).
pub(super) fn is_state_save_error(message: &str) -> bool {
    let m = message.to_lowercase();
    [
        "failed to persist state",
        "failed to save state",
        "error saving state",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// What the steps found, gathered as they run.
#[derive(Default)]
pub(super) struct Report {
    pub(super) steps: Vec<StepTiming>,
    pub(super) changes: Option<Changes>,
    pub(super) cost: Option<cost::Estimate>,
    pub(super) drift: Option<bool>,
    pub(super) outputs: std::collections::BTreeMap<String, crate::run::result::Output>,
    pub(super) versions: Vec<u64>,
    /// Bytes of the last state version written.
    pub(super) state_bytes: Option<u64>,
    pub(super) attempts: Vec<Attempt>,
    pub(super) cleanup: Option<Cleanup>,
    /// Drift checks: what changed outside terraform, attribute by attribute.
    pub(super) drifted: Vec<DriftedResource>,
    /// The terraform client that ran the job.
    pub(super) client: Option<Client>,
    pub(super) recovered: Vec<Recovery>,
    /// Objects this job's applies may have made (`recover::ApplyCreates::may_have_made`).
    pub(super) creating: BTreeSet<String>,
    /// What earlier runs of the workspace may have made.
    pub(super) earlier: Earlier,
    pub(super) unsaved_state: Option<UnsavedState>,
    /// Something in the workdir could not be saved elsewhere: do not delete it.
    pub(super) keep_workdir: bool,
}

/// Why an object that already exists was not imported.
pub(super) enum NotImported {
    /// Added to the error's hint: why it could not be told what to import.
    Why(String),
    /// The error's hint: the object may not be this workspace's.
    NotOurs(String),
}

/// Earlier runs of the workspace that ended without finishing (failed, timed out, killed),
/// newest first, and what their stored logs say they may have made, read once when an import
/// first needs it.
#[derive(Debug, Default)]
pub(super) struct Earlier {
    pub(super) runs: Vec<String>,
    /// This attempt's lease fence: its own log chunks (a job delivered again runs under its
    /// old id) are not an earlier run's.
    pub(super) fence: u64,
    pub(super) made: Option<BTreeSet<String>>,
}

#[derive(Clone, Copy)]
pub(super) struct Steps<'a> {
    pub(super) job_id: &'a str,
    pub(super) ws: &'a WorkspaceId,
    pub(super) server: &'a StateServer,
    pub(super) config: &'a TerraformConfig,
    pub(super) dir: &'a Path,
    pub(super) logger: &'a Logger,
    pub(super) stop: &'a CancellationToken,
    /// Price books (and the job's budget) when plans are estimated.
    pub(super) costing: Option<&'a Costing>,
}

/// What a job's plans are priced with.
pub(super) struct Costing {
    pub(super) books: cost::PriceBooks,
    pub(super) budget: Option<crate::job::Budget>,
}

/// A regular file in a workdir, read without following a link and only up to `cap` bytes;
/// `None` when there is none.
///
/// # Errors
/// Why it is not read: a link, a special file (a FIFO would hang the job), too large.
pub(super) fn read_own_file(path: &Path, cap: usize) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it as a plain file: {e}")),
    };
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    let mut data = Vec::new();
    file.take(u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| e.to_string())?;
    if data.len() > cap {
        return Err(format!("it is larger than {cap} bytes"));
    }
    Ok(Some(data))
}

/// The waits between tries of keeping and of pushing a state terraform could not save, while
/// the store fails: 31 s in all, enough to ride out a short outage of the store. A stopped job
/// (its deadline, a shutdown, its lease lost) makes 3 tries in all, without waiting.
const UNSAVED_WAITS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];

/// The state server's refusal of a pushed state.
struct Refused {
    why: String,
    retryable: bool,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// A finished step and its outcome.
pub(super) struct Ran {
    pub(super) step: &'static str,
    pub(super) outcome: Outcome,
    /// terraform's requests the state server answered 503 during the step: the store failed.
    pub(super) store_failures: u64,
}

impl std::ops::Deref for Ran {
    type Target = Outcome;
    fn deref(&self) -> &Outcome {
        &self.outcome
    }
}

impl Ran {
    /// The outcome when the step succeeded, else the step's error.
    pub(super) fn ok(self) -> Result<Outcome, JobError> {
        if self.outcome.success() {
            return Ok(self.outcome);
        }
        Err(classify_after(
            self.step,
            &self.outcome,
            self.store_failures,
        ))
    }
}

impl Steps<'_> {
    /// A successful plan's changes: from its own messages, else from `show -json` of the
    /// saved plan.
    pub(super) async fn changes(
        &self,
        planned: Outcome,
        report: &mut Report,
    ) -> Result<Changes, JobError> {
        if let Some(changes) = planned.events.changes() {
            return Ok(changes);
        }
        let shown = self.run(&Command::ShowPlan, report).await?.ok()?;
        Changes::from_plan_json(&shown.stdout).map_err(|e| JobError::internal("show", e))
    }

    pub(super) async fn run(
        &self,
        command: &Command,
        report: &mut Report,
    ) -> Result<Ran, JobError> {
        let step = command.step();
        if self.stop.is_cancelled() {
            return Err(JobError::internal(step, "stopped before the step started"));
        }
        self.logger.runner(step, &format!("terraform {step}")).await;
        let failures_before = self.server.activity().store_failures;
        let span = tracing::info_span!("step", step);
        let outcome = terraform::run(self.config, self.dir, command, self.logger, self.stop)
            .instrument(span.clone())
            .await
            .map_err(|e| {
                JobError::new(
                    Category::Internal,
                    step,
                    e.to_string(),
                    "install terraform or OpenTofu and point the runner at it (TERRACE_TERRAFORM)",
                    false,
                )
            })?;
        let duration_ms = outcome.duration.as_millis() as u64;
        span.in_scope(|| {
            tracing::info!(
                duration_ms,
                exit_code = outcome.exit_code,
                "terraform {step} ended"
            );
        });
        report.steps.push(StepTiming {
            step: step.into(),
            duration_ms,
            exit_code: outcome.exit_code,
        });
        report
            .creating
            .extend(outcome.events.creates.may_have_made());
        let store_failures = self.server.activity().store_failures - failures_before;
        Ok(Ran {
            step,
            outcome,
            store_failures,
        })
    }
}

/// What fixes a budget in another currency than the runner's price books.
pub(super) const BUDGET_CURRENCY_HINT: &str =
    "give the budget in the price books' currency, or leave budget.currency out";

/// The error of a job stopped by its deadline, its caller or a lost lease; `step_error` is what
/// the step it stopped said, which tells what state the workspace was left in.
pub(super) fn stopped_error(
    reason: &StopReason,
    step_error: JobError,
) -> (Status, Option<JobError>) {
    let killed = step_error.message.starts_with(crate::run::classify::KILLED);
    let left = if killed {
        format!(
            "; {}: objects it was creating may exist in the cloud without being in the state (the next apply imports those it can), and changes since its last saved state are not recorded",
            crate::run::classify::KILLED
        )
    } else if step_error.category != Category::Internal {
        format!("; terraform stopped gracefully ({})", step_error.message)
    } else {
        String::new()
    };
    let step = step_error.step;
    let (status, category, message, hint, retryable) = match reason {
        StopReason::Timeout => (
            Status::TimedOut,
            Category::Timeout,
            format!("the job ran past its timeout during {step} and was interrupted{left}"),
            "raise the job's timeout, or check why the step is slow",
            true,
        ),
        StopReason::Cancelled => (
            Status::Cancelled,
            Category::Cancelled,
            format!("the job was cancelled during {step}{left}"),
            "run the job again when ready",
            true,
        ),
        StopReason::Shutdown => (
            Status::Interrupted,
            Category::Cancelled,
            format!("the runner was shut down during {step}{left}"),
            "nothing to do: the job runs again when its message is delivered again",
            true,
        ),
        StopReason::LeaseLost(why) => (
            Status::Failed,
            Category::StateConflict,
            format!(
                "the workspace's lease was lost ({why}); terraform was stopped and its writes are refused"
            ),
            "another runner may now hold the workspace; check `terrace state versions` before running again",
            true,
        ),
    };
    (
        status,
        Some(JobError::new(category, step, message, hint, retryable).at(step_error.address)),
    )
}

#[cfg(test)]
mod tests;
