//! Templates: a folder of terraform files and a `template.yaml` that declares the variables a job
//! may set, with their types and constraints, and rules across variables.
//!
//! ```yaml
//! description: A network and a cluster in the test cloud
//! variables:
//!   region:     { type: string, required: true, enum: [eu-west-1, us-east-1] }
//!   node_count: { type: number, default: 1, min: 1, max: 20 }
//!   ha:         { type: bool, default: false }
//!   name:       { type: string, required: true, pattern: "^[a-z][a-z0-9-]{2,30}$" }
//!   password:   { type: string, sensitive: true }
//! rules:
//!   - when: { ha: true }
//!     require: { node_count: { min: 3 } }
//!     message: a highly available cluster needs at least 3 nodes
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod modules;
mod sensitivity;
pub mod source;

/// The file in a template folder that declares its variables.
pub const SPEC_FILE: &str = "template.yaml";

/// The clouds a template's `defaults` may name: where the runner runs (`local`: `terrace`).
pub const CLOUDS: [&str; 4] = ["aws", "gcp", "azure", "local"];

/// The variable the runner fills with the job's tags, when a template declares it (as
/// `{ type: map }`): see [`default_tags`].
pub const TAGS_VARIABLE: &str = "terrace_tags";

/// The tags a template declaring [`TAGS_VARIABLE`] gets: who the infrastructure is for, and
/// which job and template version last applied it (`job_id`).
pub fn default_tags(
    tenant: &str,
    workspace: &str,
    job_id: &str,
    template: &crate::job::TemplateRef,
) -> BTreeMap<String, String> {
    [
        ("terrace_tenant", tenant),
        ("terrace_workspace", workspace),
        ("terrace_job", job_id),
        ("terrace_template", &template.name),
        ("terrace_template_version", &template.version),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The type of a template variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VarType {
    String,
    Number,
    Bool,
    List,
    Map,
}

impl VarType {
    pub fn matches(self, value: &serde_json::Value) -> bool {
        use serde_json::Value as V;
        matches!(
            (self, value),
            (Self::String, V::String(_))
                | (Self::Number, V::Number(_))
                | (Self::Bool, V::Bool(_))
                | (Self::List, V::Array(_))
                | (Self::Map, V::Object(_))
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Number => "number",
            Self::Bool => "bool",
            Self::List => "list",
            Self::Map => "map",
        }
    }
}

/// Limits on a value: allowed values, bounds (numbers; item counts of lists and maps; length of
/// strings) and a regular expression (strings).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraint {
    #[serde(default, rename = "enum", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
}

/// One declared variable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variable {
    #[serde(rename = "type")]
    pub var_type: VarType,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub default: Option<serde_json::Value>,
    #[serde(default)]
    pub sensitive: bool,
    /// Declared `ephemeral = true` in terraform (1.10 and later): its value is in no plan and
    /// no state, so an approved plan's apply is given it again; Terrace records it nowhere
    /// (masked as a sensitive value is).
    #[serde(default)]
    pub ephemeral: bool,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(flatten)]
    pub constraint: Constraint,
}

/// A rule across variables: when every `when` variable equals its value, each `require`d
/// variable must meet its constraint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub when: BTreeMap<String, serde_json::Value>,
    pub require: BTreeMap<String, Constraint>,
    #[serde(default)]
    pub message: Option<String>,
}

/// The content of `template.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub variables: BTreeMap<String, Variable>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Per cloud, values for variables a job leaves unset, before the variables' own defaults:
    /// `defaults: { aws: { instance_type: t3.small }, gcp: { instance_type: e2-small } }`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub defaults: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// Modules from the library, each pinned by exact version and digest (see [`modules`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, modules::Pin>,
}

/// A template found on disk.
#[derive(Clone, Debug)]
pub struct Template {
    pub dir: PathBuf,
    pub spec: TemplateSpec,
    /// Its pinned modules, found in the library with their pinned digests.
    pub modules: Vec<modules::Module>,
    /// For a version fetched from a bucket, the SHA-256 of its published listing: what its
    /// files, and each job's copy of them, are checked against (see
    /// [`Template::copy_into`]). `None` for a folder of the operator's own.
    pub published: Option<String>,
}

/// Why a template could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template folder {0} does not exist")]
    Missing(PathBuf),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is invalid: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl Template {
    /// Loads `<root>/<name>/<version>` and checks its `template.yaml` for self-consistency.
    ///
    /// # Errors
    /// [`TemplateError`] naming the file and the problem.
    pub fn load(root: &Path, name: &str, version: &str) -> Result<Self, TemplateError> {
        let dir = root.join(name).join(version);
        if !dir.is_dir() {
            return Err(TemplateError::Missing(dir));
        }
        let published = std::fs::read_to_string(source::fetched_marker(&dir))
            .ok()
            .map(|digest| digest.trim().to_owned());
        let dir = pinned(dir);
        let path = dir.join(SPEC_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| TemplateError::Read {
            path: path.clone(),
            source,
        })?;
        let spec: TemplateSpec =
            serde_norway::from_str(&text).map_err(|e| TemplateError::Invalid {
                path: path.clone(),
                message: e.to_string(),
            })?;
        spec.check()
            .map_err(|message| TemplateError::Invalid { path, message })?;
        check_no_backend(&dir)?;
        sensitivity::check(&spec, &dir)?;
        let modules = modules::resolve(root, &dir, &dir.join(SPEC_FILE), &spec.modules)?;
        Ok(Self {
            dir,
            spec,
            modules,
            published,
        })
    }

    /// Copies the template's files into a job's workdir `to` (all but `template.yaml` and any
    /// `terraform.tfstate`). A version fetched from a bucket is checked as it is copied, as
    /// modules are ([`modules::install`]): its files must still be the published listing, and
    /// the copy must be exactly those files, so a cache changed since the fetch (by a job's
    /// terraform running as the runner's own user, say) never reaches terraform. `keep`: what
    /// the workdir held before (left out of the check).
    ///
    /// # Errors
    /// A copy that fails, or files that differ from the published listing.
    pub fn copy_into(&self, to: &Path, keep: &[&str]) -> std::io::Result<()> {
        let skipped = |name: &std::ffi::OsStr| name == SPEC_FILE || name == "terraform.tfstate";
        modules::copy_tree(&self.dir, to, &skipped)?;
        let Some(published) = &self.published else {
            return Ok(());
        };
        let changed = |why: String| {
            std::io::Error::other(format!(
                "template {} {why}; it is fetched afresh for the next job",
                self.dir.display()
            ))
        };
        let source = modules::listing(&self.dir)?;
        let found = state_backends::sha256_hex(source.as_bytes());
        if found != *published {
            return Err(changed(format!(
                "changed in the runner's cache after it was fetched (its files' digest is {found}, the published listing's {published})"
            )));
        }
        let path_of = |line: &str| line.split_once("  ").map(|(_, path)| path.to_owned());
        let last = |path: &str| path.rsplit('/').next().unwrap_or(path).to_owned();
        let expected: Vec<String> = source
            .lines()
            .filter(|line| path_of(line).is_some_and(|p| !skipped(last(&p).as_ref())))
            .map(str::to_owned)
            .collect();
        let copied: Vec<String> = modules::listing(to)?
            .lines()
            .filter(|line| path_of(line).is_some_and(|p| !keep.contains(&p.as_str())))
            .map(str::to_owned)
            .collect();
        if copied != expected {
            return Err(changed(
                "was copied into the job's workdir other than its published listing says".into(),
            ));
        }
        Ok(())
    }
}

/// A default a job would be refused for is the template's mistake: said when it loads, not when
/// a job leaves the variable unset. The value is never quoted (it may be a secret's).
fn within_limits(var: &Variable, value: &serde_json::Value, field: &str) -> Result<(), String> {
    crate::job::validate::check_constraint(&var.constraint, var.var_type, value, "the value")
        .map_err(|(problem, _)| {
            // A limit's message may give the number (or length) found: not a secret's.
            let problem = if var.sensitive {
                "does not fit the variable's limits".to_owned()
            } else {
                problem
            };
            format!("{field}: {problem}, so a job leaving it unset would be refused")
        })
}

/// A version folder that is a link (a copy fetched from a bucket, see [`source`]) is read
/// through its target: the job keeps the copy it was checked with while the link moves on.
pub(crate) fn pinned(dir: PathBuf) -> PathBuf {
    match std::fs::read_link(&dir) {
        Ok(target) if target.is_absolute() => target,
        _ => dir,
    }
}

/// A template must not choose where its state lives: the runner serves it (a `backend` or
/// `cloud` block of its own would make `terraform init` fail, or send the state elsewhere).
fn check_no_backend(dir: &Path) -> Result<(), TemplateError> {
    let entries = std::fs::read_dir(dir).map_err(|source| TemplateError::Read {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "tf") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|source| TemplateError::Read {
            path: path.clone(),
            source,
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            let block = if line.starts_with("backend \"") || line.starts_with("backend\"") {
                "backend"
            } else if line.starts_with("cloud {") || line.starts_with("cloud{") {
                "cloud"
            } else {
                continue;
            };
            return Err(TemplateError::Invalid {
                path,
                message: format!(
                    "line {} declares a `{block}` block: remove it; the runner keeps each workspace's state in the customer's store itself",
                    n + 1
                ),
            });
        }
    }
    Ok(())
}

impl TemplateSpec {
    /// Checks that patterns compile, defaults fit their declarations and rules name declared
    /// variables.
    fn check(&self) -> Result<(), String> {
        if let Some(tags) = self.variables.get(TAGS_VARIABLE)
            && (tags.var_type != VarType::Map
                || tags.required
                || tags.default.is_some()
                || tags.sensitive
                || tags.constraint != Constraint::default())
        {
            return Err(format!(
                "variables.{TAGS_VARIABLE} is filled by the runner (tenant, workspace, job, template and version): declare it as `{{ type: map }}`, without required, default, sensitive or limits"
            ));
        }
        for (name, var) in &self.variables {
            if let Some(pattern) = &var.constraint.pattern {
                regex::Regex::new(pattern)
                    .map_err(|e| format!("variables.{name}.pattern does not compile: {e}"))?;
            }
            if let Some(default) = &var.default {
                if !var.var_type.matches(default) {
                    return Err(format!(
                        "variables.{name}.default is not a {}",
                        var.var_type.name()
                    ));
                }
                within_limits(var, default, &format!("variables.{name}.default"))?;
            }
        }
        for (cloud, values) in &self.defaults {
            if !CLOUDS.contains(&cloud.as_str()) {
                return Err(format!(
                    "defaults.{cloud}: is not a cloud: use {}",
                    CLOUDS.join(", ")
                ));
            }
            for (name, value) in values {
                let var = self
                    .variables
                    .get(name)
                    .filter(|_| name != TAGS_VARIABLE)
                    .ok_or_else(|| {
                        format!("defaults.{cloud}.{name}: names no variable the template declares")
                    })?;
                if !var.var_type.matches(value) {
                    return Err(format!(
                        "defaults.{cloud}.{name}: is not a {}",
                        var.var_type.name()
                    ));
                }
                within_limits(var, value, &format!("defaults.{cloud}.{name}"))?;
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            for name in rule.when.keys().chain(rule.require.keys()) {
                if !self.variables.contains_key(name) {
                    return Err(format!("rules[{i}] names the undeclared variable {name:?}"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cloud_defaults_name_a_cloud_and_a_declared_variable_of_its_type() {
        let spec = |defaults: &str| -> Result<(), String> {
            let text = format!(
                "variables:\n  size: {{ type: number, default: 1, max: 5 }}\n  terrace_tags: {{ type: map }}\ndefaults: {defaults}\n"
            );
            serde_norway::from_str::<TemplateSpec>(&text)
                .unwrap()
                .check()
        };
        assert!(spec("{ aws: { size: 3 }, local: { size: 2 } }").is_ok());
        assert!(
            spec("{ moon: { size: 3 } }")
                .unwrap_err()
                .contains("defaults.moon: is not a cloud")
        );
        assert!(
            spec("{ aws: { colour: red } }")
                .unwrap_err()
                .contains("defaults.aws.colour")
        );
        assert!(
            spec("{ aws: { size: big } }")
                .unwrap_err()
                .contains("is not a number")
        );
        assert!(
            spec("{ aws: { terrace_tags: {} } }")
                .unwrap_err()
                .contains("names no variable")
        );
        assert_eq!(
            spec("{ gcp: { size: 9 } }").unwrap_err(),
            "defaults.gcp.size: must be at most 5, found 9, so a job leaving it unset would be refused"
        );
        let own = serde_norway::from_str::<TemplateSpec>(
            "variables:\n  pw: { type: string, sensitive: true, default: hunter2, pattern: '^[a-z]{12,}$' }\n",
        )
        .unwrap()
        .check()
        .unwrap_err();
        assert_eq!(
            own,
            "variables.pw.default: does not fit the variable's limits, so a job leaving it unset would be refused"
        );
        assert!(!own.contains("hunter2"), "a default is never quoted: {own}");
    }

    #[test]
    fn a_template_with_its_own_backend_is_refused_with_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t/1.0.0");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join(SPEC_FILE), "variables: {}\n").unwrap();
        std::fs::write(
            t.join("main.tf"),
            "# backend \"s3\" {} in a comment is fine\n",
        )
        .unwrap();
        assert!(Template::load(dir.path(), "t", "1.0.0").is_ok());
        std::fs::write(
            t.join("backend.tf"),
            "terraform {\n  backend \"s3\" {\n    bucket = \"x\"\n  }\n}\n",
        )
        .unwrap();
        let err = Template::load(dir.path(), "t", "1.0.0")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("backend.tf") && err.contains("line 2") && err.contains("`backend`"),
            "{err}"
        );
    }
}
