//! Jobs: what a platform asks Terrace to do, parsed from JSON or YAML.
//!
//! Parsing is lenient about nothing and reports everything: [`RawJob::parse`] turns the text into
//! a document, and [`crate::job::validate::validate`] checks every field of it at once, so a job with
//! five mistakes gets five messages. Only a [`crate::job::validate::ValidatedJob`] reaches terraform.
//!
//! The bottom layer of the crate: what a job is ([`Job`]), how it is checked ([`validate`]),
//! the templates it names ([`template`]) and what of it is secret ([`redact`]). It knows
//! nothing of how a job runs or who sent it.

pub mod document;
pub mod redact;
pub mod schema;
pub mod signature;
pub mod template;
pub mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::job::validate::ValidationError;

/// The terraform operation a job asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// Plan only; the result carries the planned changes.
    Plan,
    /// Plan, then apply exactly that plan.
    Apply,
    /// Destroy everything in the workspace.
    Destroy,
    /// Plan with `-detailed-exitcode`: report whether the real infrastructure drifted.
    DriftCheck,
}

impl Operation {
    pub const ALL: [Operation; 4] = [Self::Plan, Self::Apply, Self::Destroy, Self::DriftCheck];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plan => "plan",
            Self::Apply => "apply",
            Self::Destroy => "destroy",
            Self::DriftCheck => "drift-check",
        }
    }

    /// Whether the operation may change infrastructure and state.
    pub fn mutates(self) -> bool {
        matches!(self, Self::Apply | Self::Destroy)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with what a failed job created.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Leave everything as it is and report it.
    #[default]
    Keep,
    /// Destroy what this run created, nothing else.
    DestroyCreated,
    /// Return the workspace to the state before the run.
    Rollback,
}

impl OnFailure {
    pub const NAMES: [&'static str; 3] = ["keep", "destroy-created", "rollback"];
}

/// A template by name and version, a folder `<templates root>/<name>/<version>/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TemplateRef {
    pub name: String,
    pub version: String,
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// A job, every field checked (see [`crate::job::validate::validate`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub tenant: String,
    pub workspace: String,
    pub operation: Operation,
    pub template: TemplateRef,
    pub variables: BTreeMap<String, serde_json::Value>,
    #[serde(with = "duration_secs")]
    pub timeout: Duration,
    pub on_failure: OnFailure,
    #[serde(default)]
    pub retry: RetryPolicy,
    /// The most the plan may add to the monthly cost (an apply over it stops before applying).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The platform's order of its requests on the workspace, raised for each: a job whose
    /// sequence is not above the highest one that started there never runs (its result is
    /// `superseded`). Without it, jobs run in the order they get the workspace's lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// An approved plan to apply: the id of the `plan` job that made it. The job applies
    /// exactly that plan file and plans nothing itself (see `docs/approval.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// The key of an approved plan sealed with a key of its own (a store without keys), as
    /// the plan's result gave it once. A secret: never logged or recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_key: Option<String>,
    /// A plan job plans destroying everything in the workspace (`terraform plan -destroy`),
    /// for a `destroy` job to apply once approved.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub destroy: bool,
}

/// How transient failures are retried: exponential backoff with full jitter. Attempt `n`
/// (from 1) waits a random time between zero and `min(cap, base * 2^(n-1))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub attempts: u32,
    #[serde(with = "duration_millis")]
    pub base: Duration,
    #[serde(with = "duration_millis")]
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            base: Duration::from_secs(2),
            cap: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The longest wait before retry number `retry` (1 for the first retry).
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.saturating_sub(1));
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The wait before retry number `retry`: uniformly random in `[0, ceiling(retry)]`.
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry).as_millis() as u64;
        Duration::from_millis(rand::random_range(0..=ceiling))
    }
}

/// The default deadline of a job.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The fields a job file may have, for the "unknown field" message.
pub const FIELDS: [&str; 15] = [
    "id",
    "tenant",
    "workspace",
    "operation",
    "template",
    "variables",
    "timeout",
    "on_failure",
    "retry",
    "budget",
    "sequence",
    "plan",
    "plan_key",
    "destroy",
    "signature",
];

/// A job document as written, before its fields are checked.
#[derive(Clone, Debug)]
pub struct RawJob(pub serde_json::Map<String, serde_json::Value>);

impl RawJob {
    /// Parses JSON, or YAML when the text does not start with `{`.
    ///
    /// # Errors
    /// One [`ValidationError`] when the text is not a JSON/YAML mapping.
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        use serde::de::DeserializeSeed;
        // A key given twice, or a number that is not finite (YAML's `.nan`, `.inf`), is an
        // error rather than the last value winning or the field quietly left to its default.
        let value: serde_json::Value = if text.trim_start().starts_with('{') {
            let mut de = serde_json::Deserializer::from_str(text);
            Strict
                .deserialize(&mut de)
                .and_then(|v| de.end().map(|()| v))
                .map_err(|e| {
                    ValidationError::new(
                        "",
                        format!(
                            "is not valid JSON: {}",
                            crate::job::redact::unquoted(&e.to_string())
                        ),
                        "fix the JSON syntax",
                    )
                })?
        } else {
            Strict
                .deserialize(serde_norway::Deserializer::from_str(text))
                .map_err(|e| {
                    ValidationError::new(
                        "",
                        format!(
                            "is not valid YAML: {}",
                            crate::job::redact::unquoted(&e.to_string())
                        ),
                        "fix the YAML syntax",
                    )
                })?
        };
        match value {
            serde_json::Value::Object(map) => Ok(Self(map)),
            other => Err(ValidationError::new(
                "",
                format!(
                    "must be a mapping of fields, found {}",
                    crate::job::validate::kind_of(&other)
                ),
                format!(
                    "write the job as a mapping with the fields {}",
                    FIELDS.join(", ")
                ),
            )),
        }
    }
}

/// Reads JSON as a job file is read: a key given twice in one object, or a number that is not
/// finite, is an error (a queue message's too: the last copy of a key must not win quietly).
///
/// # Errors
/// Bytes that are not one JSON value, or one with such a key or number.
pub fn strict_json(bytes: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Reads a JSON or YAML document into a JSON value, refusing a key given twice in one mapping
/// and a number that is not finite.
struct Strict;

impl<'de> serde::de::DeserializeSeed<'de> for Strict {
    type Value = serde_json::Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Strict {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON or YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        serde_json::Number::from_f64(v)
            .map(serde_json::Value::Number)
            .ok_or_else(|| E::custom(format!("{v} is not a finite number")))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(serde_json::Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key {key:?} is given twice"
                )));
            }
            let value = map.next_value_seed(Strict)?;
            out.insert(key, value);
        }
        Ok(serde_json::Value::Object(out))
    }
}

/// Parses a duration written as seconds (`90`) or with a unit (`250ms`, `90s`, `30m`, `2h`,
/// `1h30m`).
///
/// # Errors
/// A message saying what form is expected.
pub fn parse_duration(value: &serde_json::Value) -> Result<Duration, String> {
    let expected = "expected seconds (e.g. 600) or a duration like \"90s\", \"30m\", \"1h30m\"";
    if let Some(secs) = value.as_u64() {
        return Ok(Duration::from_secs(secs));
    }
    let Some(text) = value.as_str() else {
        return Err(expected.to_owned());
    };
    if let Some(ms) = text.trim().strip_suffix("ms") {
        return ms
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{text:?}: {expected}"));
    }
    let mut total = 0u64;
    let mut number = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => return Err(format!("{text:?}: {expected}")),
        };
        let n: u64 = number
            .parse()
            .map_err(|_| format!("{text:?}: {expected}"))?;
        total = n
            .checked_mul(unit)
            .and_then(|add| total.checked_add(add))
            .ok_or_else(|| format!("{text:?} is longer than any job can run; {expected}"))?;
        number.clear();
    }
    if !number.is_empty() {
        let n = number
            .parse::<u64>()
            .map_err(|_| format!("{text:?}: {expected}"))?;
        total = total
            .checked_add(n)
            .ok_or_else(|| format!("{text:?} is longer than any job can run; {expected}"))?;
    }
    if text.trim().is_empty() {
        return Err(expected.to_owned());
    }
    Ok(Duration::from_secs(total))
}

mod duration_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

mod duration_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

/// A job's limit on what its plan may add to the monthly cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// The most the monthly cost may rise, in the price books' currency.
    pub max_monthly_increase: f64,
    /// The currency the job means; refused when the books are in another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// What a resource that cannot be priced does to the budget.
    #[serde(default)]
    pub on_unpriced: OnUnpriced,
}

/// Whether a created or changed resource that cannot be priced stops a budgeted apply.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnUnpriced {
    /// Counted as nothing, and listed under `not_priced`.
    #[default]
    Allow,
    /// Stops the apply: the budget cannot be checked.
    Stop,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn durations_in_seconds_or_units() {
        assert_eq!(parse_duration(&json!(90)), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration(&json!("30m")), Ok(Duration::from_secs(1800)));
        assert_eq!(
            parse_duration(&json!("1h30m")),
            Ok(Duration::from_secs(5400))
        );
        assert_eq!(parse_duration(&json!("45")), Ok(Duration::from_secs(45)));
        assert_eq!(
            parse_duration(&json!("250ms")),
            Ok(Duration::from_millis(250))
        );
        for bad in [json!("soon"), json!(""), json!(-1), json!("5d")] {
            assert!(parse_duration(&bad).is_err(), "{bad} was accepted");
        }
        // Too long for any arithmetic: an error, not a panic or a wrapped-around timeout.
        for huge in [
            "99999999999999999999h",
            "18446744073709551615h",
            "5124095576030432h1s",
        ] {
            let e = parse_duration(&json!(huge)).unwrap_err();
            assert!(
                e.contains("longer than any job") || e.contains("expected"),
                "{e}"
            );
        }
    }

    #[test]
    fn retry_delays_are_full_jitter_under_a_doubling_capped_ceiling() {
        let p = RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_millis(500),
        };
        let ceilings: Vec<u64> = (1..=5).map(|n| p.ceiling(n).as_millis() as u64).collect();
        assert_eq!(ceilings, [100, 200, 400, 500, 500]);
        for n in 1..=5 {
            for _ in 0..50 {
                assert!(p.delay(n) <= p.ceiling(n));
            }
        }
        assert_eq!(
            RetryPolicy::default().ceiling(40),
            Duration::from_secs(60),
            "no overflow"
        );
    }

    #[test]
    fn yaml_and_json_parse_to_the_same_document() {
        let yaml = RawJob::parse("id: a\nvariables:\n  n: 3\n").unwrap();
        let json = RawJob::parse(r#"{"id":"a","variables":{"n":3}}"#).unwrap();
        assert_eq!(yaml.0, json.0);
        let err = RawJob::parse("- a\n- b\n").unwrap_err();
        assert!(err.problem.contains("mapping"), "{err}");
    }

    #[test]
    fn a_key_given_twice_or_a_number_that_is_not_finite_is_refused() {
        for (text, says) in [
            ("{\"id\": \"a\", \"id\": \"b\"}", "given twice"),
            ("id: a\nid: b\n", "id"),
            ("id: a\nvariables: { n: 1, n: 2 }\n", "given twice"),
            ("id: a\nvariables: { n: .nan }\n", "not a finite number"),
            ("id: a\nvariables: { n: -.inf }\n", "not a finite number"),
        ] {
            let e = RawJob::parse(text).unwrap_err();
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
        let ok = RawJob::parse("id: a\nvariables: { n: 1.5, m: [1, null], s: x }\n").unwrap();
        assert_eq!(ok.0["variables"]["n"], 1.5);
    }
}
