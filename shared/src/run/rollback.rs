//! What `on_failure: rollback` rolls back to: the workspace's last successful apply. Each
//! successful apply records its job id in the workspace (`runs/_workspace/last-apply.json`;
//! `_` cannot start a job id); that job's `job.json` has its template and variables, sensitive
//! ones masked. A rollback re-applies that configuration, taking the values of sensitive
//! variables from the failing job (callers pass their secrets with every job), so terraform
//! reverts what the failed run changed and destroys what it created.

use crate::job::template::source::Templates;

use serde_json::{Map, Value};
use state_backends::{StateStore, WorkspaceId};

use crate::job::RawJob;
use crate::job::validate::{ValidatedJob, validate};
use crate::run::records::{JobRecord, last_apply};

/// The configuration of the workspace's last successful apply, ready to run as `job`'s
/// rollback (same id, tenant and workspace); `None` when no apply has succeeded there yet.
///
/// # Errors
/// Why it cannot be rebuilt, as a sentence for the result.
pub async fn previous_configuration(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job: &ValidatedJob,
    templates: &Templates,
) -> Result<Option<(String, ValidatedJob)>, String> {
    let Some((prev_id, record)) = last_apply(store, ws).await? else {
        return Ok(None);
    };
    let raw = rollback_job(&record, job)?;
    templates
        .fetch(&record.template.name, &record.template.version)
        .await
        .map_err(|e| format!("the template of {prev_id} cannot be had: {e}"))?;
    let validated = validate(&raw, templates.root()).map_err(|errors| {
        let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
        format!(
            "the configuration of {prev_id} is no longer valid: {}",
            problems.join("; ")
        )
    })?;
    Ok(Some((prev_id, validated)))
}

/// The rollback job: the earlier job's template and variables, with masked (sensitive) values
/// taken from `job`.
fn rollback_job(record: &JobRecord, job: &ValidatedJob) -> Result<RawJob, String> {
    let masked = record.masked_variables();
    let mut variables = Map::new();
    let declared = &job.template.spec.variables;
    for (name, value) in &record.variables {
        let sensitive = declared.get(name).is_some_and(|v| v.sensitive);
        let value = if masked.contains(name) && !sensitive {
            // Masked because its value held a secret: that value is not recorded, and this
            // job's may differ, so it cannot be restored.
            return Err(format!(
                "the value of `{name}` in the last successful apply is not recorded (it held a secret), so a rollback cannot restore it"
            ));
        } else if masked.contains(name) {
            job.job.variables.get(name).cloned().ok_or_else(|| {
                format!(
                    "the sensitive variable `{name}` of the last successful apply is not in this job, so its value is unknown"
                )
            })?
        } else {
            value.clone()
        };
        variables.insert(name.clone(), value);
    }
    let j = &job.job;
    let mut doc = Map::new();
    doc.insert("id".into(), Value::from(j.id.clone()));
    doc.insert("tenant".into(), Value::from(j.tenant.clone()));
    doc.insert("workspace".into(), Value::from(j.workspace.clone()));
    doc.insert("operation".into(), Value::from("apply"));
    doc.insert(
        "template".into(),
        serde_json::to_value(&record.template).map_err(|e| e.to_string())?,
    );
    doc.insert("variables".into(), Value::Object(variables));
    doc.insert("timeout".into(), Value::from(j.timeout.as_secs()));
    Ok(RawJob(doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_values_come_from_the_failing_job_and_others_from_the_record() {
        let record: JobRecord = serde_json::from_value(serde_json::json!({
            "schema": 1, "id": "j1", "tenant": "t", "workspace": "w", "operation": "apply",
            "template": { "name": "demo", "version": "1.0.0" },
            // A plain value that reads like the mask is a value: only `masked` names masks.
            "variables": { "node_count": 1, "admin_password": crate::job::redact::MASK, "note": crate::job::redact::MASK },
            "masked": ["admin_password"],
        }))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tdir = dir.path().join("demo/1.0.0");
        std::fs::create_dir_all(&tdir).unwrap();
        std::fs::write(
            tdir.join("template.yaml"),
            "variables:\n  node_count: { type: number }\n  note: { type: string, required: false }\n  admin_password: { type: string, sensitive: true }\n",
        )
        .unwrap();
        std::fs::write(tdir.join("main.tf"), "").unwrap();
        let current = validate(
            &RawJob::parse(
                "id: j2\ntenant: t\nworkspace: w\noperation: apply\ntemplate: { name: demo, version: 1.0.0 }\nvariables: { node_count: 3, admin_password: s3cret-value }\n",
            )
            .unwrap(),
            dir.path(),
        )
        .unwrap();
        let raw = rollback_job(&record, &current).unwrap();
        assert_eq!(raw.0["variables"]["node_count"], 1);
        assert_eq!(raw.0["variables"]["admin_password"], "s3cret-value");
        assert_eq!(raw.0["variables"]["note"], crate::job::redact::MASK);
        assert_eq!(raw.0["id"], "j2");

        // A plain variable masked because its value held a secret cannot be restored.
        let mut held: JobRecord = record.clone();
        held.masked.insert("note".into());
        let err = rollback_job(&held, &current).unwrap_err();
        assert!(
            err.contains("`note`") && err.contains("not recorded"),
            "{err}"
        );

        let mut without = current.clone();
        without.job.variables.remove("admin_password");
        let err = rollback_job(&record, &without).unwrap_err();
        assert!(err.contains("`admin_password`"), "{err}");
    }
}
