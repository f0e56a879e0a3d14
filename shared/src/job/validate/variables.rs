//! The checks of a job's variables against its template's declarations: types, the
//! template's constraints, and which values are secret.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::job::template::{Constraint, Template, VarType};

use super::quote::{quoted, suggest};
use super::{ValidationError, kind_of};

/// Checks supplied variables against the template and returns them with defaults applied.
pub(super) fn check_variables(
    template: &Template,
    supplied: &serde_json::Map<String, Value>,
    cloud: Option<&str>,
    errors: &mut Vec<ValidationError>,
) -> BTreeMap<String, Value> {
    let declared = &template.spec.variables;
    let cloud_defaults = cloud.and_then(|c| template.spec.defaults.get(c));
    let names: Vec<&str> = declared.keys().map(String::as_str).collect();
    for key in supplied.keys() {
        if key == crate::job::template::TAGS_VARIABLE {
            errors.push(ValidationError::new(
                format!("variables.{key}"),
                "is filled by the runner (tenant, workspace, job id, template and version)",
                "remove it from the job",
            ));
        } else if !declared.contains_key(key) {
            errors.push(ValidationError::new(
                format!("variables.{key}"),
                "is not declared by the template",
                suggest(
                    key,
                    &names,
                    &format!("remove it; the template declares {}", names.join(", ")),
                ),
            ));
        }
    }
    let mut values = BTreeMap::new();
    for (name, var) in declared {
        if name == crate::job::template::TAGS_VARIABLE {
            continue;
        }
        let field = format!("variables.{name}");
        let value = match supplied.get(name) {
            Some(Value::Null) | None => match cloud_defaults
                .and_then(|d| d.get(name))
                .or(var.default.as_ref())
            {
                Some(default) => default.clone(),
                None if var.required => {
                    errors.push(ValidationError::new(
                        field,
                        "is required by the template",
                        format!("set {name} to a {}", var.var_type.name()),
                    ));
                    continue;
                }
                None => continue,
            },
            Some(value) => value.clone(),
        };
        if !var.var_type.matches(&value) {
            errors.push(ValidationError::new(
                field,
                format!(
                    "must be a {}, found {}",
                    var.var_type.name(),
                    kind_of(&value)
                ),
                format!("set {name} to a {}", var.var_type.name()),
            ));
            continue;
        }
        let shown = if var.sensitive {
            crate::job::redact::MASK.to_owned()
        } else {
            quoted(&value)
        };
        if let Err((problem, fix)) = check_constraint(&var.constraint, var.var_type, &value, &shown)
        {
            errors.push(ValidationError::new(field, problem, fix));
            continue;
        }
        values.insert(name.clone(), value);
    }
    for (i, rule) in template.spec.rules.iter().enumerate() {
        let applies = rule
            .when
            .iter()
            .all(|(name, expected)| values.get(name) == Some(expected));
        if !applies {
            continue;
        }
        let shown = |name: &str, value: &Value| {
            if declared.get(name).is_some_and(|v| v.sensitive) {
                crate::job::redact::MASK.to_owned()
            } else {
                quoted(value)
            }
        };
        let condition: Vec<String> = rule
            .when
            .iter()
            .map(|(k, v)| format!("{k} = {}", shown(k, v)))
            .collect();
        for (name, constraint) in &rule.require {
            let var_type = declared[name].var_type;
            let problem = match values.get(name) {
                None => Some(("is required".to_owned(), format!("set {name}"))),
                Some(value) => {
                    check_constraint(constraint, var_type, value, &shown(name, value)).err()
                }
            };
            if let Some((problem, fix)) = problem {
                let why = rule
                    .message
                    .clone()
                    .unwrap_or_else(|| format!("rule {i} of the template"));
                errors.push(ValidationError::new(
                    format!("variables.{name}"),
                    format!("{problem} when {}: {why}", condition.join(" and ")),
                    fix,
                ));
            }
        }
    }
    values
}

/// Checks one value against a constraint; the error is (problem, fix).
pub(crate) fn check_constraint(
    c: &Constraint,
    var_type: VarType,
    value: &Value,
    shown: &str,
) -> Result<(), (String, String)> {
    if let Some(allowed) = &c.one_of
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err((
            format!("{shown} is not an allowed value"),
            format!("use one of {}", list.join(", ")),
        ));
    }
    let (measure, what) = match (var_type, value) {
        (VarType::Number, Value::Number(n)) => (n.as_f64(), ""),
        (VarType::String, Value::String(s)) => (Some(s.chars().count() as f64), " characters"),
        (VarType::List, Value::Array(a)) => (Some(a.len() as f64), " items"),
        (VarType::Map, Value::Object(m)) => (Some(m.len() as f64), " entries"),
        _ => (None, ""),
    };
    if let Some(x) = measure {
        // A secret's value (or size) is never quoted, not even as the number it is.
        let found = if shown == crate::job::redact::MASK {
            String::new()
        } else {
            format!(", found {x}{what}")
        };
        if let Some(min) = c.min
            && x < min
        {
            return Err((
                format!("must be at least {min}{what}{found}"),
                format!("use a value of at least {min}{what}"),
            ));
        }
        if let Some(max) = c.max
            && x > max
        {
            return Err((
                format!("must be at most {max}{what}{found}"),
                format!("use a value of at most {max}{what}"),
            ));
        }
    }
    if let (Some(pattern), Value::String(s)) = (&c.pattern, value) {
        let re = regex::Regex::new(pattern)
            .map_err(|e| (format!("bad pattern: {e}"), "fix the template".into()))?;
        if !re.is_match(s) {
            return Err((
                format!("{shown} does not match the pattern {pattern}"),
                format!("use a value matching {pattern}"),
            ));
        }
    }
    Ok(())
}
