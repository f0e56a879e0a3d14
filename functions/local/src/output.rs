//! What `terrace … --json` prints, one type per answer, and every published JSON Schema
//! (`terrace schema`, `docs/schema/`): each generated from the type that is serialized, never
//! written by hand. `docs/cli-json.md` says what the fields mean.

use schemars::{JsonSchema, Schema, schema_for};
use serde::Serialize;
use shared::run::lifecycle::{Transition, WorkspaceStatus};
use shared::run::result::{Changes, JobError, JobResult, Status};
use state_backends::{BackupInfo, VersionInfo};

use crate::ops::{JSON_SCHEMA, RunSummary};

/// `terrace workspaces --json`.
#[derive(Serialize, JsonSchema)]
pub struct Workspaces {
    pub schema: u32,
    /// `TENANT/WORKSPACE`, in order.
    pub workspaces: Vec<String>,
}

/// `terrace runs TENANT/WORKSPACE --json`.
#[derive(Serialize, JsonSchema)]
pub struct Runs {
    pub schema: u32,
    pub workspace: String,
    /// Runs recorded in all; `runs` holds the newest `--limit` of them, newest first.
    pub total: usize,
    pub runs: Vec<RunSummary>,
}

/// `terrace status TENANT/WORKSPACE --json`: the workspace's record (`status.json`) with its
/// newest `--history` moves; without a record, `status` only (`pending` or `unknown`).
#[derive(Serialize, JsonSchema)]
pub struct WorkspaceAnswer {
    pub schema: u32,
    pub workspace: String,
    /// A lifecycle phase (`provisioning`, `active`, …); without a record `pending` (runs, but
    /// no apply or destroy yet) or `unknown` (a state older than records).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "shared::job::schema::optional_date_time")]
    pub since: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// Moves, oldest first.
    pub history: Vec<Transition>,
}

impl WorkspaceAnswer {
    /// A workspace with its record, and its newest `history` moves.
    pub fn of(workspace: String, record: &WorkspaceStatus, history: usize) -> Self {
        let skip = record.history.len().saturating_sub(history);
        Self {
            schema: JSON_SCHEMA,
            workspace,
            status: record.status.as_str().to_owned(),
            since: Some(state_backends::display_time(record.since)),
            job_id: Some(record.job_id.clone()),
            reason: record.reason.clone(),
            exists: Some(record.exists),
            consecutive_failures: Some(record.consecutive_failures),
            history: record.history[skip..].to_vec(),
        }
    }

    /// A workspace without a record.
    pub fn without_record(workspace: String, status: &str) -> Self {
        Self {
            schema: JSON_SCHEMA,
            workspace,
            status: status.to_owned(),
            since: None,
            job_id: None,
            reason: None,
            exists: None,
            consecutive_failures: None,
            history: Vec::new(),
        }
    }
}

/// `terrace cancel JOB --json`.
#[derive(Serialize, JsonSchema)]
pub struct Cancelled {
    pub schema: u32,
    pub job_id: String,
    pub workspace: String,
    /// Whether a cancel was recorded; `false` when the job had already finished.
    pub cancelled: bool,
    /// How the job had finished, when it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// When the cancel was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "shared::job::schema::optional_date_time")]
    pub requested_at: Option<String>,
}

/// `terrace estimate JOB_FILE --json`.
#[derive(Serialize, JsonSchema)]
pub struct Estimated {
    pub schema: u32,
    /// The id the job was planned under: its own with `.estimate-<hex>`.
    pub job_id: String,
    pub status: Status,
    pub changes: Option<Changes>,
    pub cost: Option<shared::run::cost::Estimate>,
    /// The policies' verdicts on the plan (`--policies`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<shared::run::policy::Verdicts>,
    pub error: Option<JobError>,
}

/// `terrace state versions TENANT/WORKSPACE --json`.
#[derive(Serialize, JsonSchema)]
pub struct Versions {
    pub schema: u32,
    pub workspace: String,
    /// The current version's number; `null` with no current state.
    pub current: Option<u64>,
    pub versions: Vec<VersionInfo>,
}

/// `terrace state backups TENANT/WORKSPACE --json`.
#[derive(Serialize, JsonSchema)]
pub struct Backups {
    pub schema: u32,
    pub workspace: String,
    pub backups: Vec<BackupInfo>,
}

/// `terrace template list --json`.
#[derive(Serialize, JsonSchema)]
pub struct TemplateList {
    pub schema: u32,
    pub templates: Vec<TemplateItem>,
}

/// One template version as `terrace template list` finds it.
#[derive(Serialize, JsonSchema)]
pub struct TemplateItem {
    pub name: String,
    pub version: String,
    /// Whether it loads; `error` says why not.
    pub valid: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<Vec<ModuleUse>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A library module a template uses, pinned by digest.
#[derive(Serialize, JsonSchema)]
pub struct ModuleUse {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

/// `terrace template show NAME VERSION --json`.
#[derive(Serialize, JsonSchema)]
pub struct TemplateShown {
    pub schema: u32,
    pub name: String,
    pub version: String,
    pub description: Option<String>,
    /// Its variables as its `template.yaml` declares them (type, description, default,
    /// sensitive, ephemeral, validation): see docs/templates.md.
    pub variables: serde_json::Value,
    /// Its rules across variables, as declared.
    pub rules: serde_json::Value,
    pub modules: Vec<ModuleUse>,
    /// Whether it takes the platform's default tags (`terrace_tags`).
    pub tagged: bool,
}

/// Every published schema, by name: `docs/schema/<name>.schema.json`.
pub fn schemas() -> Vec<(&'static str, Schema)> {
    use shared::host::message::{CancelEnvelope, Message};
    use shared::host::pipeline::Envelope;
    type Target = serde_json::Map<String, serde_json::Value>;
    vec![
        ("job", schema_for!(shared::job::document::JobDocument)),
        ("job-message", schema_for!(Envelope<Target>)),
        ("cancel-message", schema_for!(CancelEnvelope<Target>)),
        ("result", schema_for!(JobResult)),
        ("message", schema_for!(Message)),
        (
            "dead-letter",
            schema_for!(shared::host::message::DeadLetter),
        ),
        (
            "sweep-report",
            schema_for!(shared::sweeps::report::SweepReport),
        ),
        ("cli-workspaces", schema_for!(Workspaces)),
        ("cli-runs", schema_for!(Runs)),
        ("cli-status", schema_for!(WorkspaceAnswer)),
        ("cli-cancel", schema_for!(Cancelled)),
        ("cli-estimate", schema_for!(Estimated)),
        ("cli-state-versions", schema_for!(Versions)),
        ("cli-state-backups", schema_for!(Backups)),
        ("cli-template-list", schema_for!(TemplateList)),
        ("cli-template-show", schema_for!(TemplateShown)),
        ("cli-log-line", schema_for!(shared::run::logs::LogLine)),
    ]
}

/// Every field of every object a schema describes, as `Definition.field` (`.field` at the
/// top).
fn fields(schema: &serde_json::Value) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut add = |owner: &str, object: &serde_json::Value| {
        if let Some(props) = object.get("properties").and_then(|p| p.as_object()) {
            out.extend(props.keys().map(|k| format!("{owner}.{k}")));
        }
    };
    add("", schema);
    if let Some(defs) = schema.get("$defs").and_then(|d| d.as_object()) {
        for (name, def) in defs {
            add(name, def);
        }
    }
    out
}

/// The name of the file in the schema folder that lists every field ever published under
/// the current schema numbers, one `schema: Definition.field` a line: `terrace schema --write`
/// only ever adds to it, and a test fails while a field in it is missing from the types.
pub const FIELDS_FILE: &str = "fields.txt";

/// Every field of every published schema, as [`FIELDS_FILE`] lists them.
pub fn all_fields() -> std::collections::BTreeSet<String> {
    schemas()
        .iter()
        .flat_map(|(name, schema)| {
            let value = serde_json::to_value(schema).unwrap_or_default();
            fields(&value)
                .into_iter()
                .map(move |f| format!("{name}: {f}"))
        })
        .collect()
}

/// A schema as its file holds it.
pub fn schema_text(schema: &Schema) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_default();
    text.push('\n');
    text
}

/// `terrace schema [NAME] [--write DIR]`.
///
/// # Errors
/// A folder that cannot be written.
pub fn schema_cmd(name: Option<&str>, write: Option<&std::path::Path>) -> anyhow::Result<u8> {
    use anyhow::Context as _;
    let all = schemas();
    if let Some(dir) = write {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, schema) in &all {
            let path = dir.join(format!("{name}.schema.json"));
            std::fs::write(&path, schema_text(schema))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        let path = dir.join(FIELDS_FILE);
        let mut listed: std::collections::BTreeSet<String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        listed.extend(all_fields());
        let text: String = listed.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {} schemas to {}", all.len(), dir.display());
        return Ok(crate::exit::OK);
    }
    let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
    match name {
        None => {
            for name in names {
                outln!("{name}");
            }
            Ok(crate::exit::OK)
        }
        Some(name) => match all.iter().find(|(n, _)| *n == name) {
            Some((_, schema)) => {
                outln!("{}", schema_text(schema).trim_end());
                Ok(crate::exit::OK)
            }
            None => {
                eprintln!(
                    "error: no schema named {name:?}: use one of {}",
                    names.join(", ")
                );
                Ok(crate::exit::USAGE)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/schema/` is what the types say: regenerate it with `make schema` after changing a
    /// record. Within a schema number fields are only ever added: a field that went away
    /// stays in `fields.txt` and fails here until the record's `schema` is raised (and its
    /// lines are taken out of the file with it).
    #[test]
    fn the_published_schemas_are_the_types_and_only_ever_gain_fields() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema");
        let mut stale = Vec::new();
        for (name, schema) in schemas() {
            let path = dir.join(format!("{name}.schema.json"));
            let published = std::fs::read_to_string(&path).ok();
            if published.as_deref() != Some(schema_text(&schema).as_str()) {
                stale.push(name);
            }
        }
        let listed: std::collections::BTreeSet<String> =
            std::fs::read_to_string(dir.join(FIELDS_FILE))
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect();
        let now = all_fields();
        let gone: Vec<&String> = listed.difference(&now).collect();
        assert!(
            gone.is_empty(),
            "fields removed {gone:?}: within a schema number a field may only be added"
        );
        assert!(
            now.is_subset(&listed),
            "{FIELDS_FILE} is stale: run `make schema`"
        );
        let published = std::fs::read_dir(&dir).unwrap().count();
        assert!(
            stale.is_empty(),
            "stale schemas {stale:?}: run `make schema`"
        );
        assert_eq!(
            published,
            schemas().len() + 1,
            "a file in docs/schema no type makes"
        );
    }
}
