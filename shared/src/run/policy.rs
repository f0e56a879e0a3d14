//! Policies on plans (see `docs/policy.md`): Rego files whose `deny` and `warn` rules
//! (conftest's convention) are evaluated against every plan before anything is applied.
//!
//! A [`PolicySet`] is read and parsed once, when the runner starts: a file that does not parse
//! stops it there, named with its line. Each plan is then evaluated in a child process of the
//! runner's own binary ([`child`]), with an address-space limit and a deadline: a policy that
//! loops or allocates without bound is stopped and reported, and never takes the runner, or
//! the jobs beside it, down. The input ([`input`]) is terraform's plan JSON with every value
//! terraform or the job marks sensitive masked, and the job's facts under `input.terrace`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

pub mod child;
pub mod input;
pub mod source;

/// The largest policy file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Rule names that fail a plan, and that warn: conftest's, with its `deny_…` forms.
const DENY_RULES: [&str; 2] = ["deny", "violation"];
const WARN_RULES: [&str; 1] = ["warn"];

/// One Rego file of a set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyFile {
    /// Its path in the set's folder, `/`-separated.
    pub name: String,
    pub text: String,
    /// Written in Rego v0 (no `if`/`contains`), as older policies are; v1 otherwise.
    #[serde(default)]
    pub v0: bool,
    /// The set it belongs to beside others: empty for the runner's, the label of a tenant's.
    /// Each set is evaluated on its own, so no set's rules can change another's.
    #[serde(default)]
    pub group: String,
}

/// The policies a runner holds every plan to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySet {
    /// Where it was read from, as an operator names it.
    pub origin: String,
    pub files: Vec<PolicyFile>,
    /// `sha256:` of every file's name and text, in name order: which set gave a verdict.
    pub digest: String,
}

/// What one evaluation may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Wall-clock time for the whole evaluation.
    pub time: Duration,
    /// Address space of the process that evaluates (`RLIMIT_AS`).
    pub memory_bytes: u64,
}

impl Default for Bounds {
    /// Ten seconds and 1 GiB: a plan of thousands of resources evaluates in well under a
    /// second.
    fn default() -> Self {
        Self {
            time: Duration::from_secs(10),
            memory_bytes: 1 << 30,
        }
    }
}

/// A runner's policies: the set, and how each evaluation is bounded and run.
#[derive(Clone, Debug)]
pub struct Policies {
    pub set: PolicySet,
    pub bounds: Bounds,
    /// The binary that evaluates, as a child process (the runner's own, which answers
    /// [`child::ARG`]); none evaluates in-process, bounded in time only (the library's tests).
    pub evaluator: Option<std::path::PathBuf>,
}

/// The verdicts of a set on one plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Verdicts {
    /// The set's digest (`sha256:…`).
    pub policies: String,
    /// Messages of `deny` (and `violation`) rules: the plan may not be applied.
    pub deny: Vec<Verdict>,
    /// Messages of `warn` rules: reported, the job goes on.
    pub warn: Vec<Verdict>,
}

/// One message of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Verdict {
    /// The file (or files) of the rule's package.
    pub policy: String,
    /// The rule, `data.<package>.<rule>`.
    pub rule: String,
    pub message: String,
}

impl Verdicts {
    /// Every deny message with its rule, for an error.
    pub fn denied(&self) -> String {
        self.deny
            .iter()
            .map(Verdict::describe)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Verdict {
    pub fn describe(&self) -> String {
        format!("{} ({}, {})", self.message, self.rule, self.policy)
    }
}

/// Why a set could not be read or a plan could not be judged.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policies in {origin}: {why}")]
    Read { origin: String, why: String },
    /// Rego's own message names the file, line and column.
    #[error("policy {file} does not parse: {message}")]
    Parse { file: String, message: String },
    #[error(
        "the policies ran past their limit of {limit:?}: a rule that loops or grows without end"
    )]
    Time { limit: Duration },
    #[error(
        "the policies ran out of memory (limit {} MiB): a rule that grows without end",
        .limit_bytes >> 20
    )]
    Memory { limit_bytes: u64 },
    /// A rule's own error (a builtin given the wrong type, rules that conflict).
    #[error("the policies could not be evaluated: {0}")]
    Eval(String),
    /// The runner's fault, not the policies': the evaluator did not start or answered nothing
    /// readable.
    #[error("the runner could not evaluate the policies: {0}")]
    Evaluator(String),
}

impl PolicyError {
    /// A limit the evaluation reached (time or memory), rather than a policy's own error.
    pub fn is_limit(&self) -> bool {
        matches!(self, Self::Time { .. } | Self::Memory { .. })
    }
}

/// The most verdicts of each kind a result carries, and the longest message: a result must
/// fit a queue message. Past them, one verdict says how many more there were.
const MAX_VERDICTS: usize = 50;
const MAX_MESSAGE: usize = 1000;

impl PolicySet {
    /// Reads every `.rego` file under `dir` (tests, `*_test.rego`, left out) and parses each.
    ///
    /// # Errors
    /// A folder or file that cannot be read, no policy in it, or the first file that does not
    /// parse, with its line.
    pub fn load(dir: &Path) -> Result<Self, PolicyError> {
        let origin = dir.display().to_string();
        let read = |why: String| PolicyError::Read {
            origin: origin.clone(),
            why,
        };
        let mut found = Vec::new();
        let mut folders = vec![dir.to_owned()];
        while let Some(folder) = folders.pop() {
            let entries = std::fs::read_dir(&folder)
                .map_err(|e| read(format!("{}: {e}", folder.display())))?;
            for entry in entries {
                let entry = entry.map_err(|e| read(e.to_string()))?;
                let path = entry.path();
                let kind = entry.file_type().map_err(|e| read(e.to_string()))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                if kind.is_dir() {
                    folders.push(path);
                } else if name.ends_with(".rego") && !name.ends_with("_test.rego") {
                    found.push(path);
                }
            }
        }
        let mut files = Vec::new();
        for path in found {
            let name = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            let size = std::fs::metadata(&path)
                .map_err(|e| read(format!("{name}: {e}")))?
                .len();
            if size > MAX_FILE_BYTES {
                return Err(read(format!(
                    "{name} is {size} bytes, over the {MAX_FILE_BYTES} a policy file may be"
                )));
            }
            let text = std::fs::read_to_string(&path).map_err(|e| read(format!("{name}: {e}")))?;
            files.push((name, text));
        }
        if files.is_empty() {
            return Err(read(
                "no .rego file: put the policies there, or unset the setting".into(),
            ));
        }
        Self::parse(origin, files)
    }

    /// A set of `files` (name, Rego), each parsed: as Rego v1, else as v0.
    ///
    /// # Errors
    /// The first file that parses as neither, with the v1 error (file, line, column), or a set
    /// whose files do not go together.
    pub fn parse(origin: String, files: Vec<(String, String)>) -> Result<Self, PolicyError> {
        let mut parsed = Vec::with_capacity(files.len());
        for (name, text) in files {
            let v0 = match parses(&name, &text, false) {
                Ok(()) => false,
                Err(v1) => match parses(&name, &text, true) {
                    Ok(()) => true,
                    Err(_) => {
                        return Err(PolicyError::Parse {
                            file: name,
                            message: v1,
                        });
                    }
                },
            };
            parsed.push(PolicyFile {
                name,
                text,
                v0,
                group: String::new(),
            });
        }
        parsed.sort_by(|a, b| a.name.cmp(&b.name));
        let set = Self {
            origin,
            digest: digest(&parsed),
            files: parsed,
        };
        // The files load side by side (a conflict between rules is found when evaluated).
        engine(&set.files, None).map_err(|e| PolicyError::Read {
            origin: set.origin.clone(),
            why: e,
        })?;
        Ok(set)
    }
}

impl PolicySet {
    /// This set with `other`'s files beside its own, named `<label>/<file>`: a tenant's set
    /// beside the runner's. Each is evaluated on its own (no rule of one can change a rule of
    /// the other, even in a package of the same name), and the verdicts of both count.
    pub fn with(&self, other: &PolicySet, label: &str) -> PolicySet {
        let mut files = self.files.clone();
        files.extend(other.files.iter().map(|f| PolicyFile {
            name: format!("{label}/{}", f.name),
            group: label.to_owned(),
            ..f.clone()
        }));
        PolicySet {
            origin: format!("{} and {}", self.origin, other.origin),
            digest: digest(&files),
            files,
        }
    }
}

/// `sha256:` of every file's name and text, in order.
fn digest(files: &[PolicyFile]) -> String {
    let mut hash = sha2::Sha256::new();
    for file in files {
        hash.update(file.name.as_bytes());
        hash.update([0]);
        hash.update(file.text.as_bytes());
        hash.update([0]);
    }
    format!("sha256:{}", hex(&hash.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `text` parses (as Rego v0 when `v0`), else regorus's message.
fn parses(name: &str, text: &str, v0: bool) -> Result<(), String> {
    let mut engine = regorus::Engine::new();
    engine.set_rego_v0(v0);
    engine
        .add_policy(name.to_owned(), text.to_owned())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// An engine holding `files`, with the time limit; each package's files.
fn engine(
    files: &[PolicyFile],
    limit: Option<Duration>,
) -> Result<(regorus::Engine, BTreeMap<String, Vec<String>>), String> {
    let mut engine = regorus::Engine::new();
    // A rule's `print` is kept in the engine (and dropped), never written out.
    engine.set_gather_prints(true);
    if let Some(limit) = limit {
        engine.set_execution_timer_config(regorus::utils::limits::ExecutionTimerConfig {
            limit,
            check_interval: std::num::NonZeroU32::new(64).expect("not zero"),
        });
    }
    let mut packages: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in files {
        engine.set_rego_v0(file.v0);
        let package = engine
            .add_policy(file.name.clone(), file.text.clone())
            .map_err(|e| e.to_string())?;
        packages.entry(package).or_default().push(file.name.clone());
    }
    Ok((engine, packages))
}

/// Evaluates `files` on `input` here, in this thread, bounded in time by `limit` only: the
/// child process's work ([`child`]), and the library's tests'.
///
/// # Errors
/// A limit reached, or a rule's own error (a builtin given the wrong type, a conflict).
pub fn evaluate_here(
    files: &[PolicyFile],
    digest: &str,
    input: &str,
    limit: Duration,
) -> Result<Verdicts, PolicyError> {
    let input = regorus::Value::from_json_str(input)
        .map_err(|e| PolicyError::Evaluator(format!("the input: {e}")))?;
    let mut verdicts = Verdicts {
        policies: digest.to_owned(),
        ..Verdicts::default()
    };
    let mut groups: BTreeMap<&str, Vec<PolicyFile>> = BTreeMap::new();
    for file in files {
        groups.entry(&file.group).or_default().push(file.clone());
    }
    for group in groups.values() {
        judge_group(group, &input, limit, &mut verdicts)?;
    }
    for list in [&mut verdicts.deny, &mut verdicts.warn] {
        cap(list);
    }
    Ok(verdicts)
}

/// At most [`MAX_VERDICTS`], each message at most [`MAX_MESSAGE`] bytes.
fn cap(list: &mut Vec<Verdict>) {
    for v in list.iter_mut() {
        if v.message.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !v.message.is_char_boundary(end) {
                end -= 1;
            }
            v.message.truncate(end);
            v.message.push('…');
        }
    }
    if list.len() > MAX_VERDICTS {
        let more = list.len() - (MAX_VERDICTS - 1);
        list.truncate(MAX_VERDICTS - 1);
        let last = &list[MAX_VERDICTS - 2];
        let (policy, rule) = (last.policy.clone(), last.rule.clone());
        list.push(Verdict {
            policy,
            rule,
            message: format!("… and {more} more"),
        });
    }
}

/// One set's verdicts, from an engine of its own.
fn judge_group(
    files: &[PolicyFile],
    input: &regorus::Value,
    limit: Duration,
    verdicts: &mut Verdicts,
) -> Result<(), PolicyError> {
    let timed_out = |e: &anyhow::Error| {
        e.chain().any(|cause| {
            cause
                .downcast_ref::<regorus::LimitError>()
                .is_some_and(|l| matches!(l, regorus::LimitError::TimeLimitExceeded { .. }))
        }) || e.to_string().contains("exceeded time limit")
    };
    let (mut engine, packages) = engine(files, Some(limit)).map_err(PolicyError::Eval)?;
    engine.set_input(input.clone());
    for (package, files) in packages {
        let results = engine.eval_query(package.clone(), false).map_err(|e| {
            if timed_out(&e) {
                PolicyError::Time { limit }
            } else {
                PolicyError::Eval(format!("{package}: {e}"))
            }
        })?;
        let Some(value) = results
            .result
            .first()
            .and_then(|r| r.expressions.first())
            .map(|e| &e.value)
        else {
            continue;
        };
        let json = value
            .to_json_str()
            .map_err(|e| PolicyError::Evaluator(e.to_string()))?;
        let rules: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| PolicyError::Evaluator(e.to_string()))?;
        let Some(rules) = rules.as_object() else {
            continue;
        };
        for (rule, value) in rules {
            let into = if is_rule(rule, &DENY_RULES) {
                &mut verdicts.deny
            } else if is_rule(rule, &WARN_RULES) {
                &mut verdicts.warn
            } else {
                continue;
            };
            let rule = format!("{package}.{rule}");
            for message in messages(value, &rule) {
                into.push(Verdict {
                    policy: files.join(", "),
                    rule: rule.clone(),
                    message,
                });
            }
        }
    }
    Ok(())
}

/// `deny`, or `deny_<anything>`, for `names` = `["deny"]`.
fn is_rule(rule: &str, names: &[&str]) -> bool {
    names.iter().any(|name| {
        rule == *name
            || rule
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('_'))
    })
}

/// The messages a rule's value gives: each string of a set, each object's `msg`, the rule
/// itself when it is just `true`; any other value but `false` as its JSON (a deny is never
/// lost for being of another type).
fn messages(value: &serde_json::Value, rule: &str) -> Vec<String> {
    use serde_json::Value;
    match value {
        Value::Bool(false) => Vec::new(),
        Value::Bool(true) => vec![format!("{rule} is true")],
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items.iter().flat_map(|v| messages(v, rule)).collect(),
        Value::Object(o) => match o.get("msg") {
            Some(Value::String(msg)) => vec![msg.clone()],
            _ => vec![value.to_string()],
        },
        other => vec![format!("{rule}: {other}")],
    }
}

impl Policies {
    /// The set's verdicts on `input` (see [`input::of_plan`]), evaluated within the bounds.
    ///
    /// # Errors
    /// A limit reached, a rule's own error, or a child that could not be started.
    pub async fn evaluate(&self, input: &serde_json::Value) -> Result<Verdicts, PolicyError> {
        match &self.evaluator {
            Some(binary) => child::evaluate(binary, &self.set, input, self.bounds).await,
            None => {
                let (files, digest) = (self.set.files.clone(), self.set.digest.clone());
                let (input, limit) = (input.to_string(), self.bounds.time);
                tokio::task::spawn_blocking(move || evaluate_here(&files, &digest, &input, limit))
                    .await
                    .map_err(|e| PolicyError::Evaluator(e.to_string()))?
            }
        }
    }
}

#[cfg(test)]
mod tests;
