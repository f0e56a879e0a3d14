//! Every record a test sees is checked against the published JSON Schemas (`docs/schema/`):
//! results-channel messages, job and cancel messages, and `terrace … --json` answers. A record
//! that departs from its schema fails the test that saw it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/schema")
}

type Validators = Mutex<HashMap<String, &'static jsonschema::Validator>>;

fn validator(name: &str) -> &'static jsonschema::Validator {
    static CACHE: OnceLock<Validators> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    if let Some(v) = cache.get(name) {
        return v;
    }
    let path = dir().join(format!("{name}.schema.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no schema {}: {e}", path.display()));
    let schema: Value = serde_json::from_str(&text).unwrap();
    let v = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .unwrap_or_else(|e| panic!("{name} is not a valid schema: {e}"));
    let v: &'static jsonschema::Validator = Box::leak(Box::new(v));
    cache.insert(name.to_owned(), v);
    v
}

/// Panics unless `value` is valid against `docs/schema/<name>.schema.json`, naming every
/// departure.
pub fn check(name: &str, value: &Value) {
    let errors: Vec<String> = validator(name)
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "not a valid {name} record: {errors:#?}\n{value:#}"
    );
}

/// Checks a record from a queue or topic by its shape: a results-channel message (`kind`), a
/// job message (`job`) or a cancel message (`cancel`). Anything else fails.
pub fn check_record(value: &Value) {
    let name = if value.get("kind").is_some() {
        "message"
    } else if value.get("job").is_some() {
        "job-message"
    } else if value.get("cancel").is_some() {
        "cancel-message"
    } else {
        panic!("a record of no published schema: {value:#}");
    };
    check(name, value);
}

/// Checks a results-channel message, and gives it back.
pub fn message(value: Value) -> Value {
    check("message", &value);
    value
}

/// Checks what `terrace ARGS` printed when ARGS ask for JSON (an error prints nothing there).
pub fn check_cli(args: &[&str], stdout: &str) {
    if !args.contains(&"--json") || stdout.trim().is_empty() {
        return;
    }
    // The command and its words, after any global flag and its value.
    const COMMANDS: [&str; 10] = [
        "run",
        "result",
        "workspaces",
        "runs",
        "status",
        "cancel",
        "estimate",
        "state",
        "template",
        "logs",
    ];
    let start = args
        .iter()
        .position(|a| COMMANDS.contains(a))
        .unwrap_or(args.len());
    let words: Vec<&str> = args[start..]
        .iter()
        .copied()
        .filter(|a| !a.starts_with('-'))
        .collect();
    let name = match words.as_slice() {
        ["run" | "result", ..] => "result",
        ["workspaces", ..] => "cli-workspaces",
        ["runs", ..] => "cli-runs",
        ["status", ..] => "cli-status",
        ["cancel", ..] => "cli-cancel",
        ["estimate", ..] => "cli-estimate",
        ["state", "versions", ..] => "cli-state-versions",
        ["state", "backups", ..] => "cli-state-backups",
        ["template", "list", ..] => "cli-template-list",
        ["template", "show", ..] => "cli-template-show",
        ["logs", ..] => {
            for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
                check("cli-log-line", &serde_json::from_str(line).unwrap());
            }
            return;
        }
        _ => panic!("terrace {args:?} --json has no published schema"),
    };
    let value: Value = serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("terrace {args:?} printed no JSON ({e}): {stdout}"));
    check(name, &value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_departs_from_its_schema_is_caught() {
        let good = serde_json::json!({
            "kind": "rejection", "schema": 1, "status": "rejected", "message_id": "m1",
            "errors": [{ "field": "id", "problem": "is required", "fix": "add id" }],
        });
        check_record(&good);
        let mut bad = good.clone();
        bad["status"] = "accepted".into();
        assert!(std::panic::catch_unwind(|| check_record(&bad)).is_err());
        let mut missing = good;
        missing.as_object_mut().unwrap().remove("errors");
        assert!(std::panic::catch_unwind(|| check_record(&missing)).is_err());
    }
}
