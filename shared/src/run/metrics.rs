//! One metrics record per job, on stderr as one JSON line among the function's JSON logs
//! (stdout is a task's result record): its duration in all and per step,
//! its outcome, attempts, the size of the state it left and how long it waited for the
//! workspace's lease. On AWS in CloudWatch's Embedded Metric Format (Lambda's and ECS's log
//! drivers turn the line into metrics with no API call); elsewhere the same JSON, for a
//! log-based metric (Cloud Logging, Log Analytics).

use serde_json::{Map, Value, json};

use crate::run::result::JobResult;

/// The namespace of the CloudWatch metrics.
pub const NAMESPACE: &str = "Terrace";

/// How the record is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// CloudWatch Embedded Metric Format.
    Emf,
    /// Plain JSON with the same fields.
    Json,
}

/// What a job measured beyond its result.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extra {
    /// Milliseconds from asking for the workspace's lease to holding it.
    pub lease_wait_ms: u64,
    /// Bytes of the last state version the job wrote (none: it wrote none).
    pub state_bytes: Option<u64>,
    /// Milliseconds from asking for the lease to terraform's first command starting: the
    /// runner's own share of a job's start (the lease, the reads under it, the state server,
    /// the workdir), with any wait for a busy workspace (also in `lease_wait_ms`). None: no
    /// terraform command ran.
    pub to_terraform_ms: Option<u64>,
    /// Milliseconds from holding the lease to having read what the run starts from under it
    /// (whether the job already ran or was cancelled, the status record, the state): the
    /// store's part of `to_terraform_ms` after the lease. None: the job was not leased.
    pub reads_ms: Option<u64>,
}

/// The record of `result` as one JSON object.
pub fn record(result: &JobResult, extra: Extra, format: Format) -> Value {
    let mut out = Map::new();
    out.insert("metric".into(), "terrace.job".into());
    for (k, v) in [
        ("job_id", &result.job_id),
        ("tenant", &result.tenant),
        ("workspace", &result.workspace),
    ] {
        out.insert(k.into(), v.clone().into());
    }
    out.insert("operation".into(), result.operation.as_str().into());
    out.insert("outcome".into(), result.status.as_str().into());
    if let Some(e) = &result.error {
        out.insert("error_category".into(), e.category.as_str().into());
    }
    // (name, value, CloudWatch unit)
    let mut metrics: Vec<(String, u64, &str)> = vec![
        ("duration_ms".into(), result.duration_ms, "Milliseconds"),
        (
            "attempts".into(),
            result.attempts.len().max(1) as u64,
            "Count",
        ),
        ("lease_wait_ms".into(), extra.lease_wait_ms, "Milliseconds"),
    ];
    if let Some(bytes) = extra.state_bytes {
        metrics.push(("state_bytes".into(), bytes, "Bytes"));
    }
    if let Some(ms) = extra.to_terraform_ms {
        metrics.push(("to_terraform_ms".into(), ms, "Milliseconds"));
    }
    if let Some(ms) = extra.reads_ms {
        metrics.push(("reads_ms".into(), ms, "Milliseconds"));
    }
    for step in &result.steps {
        let name = format!(
            "step_{}_ms",
            step.step.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        // A step run more than once (retries) counts in all.
        match metrics.iter_mut().find(|(n, _, _)| *n == name) {
            Some(m) => m.1 += step.duration_ms,
            None => metrics.push((name, step.duration_ms, "Milliseconds")),
        }
    }
    for (name, value, _) in &metrics {
        out.insert(name.clone(), (*value).into());
    }
    if format == Format::Emf {
        let definitions: Vec<Value> = metrics
            .iter()
            .map(|(name, _, unit)| json!({ "Name": name, "Unit": unit }))
            .collect();
        out.insert(
            "_aws".into(),
            json!({
                "Timestamp": (result.finished_at.unix_timestamp_nanos() / 1_000_000) as i64,
                "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE,
                    "Dimensions": [["operation", "outcome"], ["operation"]],
                    "Metrics": definitions,
                }],
            }),
        );
    }
    Value::Object(out)
}

/// Writes the record of `result` to stderr as one line.
pub fn emit(result: &JobResult, extra: Extra, format: Format) {
    use std::io::Write as _;
    let line = record(result, extra, format).to_string();
    let mut out = std::io::stderr().lock();
    // One write of the whole line (well under PIPE_BUF), so it never interleaves with the
    // log's lines or another job's record.
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> JobResult {
        let raw = json!({
            "schema": 1, "job_id": "j1", "tenant": "acme", "workspace": "demo",
            "operation": "apply", "template": "demo@1.0.0", "status": "failed",
            "started_at": "2026-11-24T10:00:00Z", "finished_at": "2026-11-24T10:00:02Z",
            "duration_ms": 2000,
            "steps": [
                { "step": "init", "duration_ms": 100, "exit_code": 0 },
                { "step": "apply", "duration_ms": 700, "exit_code": 1 },
                { "step": "apply", "duration_ms": 800, "exit_code": 1 }
            ],
            "attempts": [{ "attempt": 1 }, { "attempt": 2 }],
            "error": { "category": "quota", "step": "apply", "message": "m", "hint": "h", "retryable": false }
        });
        serde_json::from_value(raw).unwrap()
    }

    #[test]
    fn an_emf_record_declares_only_metrics_it_carries_as_numbers() {
        let extra = Extra {
            lease_wait_ms: 5,
            state_bytes: Some(1777),
            to_terraform_ms: Some(42),
            reads_ms: Some(11),
        };
        let r = record(&result(), extra, Format::Emf);
        let directive = &r["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        assert_eq!(r["_aws"]["Timestamp"], 1_795_514_402_000_i64);
        for dims in directive["Dimensions"].as_array().unwrap() {
            for d in dims.as_array().unwrap() {
                assert!(
                    r[d.as_str().unwrap()].is_string(),
                    "dimension {d} is a string"
                );
            }
        }
        let names: Vec<&str> = directive["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap())
            .collect();
        for name in &names {
            assert!(r[name].is_u64(), "{name} is a number: {r}");
        }
        assert_eq!(
            names,
            [
                "duration_ms",
                "attempts",
                "lease_wait_ms",
                "state_bytes",
                "to_terraform_ms",
                "reads_ms",
                "step_init_ms",
                "step_apply_ms"
            ]
        );
        assert_eq!(r["step_apply_ms"], 1500, "a retried step counts in all");
        assert_eq!(r["attempts"], 2);
        assert_eq!(
            (r["outcome"].as_str(), r["error_category"].as_str()),
            (Some("failed"), Some("quota"))
        );
        let plain = record(&result(), Extra::default(), Format::Json);
        assert!(plain.get("_aws").is_none());
        assert!(
            plain.get("state_bytes").is_none(),
            "no state written, none reported"
        );
    }
}
