//! `template.yaml` and the template's terraform files must agree on which variables are
//! sensitive. If only `template.yaml` says so, terraform prints what it derives from the value
//! (an attribute built from it, an encoding of it) in clear, beyond what Terrace's redaction of
//! the literal value can find; if only the terraform files say so, Terrace keeps the value in
//! clear in the job's record. Either way a secret reaches a log, so such a template is refused.
//!
//! They must agree on `ephemeral` too (terraform 1.10 and later): a value no plan keeps is given
//! again to an approved plan's apply, and only the variables `template.yaml` calls ephemeral
//! may be given there.

use std::collections::BTreeMap;
use std::path::Path;

use super::{SPEC_FILE, TemplateError, TemplateSpec};

/// A root-module variable as the terraform files declare it.
#[derive(Debug, PartialEq, Eq)]
struct Declared {
    /// The file that declares it.
    file: String,
    /// Its `sensitive` (or `ephemeral`, as read).
    sensitive: bool,
}

/// Refuses a template whose `template.yaml` and terraform files disagree on a variable's
/// `sensitive` or `ephemeral`.
///
/// # Errors
/// [`TemplateError::Invalid`] naming the variable, both files and the fix; or a terraform file
/// that cannot be read.
pub(super) fn check(spec: &TemplateSpec, dir: &Path) -> Result<(), TemplateError> {
    let declared = declared(dir, "sensitive")?;
    let mut problems = Vec::new();
    let ephemeral = declared_ephemeral(dir)?;
    for (name, var) in &spec.variables {
        match (var.ephemeral, ephemeral.get(name)) {
            (true, Some(tf)) if !tf.sensitive => problems.push(format!(
                "variables.{name} is ephemeral in {SPEC_FILE} but not in {}: add `ephemeral = true` to its `variable \"{name}\"` block, or every plan keeps its value",
                tf.file
            )),
            (false, Some(tf)) if tf.sensitive => problems.push(format!(
                "variables.{name} is ephemeral in {} but not in {SPEC_FILE}: add `ephemeral: true` to it there, or the apply of an approved plan cannot be given it",
                tf.file
            )),
            _ => {}
        }
        let Some(tf) = declared.get(name) else {
            continue;
        };
        match (var.sensitive, tf.sensitive) {
            (true, false) => problems.push(format!(
                "variables.{name} is sensitive in {SPEC_FILE} but not in {}: add `sensitive = true` to its `variable \"{name}\"` block, or terraform prints what it derives from the value in clear",
                tf.file
            )),
            (false, true) => problems.push(format!(
                "variables.{name} is sensitive in {} but not in {SPEC_FILE}: add `sensitive: true` to it there, or its value is kept in clear in the job's record",
                tf.file
            )),
            _ => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(TemplateError::Invalid {
            path: dir.join(SPEC_FILE),
            message: problems.join("; "),
        })
    }
}

/// Whether terraform reads `name` as an override file (after all the others, each of its
/// settings replacing the one it overrides).
fn is_override(name: &str) -> bool {
    let stem = name
        .strip_suffix(".tf.json")
        .or_else(|| name.strip_suffix(".tf"))
        .unwrap_or(name);
    stem == "override" || stem.ends_with("_override")
}

/// The root module's variables, from every `*.tf` and `*.tf.json` file in `dir`, as terraform
/// merges them: the primary files, then the override files in name order, whose `sensitive`
/// (when they set one) replaces the variable's.
fn declared(dir: &Path, attr: &str) -> Result<BTreeMap<String, Declared>, TemplateError> {
    let entries = std::fs::read_dir(dir).map_err(|source| TemplateError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<(bool, String, std::path::PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            (name.ends_with(".tf") || name.ends_with(".tf.json"))
                .then(|| (is_override(&name), name, path))
        })
        .collect();
    // Primary files first, then overrides; each group in name order.
    files.sort();
    let mut out = BTreeMap::new();
    for (overrides, name, path) in files {
        let text = std::fs::read_to_string(&path).map_err(|source| TemplateError::Read {
            path: path.clone(),
            source,
        })?;
        let invalid = |message: String| TemplateError::Invalid {
            path: path.clone(),
            message,
        };
        let found = if name.ends_with(".tf.json") {
            from_json(&text, attr).map_err(|e| invalid(format!("is not terraform JSON: {e}")))?
        } else {
            from_hcl(&text, attr).map_err(|e| invalid(format!("is not valid HCL: {e}")))?
        };
        for (var, sensitive) in found {
            let sensitive = sensitive.map_err(|found| {
                invalid(format!(
                    "variable {var:?} has `{attr} = {found}`: write true or false"
                ))
            })?;
            match (overrides, sensitive, out.get_mut(&var)) {
                // An override that does not set it leaves the variable as it was.
                (true, None, _) => {}
                (true, Some(sensitive), Some(d)) => {
                    *d = Declared {
                        file: name.clone(),
                        sensitive,
                    };
                }
                (_, sensitive, _) => {
                    out.insert(
                        var,
                        Declared {
                            file: name.clone(),
                            sensitive: sensitive.unwrap_or(false),
                        },
                    );
                }
            }
        }
    }
    Ok(out)
}

/// What a file says of a variable's `sensitive`: unset, a literal bool, or (as the error) the
/// expression that is neither.
type Setting = Result<Option<bool>, String>;

/// The variables the terraform files declare `ephemeral`, as [`declared`] reads `sensitive`.
fn declared_ephemeral(dir: &Path) -> Result<BTreeMap<String, Declared>, TemplateError> {
    declared(dir, "ephemeral")
}

/// `variable "NAME" { ATTR = … }` blocks of a `.tf` file.
fn from_hcl(text: &str, attr: &str) -> Result<Vec<(String, Setting)>, hcl::Error> {
    let body = hcl::parse(text)?;
    Ok(body
        .blocks()
        .filter(|b| b.identifier() == "variable")
        .filter_map(|b| {
            let name = b.labels().first()?.as_str().to_owned();
            let setting = match b.body().attributes().find(|a| a.key() == attr) {
                None => Ok(None),
                Some(a) => match a.expr() {
                    hcl::Expression::Bool(value) => Ok(Some(*value)),
                    other => Err(hcl::format::to_string(other).unwrap_or_else(|_| "…".into())),
                },
            };
            Some((name, setting))
        })
        .collect())
}

/// The `variable` object of a `.tf.json` file.
fn from_json(text: &str, attr: &str) -> Result<Vec<(String, Setting)>, serde_json::Error> {
    let doc: serde_json::Value = serde_json::from_str(text)?;
    let mut out = Vec::new();
    // `"variable": {"name": {…}}`, or a list of such objects.
    let groups: Vec<&serde_json::Value> = match &doc["variable"] {
        serde_json::Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    for group in groups {
        for (name, decl) in group.as_object().into_iter().flatten() {
            let setting = match decl.get(attr) {
                None => Ok(None),
                Some(serde_json::Value::Bool(value)) => Ok(Some(*value)),
                Some(other) => Err(other.to_string()),
            };
            out.push((name.clone(), setting));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::Template;

    /// A template `t/1.0.0` whose `template.yaml` declares `token` (sensitive or not) and whose
    /// terraform files are `files`.
    fn template(sensitive: bool, files: &[(&str, &str)]) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t/1.0.0");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(
            t.join("template.yaml"),
            format!(
                "variables:\n  token: {{ type: string, sensitive: {sensitive} }}\n  name: {{ type: string }}\n"
            ),
        )
        .unwrap();
        for (name, text) in files {
            std::fs::write(t.join(name), text).unwrap();
        }
        let outcome = match Template::load(dir.path(), "t", "1.0.0") {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        (dir, outcome)
    }

    const SENSITIVE: &str = r#"
variable "token" {
  type      = string
  sensitive = true
  validation {
    condition     = length(var.token) > 3 && !strcontains(var.token, "}")
    error_message = <<-EOT
      The token { is too short }.
    EOT
  }
}
variable "name" { type = string }
"#;
    const PLAIN: &str = "variable \"token\" {\n  type = string\n}\nvariable \"name\" {}\n";

    #[test]
    fn ephemeral_must_agree_too() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t/1.0.0");
        std::fs::create_dir_all(&t).unwrap();
        let eph = "variable \"token\" {\n  type = string\n  ephemeral = true\n}\n";
        let load = |yaml_ephemeral: bool, tf: &str| {
            std::fs::write(
                t.join("template.yaml"),
                format!("variables:\n  token: {{ type: string, ephemeral: {yaml_ephemeral} }}\n"),
            )
            .unwrap();
            std::fs::write(t.join("main.tf"), tf).unwrap();
            Template::load(dir.path(), "t", "1.0.0")
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(load(true, eph), None);
        let e = load(false, eph).unwrap();
        assert!(
            e.contains("variables.token is ephemeral in main.tf but not in template.yaml"),
            "{e}"
        );
        let e = load(true, "variable \"token\" {}\n").unwrap();
        assert!(e.contains("add `ephemeral = true`"), "{e}");
    }

    #[test]
    fn agreeing_declarations_load() {
        assert_eq!(template(true, &[("variables.tf", SENSITIVE)]).1, "");
        assert_eq!(template(false, &[("variables.tf", PLAIN)]).1, "");
    }

    #[test]
    fn a_secret_only_template_yaml_knows_is_refused_naming_the_file_and_the_fix() {
        let (_dir, e) = template(true, &[("variables.tf", PLAIN)]);
        assert!(
            e.contains("variables.token is sensitive in template.yaml but not in variables.tf")
                && e.contains("add `sensitive = true`"),
            "{e}"
        );
    }

    #[test]
    fn a_secret_only_terraform_knows_is_refused() {
        let (_dir, e) = template(false, &[("main.tf", SENSITIVE)]);
        assert!(
            e.contains("variables.token is sensitive in main.tf but not in template.yaml"),
            "{e}"
        );
    }

    #[test]
    fn json_declarations_count_too() {
        let json = r#"{"variable": {"token": {"type": "string", "sensitive": true}}}"#;
        assert_eq!(template(true, &[("variables.tf.json", json)]).1, "");
        let (_dir, e) = template(false, &[("variables.tf.json", json)]);
        assert!(e.contains("sensitive in variables.tf.json"), "{e}");
    }

    #[test]
    fn an_override_file_wins_where_it_sets_sensitive_and_only_there() {
        // Terraform reads `a_override.tf` after `variables.tf`, whatever their names' order.
        let off = "variable \"token\" {\n  sensitive = false\n}\n";
        let (_dir, e) = template(true, &[("variables.tf", SENSITIVE), ("a_override.tf", off)]);
        assert!(e.contains("not in a_override.tf"), "{e}");
        let silent = "variable \"token\" {\n  description = \"x\"\n}\n";
        assert_eq!(
            template(
                true,
                &[("variables.tf", SENSITIVE), ("override.tf", silent)]
            )
            .1,
            ""
        );
    }

    #[test]
    fn sensitive_must_be_a_plain_bool() {
        let text = "variable \"token\" {\n  sensitive = \"true\"\n}\n";
        let (_dir, e) = template(true, &[("variables.tf", text)]);
        assert!(e.contains("write true or false"), "{e}");
    }

    #[test]
    fn a_terraform_file_that_does_not_parse_is_named() {
        let (_dir, e) = template(false, &[("main.tf", "variable \"token\" {\n")]);
        assert!(e.contains("main.tf") && e.contains("not valid HCL"), "{e}");
    }
}
