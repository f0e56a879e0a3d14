//! The result of a job, `runs/<job-id>/result.json`: status, step timings, planned changes,
//! outputs (sensitive ones masked), the state versions written, and on failure an error a
//! person can act on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::job::Operation;
use crate::job::redact::MASK;

/// How a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
    /// The runner stopped without a result (killed, crashed); a later job found its lease
    /// expired. Not final: the same job id may run again.
    Interrupted,
    /// Never ran: a job with a higher or equal `sequence` had started on the workspace
    /// (`superseded_by` names it).
    Superseded,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::TimedOut => "timed-out",
            Status::Interrupted => "interrupted",
            Status::Superseded => "superseded",
        }
    }
}

/// What kind of failure, for the caller to branch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    Validation,
    Auth,
    Quota,
    Transient,
    /// The object already exists in the cloud (often after a create that failed after the cloud
    /// made it); it needs importing or deleting.
    ProviderConflict,
    Provider,
    StateConflict,
    Timeout,
    Cancelled,
    /// The plan's cost is over the job's budget: nothing was applied.
    Budget,
    /// A process of the job went over the runner's per-process limits (memory, CPU time).
    ResourceLimit,
    /// A later request on the workspace started first: the job never ran. For an approved
    /// plan: a later run changed the state it was made from.
    Superseded,
    /// The plan breaks a policy (a `deny` rule), or its policies could not be evaluated:
    /// nothing was applied.
    Policy,
    /// The approved plan a job names may not be applied (expired, applied already, made by
    /// another version, of another kind, failed, or not there): nothing ran.
    PlanRefused,
    Internal,
}

impl Category {
    /// The category as results spell it (`provider-conflict`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Validation => "validation",
            Self::Auth => "auth",
            Self::Quota => "quota",
            Self::Transient => "transient",
            Self::ProviderConflict => "provider-conflict",
            Self::Provider => "provider",
            Self::StateConflict => "state-conflict",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Budget => "budget",
            Self::ResourceLimit => "resource-limit",
            Self::Superseded => "superseded",
            Self::Policy => "policy",
            Self::PlanRefused => "plan-refused",
            Self::Internal => "internal",
        }
    }
}

impl JobError {
    /// A failure at `step` that names no resource.
    pub fn new(
        category: Category,
        step: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
        retryable: bool,
    ) -> Self {
        Self {
            category,
            step: step.into(),
            address: None,
            message: message.into(),
            hint: hint.into(),
            retryable,
        }
    }

    /// The same failure, naming the resource terraform names (or none).
    #[must_use]
    pub fn at(mut self, address: Option<String>) -> Self {
        self.address = address;
        self
    }

    /// A fault of the runner or its machine at `step`: worth trying again.
    pub fn internal(step: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(
            Category::Internal,
            step,
            message,
            "this is a fault of the runner or its machine; see the runner's log",
            true,
        )
    }

    /// A job stopped by its budget, or a budget that cannot be checked: never retried.
    pub fn budget(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(Category::Budget, "estimate", message, hint, false)
    }

    /// `category at step: message`, as a status or a listing shows it in one line.
    pub fn summary(&self) -> String {
        format!(
            "{} at {}: {}",
            self.category.as_str(),
            self.step,
            self.message
        )
    }
}

/// A failure: what, where, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobError {
    pub category: Category,
    /// The step that failed (`init`, `plan`, `apply`, …, or `lease`, `prepare`).
    pub step: String,
    /// The resource terraform names in the diagnostic, where it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub message: String,
    pub hint: String,
    /// Whether running the same job again may succeed.
    pub retryable: bool,
}

/// One attempt of the operation (plan, apply, …, after `init`): how it ended, and how long the
/// runner waited before the next one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Why it failed; `None` when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<JobError>,
    /// The wait before the next attempt, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The ceiling that wait was drawn under (full jitter: uniform in `[0, ceiling]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_after_ms: Option<u64>,
}

/// What became of the resources a failed run created (`on_failure`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Cleanup {
    /// The job's policy: `keep`, `destroy-created` or `rollback`.
    pub policy: String,
    /// Resources this run created (in the state after the run, not before it).
    pub created: Vec<String>,
    /// Of those, the ones the cleanup destroyed.
    pub destroyed: Vec<String>,
    /// Of those, the ones still there: kept by policy, or not cleaned (see `error`).
    pub left: Vec<String>,
    /// Cleanup attempts made (at most 3).
    pub attempts: u32,
    /// `rollback`: the job whose configuration was re-applied (the last successful apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<String>,
    /// `rollback`: resources that existed before the run and that the rollback changed back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reverted: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Terraform's own copy of a state it could not save to the backend (`errored.tfstate`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UnsavedState {
    /// The run artifact that keeps it, byte for byte.
    pub artifact: String,
    /// The state version it became, when the runner could push it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed_as: Option<u64>,
    /// Why it could not be pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One step's timing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StepTiming {
    pub step: String,
    pub duration_ms: u64,
    pub exit_code: Option<i32>,
}

/// One resource's planned change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ResourceChange {
    pub address: String,
    pub actions: Vec<String>,
}

/// The planned changes, from `terraform show -json` of the saved plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Changes {
    pub add: u32,
    pub change: u32,
    pub destroy: u32,
    /// Changes other than no-op and read, by resource.
    pub resources: Vec<ResourceChange>,
}

impl Changes {
    /// Summarises a plan in terraform's JSON format.
    ///
    /// # Errors
    /// When the JSON is not a plan.
    pub fn from_plan_json(plan: &[u8]) -> Result<Self, String> {
        let plan: serde_json::Value =
            serde_json::from_slice(plan).map_err(|e| format!("plan JSON does not parse: {e}"))?;
        let mut changes = Changes::default();
        let Some(items) = plan.get("resource_changes").and_then(|v| v.as_array()) else {
            return Ok(changes);
        };
        for item in items {
            let actions: Vec<String> = item["change"]["actions"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            for action in &actions {
                match action.as_str() {
                    "create" => changes.add += 1,
                    "update" => changes.change += 1,
                    "delete" => changes.destroy += 1,
                    _ => {}
                }
            }
            if actions.iter().any(|a| a != "no-op" && a != "read") {
                changes.resources.push(ResourceChange {
                    address: item["address"].as_str().unwrap_or_default().to_owned(),
                    actions,
                });
            }
        }
        Ok(changes)
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }
}

/// A resource that changed outside terraform (a drift check's `plan -refresh-only`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DriftedResource {
    pub address: String,
    /// Terraform's action for the state to catch up: `update` (changed), `delete` (gone).
    pub action: String,
    /// The attributes that differ, innermost paths (`tags.env`, `rules[0].port`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<AttributeChange>,
}

/// One attribute's value as terraform last saw it and as it is now. A value terraform marks
/// sensitive is masked; template-sensitive values are masked with the whole result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AttributeChange {
    pub path: String,
    pub before: serde_json::Value,
    pub after: serde_json::Value,
}

impl DriftedResource {
    /// Reads `resource_drift` from `show -json` of a plan.
    ///
    /// # Errors
    /// When the JSON is not a plan.
    pub fn from_plan_json(plan: &[u8]) -> Result<Vec<Self>, String> {
        let plan: serde_json::Value =
            serde_json::from_slice(plan).map_err(|e| format!("plan JSON does not parse: {e}"))?;
        let Some(items) = plan.get("resource_drift").and_then(|v| v.as_array()) else {
            return Ok(Vec::new());
        };
        Ok(items
            .iter()
            .map(|item| {
                let change = &item["change"];
                let action = change["actions"]
                    .as_array()
                    .and_then(|a| a.first())
                    .and_then(|a| a.as_str())
                    .unwrap_or("update")
                    .to_owned();
                let mut attributes = Vec::new();
                let sensitive = (&change["before_sensitive"], &change["after_sensitive"]);
                diff(
                    String::new(),
                    &change["before"],
                    &change["after"],
                    sensitive,
                    &mut attributes,
                );
                DriftedResource {
                    address: item["address"].as_str().unwrap_or_default().to_owned(),
                    action,
                    attributes,
                }
            })
            .collect())
    }

    /// One line for the log: `testcloud_cluster.main changed outside terraform: instance_type
    /// "small" → "large"`, redacted.
    pub fn describe(&self, redactor: &crate::job::redact::Redactor) -> String {
        let what = if self.action == "delete" {
            "was deleted outside terraform".to_owned()
        } else {
            let attributes: Vec<String> = self
                .attributes
                .iter()
                .map(|a| {
                    let before = redactor.redact_json(&a.before);
                    let after = redactor.redact_json(&a.after);
                    format!("{} {before} → {after}", a.path)
                })
                .collect();
            format!("changed outside terraform: {}", attributes.join(", "))
        };
        format!("{} {what}", self.address)
    }
}

/// The paths where `before` and `after` differ, leaves only; values under a path marked in
/// either sensitivity tree are masked.
fn diff(
    path: String,
    before: &serde_json::Value,
    after: &serde_json::Value,
    sensitive: (&serde_json::Value, &serde_json::Value),
    out: &mut Vec<AttributeChange>,
) {
    use serde_json::Value;
    if before == after {
        return;
    }
    if sensitive.0 == &Value::Bool(true) || sensitive.1 == &Value::Bool(true) {
        let masked = Value::String(MASK.to_owned());
        out.push(AttributeChange {
            path,
            before: masked.clone(),
            after: masked,
        });
        return;
    }
    let child = |key: &str| format!("{path}{}{key}", if path.is_empty() { "" } else { "." });
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
            for key in keys {
                let null = Value::Null;
                diff(
                    child(key),
                    b.get(key.as_str()).unwrap_or(&null),
                    a.get(key.as_str()).unwrap_or(&null),
                    (&sensitive.0[key.as_str()], &sensitive.1[key.as_str()]),
                    out,
                );
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (i, (bv, av)) in b.iter().zip(a).enumerate() {
                diff(
                    format!("{path}[{i}]"),
                    bv,
                    av,
                    (&sensitive.0[i], &sensitive.1[i]),
                    out,
                );
            }
        }
        _ => out.push(AttributeChange {
            path,
            before: before.clone(),
            after: after.clone(),
        }),
    }
}

/// One output value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Output {
    pub value: serde_json::Value,
    pub sensitive: bool,
}

impl Output {
    /// An output as a result shows it: a sensitive one's value masked.
    pub fn masked(value: Option<serde_json::Value>, sensitive: bool) -> Self {
        let value = if sensitive {
            serde_json::Value::String(MASK.to_owned())
        } else {
            value.unwrap_or(serde_json::Value::Null)
        };
        Self { value, sensitive }
    }
}

/// Reads `terraform output -json`, masking sensitive values.
///
/// # Errors
/// When the JSON is not terraform's output format.
pub fn outputs_from_json(raw: &[u8]) -> Result<BTreeMap<String, Output>, String> {
    let map: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(raw).map_err(|e| format!("output JSON does not parse: {e}"))?;
    Ok(map
        .into_iter()
        .map(|(name, v)| {
            let sensitive = v["sensitive"].as_bool().unwrap_or(false);
            (name, Output::masked(v.get("value").cloned(), sensitive))
        })
        .collect())
}

/// The format of a [`JobResult`] written now.
pub const RESULT_SCHEMA: u32 = 1;

/// Everything a job's run reports (`result.json`, and what the results channels carry).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobResult {
    /// The record's format; results written before it had one read as 0.
    #[serde(default)]
    pub schema: u32,
    pub job_id: String,
    pub tenant: String,
    pub workspace: String,
    pub operation: Operation,
    pub template: String,
    pub status: Status,
    /// The fence of the lease the run held: a stored result is taken as a job's only when
    /// its run's `job.json` records the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The terraform client that ran the job (absent when it never reached terraform).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terraform: Option<crate::run::client::Client>,
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(schema_with = "crate::job::schema::date_time")]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(schema_with = "crate::job::schema::date_time")]
    pub finished_at: OffsetDateTime,
    pub duration_ms: u64,
    pub steps: Vec<StepTiming>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
    /// The plan's monthly cost estimate, when the runner has price books (plan, apply, destroy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::run::cost::Estimate>,
    /// The policies' verdicts on the plan, when the runner holds plans to policies
    /// (`docs/policy.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::run::policy::Verdicts>,
    /// For drift checks: whether the infrastructure changed outside terraform or differs from
    /// the configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<bool>,
    /// For drift checks: what changed outside terraform, attribute by attribute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drifted: Vec<DriftedResource>,
    #[serde(default)]
    pub outputs: BTreeMap<String, Output>,
    /// The sensitive outputs' values, sealed to the platform's key (`docs/outputs.md`), when
    /// the tenant or the runner has one; their values in `outputs` stay masked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_outputs: Option<crate::run::sealed_outputs::SealedOutputs>,
    /// Numbers of the state versions this run wrote.
    #[serde(default)]
    pub state_versions: Vec<u64>,
    /// Every attempt of the operation, in order.
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    /// What became of the resources a failed run created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<Cleanup>,
    /// Objects the cloud had but the state did not, imported so the run could go on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recovered: Vec<crate::run::recover::Recovery>,
    /// A state terraform could not save (its `errored.tfstate`): kept, and pushed when it could.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsaved_state: Option<UnsavedState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<JobError>,
    /// The workspace's lifecycle move this run ended with (apply and destroy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<crate::run::lifecycle::Transition>,
    /// What a platform should alert its operators to: resources left after a failure, an
    /// interrupted run, a workspace failing repeatedly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<crate::run::lifecycle::Attention>,
    /// The job's `sequence`, when it carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// For a `superseded` job: the run that superseded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<SupersededBy>,
    /// For a plan job: the plan it kept for approval (see `docs/approval.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::run::plans::PlanSummary>,
    /// For an apply or destroy of an approved plan: the plan job it names (whose plan it
    /// applied, when it succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_plan: Option<String>,
}

impl JobResult {
    /// The result of a job that ended before it reached terraform (a record it cannot read, a
    /// task that gave up): every field a result has, no step, `error` saying why. What a
    /// platform parses like any other result.
    pub fn never_started(job: &crate::job::Job, status: Status, error: JobError) -> Self {
        let ws = Ran {
            job_id: &job.id,
            tenant: &job.tenant,
            workspace: &job.workspace,
            operation: job.operation,
            template: job.template.to_string(),
        };
        Self {
            sequence: job.sequence,
            approved_plan: job.plan.clone(),
            ..Self::nothing_run(ws, status, error)
        }
    }

    /// A result with no step, no output and no state version: `job`, ended `status` now with
    /// `error`. The caller sets what it knows beyond that (its fence, its times).
    pub fn nothing_run(job: Ran<'_>, status: Status, error: JobError) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            schema: RESULT_SCHEMA,
            job_id: job.job_id.to_owned(),
            tenant: job.tenant.to_owned(),
            workspace: job.workspace.to_owned(),
            operation: job.operation,
            template: job.template,
            status,
            fence: None,
            terraform: None,
            started_at: now,
            finished_at: now,
            duration_ms: 0,
            steps: Vec::new(),
            changes: None,
            cost: None,
            policy: None,
            drift: None,
            drifted: Vec::new(),
            outputs: BTreeMap::new(),
            sealed_outputs: None,
            state_versions: Vec::new(),
            attempts: Vec::new(),
            cleanup: None,
            recovered: Vec::new(),
            unsaved_state: None,
            error: Some(error),
            lifecycle: None,
            attention: Vec::new(),
            sequence: None,
            superseded_by: None,
            plan: None,
            approved_plan: None,
        }
    }
}

/// Which job a result is of, for [`JobResult::nothing_run`].
pub struct Ran<'a> {
    pub job_id: &'a str,
    pub tenant: &'a str,
    pub workspace: &'a str,
    pub operation: Operation,
    /// `NAME@VERSION`.
    pub template: String,
}

/// The run that superseded a job: it started on the workspace with this sequence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SupersededBy {
    pub job_id: String,
    pub sequence: u64,
}

impl JobResult {
    /// This result with every secret `redactor` knows masked in its text, field by field: the
    /// free text (messages, addresses, ids, values) is redacted, while what a reader parses
    /// (times, status, category, numbers) is left alone, so a redacted result is always a
    /// valid one, whatever the secrets are.
    #[must_use]
    pub fn redacted(&self, redactor: &crate::job::redact::Redactor) -> Self {
        let text = |s: &String| redactor.redact(s);
        let error = |e: &JobError| JobError {
            address: e.address.as_ref().map(text),
            message: text(&e.message),
            hint: text(&e.hint),
            ..e.clone()
        };
        let texts = |v: &Vec<String>| v.iter().map(text).collect::<Vec<_>>();
        let mut out = self.clone();
        out.error = self.error.as_ref().map(error);
        for attempt in &mut out.attempts {
            attempt.error = attempt.error.as_ref().map(error);
        }
        if let Some(cleanup) = &mut out.cleanup {
            cleanup.created = texts(&cleanup.created);
            cleanup.destroyed = texts(&cleanup.destroyed);
            cleanup.left = texts(&cleanup.left);
            cleanup.reverted = texts(&cleanup.reverted);
            cleanup.rolled_back_to = cleanup.rolled_back_to.as_ref().map(text);
            cleanup.error = cleanup.error.as_ref().map(text);
        }
        if let Some(unsaved) = &mut out.unsaved_state {
            unsaved.error = unsaved.error.as_ref().map(text);
        }
        if let Some(changes) = &mut out.changes {
            for change in &mut changes.resources {
                change.address = text(&change.address);
            }
        }
        out.cost = self.cost.as_ref().map(|c| c.redacted(redactor));
        for drifted in &mut out.drifted {
            drifted.address = text(&drifted.address);
            for attribute in &mut drifted.attributes {
                attribute.path = text(&attribute.path);
                attribute.before = redactor.redact_json(&attribute.before);
                attribute.after = redactor.redact_json(&attribute.after);
            }
        }
        for output in out.outputs.values_mut() {
            output.value = redactor.redact_json(&output.value);
        }
        for recovery in &mut out.recovered {
            recovery.address = text(&recovery.address);
            recovery.id = text(&recovery.id);
            recovery.after = text(&recovery.after);
        }
        if let Some(t) = &mut out.lifecycle {
            t.reason = t.reason.as_ref().map(text);
        }
        for a in &mut out.attention {
            a.message = text(&a.message);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_summary_counts_actions_and_lists_real_changes() {
        let plan = br#"{"resource_changes":[
          {"address":"a.x","change":{"actions":["create"]}},
          {"address":"a.y","change":{"actions":["delete","create"]}},
          {"address":"a.z","change":{"actions":["no-op"]}},
          {"address":"a.w","change":{"actions":["update"]}}]}"#;
        let c = Changes::from_plan_json(plan).unwrap();
        assert_eq!((c.add, c.change, c.destroy), (2, 1, 1));
        let addresses: Vec<&str> = c.resources.iter().map(|r| r.address.as_str()).collect();
        assert_eq!(addresses, ["a.x", "a.y", "a.w"]);
        assert!(Changes::from_plan_json(b"{}").unwrap().is_empty());
    }

    #[test]
    fn drift_lists_the_changed_attributes_from_a_real_refresh_only_plan() {
        let raw = include_bytes!("../../tests/fixtures/ui/show-refresh-only-drift.json");
        let drifted = DriftedResource::from_plan_json(raw).unwrap();
        assert_eq!(drifted.len(), 1);
        assert_eq!(drifted[0].address, "testcloud_cluster.main");
        assert_eq!(drifted[0].action, "update");
        assert_eq!(
            drifted[0].attributes,
            [AttributeChange {
                path: "instance_type".into(),
                before: "small".into(),
                after: "large".into(),
            }]
        );
        let line = drifted[0].describe(&crate::job::redact::Redactor::default());
        assert_eq!(
            line,
            r#"testcloud_cluster.main changed outside terraform: instance_type "small" → "large""#
        );
    }

    #[test]
    fn drifted_attributes_marked_sensitive_are_masked_at_any_depth() {
        let plan = br#"{"resource_drift":[{"address":"a.b","change":{"actions":["update"],
            "before":{"tags":{"env":"dev","token":"old-s3cret"},"ports":[1,2],"same":1},
            "after":{"tags":{"env":"prod","token":"new-s3cret"},"ports":[1,3],"same":1},
            "before_sensitive":{"tags":{"token":true}},"after_sensitive":{}}}]}"#;
        let drifted = DriftedResource::from_plan_json(plan).unwrap();
        let paths: Vec<&str> = drifted[0]
            .attributes
            .iter()
            .map(|a| a.path.as_str())
            .collect();
        assert_eq!(paths, ["ports[1]", "tags.env", "tags.token"]);
        assert_eq!(drifted[0].attributes[2].before, MASK);
        assert_eq!(drifted[0].attributes[2].after, MASK);
        let text = serde_json::to_string(&drifted).unwrap();
        assert!(!text.contains("s3cret"), "{text}");
        let deleted = br#"{"resource_drift":[{"address":"a.c","change":{"actions":["delete"],"before":{"x":1},"after":null}}]}"#;
        let gone = DriftedResource::from_plan_json(deleted).unwrap();
        assert_eq!(
            gone[0].describe(&crate::job::redact::Redactor::default()),
            "a.c was deleted outside terraform"
        );
    }

    #[test]
    fn categories_are_spelled_as_serialized() {
        for c in [
            Category::Validation,
            Category::Auth,
            Category::Quota,
            Category::Transient,
            Category::ProviderConflict,
            Category::Provider,
            Category::StateConflict,
            Category::Timeout,
            Category::Cancelled,
            Category::Budget,
            Category::ResourceLimit,
            Category::Internal,
        ] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }

    #[test]
    fn sensitive_outputs_are_masked() {
        let raw = br#"{"id":{"sensitive":false,"type":"string","value":"net-1"},
                       "pw":{"sensitive":true,"type":"string","value":"hunter2"}}"#;
        let out = outputs_from_json(raw).unwrap();
        assert_eq!(out["id"].value, "net-1");
        assert_eq!(out["pw"].value, MASK);
        assert!(!serde_json::to_string(&out).unwrap().contains("hunter2"));
    }

    #[test]
    fn a_redacted_result_is_always_a_valid_one_whatever_the_secret() {
        // A secret that is part of every timestamp this year, and of a step's name.
        let redactor = crate::job::redact::Redactor::new(["2026".to_owned(), "plan".to_owned()]);
        let at = time::macros::datetime!(2026-11-24 10:20:26 UTC);
        let result = JobResult {
            cost: None,
            policy: None,
            schema: RESULT_SCHEMA,
            job_id: "j-2026".into(),
            tenant: "t".into(),
            workspace: "w".into(),
            operation: Operation::Apply,
            template: "demo@1.0.0".into(),
            status: Status::Failed,
            fence: Some(3),
            terraform: None,
            started_at: at,
            finished_at: at,
            duration_ms: 2026,
            steps: vec![StepTiming {
                step: "plan".into(),
                duration_ms: 1,
                exit_code: Some(1),
            }],
            changes: None,
            drift: None,
            drifted: Vec::new(),
            outputs: BTreeMap::new(),
            sealed_outputs: None,
            state_versions: Vec::new(),
            attempts: Vec::new(),
            cleanup: Some(Cleanup {
                error: Some("destroy failed: password 2026 refused".into()),
                ..Cleanup::default()
            }),
            recovered: Vec::new(),
            unsaved_state: Some(UnsavedState {
                artifact: "runs/j/errored.tfstate".into(),
                pushed_as: None,
                error: Some("push refused: 2026".into()),
            }),
            error: Some(JobError {
                category: Category::Provider,
                step: "plan".into(),
                address: None,
                message: "the password 2026 is wrong".into(),
                hint: "check it".into(),
                retryable: false,
            }),
            lifecycle: Some(crate::run::lifecycle::Transition {
                from: Some(crate::run::lifecycle::Phase::Updating),
                to: crate::run::lifecycle::Phase::Failed,
                at,
                job_id: "j".into(),
                operation: Operation::Apply,
                reason: Some("refused: 2026 at plan".into()),
            }),
            attention: vec![crate::run::lifecycle::Attention {
                kind: "resources-left".into(),
                message: "left db-2026".into(),
            }],
            sequence: None,
            superseded_by: None,
            plan: None,
            approved_plan: None,
        };
        let redacted = result.redacted(&redactor);
        let error = redacted.error.as_ref().unwrap();
        assert_eq!(error.message, format!("the password {MASK} is wrong"));
        let all = serde_json::to_string(&redacted).unwrap();
        for text in ["password 2026", "refused: 2026", "db-2026"] {
            assert!(!all.contains(text), "{text} in {all}");
        }
        assert_eq!(redacted.started_at, at, "times are not text");
        assert_eq!(redacted.steps, result.steps, "step names are not secrets");
        let written = serde_json::to_vec(&redacted).unwrap();
        let back: JobResult = serde_json::from_slice(&written).unwrap();
        assert_eq!(back, redacted);
    }
}
