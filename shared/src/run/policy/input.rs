//! The input a policy sees: terraform's plan JSON (`terraform show -json`), whole, as conftest
//! gives it (so `input.resource_changes`, `input.planned_values`, `input.configuration` are
//! where policies written for conftest look), with every value terraform marks sensitive,
//! every sensitive variable (its value and its default) and every literal of the configuration
//! masked, every secret of the job redacted, and the job's own facts under `input.terrace`.

use serde_json::{Value, json};

use crate::job::redact::{MASK, Redactor};

/// The job's facts, `input.terrace`.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub job_id: &'a str,
    pub tenant: &'a str,
    pub workspace: &'a str,
    pub operation: crate::job::Operation,
    /// `name@version`.
    pub template: String,
    /// The plan's cost estimate, when the runner priced it.
    pub cost: Option<&'a crate::run::cost::Estimate>,
}

/// The input for a plan's policies.
///
/// # Errors
/// A plan that is not JSON.
pub fn of_plan(plan_json: &str, facts: &Facts<'_>, redactor: &Redactor) -> Result<Value, String> {
    let mut plan: Value =
        serde_json::from_str(plan_json).map_err(|e| format!("the plan's JSON: {e}"))?;
    if !plan.is_object() {
        return Err("the plan's JSON is not an object".into());
    }
    mask_variables(&mut plan);
    mask_sensitive(&mut plan);
    if let Some(configuration) = plan.get_mut("configuration") {
        mask_configuration(configuration);
    }
    let mut plan = redactor.redact_json(&plan);
    plan["terrace"] = json!({
        "job_id": facts.job_id,
        "tenant": facts.tenant,
        "workspace": facts.workspace,
        "operation": facts.operation,
        "template": facts.template,
        "cost": facts.cost.map(|c| redactor.redact_json(&serde_json::to_value(c).unwrap_or(Value::Null))),
    });
    Ok(plan)
}

/// Masks, at any depth: a value under its `<name>_sensitive` tree (`before`/`after` of a
/// change, `after_unknown` aside), a resource's `values` under its `sensitive_values`, and the
/// `value` of an output marked `"sensitive": true`.
pub fn mask_sensitive(value: &mut Value) {
    match value {
        Value::Object(map) => {
            // `before`/`before_sensitive`, and `config_values`/`config_sensitive` (actions).
            let pairs: Vec<(String, String)> = map
                .keys()
                .filter_map(|k| {
                    let base = k.strip_suffix("_sensitive")?;
                    [base.to_owned(), format!("{base}_values")]
                        .into_iter()
                        .find(|b| map.contains_key(b))
                        .map(|b| (b, k.clone()))
                })
                .collect();
            for (base, marks) in pairs {
                let marks = map[&marks].clone();
                if let Some(v) = map.get_mut(&base) {
                    mask_under(v, &marks);
                }
            }
            if let Some(marks) = map.get("sensitive_values").cloned()
                && let Some(values) = map.get_mut("values")
            {
                mask_under(values, &marks);
            }
            if map.get("sensitive") == Some(&Value::Bool(true))
                && let Some(v) = map.get_mut("value")
            {
                *v = Value::String(MASK.to_owned());
            }
            for v in map.values_mut() {
                mask_sensitive(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_sensitive),
        _ => {}
    }
}

/// `value` with what `marks` (terraform's sensitivity tree: `true` where sensitive) marks
/// replaced by the mask.
fn mask_under(value: &mut Value, marks: &Value) {
    match (marks, value) {
        (Value::Bool(true), value) => *value = Value::String(MASK.to_owned()),
        (Value::Object(marks), Value::Object(values)) => {
            for (key, mark) in marks {
                if let Some(v) = values.get_mut(key) {
                    mask_under(v, mark);
                }
            }
        }
        (Value::Array(marks), Value::Array(values)) => {
            for (v, mark) in values.iter_mut().zip(marks) {
                mask_under(v, mark);
            }
        }
        _ => {}
    }
}

/// Masks, in the configuration: every literal (`constant_value`, which terraform writes even
/// for a sensitive attribute or a provider's credentials), and the `default` of every variable
/// declared `sensitive`, in every module. A policy reads values from the plan's changes.
fn mask_configuration(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(v) = map.get_mut("constant_value") {
                *v = Value::String(MASK.to_owned());
            }
            if map.get("sensitive") == Some(&Value::Bool(true))
                && let Some(v) = map.get_mut("default")
            {
                *v = Value::String(MASK.to_owned());
            }
            map.values_mut().for_each(mask_configuration);
        }
        Value::Array(items) => items.iter_mut().for_each(mask_configuration),
        _ => {}
    }
}

/// Masks `variables.<name>.value` for each root variable the configuration declares
/// `sensitive` (terraform's plan JSON shows their values as given).
fn mask_variables(plan: &mut Value) {
    let sensitive: Vec<String> = plan["configuration"]["root_module"]["variables"]
        .as_object()
        .map(|vars| {
            vars.iter()
                .filter(|(_, v)| v["sensitive"] == Value::Bool(true))
                .map(|(name, _)| name.clone())
                .collect()
        })
        .unwrap_or_default();
    if let Some(vars) = plan.get_mut("variables").and_then(Value::as_object_mut) {
        for name in sensitive {
            if let Some(v) = vars.get_mut(&name).and_then(Value::as_object_mut) {
                v.insert("value".into(), Value::String(MASK.to_owned()));
            }
        }
    }
}
