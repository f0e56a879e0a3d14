//! Redaction of sensitive values: applied once to every log line and result, before any sink.

/// What a redacted value is replaced with.
pub const MASK: &str = "(sensitive value)";

/// A parser's error message (serde's, for JSON or YAML) without the values it quotes: serde
/// says `invalid type: string "…", expected a map`, which for a job encoded twice (a string
/// where the job goes) is the whole job, its secrets included. The kind of value stays.
pub fn unquoted(message: &str) -> String {
    static QUOTED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r#"(boolean|integer|floating point|character|string) (`[^`]*`|"(?:[^"\\]|\\.)*"?)"#,
        )
        .expect("a valid pattern")
    });
    QUOTED.replace_all(message, "$1").into_owned()
}

/// Secrets learned while a job runs (a session a function refreshes mid-job), shared with the
/// job's redactor, which masks them from then on.
#[derive(Clone, Default)]
pub struct LateSecrets(std::sync::Arc<std::sync::RwLock<Vec<String>>>);

impl std::fmt::Debug for LateSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LateSecrets({})", self.read().len())
    }
}

impl LateSecrets {
    pub fn add(&self, secret: &str) {
        if secret.is_empty() {
            return;
        }
        let mut all = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !all.iter().any(|s| s == secret) {
            all.push(secret.to_owned());
            all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<String>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Replaces every occurrence of a set of secrets in text.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Longest first, so a secret containing another is masked whole.
    secrets: Vec<String>,
    late: LateSecrets,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor for `secrets`; also masks their JSON-escaped forms (how they appear in
    /// terraform's JSON output). Secrets shorter than 3 characters are masked too, at the cost of
    /// masking unrelated text: a secret must never leak.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut all: Vec<String> = Vec::new();
        for secret in secrets {
            if secret.is_empty() {
                continue;
            }
            let escaped = serde_json::to_string(&secret).expect("strings serialize");
            let escaped = escaped[1..escaped.len() - 1].to_owned();
            if escaped != secret {
                all.push(escaped);
            }
            // Output is redacted line by line: each line of a multi-line secret (a PEM key)
            // is a secret of its own.
            if secret.contains('\n') {
                all.extend(
                    secret
                        .lines()
                        .map(str::trim)
                        .filter(|line| line.len() >= 4)
                        .map(str::to_owned),
                );
            }
            all.push(secret);
        }
        all.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        all.dedup();
        Self {
            secrets: all,
            late: LateSecrets::default(),
        }
    }

    /// This redactor, masking `late`'s secrets too, as they are added.
    #[must_use]
    pub fn with_late(mut self, late: LateSecrets) -> Self {
        self.late = late;
        self
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty() && self.late.read().is_empty()
    }

    /// `text` with every secret masked.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in self.secrets.iter().chain(self.late.read().iter()) {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), MASK);
            }
        }
        out
    }

    /// A JSON value with every string redacted.
    pub fn redact_json(&self, value: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::String(s) => Value::String(self.redact(s)),
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.redact_json(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), self.redact_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_parse_error_keeps_the_kind_of_value_and_never_the_value() {
        let doubled = r#"{"job": "{\"id\": \"j1\", \"variables\": {\"pw\": \"hunter2\"}}"}"#;
        let e = serde_json::from_str::<
            std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
        >(doubled)
        .unwrap_err()
        .to_string();
        assert!(e.contains("hunter2"), "serde quotes it: {e}");
        let shown = super::unquoted(&e);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.starts_with("invalid type: string, expected a map"),
            "{shown}"
        );
        let e = serde_json::from_str::<String>("424242")
            .unwrap_err()
            .to_string();
        assert_eq!(super::unquoted(&e), e.replace(" `424242`", ""));
        assert!(!super::unquoted(&e).contains("424242"));
    }

    use super::*;

    #[test]
    fn masks_plain_escaped_and_overlapping_secrets() {
        let r = Redactor::new([
            "pa\"ss".to_owned(),
            "topsecret".to_owned(),
            "secret".to_owned(),
        ]);
        assert_eq!(
            r.redact("a=topsecret b=secret"),
            format!("a={MASK} b={MASK}")
        );
        assert_eq!(
            r.redact(r#"{"p":"pa\"ss"}"#),
            format!(r#"{{"p":"{MASK}"}}"#)
        );
        assert_eq!(r.redact("pa\"ss"), MASK);
        let v = r.redact_json(&serde_json::json!({ "k": ["x topsecret"] }));
        assert_eq!(v, serde_json::json!({ "k": [format!("x {MASK}")] }));
        assert!(Redactor::new([String::new()]).is_empty());
        assert!(!format!("{r:?}").contains("topsecret"));
        let pem =
            Redactor::new(["-----BEGIN KEY-----\nMIIBOgIBAAJBAK\n-----END KEY-----".to_owned()]);
        assert_eq!(pem.redact("  MIIBOgIBAAJBAK"), format!("  {MASK}"));
    }

    #[test]
    fn late_secrets_are_masked_from_when_they_are_added() {
        let late = LateSecrets::default();
        let r = Redactor::new(["early-secret".to_owned()]).with_late(late.clone());
        assert_eq!(r.redact("k=late-secret"), "k=late-secret");
        late.add("late-secret");
        late.add("");
        assert_eq!(
            r.redact("k=late-secret e=early-secret"),
            format!("k={MASK} e={MASK}")
        );
        assert!(!format!("{late:?}").contains("late-secret"));
    }
}
