//! Approved plans in the run (see [`crate::run::plans`]): a plan job keeps its plan, sealed,
//! with its record; an apply or destroy job that names a plan is checked against it under its
//! lease before anything runs, claims it, and has terraform apply exactly that file.

use std::path::Path;

use state_backends::{Lease, StateStoreExt, WorkspaceId, sha256_hex};
use time::OffsetDateTime;

use crate::job::validate::ValidatedJob;
use crate::job::{Operation, TemplateRef};
use crate::run::plans::{
    self, Applied, Applying, PLAN_APPLIED, PLAN_FILE, PLAN_RECORD, PlanRecord, PlanSummary,
    Refusal, Sealing, StateFacts,
};
use crate::run::result::{Category, JobError, JobResult, Status};
use crate::run::terraform;

use super::finish::Clock;
use super::report::Report;
use super::steps::Steps;
use super::{RunError, Runner, previous_result};

impl Runner {
    /// Checks the approved plan an apply or destroy job names, under its lease, and claims it
    /// for the job. `Some` with the job's result (written) when it may not be applied.
    pub(super) async fn check_approved(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        lease: &Lease,
    ) -> Result<Option<JobResult>, RunError> {
        let j = &job.job;
        let Some(plan) = j.plan.as_deref() else {
            return Ok(None);
        };
        let store = self.store.as_ref();
        let (record, claim, made, current) = tokio::join!(
            store.artifact(ws, plan, PLAN_RECORD),
            store.artifact(ws, plan, PLAN_APPLIED),
            previous_result(store, ws, plan, Some(Operation::Plan)),
            store.current_version(ws),
        );
        let (record, claim, made, current) = (record?, claim?, made?, current?);
        let refusal = |message: String, fix: &str| Refusal {
            superseded: false,
            message,
            fix: fix.to_owned(),
        };
        let refused = |r: Refusal| {
            let category = if r.superseded {
                Category::Superseded
            } else {
                Category::PlanRefused
            };
            JobError::new(
                category,
                "plan",
                format!("{}; nothing was applied", r.message),
                r.fix,
                false,
            )
        };
        let checked = match (record, made) {
            (_, None) => Err(refused(refusal(
                format!("there is no plan {plan} in workspace {ws}"),
                "name the id of a plan job that ran in this job's tenant and workspace",
            ))),
            (_, Some(made)) if made.status != Status::Succeeded => Err(refused(refusal(
                format!(
                    "plan {plan} did not succeed ({}): it has nothing to apply",
                    made.error
                        .as_ref()
                        .map_or_else(|| made.status.as_str().to_owned(), |e| e.summary())
                ),
                "fix what the plan's error says and plan again",
            ))),
            (None, Some(_)) => Err(refused(refusal(
                format!(
                    "plan {plan} kept no plan file (it was made before plans were kept, or it was deleted after it expired)"
                ),
                "send a new plan job, have its plan approved, then apply that one",
            ))),
            (Some(raw), Some(_)) => {
                let record = PlanRecord::parse(&raw)?;
                let claim = claim.as_deref().map(Applied::parse).transpose()?;
                let client = self.client().await.map_err(|e| {
                    RunError::Task(format!("terraform's version cannot be read: {e}"))
                })?;
                let state = current.as_ref().map(StateFacts::of);
                let applying = Applying {
                    job_id: &j.id,
                    destroy: j.operation == Operation::Destroy,
                    template: &j.template,
                    flavour: client.flavour.name(),
                    terraform_version: &client.version,
                    state: state.as_ref(),
                    now: OffsetDateTime::now_utc(),
                    applied: claim.as_ref(),
                };
                let ours = record.job_id == plan
                    && record.tenant == j.tenant
                    && record.workspace == j.workspace;
                let checked = if ours {
                    plans::check(&record, &applying)
                } else {
                    Err(refusal(
                        format!("plan {plan} is not a plan of workspace {ws}"),
                        "name a plan made in this job's workspace",
                    ))
                };
                match checked {
                    Err(refusal) => Err(refused(refusal)),
                    // The job must be able to open the plan before it claims it: a wrong key
                    // never takes a plan from the job that has the right one.
                    Ok(()) => match self.open_plan(job, ws, &record).await {
                        Err(e) => Err(e),
                        Ok(_) if claim.is_some() => Ok(()),
                        Ok(_) => {
                            let claim = Applied {
                                job_id: j.id.clone(),
                                at: OffsetDateTime::now_utc(),
                            };
                            store
                                .put_artifact_fenced(
                                    ws,
                                    plan,
                                    PLAN_APPLIED,
                                    claim.to_bytes(),
                                    &lease.fence(),
                                )
                                .await?;
                            Ok(())
                        }
                    },
                }
            }
        };
        let error = match checked {
            Ok(()) => return Ok(None),
            // The store did not answer: the delivery is tried again, nothing is settled.
            Err(e) if e.retryable => return Err(RunError::Task(e.message)),
            Err(e) => e,
        };
        tracing::info!(plan, "approved plan refused: {}", error.message);
        let status = if error.category == Category::Superseded {
            Status::Superseded
        } else {
            Status::Failed
        };
        let result =
            Report::default().into_result(job, lease, &Clock::start(), status, Some(error));
        Ok(Some(self.never_ran(job, ws, lease, result).await?))
    }

    /// Keeps a plan job's plan: the plan file, sealed, then its record; the plan's summary
    /// (with its key, when it has one of its own) goes in the report.
    pub(super) async fn keep_plan(
        &self,
        job: &ValidatedJob,
        lease: &Lease,
        server: &crate::run::state_server::StateServer,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let j = &job.job;
        // Over its budget, a plan is shown but never kept: its apply would skip the budget.
        if let Some(over) = report
            .cost
            .as_ref()
            .and_then(|c| c.budget.as_ref())
            .filter(|b| b.exceeded)
        {
            let line = format!(
                "plan not kept for approval: it is over the job's budget ({})",
                over.reason.as_deref().unwrap_or_default()
            );
            s.logger.runner("plan", &line).await;
            return Ok(());
        }
        let fail = |what: &str, e: &dyn std::fmt::Display, retryable: bool| {
            JobError::new(
                if retryable {
                    Category::Transient
                } else {
                    Category::Internal
                },
                "plan",
                format!("the plan could not be kept for approval: {what}: {e}"),
                "check that the store is reachable and writable, and plan again",
                retryable,
            )
        };
        let file = std::fs::read(s.dir.join(terraform::PLAN_FILE))
            .map_err(|e| fail("terraform's plan file cannot be read", &e, false))?;
        // What the plan was made from (the state server read it before terraform did).
        let state = match server.current().await {
            Ok(current) => current.map(|c| StateFacts::of(&c.version)),
            Err(e) => {
                return Err(fail(
                    "the state it was made from cannot be read",
                    &e,
                    e.is_retryable(),
                ));
            }
        };
        let lock = std::fs::read(s.dir.join(".terraform.lock.hcl")).ok();
        let client = self
            .client()
            .await
            .map_err(|e| fail("terraform's version cannot be read", &e, false))?;
        let made_at = OffsetDateTime::now_utc();
        let expires_at = made_at + self.config.plan_ttl;
        let (sealing, stored, key) = if self.store.seals() {
            (Sealing::WorkspaceKey, plans::bind(&j.id, &file), None)
        } else {
            let key = plans::new_key();
            let sealed = plans::seal(&key, &file, (&j.tenant, &j.workspace, &j.id));
            (Sealing::PlanKey, sealed, Some(plans::encode_key(&key)))
        };
        let record = PlanRecord {
            schema: plans::PLAN_RECORD_SCHEMA,
            job_id: j.id.clone(),
            tenant: j.tenant.clone(),
            workspace: j.workspace.clone(),
            destroy: j.destroy,
            template: TemplateRef::clone(&j.template),
            template_digest: job.template.published.clone(),
            variables_sha256: variables_digest(job),
            state,
            flavour: client.flavour.name().to_owned(),
            terraform_version: client.version.clone(),
            lock_sha256: lock.as_deref().map(sha256_hex),
            plan_sha256: sha256_hex(&file),
            sealing,
            changes: report.changes.clone().unwrap_or_default(),
            policy: report.policy.clone(),
            made_at,
            expires_at,
        };
        let fence = lease.fence();
        // The file first (while the workspace's index of kept plans is read): a record is never
        // there without the plan it describes.
        let store = self.store.as_ref();
        let (put, index) = tokio::join!(
            store.put_artifact_fenced(s.ws, &j.id, PLAN_FILE, stored, &fence),
            plans::kept(store, s.ws),
        );
        put.map_err(|e| fail("the plan file cannot be stored", &e, e.is_retryable()))?;
        let mut index = match index {
            Ok(index) => index,
            // Unlisted, the file would never expire: it goes, and the plan job fails.
            Err(crate::run::records::ReadError::Store(e)) => {
                let _ = store.delete_artifact(s.ws, &j.id, PLAN_FILE).await;
                let what = "the workspace's index of kept plans cannot be read";
                return Err(fail(what, &e, e.is_retryable()));
            }
            // Not an index at all: started afresh (the plans it listed stay, sealed, until an
            // operator deletes them).
            Err(crate::run::records::ReadError::Record(e)) => {
                let line = format!(
                    "the workspace's index of kept plans is not one ({e}); starting a new one"
                );
                s.logger.runner("plan", &line).await;
                plans::KeptPlans::default()
            }
        };
        index.plans.retain(|k| k.job_id != j.id);
        index.plans.push(plans::Kept {
            job_id: j.id.clone(),
            expires_at,
        });
        let (record, indexed) = tokio::join!(
            store.put_artifact_fenced(s.ws, &j.id, PLAN_RECORD, record.to_bytes(), &fence),
            plans::record_kept(store, s.ws, &index, &fence),
        );
        if let Err(e) = indexed {
            // Unlisted, the file would never expire: it goes, and the plan job fails.
            let _ = store.delete_artifact(s.ws, &j.id, PLAN_FILE).await;
            let what = "the workspace's index of kept plans cannot be written";
            return Err(fail(what, &e, e.is_retryable()));
        }
        record.map_err(|e| fail("the plan's record cannot be stored", &e, e.is_retryable()))?;
        let expiry = state_backends::display_time(expires_at);
        let line = match sealing {
            Sealing::WorkspaceKey => format!(
                "plan kept for approval, sealed with the workspace's key, until {expiry}: apply it with a job naming plan: {}",
                j.id
            ),
            Sealing::PlanKey => format!(
                "plan kept for approval, sealed with a key of its own (in this job's result as plan.key, given once), until {expiry}: apply it with a job naming plan: {} and plan_key",
                j.id
            ),
        };
        s.logger.runner("plan", &line).await;
        report.plan = Some(PlanSummary {
            id: j.id.clone(),
            destroy: j.destroy,
            expires_at,
            sealing,
            key,
        });
        Ok(())
    }

    /// Puts the approved plan the job names into its workdir, opened, as terraform's plan file:
    /// the plan's record, for the changes it carries out.
    pub(super) async fn fetch_plan(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        dir: &Path,
    ) -> Result<PlanRecord, JobError> {
        let plan = job.job.plan.as_deref().unwrap_or_default();
        let refused = |message: String, fix: &str| {
            JobError::new(Category::PlanRefused, "plan", message, fix, false)
        };
        let record = self
            .store
            .artifact(ws, plan, PLAN_RECORD)
            .await
            .map_err(unreadable("record"))?
            .ok_or_else(|| refused(format!("plan {plan} has no record"), "plan again"))?;
        let record = PlanRecord::parse(&record)
            .map_err(|e| refused(format!("plan {plan}'s record: {e}"), "plan again"))?;
        let file = self.open_plan(job, ws, &record).await?;
        let path = dir.join(terraform::PLAN_FILE);
        super::workdir::write_private(&path, &file)
            .and_then(|()| self.config.terraform.give(&path, &[]))
            .map_err(|e| JobError::internal("plan", format!("cannot write the plan file: {e}")))?;
        Ok(record)
    }

    /// The approved plan's file, opened with the job's `plan_key` (or by the store, with the
    /// workspace's key), and checked against its record.
    async fn open_plan(
        &self,
        job: &ValidatedJob,
        ws: &WorkspaceId,
        record: &PlanRecord,
    ) -> Result<Vec<u8>, JobError> {
        let j = &job.job;
        let plan = j.plan.as_deref().unwrap_or_default();
        let refused = |message: String, fix: &str| {
            JobError::new(
                Category::PlanRefused,
                "plan",
                format!("{message}; nothing was applied"),
                fix,
                false,
            )
        };
        let missing = || refused(format!("plan {plan} has no plan file"), "plan again");
        let open_failed = |e: plans::OpenError| {
            let fix = match e {
                plans::OpenError::NoKey => {
                    "give the key the plan's result gave (plan.key) as plan_key"
                }
                plans::OpenError::NotSealed if j.plan_key.is_some() => {
                    "this plan is sealed with the workspace's key: drop plan_key"
                }
                _ => {
                    "give the key of this plan, exactly as its result gave it (plan.key); or plan again"
                }
            };
            refused(format!("plan {plan}: {e}"), fix)
        };
        // How it is opened follows the job (a key given, or none), never the record alone,
        // which anyone who can write the bucket could change: a plan key's plan opens only
        // with that key, a workspace key's only if the store itself sealed it.
        let file = match (j.plan_key.as_deref(), record.sealing) {
            (None, Sealing::PlanKey) => return Err(open_failed(plans::OpenError::NoKey)),
            (Some(key), _) => {
                let stored = self
                    .store
                    .artifact(ws, plan, PLAN_FILE)
                    .await
                    .map_err(unreadable("file"))?
                    .ok_or_else(missing)?;
                plans::open(Some(key), &stored, (&j.tenant, &j.workspace, plan))
                    .map_err(open_failed)?
            }
            (None, Sealing::WorkspaceKey) => {
                let opened = self
                    .store
                    .sealed_artifact(ws, plan, PLAN_FILE)
                    .await
                    .map_err(unreadable("file"))?
                    .ok_or_else(missing)?;
                plans::unbind(plan, &opened).map_err(open_failed)?
            }
        };
        if sha256_hex(&file) != record.plan_sha256 {
            return Err(refused(
                format!(
                    "plan {plan}'s file is not the one its record describes (changed in the store)"
                ),
                "plan again; and find out who can write to the workspace's bucket",
            ));
        }
        Ok(file)
    }
}

/// A store error reading an approved plan's `what`.
fn unreadable(what: &'static str) -> impl Fn(state_backends::StoreError) -> JobError {
    move |e: state_backends::StoreError| {
        let retryable = e.is_retryable();
        JobError::new(
            if retryable {
                Category::Transient
            } else {
                Category::Auth
            },
            "plan",
            format!("the approved plan's {what} cannot be read: {e}"),
            "check that the store is reachable and that the runner holds the workspace's key; nothing was applied",
            retryable,
        )
    }
}

/// SHA-256 of the job's variables as JSON, keys in order, sensitive and ephemeral ones left out:
/// an unsalted digest of a secret would let whoever reads the bucket test guesses of it.
fn variables_digest(job: &ValidatedJob) -> String {
    let declared = &job.template.spec.variables;
    let kept: std::collections::BTreeMap<&String, &serde_json::Value> = job
        .job
        .variables
        .iter()
        .filter(|(name, _)| {
            !declared
                .get(*name)
                .is_some_and(|v| v.ephemeral || v.sensitive)
        })
        .collect();
    sha256_hex(&serde_json::to_vec(&kept).unwrap_or_default())
}
