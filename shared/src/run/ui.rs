//! Terraform's machine-readable UI (`plan -json`, `apply -json`): one JSON message per line,
//! the runner's source of truth for what a step did. Each message is rendered into the human
//! log line (with a running count of the apply's resources) and kept as a structured event in
//! the durable log; [`Events`] gathers what the runner needs from them: diagnostics, planned
//! changes, drift, the change summary and the outputs.
//!
//! The format is Terraform's (UI version 1.x; OpenTofu prints the same): `@level`, `@message`,
//! `type`, and per type `change`, `changes`, `hook`, `diagnostic` or `outputs`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::run::result::{Changes, Output, ResourceChange};

/// One message of the machine-readable UI; only the fields the runner reads.
#[derive(Debug, Deserialize)]
struct Message {
    #[serde(rename = "@message", default)]
    message: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    change: Option<ChangeEvent>,
    #[serde(default)]
    changes: Option<ChangeSummary>,
    #[serde(default)]
    hook: Option<Hook>,
    #[serde(default)]
    diagnostic: Option<Diagnostic>,
    #[serde(default)]
    outputs: Option<BTreeMap<String, OutputEvent>>,
}

#[derive(Debug, Deserialize)]
struct Resource {
    addr: String,
}

#[derive(Debug, Deserialize)]
struct ChangeEvent {
    resource: Resource,
    action: String,
}

#[derive(Debug, Deserialize)]
struct Hook {
    #[serde(default)]
    action: Option<String>,
}

/// `change_summary`: terraform's own count of a plan's or an apply's changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ChangeSummary {
    pub add: u32,
    pub change: u32,
    pub remove: u32,
    #[serde(default)]
    pub import: u32,
}

#[derive(Debug, Deserialize)]
struct OutputEvent {
    #[serde(default)]
    sensitive: bool,
    #[serde(default)]
    value: Option<serde_json::Value>,
}

/// A diagnostic: an error or a warning, with the resource and the place it is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Diagnostic {
    pub severity: String,
    pub summary: String,
    #[serde(default)]
    pub detail: String,
    /// The resource instance it is about, where terraform names one.
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    range: Option<Range>,
    #[serde(default)]
    snippet: Option<Snippet>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
struct Range {
    filename: String,
    start: Position,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
struct Position {
    line: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
struct Snippet {
    #[serde(default)]
    context: Option<String>,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == "error"
    }

    /// One line: `Error: SUMMARY — DETAIL — on FILE line N, in CONTEXT`, white space folded.
    pub fn render(&self) -> String {
        let level = if self.is_error() { "Error" } else { "Warning" };
        let mut text = format!("{level}: {}", fold(&self.summary));
        if !self.detail.trim().is_empty() {
            text.push_str(" — ");
            text.push_str(&fold(&self.detail));
        }
        if let Some(range) = &self.range {
            text.push_str(&format!(
                " — on {} line {}",
                range.filename, range.start.line
            ));
            if let Some(context) = self.snippet.as_ref().and_then(|s| s.context.as_deref()) {
                text.push_str(&format!(", in {context}"));
            }
        }
        text
    }

    /// The resource it is about: terraform's `address`, else the block its snippet is in
    /// (`resource "T" "N"` → `T.N`, without an instance key).
    pub fn resource_address(&self) -> Option<String> {
        if let Some(address) = self.address.as_deref().filter(|a| !a.is_empty()) {
            return Some(address.to_owned());
        }
        let context = self.snippet.as_ref()?.context.as_deref()?;
        let mut parts = context.strip_prefix("resource \"")?.split('"');
        let (type_name, _, name) = (parts.next()?, parts.next()?, parts.next()?);
        Some(format!("{type_name}.{name}"))
    }
}

fn fold(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What one command's messages said, gathered as they arrive.
#[derive(Debug, Default)]
pub struct Events {
    /// Every diagnostic, errors and warnings, in order.
    pub diagnostics: Vec<Diagnostic>,
    /// `planned_change`: the plan's changes by resource (no-ops and reads left out).
    pub planned: Vec<ResourceChange>,
    /// `resource_drift`: resources changed outside terraform, with terraform's action.
    pub drifted: Vec<ResourceChange>,
    /// The last `change_summary`.
    pub summary: Option<ChangeSummary>,
    /// `outputs` of an apply, sensitive values masked.
    pub outputs: Option<BTreeMap<String, Output>>,
    /// The creates this apply started and how each ended: what may exist in the cloud when
    /// the apply fails or is killed before its state is saved.
    pub creates: crate::run::recover::ApplyCreates,
    /// Resource operations an apply will carry out (from its planned changes), and done so far.
    expected: u32,
    done: u32,
}

impl Events {
    /// Takes one line of stdout. A UI message returns the text to log and the message as JSON
    /// (to keep as the line's event); anything else returns `None` and is logged as it is.
    pub fn take(&mut self, line: &str) -> Option<(String, serde_json::Value)> {
        if !line.starts_with('{') {
            return None;
        }
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        let message = Message::deserialize(&value).ok()?;
        self.creates.absorb(&value);
        let text = self.absorb(message);
        Some((text, value))
    }

    /// Records a message; returns its human text.
    fn absorb(&mut self, m: Message) -> String {
        match m.kind.as_str() {
            "diagnostic" => {
                let Some(diagnostic) = m.diagnostic else {
                    return m.message;
                };
                let text = diagnostic.render();
                self.diagnostics.push(diagnostic);
                text
            }
            "planned_change" => {
                if let Some(change) = m.change {
                    self.expected += operations(&change.action);
                    if let Some(actions) = plan_actions(&change.action) {
                        self.planned.push(ResourceChange {
                            address: change.resource.addr,
                            actions,
                        });
                    }
                }
                m.message
            }
            "resource_drift" => {
                if let Some(change) = m.change {
                    self.drifted.push(ResourceChange {
                        address: change.resource.addr,
                        actions: vec![change.action],
                    });
                }
                m.message
            }
            "change_summary" => {
                self.summary = m.changes;
                m.message
            }
            "outputs" => {
                let Some(outputs) = m.outputs else {
                    return m.message;
                };
                // A plan's outputs have no values yet; an apply's are shown as terraform does.
                let applied = outputs.values().any(|o| o.value.is_some());
                let outputs: BTreeMap<String, Output> = outputs
                    .into_iter()
                    .map(|(name, o)| (name, Output::masked(o.value, o.sensitive)))
                    .collect();
                let shown: Vec<String> = outputs
                    .iter()
                    .filter(|_| applied)
                    .map(|(name, o)| format!("{name} = {}", o.value))
                    .collect();
                self.outputs = Some(outputs);
                if shown.is_empty() {
                    m.message
                } else {
                    format!("{}: {}", m.message, shown.join(", "))
                }
            }
            "apply_complete" | "apply_errored" => {
                if m.kind == "apply_complete"
                    && m.hook.as_ref().and_then(|h| h.action.as_deref()) != Some("read")
                {
                    self.done += 1;
                }
                self.counted(m.message)
            }
            "apply_progress" | "apply_start" => self.counted(m.message),
            _ => m.message,
        }
    }

    /// An apply message with the running count, once the apply's size is known.
    fn counted(&self, message: String) -> String {
        if self.expected == 0 {
            return message;
        }
        format!("{message} ({} of {} done)", self.done, self.expected)
    }

    /// The plan's changes: terraform's own counts, and the resources that change.
    pub fn changes(&self) -> Option<Changes> {
        let summary = self.summary?;
        Some(Changes {
            add: summary.add,
            change: summary.change,
            destroy: summary.remove,
            resources: self.planned.clone(),
        })
    }

    /// The error diagnostics, rendered.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }
}

/// A planned change's actions as in terraform's plan JSON (`replace` is a delete and a create);
/// `None` for what changes nothing.
fn plan_actions(action: &str) -> Option<Vec<String>> {
    let actions: &[&str] = match action {
        "noop" | "read" => return None,
        "replace" => &["delete", "create"],
        other => return Some(vec![other.to_owned()]),
    };
    Some(actions.iter().map(|a| (*a).to_owned()).collect())
}

/// How many `apply_complete` messages an action leads to.
fn operations(action: &str) -> u32 {
    match action {
        "create" | "update" | "delete" => 1,
        "replace" => 2,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/ui/", $name))
        };
    }

    fn events_of(text: &str) -> (Events, Vec<String>) {
        let mut events = Events::default();
        let lines = text
            .lines()
            .map(|l| events.take(l).map_or_else(|| l.to_owned(), |(t, _)| t))
            .collect();
        (events, lines)
    }

    #[test]
    fn a_plan_gives_its_changes_and_outputs_to_be() {
        let (events, lines) = events_of(fixture!("plan-create.jsonl"));
        let changes = events.changes().unwrap();
        assert_eq!((changes.add, changes.change, changes.destroy), (2, 0, 0));
        let addresses: Vec<&str> = changes
            .resources
            .iter()
            .map(|r| r.address.as_str())
            .collect();
        assert_eq!(
            addresses,
            ["testcloud_network.main", "testcloud_cluster.main"]
        );
        assert!(lines.contains(&"Plan: 2 to add, 0 to change, 0 to destroy.".to_owned()));
        // A plan's outputs have no values: only their number is shown.
        assert_eq!(lines.last().unwrap(), "Outputs: 4");
        assert!(events.diagnostics.is_empty());
    }

    #[test]
    fn an_apply_counts_its_resources_and_gives_its_outputs() {
        let (events, lines) = events_of(fixture!("apply-create.jsonl"));
        assert!(
            lines.contains(
                &"testcloud_network.main: Still creating... [10s elapsed] (0 of 2 done)".to_owned()
            ),
            "{lines:#?}"
        );
        assert!(
            lines.iter().any(
                |l| l.starts_with("testcloud_cluster.main: Creation complete after")
                    && l.ends_with("(2 of 2 done)")
            ),
            "{lines:#?}"
        );
        assert!(
            lines.iter().any(|l| l
                .starts_with("Outputs: 4: admin_url = \"(sensitive value)\", cluster_id = \"cls-")),
            "{lines:#?}"
        );
        let outputs = events.outputs.unwrap();
        assert!(
            outputs["cluster_id"]
                .value
                .as_str()
                .unwrap()
                .starts_with("cls-")
        );
        assert_eq!(outputs["admin_url"].value, crate::job::redact::MASK);
        assert!(outputs["admin_url"].sensitive);
        // Both creates completed: both objects are this apply's.
        assert_eq!(
            events.creates.may_have_made(),
            ["testcloud_network.main", "testcloud_cluster.main"]
        );
    }

    #[test]
    fn a_failed_apply_gives_a_structured_diagnostic() {
        let (events, lines) = events_of(fixture!("apply-quota.jsonl"));
        let errors: Vec<&Diagnostic> = events.errors().collect();
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].summary,
            "QuotaExceeded: vCPU limit 32 reached in us-east-1"
        );
        assert_eq!(
            errors[0].resource_address().as_deref(),
            Some("testcloud_cluster.main")
        );
        let rendered = errors[0].render();
        assert!(rendered.starts_with("Error: QuotaExceeded"), "{rendered}");
        assert!(
            rendered.contains("on main.tf line 19, in resource \"testcloud_cluster\" \"main\""),
            "{rendered}"
        );
        assert!(lines.contains(&rendered));
        assert!(
            lines
                .iter()
                .any(|l| l.contains("Modifications errored after 0s"))
        );
    }

    #[test]
    fn a_refresh_only_plan_names_the_drifted_resources() {
        let (events, _) = events_of(fixture!("plan-refresh-only-drift.jsonl"));
        assert_eq!(events.drifted.len(), 1);
        assert_eq!(events.drifted[0].address, "testcloud_cluster.main");
        assert_eq!(events.drifted[0].actions, ["update"]);
        assert!(events.changes().unwrap().is_empty());
    }

    #[test]
    fn lines_that_are_not_messages_are_left_alone() {
        let mut events = Events::default();
        assert!(
            events
                .take("Terraform has been successfully initialized!")
                .is_none()
        );
        assert!(events.take("{not json").is_none());
        assert!(
            events
                .take(r#"{"@message":"x","type":"something_new"}"#)
                .is_some()
        );
    }

    #[test]
    fn a_diagnostic_without_an_address_takes_it_from_its_block() {
        let d: Diagnostic = serde_json::from_str(
            r#"{"severity":"error","summary":"boom","detail":"a\n  b",
                "range":{"filename":"main.tf","start":{"line":7}},
                "snippet":{"context":"resource \"testcloud_network\" \"net\""}}"#,
        )
        .unwrap();
        assert_eq!(
            d.resource_address().as_deref(),
            Some("testcloud_network.net")
        );
        assert_eq!(
            d.render(),
            "Error: boom — a b — on main.tf line 7, in resource \"testcloud_network\" \"net\""
        );
    }
}
