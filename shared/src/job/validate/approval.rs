//! The fields of the approval flow (see `docs/approval.md`): `destroy` on a plan job, and
//! `plan` (with `plan_key`) on the apply or destroy job that applies an approved plan.

use serde_json::Value;

use super::{ValidationError, kind_of};
use crate::job::{OnFailure, Operation};

/// What a job says of approved plans.
#[derive(Debug, Default)]
pub(super) struct Approval {
    pub(super) plan: Option<String>,
    pub(super) plan_key: Option<String>,
    pub(super) destroy: bool,
}

/// The length of a plan key: 32 bytes in unpadded base64url.
pub const PLAN_KEY_CHARS: usize = 43;

/// Reads `destroy`, `plan` and `plan_key` and checks them against the job's other fields.
pub(super) fn approval(
    doc: &serde_json::Map<String, Value>,
    operation: Option<Operation>,
    on_failure: Option<OnFailure>,
    errors: &mut Vec<ValidationError>,
) -> Approval {
    let mut out = Approval::default();
    match doc.get("destroy") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) if matches!(operation, Some(Operation::Plan) | None) => {
            out.destroy = true;
        }
        Some(Value::Bool(true)) => errors.push(ValidationError::new(
            "destroy",
            "is for plan jobs only",
            "to plan a destroy for approval send `operation: plan` with `destroy: true`; a destroy job destroys without it",
        )),
        Some(other) => errors.push(ValidationError::new(
            "destroy",
            format!("must be true or false, found {}", kind_of(other)),
            "write destroy: true to plan destroying everything in the workspace",
        )),
    }
    match doc.get("plan") {
        None => {}
        Some(Value::String(id)) => {
            let checked = super::check_id(id).map_err(|mut e| {
                e.field = "plan".into();
                e.problem = format!("{id:?} is not a plan job's id");
                e.fix = "give the id of the plan job whose plan was approved".into();
                e
            });
            match (checked, operation) {
                (Err(e), _) => errors.push(e),
                (Ok(()), Some(Operation::Apply | Operation::Destroy) | None) => {
                    out.plan = Some(id.clone());
                }
                (Ok(()), Some(op)) => errors.push(ValidationError::new(
                    "plan",
                    format!("names a plan to apply, which a {op} job does not do"),
                    "send it with operation apply (or destroy, for a destroy plan), or drop plan",
                )),
            }
        }
        Some(other) => errors.push(ValidationError::new(
            "plan",
            format!("must be a plan job's id, found {}", kind_of(other)),
            "give the id of the plan job whose plan was approved, as a string",
        )),
    }
    match doc.get("plan_key") {
        None => {}
        Some(Value::String(key)) if doc.contains_key("plan") => {
            if key.len() == PLAN_KEY_CHARS
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
            {
                out.plan_key = Some(key.clone());
            } else {
                // Never quoted: it is a secret, even a malformed one.
                errors.push(ValidationError::new(
                    "plan_key",
                    format!("is not a plan key ({} characters)", key.len()),
                    format!(
                        "give the plan's key exactly as its result gave it (plan.key, {PLAN_KEY_CHARS} characters of base64url)"
                    ),
                ));
            }
        }
        Some(Value::String(_)) => errors.push(ValidationError::new(
            "plan_key",
            "is given without plan",
            "name the approved plan with plan: PLAN_JOB_ID, or drop plan_key",
        )),
        Some(other) => errors.push(ValidationError::new(
            "plan_key",
            format!("must be a string, found {}", kind_of(other)),
            "give the plan's key exactly as its result gave it (plan.key)",
        )),
    }
    if out.plan.is_some() {
        if let Some(policy) = on_failure.filter(|p| *p != OnFailure::Keep) {
            errors.push(ValidationError::new(
                "on_failure",
                format!(
                    "{} needs a plan of its own, and an approved plan's apply makes none",
                    serde_json::to_value(policy)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
                "leave on_failure out (keep) and, after a failed apply, plan again and have the new plan approved",
            ));
        }
        if doc.contains_key("budget") {
            errors.push(ValidationError::new(
                "budget",
                "is checked when the plan is made, not when it is applied",
                "send the budget with the plan job, or drop it here",
            ));
        }
    }
    out
}

/// Only the template's ephemeral variables are given to an approved plan's apply: the plan
/// keeps every other value it was made with. The supplied variables that are ephemeral, for
/// their own checks; one problem for each other.
pub(super) fn only_ephemeral(
    template: &crate::job::template::Template,
    supplied: &serde_json::Map<String, Value>,
    errors: &mut Vec<ValidationError>,
) -> serde_json::Map<String, Value> {
    let declared = &template.spec.variables;
    let ephemeral: Vec<&str> = declared
        .iter()
        .filter(|(_, v)| v.ephemeral)
        .map(|(name, _)| name.as_str())
        .collect();
    let takes = if ephemeral.is_empty() {
        "this template has none, so give no variables".to_owned()
    } else {
        format!("this template's are {}", ephemeral.join(", "))
    };
    let mut out = serde_json::Map::new();
    for (key, value) in supplied {
        match declared.get(key) {
            Some(v) if v.ephemeral => {
                out.insert(key.clone(), value.clone());
            }
            Some(_) => errors.push(ValidationError::new(
                format!("variables.{key}"),
                "is kept in the approved plan, with the value it was planned with",
                format!(
                    "drop it: an approved plan's apply takes only ephemeral variables ({takes})"
                ),
            )),
            None => errors.push(ValidationError::new(
                format!("variables.{key}"),
                "is not declared by the template",
                format!(
                    "drop it: an approved plan's apply takes only ephemeral variables ({takes})"
                ),
            )),
        }
    }
    out
}
