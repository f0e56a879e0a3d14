//! A job as a platform writes it (JSON, or YAML for a person): the shape published as
//! `docs/schema/job.schema.json`. [`crate::job::validate`] is what checks a job; this type
//! describes the same fields for a platform's code generator, and a test keeps the two
//! together ([`crate::job::FIELDS`], the example jobs).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::job::{OnFailure, OnUnpriced, Operation, TemplateRef};

/// A job: what a platform asks a runner to do, in one workspace of one tenant.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct JobDocument {
    /// Unique per job: a job id runs once; a delivery of a finished job gets its result again.
    /// Up to 128 letters, digits, `-`, `_` or `.`, starting with a letter or digit and not
    /// ending with `.`.
    #[schemars(
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"),
        length(max = 128)
    )]
    pub id: String,
    /// The tenant (the customer): lowercase letters, digits and `-`.
    pub tenant: String,
    /// The workspace within the tenant: one terraform state.
    pub workspace: String,
    pub operation: Operation,
    /// The template (its folder `NAME/VERSION`, or as published to the templates bucket).
    pub template: TemplateRef,
    /// The template's variables. A sensitive one is redacted from every log and record.
    #[serde(default)]
    pub variables: BTreeMap<String, serde_json::Value>,
    /// The job's deadline, 1 s to 24 h (default 30 min).
    #[serde(default)]
    pub timeout: Option<DurationText>,
    /// What to do with what a failed apply created (default `keep`).
    #[serde(default)]
    pub on_failure: Option<OnFailure>,
    /// How transient failures are retried.
    #[serde(default)]
    pub retry: Option<RetryDocument>,
    /// The most the plan may add to the monthly cost: an apply over it stops before applying.
    #[serde(default)]
    pub budget: Option<BudgetDocument>,
    /// The platform's order of its requests on the workspace, raised for each: a job whose
    /// sequence is not above the highest one that started there never runs (`superseded`).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub sequence: Option<u64>,
    /// An approved plan to apply: the id of the `plan` job that made it (`apply` or
    /// `destroy` only). See `docs/approval.md`.
    #[serde(default)]
    pub plan: Option<String>,
    /// The key of an approved plan sealed with a key of its own, as the plan's result gave it
    /// (`plan.key`). A secret: never logged or recorded.
    #[serde(default)]
    #[schemars(extend("writeOnly" = true))]
    pub plan_key: Option<String>,
    /// A `plan` job plans destroying everything in the workspace, for a `destroy` job to
    /// apply once approved.
    #[serde(default)]
    pub destroy: Option<bool>,
    /// The sender's signature of the job (`docs/signing.md`): required by a runner whose
    /// tenant registry names keys for the job's tenant.
    #[serde(default)]
    pub signature: Option<crate::job::signature::Signature>,
}

/// A duration: whole seconds (`600`), or text with units (`"250ms"`, `"90s"`, `"30m"`,
/// `"1h30m"`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum DurationText {
    Seconds(u64),
    Text(#[schemars(regex(pattern = r"^\s*([0-9]+ms|([0-9]+[hms])+|[0-9]+)\s*$"))] String),
}

/// `retry`: every field optional.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct RetryDocument {
    /// Attempts in all, the first included: 1 (no retry) to 20 (default 5).
    #[schemars(range(min = 1, max = 20))]
    pub attempts: Option<u32>,
    /// The first retry's longest wait, 1 ms to 1 h (default 2 s).
    pub base: Option<DurationText>,
    /// The longest wait, at least `base`, at most 1 h (default 60 s).
    pub cap: Option<DurationText>,
}

/// `budget`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BudgetDocument {
    /// The most the monthly cost may rise, in the price books' currency.
    #[schemars(range(min = 0.0))]
    pub max_monthly_increase: f64,
    /// The currency the job means; refused when the books are in another.
    pub currency: Option<String>,
    /// What a resource that cannot be priced does to the budget (default `allow`).
    pub on_unpriced: Option<OnUnpriced>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_has_every_field_a_job_may_have() {
        let schema = schemars::schema_for!(JobDocument);
        let properties: Vec<&String> = schema
            .get("properties")
            .and_then(|p| p.as_object())
            .unwrap()
            .keys()
            .collect();
        let mut fields = crate::job::FIELDS.to_vec();
        fields.sort_unstable();
        let mut properties: Vec<&str> = properties.iter().map(|s| s.as_str()).collect();
        properties.sort_unstable();
        assert_eq!(properties, fields);
    }

    #[test]
    fn every_example_job_reads_as_the_schema_says() {
        let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut read = 0;
        for entry in std::fs::read_dir(examples).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let raw = crate::job::RawJob::parse(&text).unwrap();
            serde_json::from_value::<JobDocument>(serde_json::Value::Object(raw.0))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            read += 1;
        }
        assert!(read >= 2, "only {read} example jobs");
    }
}
