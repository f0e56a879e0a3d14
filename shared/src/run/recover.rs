//! Recovering from an object the cloud has but the state does not know: a create that failed
//! after the cloud made it (a *false failure*), or a runner killed before terraform saved its
//! state. The next create meets "already exists". When the error and the plan say
//! unambiguously which planned create it was and the object's id, the runner imports it and
//! plans again; otherwise the error says what to import.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::run::result::JobError;

/// An object to import into the state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Import {
    pub address: String,
    pub id: String,
}

/// What the runner did about a conflict, for the result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Recovery {
    /// `imported`.
    pub action: String,
    pub address: String,
    pub id: String,
    /// The error that led to it.
    pub after: String,
}

/// Whether an error says the object already exists.
pub fn says_already_exists(text: &str) -> bool {
    let text = text.to_lowercase();
    crate::run::classify::CONFLICT_WORDS
        .iter()
        .any(|w| text.contains(w))
}

/// Whether an error leaves it unknown if the cloud carried the request out: a timeout, a 5xx,
/// throttling, `InternalError` (what a *false failure* says), and not "already exists".
fn outcome_unknown(text: &str) -> bool {
    let text = text.to_lowercase();
    crate::run::classify::TRANSIENT_WORDS
        .iter()
        .any(|w| text.contains(w))
        && !says_already_exists(&text)
}

/// Whether a diagnostic naming `named` (an instance, or a resource block without its key, or
/// without its module path) is about the instance `address`.
fn names(address: &str, named: &str) -> bool {
    let keyless = |a: &str| a.split('[').next().unwrap_or(a).to_owned();
    if named.contains('[') {
        return address == named || address.ends_with(&format!(".{named}"));
    }
    let block = keyless(address);
    block == named || block.ends_with(&format!(".{named}"))
}

/// How an apply's create of one resource ended, as its UI messages say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateEnd {
    /// Started, no end seen: the apply was killed or the log cut short in the middle of it.
    Open,
    Completed,
    Errored,
}

/// What one apply's UI messages say about its creates: each create it started and how it
/// ended, and its error diagnostics (the resource they name, their text).
#[derive(Clone, Debug, Default)]
pub struct ApplyCreates {
    pub creates: Vec<(String, CreateEnd)>,
    pub errors: Vec<(Option<String>, String)>,
}

impl ApplyCreates {
    /// Takes one UI message (`apply_start`, `apply_complete`, `apply_errored` of a create, or
    /// an error `diagnostic`); others are ignored.
    pub fn absorb(&mut self, event: &Value) {
        let kind = event["type"].as_str().unwrap_or_default();
        let hook = &event["hook"];
        let address = hook["resource"]["addr"].as_str();
        match (kind, address) {
            ("apply_start", Some(address)) if hook["action"] == "create" => {
                self.creates.push((address.to_owned(), CreateEnd::Open));
            }
            ("apply_complete" | "apply_errored", Some(address)) => {
                let end = if kind == "apply_complete" {
                    CreateEnd::Completed
                } else {
                    CreateEnd::Errored
                };
                if let Some(create) = self
                    .creates
                    .iter_mut()
                    .rev()
                    .find(|(a, e)| a == address && *e == CreateEnd::Open)
                {
                    create.1 = end;
                }
            }
            ("diagnostic", _) => {
                if let Ok(d) = serde_json::from_value::<crate::run::ui::Diagnostic>(
                    event["diagnostic"].clone(),
                ) && d.is_error()
                {
                    self.errors.push((d.resource_address(), d.render()));
                }
            }
            _ => {}
        }
    }

    /// The resources this apply may have made in the cloud: a create it saw complete, one
    /// whose end it never saw (killed in the middle of it), and one that failed with an error
    /// leaving the outcome unknown (a timeout, a 5xx, `InternalError`: a false failure) and
    /// with no other error about it. A create that failed for a definite reason (already
    /// exists, quota, permissions, an invalid argument), or whose error is not known, is not.
    pub fn may_have_made(&self) -> Vec<String> {
        self.creates
            .iter()
            .filter(|(address, end)| match end {
                CreateEnd::Open | CreateEnd::Completed => true,
                CreateEnd::Errored => {
                    let about: Vec<&String> = self
                        .errors
                        .iter()
                        .filter(|(named, _)| named.as_deref().is_some_and(|n| names(address, n)))
                        .map(|(_, text)| text)
                        .collect();
                    !about.is_empty() && about.iter().all(|text| outcome_unknown(text))
                }
            })
            .map(|(address, _)| address.clone())
            .collect()
    }
}

/// The resources a stored log's applies may have made (see [`ApplyCreates::may_have_made`]):
/// each apply is the lines after the runner's `terraform apply`, up to the next step it
/// starts.
pub fn made_in_log(lines: &[crate::run::logs::LogLine]) -> BTreeSet<String> {
    let mut made = BTreeSet::new();
    let mut apply = ApplyCreates::default();
    for line in lines {
        if line.stream == crate::run::logs::Stream::Runner
            && line.text.strip_prefix("terraform ") == Some(line.step.as_str())
        {
            made.extend(std::mem::take(&mut apply).may_have_made());
            continue;
        }
        if let Some(event) = &line.event {
            apply.absorb(event);
        }
    }
    made.extend(apply.may_have_made());
    made
}

/// The id of the existing object in a conflict message: `(id X)`, `ID "X"` or `id "X"`.
pub fn existing_id(message: &str) -> Option<String> {
    let quoted = |rest: &str| {
        let rest = rest.strip_prefix('"')?;
        Some(rest[..rest.find('"')?].to_owned())
    };
    for (marker, close) in [("(id ", ')'), ("(ID ", ')')] {
        if let Some(at) = message.find(marker) {
            let rest = &message[at + marker.len()..];
            if let Some(end) = rest.find(close) {
                return Some(rest[..end].trim_matches('"').to_owned()).filter(|s| !s.is_empty());
            }
        }
    }
    for marker in ["ID ", "id "] {
        for (at, _) in message.match_indices(marker) {
            if let Some(id) = quoted(&message[at + marker.len()..]).filter(|s| !s.is_empty()) {
                return Some(id);
            }
        }
    }
    None
}

/// The planned create that met `error`, and the id to import it with. `plan_json` is
/// `terraform show -json` of the attempt's plan; `in_state` the addresses the state now has.
///
/// # Errors
/// Why it cannot be told unambiguously, as a sentence for the user.
pub fn import_for(
    error: &JobError,
    plan_json: &[u8],
    in_state: &BTreeSet<String>,
) -> Result<Import, String> {
    let plan: Value = serde_json::from_slice(plan_json)
        .map_err(|e| format!("the plan cannot be read to find the resource: {e}"))?;
    let message = error.message.as_str();
    let creates: Vec<&Value> = plan["resource_changes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|rc| {
            rc["mode"] == "managed" && rc["change"]["actions"] == serde_json::json!(["create"])
        })
        .filter(|rc| {
            rc["address"]
                .as_str()
                .is_some_and(|a| !in_state.contains(a))
        })
        .collect();
    let address_of = |rc: &Value| rc["address"].as_str().unwrap_or_default().to_owned();
    let mut candidates: Vec<&Value> = match &error.address {
        Some(named) => creates
            .iter()
            .copied()
            .filter(|rc| {
                let a = address_of(rc);
                a == *named
                    || a.strip_prefix(named.as_str())
                        .is_some_and(|k| k.starts_with('['))
            })
            .collect(),
        None => creates
            .iter()
            .copied()
            .filter(|rc| rc["type"].as_str().is_some_and(|t| message.contains(t)))
            .collect(),
    };
    if candidates.len() > 1 {
        // Narrow down by the planned values the message quotes, such as the object's name.
        let quotes = |rc: &&Value| {
            rc["change"]["after"].as_object().is_some_and(|after| {
                after.values().any(|v| {
                    v.as_str()
                        .is_some_and(|s| !s.is_empty() && message.contains(&format!("\"{s}\"")))
                })
            })
        };
        candidates.retain(quotes);
    }
    let id = existing_id(message);
    match (candidates.as_slice(), id) {
        ([one], Some(id)) => Ok(Import {
            address: address_of(one),
            id,
        }),
        ([one], None) => Err(format!(
            "the error does not name the existing object's id: import it with `terraform import {} <id>`, or delete it, then run the job again",
            address_of(one)
        )),
        ([], _) => Err(
            "no planned create matches the error: find the object in the cloud and import or delete it"
                .to_owned(),
        ),
        (many, _) => Err(format!(
            "the error matches several planned creates ({}): import the right one by hand",
            many.iter().map(|rc| address_of(rc)).collect::<Vec<_>>().join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::logs::{LogLine, Stream};
    use crate::run::result::Category;

    /// A stored log: the runner's `terraform apply`, then each UI message of `jsonl`.
    fn apply_log(jsonl: &str) -> Vec<LogLine> {
        let line = |stream, text: &str, event| LogLine {
            seq: 0,
            ts: time::OffsetDateTime::UNIX_EPOCH,
            stream,
            step: "apply".into(),
            text: text.into(),
            event,
        };
        let mut lines = vec![line(Stream::Runner, "terraform apply", None)];
        for raw in jsonl.lines().filter(|l| l.starts_with('{')) {
            lines.push(line(
                Stream::Stdout,
                "",
                Some(serde_json::from_str(raw).unwrap()),
            ));
        }
        lines
    }

    #[test]
    fn only_a_create_that_may_have_happened_is_evidence() {
        let refused = apply_log(include_str!(
            "../../tests/fixtures/errors/apply-already-exists.jsonl"
        ));
        assert!(
            made_in_log(&refused).is_empty(),
            "{:?}",
            made_in_log(&refused)
        );
        let quota = apply_log(include_str!(
            "../../tests/fixtures/errors/apply-quota.jsonl"
        ));
        // The cluster's create started and failed on a quota: the cloud made nothing.
        assert!(
            !made_in_log(&quota).contains("testcloud_cluster.main"),
            "{:?}",
            made_in_log(&quota)
        );
        let false_failure = apply_log(include_str!(
            "../../tests/fixtures/errors/apply-false-failure.jsonl"
        ));
        assert!(made_in_log(&false_failure).contains("testcloud_network.main"));
        // Each apply on its own: a refusal in a later apply does not undo an earlier one's create.
        let both: Vec<LogLine> = false_failure.into_iter().chain(refused).collect();
        assert!(made_in_log(&both).contains("testcloud_network.main"));
    }

    #[test]
    fn a_create_killed_midway_is_evidence_and_a_refused_sibling_is_not() {
        let start = |a: &str| serde_json::json!({"type": "apply_start", "hook": {"action": "create", "resource": {"addr": a}}});
        let errored = |a: &str| serde_json::json!({"type": "apply_errored", "hook": {"action": "create", "resource": {"addr": a}}});
        let diagnostic = |a: &str, summary: &str| serde_json::json!({"type": "diagnostic", "diagnostic": {"severity": "error", "summary": summary, "detail": "", "address": a}});
        let mut apply = ApplyCreates::default();
        for event in [
            start("t.n[\"a\"]"),
            start("t.n[\"b\"]"),
            start("module.m.t.k"),
            errored("t.n[\"a\"]"),
            errored("t.n[\"b\"]"),
            diagnostic("t.n[\"a\"]", "creating: InternalError"),
            diagnostic("t.n[\"b\"]", "resource already exists (id n-1)"),
        ] {
            apply.absorb(&event);
        }
        // a: a false failure; b: refused; module.m.t.k: never ended (killed).
        assert_eq!(apply.may_have_made(), ["t.n[\"a\"]", "module.m.t.k"]);
        // An error without its diagnostic (cut short before terraform printed it) is no evidence.
        let mut cut = ApplyCreates::default();
        cut.absorb(&start("t.x"));
        cut.absorb(&errored("t.x"));
        assert!(cut.may_have_made().is_empty());
        // A diagnostic naming the block without its module path still refuses.
        let mut module = ApplyCreates::default();
        module.absorb(&start("module.m.t.k"));
        module.absorb(&errored("module.m.t.k"));
        module.absorb(&diagnostic("t.k", "already exists"));
        assert!(module.may_have_made().is_empty());
    }

    fn conflict(message: &str, address: Option<&str>) -> JobError {
        JobError {
            category: Category::ProviderConflict,
            step: "apply".into(),
            address: address.map(str::to_owned),
            message: message.into(),
            hint: String::new(),
            retryable: false,
        }
    }

    fn plan(creates: &[(&str, &str, &str)]) -> Vec<u8> {
        let changes: Vec<Value> = creates
            .iter()
            .map(|(address, type_name, name)| {
                serde_json::json!({
                    "address": address, "mode": "managed", "type": type_name,
                    "change": { "actions": ["create"], "after": { "name": name, "cidr": "10.0.0.0/16" } }
                })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({ "resource_changes": changes })).unwrap()
    }

    #[test]
    fn ids_are_found_in_the_usual_shapes_of_conflict_messages() {
        assert_eq!(
            existing_id(
                r#"Error: resource already exists: testcloud_network "n1" (id net-54ad5eee)"#
            )
            .as_deref(),
            Some("net-54ad5eee")
        );
        assert_eq!(
            existing_id(r#"Error: A resource with the ID "/subscriptions/s/resourceGroups/rg" already exists"#)
                .as_deref(),
            Some("/subscriptions/s/resourceGroups/rg")
        );
        assert_eq!(existing_id("Error: BucketAlreadyExists"), None);
    }

    #[test]
    fn the_create_that_met_the_conflict_is_found_by_address_and_quoted_name() {
        let message = r#"Error: resource already exists: testcloud_network "b" (id net-2) — on main.tf line 3, in resource "testcloud_network" "net":"#;
        let p = plan(&[
            ("testcloud_network.net[0]", "testcloud_network", "a"),
            ("testcloud_network.net[1]", "testcloud_network", "b"),
            ("testcloud_cluster.c", "testcloud_cluster", "b"),
        ]);
        let got = import_for(
            &conflict(message, Some("testcloud_network.net")),
            &p,
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(
            got,
            Import {
                address: "testcloud_network.net[1]".into(),
                id: "net-2".into()
            }
        );
    }

    #[test]
    fn ambiguity_or_a_missing_id_is_reported_not_guessed() {
        let p = plan(&[
            ("testcloud_network.a", "testcloud_network", "x"),
            ("testcloud_network.b", "testcloud_network", "x"),
        ]);
        let ambiguous = import_for(
            &conflict(
                r#"Error: testcloud_network "x" already exists (id net-1)"#,
                None,
            ),
            &p,
            &BTreeSet::new(),
        )
        .unwrap_err();
        assert!(
            ambiguous.contains("testcloud_network.a, testcloud_network.b"),
            "{ambiguous}"
        );

        let p = plan(&[("testcloud_network.a", "testcloud_network", "x")]);
        let no_id = import_for(
            &conflict(r#"Error: testcloud_network "x" already exists"#, None),
            &p,
            &BTreeSet::new(),
        )
        .unwrap_err();
        assert!(
            no_id.contains("terraform import testcloud_network.a <id>"),
            "{no_id}"
        );

        // A resource already in the state is not a candidate.
        let in_state = BTreeSet::from(["testcloud_network.a".to_owned()]);
        assert!(
            import_for(
                &conflict(
                    r#"Error: testcloud_network "x" already exists (id n)"#,
                    None
                ),
                &p,
                &in_state
            )
            .is_err()
        );
    }
}
