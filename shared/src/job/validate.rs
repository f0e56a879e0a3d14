//! Validation of a job against its template: every problem at once, each with the field path,
//! what is wrong and how to fix it. The executor accepts only a [`ValidatedJob`].

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::job::template::Template;
use crate::job::{self, FIELDS, Job, OnFailure, Operation, RawJob, RetryPolicy, TemplateRef};

mod quote;
use quote::{quoted, suggest};

mod approval;
mod variables;
pub use approval::PLAN_KEY_CHARS;
pub(crate) use variables::check_constraint;
use variables::check_variables;

/// The longest deadline a job may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// One problem with a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ValidationError {
    /// The path of the field, e.g. `variables.node_count`; empty for the whole document.
    pub field: String,
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

impl ValidationError {
    pub fn new(
        field: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = if self.field.is_empty() {
            "job"
        } else {
            &self.field
        };
        write!(f, "{field}: {} (fix: {})", self.problem, self.fix)
    }
}

/// A job whose every field, and every variable against its template, has been checked.
#[derive(Clone, Debug)]
pub struct ValidatedJob {
    pub job: Job,
    pub template: Template,
    /// The values of sensitive variables, to be redacted from every log line and result.
    pub sensitive_values: Vec<String>,
}

/// Describes a JSON value's kind for messages.
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Checks a parsed job document against the templates under `templates_root`.
///
/// # Errors
/// Every problem found, in field order.
pub fn validate(raw: &RawJob, templates_root: &Path) -> Result<ValidatedJob, Vec<ValidationError>> {
    validate_for(raw, templates_root, None)
}

/// [`validate_for`] once the job's template (and its modules) are fetched from the bucket
/// `templates` names, if they come from one. A template its bucket does not have, or has
/// other than pinned, is a problem of the job's `template` (said as the bucket says it).
///
/// # Errors
/// The outer error: the template could not be fetched for a reason that may pass (the job is
/// not at fault; try it again later).
pub async fn fetch_and_validate(
    raw: &RawJob,
    templates: &crate::job::template::source::Templates,
    cloud: Option<&str>,
) -> Result<Result<ValidatedJob, Vec<ValidationError>>, crate::job::template::source::SourceError> {
    let unpublished = match templates.fetch_for(&raw.0).await {
        Ok(()) => None,
        Err(e) if e.passes() => return Err(e),
        Err(e) => Some(ValidationError::new("template", e.to_string(), e.fix())),
    };
    Ok(
        match (validate_for(raw, templates.root(), cloud), unpublished) {
            (checked, None) => checked,
            (Ok(_), Some(problem)) => Err(vec![problem]),
            (Err(mut errors), Some(problem)) => {
                // The bucket's answer says better why the template is not there.
                errors.retain(|e| e.field != "template");
                errors.push(problem);
                Err(errors)
            }
        },
    )
}

/// [`validate`] on a runner of `cloud` (`aws`, `gcp`, `azure`, `local`): a variable the job
/// leaves unset takes the template's default for that cloud, before its own default.
///
/// # Errors
/// As [`validate`].
pub fn validate_for(
    raw: &RawJob,
    templates_root: &Path,
    cloud: Option<&str>,
) -> Result<ValidatedJob, Vec<ValidationError>> {
    let mut errors = Vec::new();
    let doc = &raw.0;

    for key in doc.keys() {
        if !FIELDS.contains(&key.as_str()) {
            errors.push(ValidationError::new(
                key.clone(),
                "is not a job field",
                suggest(key, &FIELDS, "remove it"),
            ));
        }
    }

    // Whether it verifies is the runner's to say (its registry holds the keys); its shape is
    // checked wherever the job is.
    if let Err(why) = crate::job::signature::read(doc) {
        errors.push(ValidationError::new(
            crate::job::signature::FIELD,
            format!("is malformed: {why}"),
            "sign the job with `terrace submit --sign KEY`, or as docs/signing.md says",
        ));
    }

    let id = required_str(doc, "id", &mut errors).and_then(|id| {
        check_id(id)
            .map_err(|e| errors.push(e))
            .ok()
            .map(|()| id.to_owned())
    });
    let mut names = ["tenant", "workspace"].map(|field| {
        let value = required_str(doc, field, &mut errors)?;
        match state_backends::check_name(value) {
            Ok(()) => Some(value.to_owned()),
            Err(e) => {
                errors.push(ValidationError::new(
                    field,
                    e.reason,
                    state_backends::NAME_RULE,
                ));
                None
            }
        }
    });
    let operation = required_str(doc, "operation", &mut errors).and_then(|op| {
        let found = Operation::ALL.into_iter().find(|o| o.as_str() == op);
        if found.is_none() {
            let names: Vec<&str> = Operation::ALL.iter().map(|o| o.as_str()).collect();
            errors.push(ValidationError::new(
                "operation",
                format!("{op:?} is not an operation"),
                suggest(op, &names, "use one of plan, apply, destroy, drift-check"),
            ));
        }
        found
    });
    let timeout = match doc.get("timeout") {
        None => Some(job::DEFAULT_TIMEOUT),
        Some(value) => match job::parse_duration(value) {
            Ok(d) if d.is_zero() || d > MAX_TIMEOUT => {
                errors.push(ValidationError::new(
                    "timeout",
                    format!("{}s is out of range", d.as_secs()),
                    "use a timeout between 1s and 24h",
                ));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                errors.push(ValidationError::new("timeout", "is not a duration", e));
                None
            }
        },
    };
    let on_failure = match doc.get("on_failure") {
        None => Some(OnFailure::default()),
        Some(value) => match serde_json::from_value::<OnFailure>(value.clone()) {
            Ok(policy) => Some(policy),
            Err(_) => {
                errors.push(ValidationError::new(
                    "on_failure",
                    format!("{} is not a failure policy", quoted(value)),
                    format!("use one of {}", OnFailure::NAMES.join(", ")),
                ));
                None
            }
        },
    };
    let retry = retry_policy(doc.get("retry"), &mut errors);
    let budget = budget(doc.get("budget"), &mut errors);
    let sequence = sequence(doc.get("sequence"), &mut errors);
    let approval = approval::approval(doc, operation, on_failure, &mut errors);
    if let (Some(plan), Some(id)) = (&approval.plan, &id)
        && plan == id
    {
        errors.push(ValidationError::new(
            "plan",
            "names this job itself",
            "give the apply its own id, and name the plan job's id in plan",
        ));
    }
    let template = template_ref(doc.get("template"), &mut errors).and_then(|r| {
        match Template::load(templates_root, &r.name, &r.version) {
            Ok(t) => Some((r, t)),
            Err(e) => {
                let fix = match e {
                    crate::job::template::TemplateError::Missing(_) => format!(
                        "name a template that exists under the templates root {}",
                        templates_root.display()
                    ),
                    // The template is there but cannot be used: its author's to fix.
                    _ => "fix the template as the problem says, or name another version".to_owned(),
                };
                errors.push(ValidationError::new("template", e.to_string(), fix));
                None
            }
        }
    });
    let supplied = match doc.get("variables") {
        None => Some(serde_json::Map::new()),
        Some(Value::Object(map)) => Some(map.clone()),
        Some(other) => {
            errors.push(ValidationError::new(
                "variables",
                format!("must be a mapping, found {}", kind_of(other)),
                "write variables as NAME: VALUE pairs",
            ));
            None
        }
    };
    let variables = match (&template, &supplied) {
        (Some((_, t)), Some(vars)) if approval.plan.is_some() => {
            let given = approval::only_ephemeral(t, vars, &mut errors);
            let mut ephemeral = t.clone();
            ephemeral.spec.variables.retain(|_, v| v.ephemeral);
            ephemeral.spec.rules.clear();
            Some(check_variables(&ephemeral, &given, cloud, &mut errors))
        }
        (Some((_, t)), Some(vars)) => Some(check_variables(t, vars, cloud, &mut errors)),
        _ => None,
    };

    if !errors.is_empty() {
        return Err(errors);
    }
    let (
        Some(id),
        [Some(tenant), Some(workspace)],
        Some(operation),
        Some(timeout),
        Some(on_failure),
        Some(retry),
    ) = (
        id,
        std::mem::take(&mut names),
        operation,
        timeout,
        on_failure,
        retry,
    )
    else {
        unreachable!("every missing field pushed an error");
    };
    let (Some((template_ref, template)), Some(variables)) = (template, variables) else {
        unreachable!("every missing field pushed an error");
    };
    let sensitive_values = template
        .spec
        .variables
        .iter()
        .filter(|(_, v)| v.sensitive || v.ephemeral)
        .filter_map(|(name, _)| variables.get(name))
        .flat_map(secret_strings)
        // A plan's own key opens the plan and its values: a secret like them.
        .chain(approval.plan_key.clone())
        .collect();
    Ok(ValidatedJob {
        job: Job {
            id,
            tenant,
            workspace,
            operation,
            template: template_ref,
            variables,
            timeout,
            on_failure,
            retry,
            budget,
            sequence,
            plan: approval.plan,
            plan_key: approval.plan_key,
            destroy: approval.destroy,
        },
        template,
        sensitive_values,
    })
}

/// Reads `retry: { attempts, base, cap }`; every field is optional.
fn retry_policy(value: Option<&Value>, errors: &mut Vec<ValidationError>) -> Option<RetryPolicy> {
    let mut policy = RetryPolicy::default();
    let Some(value) = value else {
        return Some(policy);
    };
    let Value::Object(map) = value else {
        errors.push(ValidationError::new(
            "retry",
            format!("must be a mapping, found {}", kind_of(value)),
            "write retry: { attempts: 5, base: 2s, cap: 60s }",
        ));
        return None;
    };
    let before = errors.len();
    for (key, v) in map {
        let field = format!("retry.{key}");
        match key.as_str() {
            "attempts" => match v.as_u64().filter(|n| (1..=20).contains(n)) {
                Some(n) => policy.attempts = n as u32,
                None => errors.push(ValidationError::new(
                    field,
                    format!("{} is not a number of attempts", quoted(v)),
                    "use a whole number from 1 (no retry) to 20",
                )),
            },
            "base" | "cap" => match crate::job::parse_duration(v) {
                Ok(d) if !d.is_zero() && d <= Duration::from_secs(3600) => {
                    if key == "base" {
                        policy.base = d;
                    } else {
                        policy.cap = d;
                    }
                }
                Ok(_) => errors.push(ValidationError::new(
                    field,
                    "is out of range",
                    "use a duration between 1ms and 1h",
                )),
                Err(e) => errors.push(ValidationError::new(field, "is not a duration", e)),
            },
            _ => errors.push(ValidationError::new(
                field,
                "is not a retry field",
                suggest(key, &["attempts", "base", "cap"], "remove it"),
            )),
        }
    }
    if errors.len() == before && policy.cap < policy.base {
        errors.push(ValidationError::new(
            "retry.cap",
            format!("{:?} is below the base {:?}", policy.cap, policy.base),
            "use a cap at least as long as the base",
        ));
    }
    (errors.len() == before).then_some(policy)
}

/// Reads `sequence`: a positive integer, or nothing.
fn sequence(value: Option<&Value>, errors: &mut Vec<ValidationError>) -> Option<u64> {
    let value = value?;
    if let Some(n) = value.as_u64().filter(|n| *n > 0) {
        return Some(n);
    }
    let found = match value {
        Value::Number(n) => n.to_string(),
        other => kind_of(other).to_owned(),
    };
    errors.push(ValidationError::new(
        "sequence",
        format!("must be a positive integer, found {found}"),
        "give the number the platform raises for each request on this workspace (1, 2, 3, …), or leave sequence out",
    ));
    None
}

/// Reads `budget: { max_monthly_increase, currency, on_unpriced }`.
fn budget(value: Option<&Value>, errors: &mut Vec<ValidationError>) -> Option<crate::job::Budget> {
    use crate::job::{Budget, OnUnpriced};
    let value = value.filter(|v| !v.is_null())?;
    let Value::Object(map) = value else {
        errors.push(ValidationError::new(
            "budget",
            format!("must be a mapping, found {}", kind_of(value)),
            "write budget: { max_monthly_increase: 100 }",
        ));
        return None;
    };
    let mut budget = Budget {
        max_monthly_increase: -1.0,
        currency: None,
        on_unpriced: OnUnpriced::Allow,
    };
    let before = errors.len();
    for (key, v) in map {
        let field = format!("budget.{key}");
        match key.as_str() {
            "max_monthly_increase" => match v.as_f64().filter(|n| n.is_finite() && *n >= 0.0) {
                Some(n) => budget.max_monthly_increase = n,
                None => errors.push(ValidationError::new(
                    field,
                    format!("{} is not an amount", quoted(v)),
                    "use a number of 0 or more, in the price books' currency (0: no increase at all)",
                )),
            },
            "currency" => match v.as_str() {
                Some(c) if c.len() == 3 && c.chars().all(|c| c.is_ascii_uppercase()) => {
                    budget.currency = Some(c.to_owned());
                }
                _ => errors.push(ValidationError::new(
                    field,
                    format!("{} is not a currency code", quoted(v)),
                    "use an ISO 4217 code as USD or EUR, or leave it out",
                )),
            },
            "on_unpriced" => match serde_json::from_value::<OnUnpriced>(v.clone()) {
                Ok(p) => budget.on_unpriced = p,
                Err(_) => errors.push(ValidationError::new(
                    field,
                    format!("{} is not a choice", quoted(v)),
                    "use allow (what cannot be priced counts as nothing) or stop",
                )),
            },
            _ => errors.push(ValidationError::new(
                field,
                "is not a budget field",
                suggest(
                    key,
                    &["max_monthly_increase", "currency", "on_unpriced"],
                    "remove it",
                ),
            )),
        }
    }
    if errors.len() == before && budget.max_monthly_increase < 0.0 {
        errors.push(ValidationError::new(
            "budget.max_monthly_increase",
            "is required",
            "add the most the monthly cost may rise, as max_monthly_increase: 100",
        ));
    }
    (errors.len() == before).then_some(budget)
}

/// The strings a sensitive value may show up as in terraform's output.
/// What of a sensitive value is searched for in free text (log lines, messages). Strings are,
/// whatever their length. A boolean, or a number of fewer than 4 characters, is not: searching
/// for `true` or `1` would mask every such word in every line and still hide nothing. Those
/// are masked where they stand as values of their own (the job's record, outputs and drift
/// attributes terraform marks sensitive).
fn secret_strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) if !s.is_empty() => vec![s.clone()],
        Value::Null | Value::String(_) | Value::Bool(_) => Vec::new(),
        Value::Array(items) => items.iter().flat_map(secret_strings).collect(),
        Value::Object(map) => map.values().flat_map(secret_strings).collect(),
        Value::Number(n) => {
            let text = n.to_string();
            if text.len() >= 4 {
                vec![text]
            } else {
                Vec::new()
            }
        }
    }
}

fn required_str<'a>(
    doc: &'a serde_json::Map<String, Value>,
    field: &str,
    errors: &mut Vec<ValidationError>,
) -> Option<&'a str> {
    match doc.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Some(s),
        None | Some(Value::Null) => {
            errors.push(ValidationError::new(
                field,
                "is required",
                format!("add a {field} field"),
            ));
            None
        }
        Some(other) => {
            errors.push(ValidationError::new(
                field,
                format!("must be a non-empty string, found {}", kind_of(other)),
                format!("write {field} as a string"),
            ));
            None
        }
    }
}

/// Whether `id` can be a job's id (it names the run's folder in every store).
///
/// # Errors
/// What is wrong and the fix, at field `id`.
pub(crate) fn check_id(id: &str) -> Result<(), ValidationError> {
    let ok = id.len() <= 128
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        // Azure Blob drops a trailing dot from a path's segment: `j1.` and `j1` would share
        // a run's folder.
        && !id.ends_with('.');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "id",
            format!("{id:?} is not a valid job id"),
            "use up to 128 letters, digits, '-', '_' or '.', starting with a letter or digit and not ending with '.'",
        ))
    }
}

fn template_ref(value: Option<&Value>, errors: &mut Vec<ValidationError>) -> Option<TemplateRef> {
    let Some(value) = value else {
        errors.push(ValidationError::new(
            "template",
            "is required",
            "add template: { name: NAME, version: VERSION }",
        ));
        return None;
    };
    let Value::Object(map) = value else {
        errors.push(ValidationError::new(
            "template",
            format!("must be a mapping, found {}", kind_of(value)),
            "write template: { name: NAME, version: VERSION }",
        ));
        return None;
    };
    let before = errors.len();
    for key in map.keys() {
        if key != "name" && key != "version" {
            errors.push(ValidationError::new(
                format!("template.{key}"),
                "is not a template field",
                suggest(key, &["name", "version"], "remove it"),
            ));
        }
    }
    let mut part = |field: &str| match map.get(field) {
        // Names starting with `_` are the templates root's own (`_modules`, the library).
        Some(Value::String(s))
            if is_path_segment(s) && !(field == "name" && s.starts_with('_')) =>
        {
            Some(s.clone())
        }
        Some(Value::String(s)) => {
            errors.push(ValidationError::new(
                format!("template.{field}"),
                format!("{s:?} is not a valid template {field}"),
                "use letters, digits, '-', '_' or '.', not starting with '.' (nor '_', for a name)",
            ));
            None
        }
        _ => {
            errors.push(ValidationError::new(
                format!("template.{field}"),
                "is required and must be a string",
                format!("add template.{field}"),
            ));
            None
        }
    };
    let (name, version) = (part("name"), part("version"));
    if errors.len() > before {
        return None;
    }
    Some(TemplateRef {
        name: name?,
        version: version?,
    })
}

pub(crate) fn is_path_segment(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests;
