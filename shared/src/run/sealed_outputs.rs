//! Sensitive outputs, sealed to the platform: with a recipient (an age X25519 public key,
//! `age1…`) from the tenant registry or the runner's settings, a result carries the values of
//! its sensitive outputs encrypted to that key, as an armored age file, beside the masked
//! values it always had. Only the holder of the matching identity (`AGE-SECRET-KEY-1…`) opens
//! them: with `age -d -i key.txt`, `rage`, any age library, or `terrace result JOB --identity
//! key.txt`. Logs, `job.json`, `--json` answers and dead letters still hold no plain value.
//! See `docs/outputs.md`.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An age X25519 identity (`AGE-SECRET-KEY-1…`): what opens outputs sealed to its recipient.
pub type Identity = age::x25519::Identity;

/// An identity as an identity file holds it (`AGE-SECRET-KEY-1…`), for a platform's own
/// tooling and tests.
pub fn identity_text(identity: &Identity) -> String {
    use age::secrecy::ExposeSecret as _;
    identity.to_string().expose_secret().to_owned()
}

/// What to tell whoever gives a key that is not an age recipient.
pub const RECIPIENT_FIX: &str = "give an age X25519 public key (age1…), as `age-keygen` prints it for the platform's identity file";

/// A platform's public key the sensitive outputs are sealed to: an age X25519 recipient.
#[derive(Clone, PartialEq, Eq)]
pub struct OutputsRecipient(String);

impl FromStr for OutputsRecipient {
    type Err = String;

    /// # Errors
    /// Text that is not an age X25519 recipient, as a sentence that quotes none of it.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.to_ascii_uppercase().starts_with("AGE-SECRET-KEY-") {
            return Err(
                "is an age identity, a private key, not a recipient: give its public key (age1…) and keep the identity to the platform"
                    .to_owned(),
            );
        }
        age::x25519::Recipient::from_str(text)
            .map(|_| Self(text.to_owned()))
            .map_err(|_| "is not an age X25519 recipient (age1…)".to_owned())
    }
}

impl std::fmt::Debug for OutputsRecipient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for OutputsRecipient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A result's sensitive outputs, sealed to a platform's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SealedOutputs {
    /// The key they are sealed to (`age1…`): the platform knows which identity opens them.
    pub recipient: String,
    /// The sensitive outputs inside, by name (their values are masked in `outputs`).
    pub names: Vec<String>,
    /// An armored age file (`-----BEGIN AGE ENCRYPTED FILE-----`) holding one JSON object:
    /// each sensitive output's name and its value as terraform gave it.
    pub age: String,
}

/// Seals `values` (each sensitive output's value by name) to `recipient`.
///
/// # Errors
/// Only if age cannot write its output (it writes to memory here).
pub fn seal(
    recipient: &OutputsRecipient,
    values: &BTreeMap<String, Value>,
) -> Result<SealedOutputs, String> {
    let key = age::x25519::Recipient::from_str(&recipient.0)
        .map_err(|e| format!("the outputs' recipient: {e}"))?;
    let plain = serde_json::to_vec(values).map_err(|e| e.to_string())?;
    let age = age::encrypt_and_armor(&key, &plain)
        .map_err(|e| format!("cannot seal the outputs: {e}"))?;
    Ok(SealedOutputs {
        recipient: recipient.0.clone(),
        names: values.keys().cloned().collect(),
        age,
    })
}

/// The sensitive outputs' plain values from `terraform output -json`, by name.
///
/// # Errors
/// When the JSON is not terraform's output format.
pub fn sensitive_values(raw: &[u8]) -> Result<BTreeMap<String, Value>, String> {
    let all: BTreeMap<String, Value> =
        serde_json::from_slice(raw).map_err(|e| format!("output JSON does not parse: {e}"))?;
    Ok(all
        .into_iter()
        .filter(|(_, v)| v["sensitive"].as_bool().unwrap_or(false))
        .map(|(name, v)| (name, v.get("value").cloned().unwrap_or(Value::Null)))
        .collect())
}

/// Why sealed outputs could not be opened; each says what to do.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error(
        "line {line} of the identity file is not an age X25519 identity (AGE-SECRET-KEY-1…): use the file `age-keygen -o FILE` wrote"
    )]
    BadIdentity { line: usize },
    #[error(
        "the identity file holds no identity (AGE-SECRET-KEY-1…): use the file `age-keygen -o FILE` wrote"
    )]
    NoIdentity,
    #[error(
        "none of the identities opens these outputs: they are sealed to {recipient}; use the identity file of that key"
    )]
    NotForYou { recipient: String },
    #[error("the sealed outputs are damaged: {0}")]
    Damaged(String),
}

/// The X25519 identities of an age identity file (`age-keygen`'s format: `#` comments, one
/// `AGE-SECRET-KEY-1…` a line).
///
/// # Errors
/// [`OpenError::BadIdentity`] naming the line (never quoting it), or [`OpenError::NoIdentity`].
pub fn identities(text: &str) -> Result<Vec<age::x25519::Identity>, OpenError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(
            age::x25519::Identity::from_str(line)
                .map_err(|_| OpenError::BadIdentity { line: i + 1 })?,
        );
    }
    if out.is_empty() {
        return Err(OpenError::NoIdentity);
    }
    Ok(out)
}

/// Opens sealed outputs with one of `identities`: each output's value by name.
///
/// # Errors
/// [`OpenError::NotForYou`] when no identity matches, [`OpenError::Damaged`] otherwise.
pub fn open(
    sealed: &SealedOutputs,
    identities: &[age::x25519::Identity],
) -> Result<BTreeMap<String, Value>, OpenError> {
    let decryptor =
        age::Decryptor::new_buffered(age::armor::ArmoredReader::new(sealed.age.as_bytes()))
            .map_err(|e| OpenError::Damaged(e.to_string()))?;
    let mut reader = decryptor
        .decrypt(identities.iter().map(|i| i as &dyn age::Identity))
        .map_err(|e| match e {
            age::DecryptError::NoMatchingKeys => OpenError::NotForYou {
                recipient: sealed.recipient.clone(),
            },
            other => OpenError::Damaged(other.to_string()),
        })?;
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut plain)
        .map_err(|e| OpenError::Damaged(e.to_string()))?;
    serde_json::from_slice(&plain).map_err(|e| OpenError::Damaged(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (age::x25519::Identity, OutputsRecipient) {
        let identity = age::x25519::Identity::generate();
        let recipient = identity.to_public().to_string().parse().unwrap();
        (identity, recipient)
    }

    #[test]
    fn sealed_outputs_open_with_the_identity_and_hold_no_plain_value() {
        let (identity, recipient) = key();
        let values = BTreeMap::from([
            (
                "kubeconfig".to_owned(),
                Value::from("apiVersion: v1 secret-x"),
            ),
            (
                "admin".to_owned(),
                serde_json::json!({ "password": "hunter2-hunter2" }),
            ),
        ]);
        let sealed = seal(&recipient, &values).unwrap();
        assert!(sealed.age.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"));
        assert_eq!(sealed.names, ["admin", "kubeconfig"]);
        let text = serde_json::to_string(&sealed).unwrap();
        assert!(
            !text.contains("secret-x") && !text.contains("hunter2"),
            "{text}"
        );
        assert_eq!(open(&sealed, &[identity]).unwrap(), values);
    }

    #[test]
    fn another_key_a_bad_identity_file_and_a_bad_recipient_each_say_what_to_do() {
        let (_, recipient) = key();
        let sealed = seal(&recipient, &BTreeMap::new()).unwrap();
        let (other, _) = key();
        let e = open(&sealed, &[other]).unwrap_err();
        assert_eq!(
            e,
            OpenError::NotForYou {
                recipient: recipient.to_string()
            }
        );
        assert_eq!(
            identities("# created: now\n\nAGE-SECRET-KEY-1NOTAKEY\n")
                .err()
                .unwrap(),
            OpenError::BadIdentity { line: 3 }
        );
        assert_eq!(
            identities("# only a comment\n").err().unwrap(),
            OpenError::NoIdentity
        );
        let e = "age1notakey".parse::<OutputsRecipient>().unwrap_err();
        assert!(e.contains("not an age X25519 recipient"), "{e}");
        let e = identity_text(&key().0)
            .parse::<OutputsRecipient>()
            .unwrap_err();
        assert!(
            e.contains("a private key") && !e.contains("AGE-SECRET"),
            "{e}"
        );
        let (identity, recipient) = key();
        let mut damaged = seal(&recipient, &BTreeMap::new()).unwrap();
        let body = damaged.age.lines().nth(1).unwrap().to_owned();
        damaged.age = damaged
            .age
            .replace(&body, &body.chars().rev().collect::<String>());
        assert!(matches!(
            open(&damaged, &[identity]),
            Err(OpenError::Damaged(_))
        ));
    }

    #[test]
    fn only_sensitive_outputs_are_taken_with_their_plain_values() {
        let raw = br#"{"id": {"sensitive": false, "type": "string", "value": "n-1"},
                      "url": {"sensitive": true, "type": "string", "value": "https://a:pw@x"}}"#;
        assert_eq!(
            sensitive_values(raw).unwrap(),
            BTreeMap::from([("url".to_owned(), Value::from("https://a:pw@x"))])
        );
    }
}
