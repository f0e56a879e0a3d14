//! Terraform's steps for each operation, with attempts and retries of transient failures, the
//! cost estimate and budget, and drift; each step run through the [`Steps`] context, gathering
//! what it finds into a `Report`.

use std::path::Path;

use state_backends::WorkspaceId;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::job::{Operation, RetryPolicy};
use crate::run::classify::classify_after;
use crate::run::logs::Logger;
use crate::run::policy::{Policies, PolicyError, input};
use crate::run::result::{
    Attempt, Category, Changes, DriftedResource, JobError, StepTiming, outputs_from_json,
};
use crate::run::state_server::StateServer;
use crate::run::terraform::{Command, Outcome, PlanMode, TerraformConfig};
use crate::run::{cost, terraform};

use super::Runner;
use super::imports::{MAX_IMPORTS, NotImported};
use super::prepare::BUDGET_CURRENCY_HINT;
use super::report::{Costing, Report};
use super::unsaved::is_state_save_error;

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
        s.run(&Command::Init, report).await?.ok()?;
        if s.approved {
            // The approved plan is held to the policies as they are now: a rule added since
            // it was made stops it before anything is applied.
            let judged = match s.policies {
                Some(policies) => match s.run(&Command::ShowPlan, report).await.and_then(Ran::ok) {
                    Ok(shown) => judge(op, policies, &shown.stdout, s, report).await,
                    Err(e) => Err(e),
                },
                None => Ok(()),
            };
            // Once: a saved plan cannot be applied again after an apply that changed anything.
            let applied = match judged {
                Ok(()) => self.apply_planned(s, report).await,
                Err(e) => Err(e),
            };
            report.attempts.push(Attempt {
                attempt: 1,
                error: applied.as_ref().err().cloned(),
                retry_after_ms: None,
                max_retry_after_ms: None,
            });
            return applied;
        }
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
        shown: &Result<Vec<u8>, JobError>,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let estimated = match shown {
            Ok(shown) => {
                cost::estimate(shown, &costing.books).map_err(|e| JobError::internal("estimate", e))
            }
            Err(e) => Err(e.clone()),
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
            mode: if op == Operation::Destroy || s.destroy {
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
        let judged = s.policies.filter(|_| op != Operation::DriftCheck);
        if s.costing.is_some() || judged.is_some() {
            let shown = s
                .run(&Command::ShowPlan, report)
                .await
                .and_then(Ran::ok)
                .map(|o| o.stdout);
            if let Some(costing) = s.costing {
                self.estimate(op, costing, &shown, s, report).await?;
            }
            if let Some(policies) = judged {
                judge(op, policies, &shown?, s, report).await?;
            }
        }
        if !op.mutates() {
            return Ok(());
        }
        self.apply_planned(s, report).await
    }

    /// Applies the workdir's plan file (this attempt's, or an approved one) and reads the
    /// outputs.
    pub(super) async fn apply_planned(
        &self,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
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
        let mut read = None;
        let outputs = match applied.events.outputs {
            Some(outputs) => outputs,
            None => {
                let output = s.run(&Command::Output, report).await?.ok()?;
                let outputs = outputs_from_json(&output.stdout)
                    .map_err(|e| JobError::internal("output", e))?;
                read = Some(output.stdout);
                outputs
            }
        };
        report.outputs = outputs
            .into_iter()
            .map(|(k, mut v)| {
                v.value = s.logger.redactor().redact_json(&v.value);
                (k, v)
            })
            .collect();
        if let Some(recipient) = s.seal_to
            && report.outputs.values().any(|o| o.sensitive)
        {
            Self::seal_outputs(s, recipient, read, report).await;
        }
        Ok(())
    }

    /// Seals the sensitive outputs' values to the platform's key. Terraform's UI leaves them
    /// out: `output -json` (captured, never logged) has them. The apply has succeeded by now:
    /// trouble here (a cancel, a state server that stopped) leaves the outputs masked only and
    /// says so in the log, never fails the job or undoes what it made.
    async fn seal_outputs(
        s: &Steps<'_>,
        recipient: &crate::run::sealed_outputs::OutputsRecipient,
        read: Option<Vec<u8>>,
        report: &mut Report,
    ) {
        let stdout = match read {
            Some(stdout) => Ok(stdout),
            None => match s.run(&Command::Output, report).await {
                Ok(ran) => ran.ok().map(|o| o.stdout).map_err(|e| e.message),
                Err(e) => Err(e.message),
            },
        };
        let sealed = stdout.and_then(|stdout| {
            let values = crate::run::sealed_outputs::sensitive_values(&stdout)?;
            crate::run::sealed_outputs::seal(recipient, &values)
        });
        match sealed {
            Ok(sealed) => report.sealed_outputs = Some(sealed),
            Err(why) => {
                let why = s.logger.redactor().redact(&why);
                let line =
                    format!("the sensitive outputs are not sealed (they stay masked): {why}");
                tracing::warn!(job_id = %s.job_id, "{line}");
                s.logger.runner("output", &line).await;
            }
        }
    }
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
    /// A plan job plans a destroy (`destroy: true`).
    pub(super) destroy: bool,
    /// The workdir holds an approved plan: terraform applies it and plans nothing.
    pub(super) approved: bool,
    /// The platform's key the sensitive outputs are sealed to.
    pub(super) seal_to: Option<&'a crate::run::sealed_outputs::OutputsRecipient>,
    /// The run's start records, awaited before a step that changes infrastructure.
    pub(super) started: &'a super::prepare::Started,
    /// The policies each plan is held to.
    pub(super) policies: Option<&'a Policies>,
    pub(super) template: &'a crate::job::TemplateRef,
}

/// Holds the plan to the policies: every verdict logged and reported; a deny (or a plan the
/// policies could not judge) stops the job before anything is applied.
async fn judge(
    op: Operation,
    policies: &Policies,
    shown: &[u8],
    s: &Steps<'_>,
    report: &mut Report,
) -> Result<(), JobError> {
    const STEP: &str = "policy";
    let facts = input::Facts {
        job_id: s.job_id,
        tenant: s.ws.tenant(),
        workspace: s.ws.workspace(),
        operation: op,
        template: s.template.to_string(),
        cost: report.cost.as_ref(),
    };
    let input = input::of_plan(&String::from_utf8_lossy(shown), &facts, s.logger.redactor())
        .map_err(|e| JobError::internal(STEP, e))?;
    let started = std::time::Instant::now();
    let mut verdicts = policies.evaluate(&input).await.map_err(|e| match e {
        // The runner's fault: another delivery may pass.
        PolicyError::Evaluator(_) => JobError::new(
            Category::Internal,
            STEP,
            e.to_string(),
            "nothing was applied: the runner could not start its policy evaluator; send the job again (under a new job id), and tell the runner's operator if it persists",
            true,
        ),
        e => JobError::new(
            Category::Policy,
            STEP,
            e.to_string(),
            if e.is_limit() {
                "nothing was applied: a policy ran past the runner's bounds (TERRACE_POLICY_TIMEOUT, TERRACE_POLICY_MEMORY_MB); ask the policies' owner to fix the rule, then send the job again under a new job id"
            } else {
                "nothing was applied: a policy failed; ask the policies' owner (the runner's TERRACE_POLICIES, or the tenant's `policies`) to fix the rule the error names, then send the job again under a new job id"
            },
            false,
        ),
    })?;
    // A policy may rebuild a secret from what it sees: its messages are masked as logs are.
    let redactor = s.logger.redactor();
    for v in verdicts.deny.iter_mut().chain(verdicts.warn.iter_mut()) {
        v.message = redactor.redact(&v.message);
    }
    for (kind, list) in [("deny", &verdicts.deny), ("warn", &verdicts.warn)] {
        for v in list {
            s.logger
                .runner(STEP, &format!("{kind}: {}", v.describe()))
                .await;
        }
    }
    s.logger
        .runner(
            STEP,
            &format!(
                "{} denied, {} warned by {} ({} files, {}) in {} ms",
                verdicts.deny.len(),
                verdicts.warn.len(),
                policies.set.origin,
                policies.set.files.len(),
                &policies.set.digest[..19.min(policies.set.digest.len())],
                started.elapsed().as_millis()
            ),
        )
        .await;
    let denied = (!verdicts.deny.is_empty()).then(|| verdicts.denied());
    report.policy = Some(verdicts);
    match denied {
        Some(denied) => Err(JobError::new(
            Category::Policy,
            STEP,
            redactor.redact(&format!("the plan breaks policy: {denied}")),
            if op == Operation::Plan {
                "the plan may not be applied: change the job (its variables, or the template) so that its plan passes the policies, or ask their owner, and send it again under a new job id"
            } else {
                "nothing was applied: change the job (its variables, or the template) so that its plan passes the policies, or ask their owner, and send it again under a new job id"
            },
            false,
        )),
        None => Ok(()),
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
        if matches!(command, Command::Apply | Command::Import { .. }) {
            self.started.wait().await?;
        }
        if self.stop.is_cancelled() {
            return Err(JobError::internal(step, "stopped before the step started"));
        }
        self.logger.runner(step, &format!("terraform {step}")).await;
        report
            .first_command
            .get_or_insert_with(tokio::time::Instant::now);
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
