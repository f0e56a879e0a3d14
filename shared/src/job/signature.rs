//! Jobs and cancels signed by their sender (`docs/signing.md`). The runner's tenant registry
//! may name, per tenant, the Ed25519 public keys allowed to send its jobs (`senders`); such a
//! tenant accepts only a job or cancel whose `signature` verifies with one of them.
//!
//! What is signed, byte for byte, is the signed object (the job, or a cancel's `cancel`)
//! without its `signature` member, in RFC 8785 canonical JSON (JCS), after a header naming the
//! format, the kind and the time:
//!
//! ```text
//! terrace-signature-v1\n
//! job\n                      (or: cancel\n)
//! 2026-11-28T09:30:00Z\n     (signature.signed_at, exactly as sent)
//! {"id":"…","operation":"apply",…}
//! ```
//!
//! Replay is bounded twice: a job id runs once (its stored result is all a replay of a job
//! that ran gets back, and a replay of one running waits for it), and a signature older than the
//! runner's window (24 h by default) is refused, so a replay is useless even where a job's
//! records are gone.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey};
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::job::validate::ValidationError;

/// The member of a signed object that carries its signature.
pub const FIELD: &str = "signature";

/// The first line of the signed bytes.
const HEADER: &str = "terrace-signature-v1";

/// How far a signature is accepted after it was made, by default.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How far ahead of the runner's clock a sender's may be.
pub const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// How to sign a job or a cancel.
fn format_fix(kind: Kind) -> String {
    let command = match kind {
        Kind::Job => "terrace submit --sign KEY",
        Kind::Cancel => "terrace cancel --to QUEUE --sign KEY",
    };
    format!(
        "sign the {} with `{command}`, or as docs/signing.md says: {{\"signed_at\": RFC 3339 time, \"ed25519\": base64 of the 64-byte signature}}",
        kind.as_str()
    )
}

/// A signature, as the signed object's `signature` member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// When it was made (RFC 3339): part of the signed bytes, exactly as written here. A
    /// runner refuses one older than its window (24 h by default) or ahead of its clock.
    #[schemars(schema_with = "crate::job::schema::date_time")]
    pub signed_at: String,
    /// The Ed25519 signature of the signed bytes (`docs/signing.md`), base64 (standard
    /// alphabet, padded).
    pub ed25519: String,
}

/// What a signature signs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A job: the signed object is the job.
    Job,
    /// A cancel message: the signed object is its `cancel`.
    Cancel,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Job => "job",
            Self::Cancel => "cancel",
        }
    }
}

/// The bytes a signature signs: the header, the kind, `signed_at`, then `object` without its
/// `signature` member as RFC 8785 canonical JSON.
pub fn signed_bytes(kind: Kind, object: &Map<String, Value>, signed_at: &str) -> Vec<u8> {
    let mut unsigned = object.clone();
    unsigned.remove(FIELD);
    let mut bytes = format!("{HEADER}\n{}\n{signed_at}\n", kind.as_str()).into_bytes();
    // A map of JSON values always canonicalizes (its numbers are finite).
    bytes.extend(serde_json_canonicalizer::to_vec(&Value::Object(unsigned)).unwrap_or_default());
    bytes
}

/// A key allowed to send a tenant's jobs: an Ed25519 public key.
#[derive(Clone, PartialEq, Eq)]
pub struct SenderKey(VerifyingKey);

impl std::str::FromStr for SenderKey {
    type Err = String;

    /// A PEM public key (`openssl pkey -pubout`), or base64 of its 32 bytes (as `terrace
    /// keygen` prints) or of its DER encoding.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.starts_with("-----BEGIN") {
            return VerifyingKey::from_public_key_pem(text)
                .map(Self)
                .map_err(|_| "is not an Ed25519 public key in PEM".into());
        }
        let bytes = STANDARD
            .decode(text)
            .map_err(|_| "is neither PEM nor base64".to_owned())?;
        match bytes.len() {
            32 => {
                let raw: [u8; 32] = bytes.try_into().unwrap_or([0; 32]);
                VerifyingKey::from_bytes(&raw)
                    .map(Self)
                    .map_err(|_| "is not an Ed25519 public key".into())
            }
            _ => VerifyingKey::from_public_key_der(&bytes)
                .map(Self)
                .map_err(|_| "is not an Ed25519 public key (32 bytes, or its DER)".into()),
        }
    }
}

impl fmt::Display for SenderKey {
    /// Base64 of the key's 32 bytes: what the registry's `senders` take.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0.as_bytes()))
    }
}

impl fmt::Debug for SenderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SenderKey({self})")
    }
}

/// What to do about a sender key that does not parse.
pub const SENDER_FIX: &str = "give each sender as an Ed25519 public key: base64 of its 32 bytes (`terrace keygen` prints it) or PEM (`openssl pkey -in KEY -pubout`)";

/// A sender's private key, to sign with.
pub struct SenderSecret(SigningKey);

impl SenderSecret {
    /// A new random key.
    pub fn generate() -> Self {
        Self(SigningKey::from_bytes(&rand::random::<[u8; 32]>()))
    }

    /// Reads a PKCS#8 PEM private key (`openssl genpkey -algorithm ed25519`, `terrace keygen`).
    ///
    /// # Errors
    /// Text that is not one, saying what it is instead when it can tell; the key is never
    /// quoted.
    pub fn from_pem(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.contains("OPENSSH PRIVATE KEY") {
            return Err("is an OpenSSH key: give an Ed25519 key in PKCS#8 PEM (`terrace keygen --out FILE`, or `openssl genpkey -algorithm ed25519`)".into());
        }
        if text.contains("PUBLIC KEY") {
            return Err("is a public key: give the sender's private key (PKCS#8 PEM)".into());
        }
        SigningKey::from_pkcs8_pem(text).map(Self).map_err(|_| {
            "is not an Ed25519 private key in PKCS#8 PEM: make one with `terrace keygen --out FILE` or `openssl genpkey -algorithm ed25519`".into()
        })
    }

    /// The key as PKCS#8 PEM, to be kept secret.
    pub fn to_pem(&self) -> String {
        self.0
            .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .map(|pem| pem.to_string())
            .unwrap_or_default()
    }

    /// Its public key, for the registry.
    pub fn public(&self) -> SenderKey {
        SenderKey(self.0.verifying_key())
    }

    /// Signs `object` as of `now`, replacing any signature it had.
    ///
    /// # Errors
    /// A whole number in it beyond ±2^53, which canonical JSON cannot keep exactly (named by
    /// its path: send it as text).
    pub fn sign(
        &self,
        kind: Kind,
        object: &mut Map<String, Value>,
        now: OffsetDateTime,
    ) -> Result<(), String> {
        if let Some(why) = inexact_number(object) {
            return Err(why);
        }
        let signed_at = now
            .replace_nanosecond(0)
            .unwrap_or(now)
            .to_offset(time::UtcOffset::UTC)
            .format(&Rfc3339)
            .unwrap_or_default();
        let signature = self.0.sign(&signed_bytes(kind, object, &signed_at));
        let signature = Signature {
            signed_at,
            ed25519: STANDARD.encode(signature.to_bytes()),
        };
        object.insert(
            FIELD.into(),
            serde_json::to_value(signature).unwrap_or(Value::Null),
        );
        Ok(())
    }
}

/// The largest whole number canonical JSON keeps exactly (it writes numbers as IEEE doubles).
const EXACT: u64 = 1 << 53;

/// Where in `object` a whole number lies beyond ±2^53, if anywhere: a signature over it would
/// hold for a different number too.
fn inexact_number(object: &Map<String, Value>) -> Option<String> {
    fn walk(value: &Value, path: &str) -> Option<String> {
        match value {
            Value::Number(n) => {
                let beyond = n.as_u64().is_some_and(|u| u > EXACT)
                    || n.as_i64().is_some_and(|i| i.unsigned_abs() > EXACT);
                beyond.then(|| {
                    format!(
                        "{path} is a whole number beyond ±2^53, which a signature cannot cover exactly: send it as text"
                    )
                })
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            Value::Object(map) => map.iter().find_map(|(k, v)| {
                let at = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(v, &at)
            }),
            _ => None,
        }
    }
    object
        .iter()
        .filter(|(k, _)| k.as_str() != FIELD)
        .find_map(|(k, v)| walk(v, k))
}

impl fmt::Debug for SenderSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SenderSecret(public {})", self.public())
    }
}

/// Why a signed object is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// It carries no signature.
    Missing,
    /// Its `signature` is not one (the reason).
    Malformed(String),
    /// It verifies with none of the tenant's keys.
    Wrong,
    /// Made longer ago than the window: refused as a possible replay.
    Replayed { signed_at: String, window: Duration },
    /// Dated ahead of the runner's clock by more than [`CLOCK_SKEW`].
    Future { signed_at: String },
}

impl Refusal {
    /// A short word for logs and tests: `missing`, `malformed`, `wrong`, `replayed`, `future`.
    pub fn word(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed(_) => "malformed",
            Self::Wrong => "wrong",
            Self::Replayed { .. } => "replayed",
            Self::Future { .. } => "future",
        }
    }

    /// The rejection's entry: `field` is where the signature belongs (`signature`,
    /// `cancel.signature`), `keys` how many the tenant has.
    pub fn to_error(&self, field: &str, kind: Kind, tenant: &str, keys: usize) -> ValidationError {
        let what = kind.as_str();
        let (problem, fix) = match self {
            Self::Missing => (
                format!(
                    "is missing: tenant {tenant:?} accepts only a {what} signed by one of its {keys} sender key(s)"
                ),
                format_fix(kind),
            ),
            Self::Malformed(why) => (format!("is malformed: {why}"), format_fix(kind)),
            Self::Wrong => (
                format!(
                    "is wrong: it verifies with none of the {keys} sender key(s) of tenant {tenant:?} (signed by another key, or the {what} was changed after it was signed)"
                ),
                "sign with a key the runner's registry lists in the tenant's `senders`, and send the signed object unchanged".to_owned(),
            ),
            Self::Replayed { signed_at, window } => (
                format!(
                    "is replayed: it was made at {signed_at}, longer ago than this runner accepts a signature ({}): an older one may be a copy of a message sent before",
                    span(*window)
                ),
                format!("sign the {what} again and send it (a job id still runs once)"),
            ),
            Self::Future { signed_at } => (
                format!(
                    "is dated {signed_at}, more than {} ahead of this runner's clock",
                    span(CLOCK_SKEW)
                ),
                "set the sender's clock right (NTP) and sign again".to_owned(),
            ),
        };
        ValidationError::new(field, problem, fix)
    }
}

/// A window as people write it: `24 h`, `90 min`, `45 s`.
fn span(d: Duration) -> String {
    match d.as_secs() {
        s if s >= 3600 && s % 3600 == 0 => format!("{} h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// The object's signature, when it has a well-formed one.
///
/// # Errors
/// A `signature` member that is not `{signed_at, ed25519}` with an RFC 3339 time and a
/// 64-byte base64 signature.
pub fn read(object: &Map<String, Value>) -> Result<Option<Signature>, String> {
    let Some(value) = object.get(FIELD) else {
        return Ok(None);
    };
    let signature: Signature = serde_json::from_value(value.clone()).map_err(|e| {
        format!(
            "it must be {{signed_at, ed25519}}: {}",
            crate::job::redact::unquoted(&e.to_string())
        )
    })?;
    OffsetDateTime::parse(&signature.signed_at, &Rfc3339)
        .map_err(|_| "signed_at is not an RFC 3339 time (e.g. 2026-11-28T09:30:00Z)".to_owned())?;
    match STANDARD.decode(&signature.ed25519) {
        Ok(bytes) if bytes.len() == 64 => Ok(Some(signature)),
        Ok(bytes) => Err(format!(
            "ed25519 holds {} bytes, not the 64 of an Ed25519 signature",
            bytes.len()
        )),
        Err(_) => Err("ed25519 is not base64".into()),
    }
}

/// Checks `object`'s signature against `keys` as of `now`: it must be well formed, verify with
/// one of them, and be dated neither ahead of `now` by more than [`CLOCK_SKEW`] nor older than
/// `window` (checked in that order). The key that signed it, by its index in `keys`.
///
/// # Errors
/// Why it is refused.
pub fn verify(
    kind: Kind,
    object: &Map<String, Value>,
    keys: &[SenderKey],
    now: OffsetDateTime,
    window: Duration,
) -> Result<usize, Refusal> {
    let (signer, too_old) = verify_signer(kind, object, keys, now, window)?;
    too_old.map_or(Ok(signer), Err)
}

/// As [`verify`], but a signature older than the window is told apart: the key that signed it,
/// and [`Refusal::Replayed`] when it is too old. (A runner still reports the result of a job
/// it knows, whatever the age of its signature.)
///
/// # Errors
/// Any other refusal.
pub fn verify_signer(
    kind: Kind,
    object: &Map<String, Value>,
    keys: &[SenderKey],
    now: OffsetDateTime,
    window: Duration,
) -> Result<(usize, Option<Refusal>), Refusal> {
    let signature = read(object)
        .map_err(Refusal::Malformed)?
        .ok_or(Refusal::Missing)?;
    if let Some(why) = inexact_number(object) {
        return Err(Refusal::Malformed(why));
    }
    let bytes = signed_bytes(kind, object, &signature.signed_at);
    let raw: [u8; 64] = STANDARD
        .decode(&signature.ed25519)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(Refusal::Wrong)?;
    let sig = ed25519_dalek::Signature::from_bytes(&raw);
    // Strict: a signature that verifies only under the lax rules is not one.
    let signer = keys
        .iter()
        .position(|k| k.0.verify_strict(&bytes, &sig).is_ok())
        .ok_or(Refusal::Wrong)?;
    let at = OffsetDateTime::parse(&signature.signed_at, &Rfc3339)
        .map_err(|_| Refusal::Malformed("signed_at is not an RFC 3339 time".into()))?;
    if at > now + CLOCK_SKEW {
        return Err(Refusal::Future {
            signed_at: signature.signed_at,
        });
    }
    let too_old = (now - at > window).then_some(Refusal::Replayed {
        signed_at: signature.signed_at,
        window,
    });
    Ok((signer, too_old))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job() -> Map<String, Value> {
        let Value::Object(map) = json!({
            "id": "job-1", "tenant": "acme", "workspace": "dev", "operation": "apply",
            "template": {"name": "demo", "version": "1.0.0"},
            "variables": {"count": 3, "ratio": 0.5, "name": "é\u{1F600}"},
        }) else {
            unreachable!()
        };
        map
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::parse("2026-11-28T09:30:00Z", &Rfc3339).unwrap()
    }

    #[test]
    fn the_signed_bytes_are_the_header_then_canonical_json_without_the_signature() {
        let mut object = job();
        object.insert(FIELD.into(), json!({"signed_at": "x", "ed25519": "y"}));
        let bytes =
            String::from_utf8(signed_bytes(Kind::Job, &object, "2026-11-28T09:30:00Z")).unwrap();
        assert_eq!(
            bytes,
            "terrace-signature-v1\njob\n2026-11-28T09:30:00Z\n{\"id\":\"job-1\",\"operation\":\"apply\",\"template\":{\"name\":\"demo\",\"version\":\"1.0.0\"},\"tenant\":\"acme\",\"variables\":{\"count\":3,\"name\":\"é\u{1F600}\",\"ratio\":0.5},\"workspace\":\"dev\"}"
        );
    }

    #[test]
    fn a_signed_job_verifies_and_any_change_or_other_key_is_wrong() {
        let key = SenderSecret::generate();
        let other = SenderSecret::generate();
        let mut object = job();
        key.sign(Kind::Job, &mut object, now()).unwrap();
        assert_eq!(
            object[FIELD]["signed_at"], "2026-11-28T09:30:00Z",
            "{object:?}"
        );
        let keys = [other.public(), key.public()];
        assert_eq!(
            verify(Kind::Job, &object, &keys, now(), DEFAULT_WINDOW),
            Ok(1),
            "the second key signed it"
        );
        // Read back from the text a queue carries, keys in another order: still the same.
        let text = serde_json::to_string_pretty(&object).unwrap();
        let back: Map<String, Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            verify(Kind::Job, &back, &keys, now(), DEFAULT_WINDOW),
            Ok(1)
        );

        let mut changed = object.clone();
        changed["variables"]["count"] = json!(4);
        assert_eq!(
            verify(Kind::Job, &changed, &keys, now(), DEFAULT_WINDOW),
            Err(Refusal::Wrong)
        );
        assert_eq!(
            verify(Kind::Job, &object, &[other.public()], now(), DEFAULT_WINDOW),
            Err(Refusal::Wrong)
        );
        // A job's signature is not a cancel's.
        assert_eq!(
            verify(Kind::Cancel, &object, &keys, now(), DEFAULT_WINDOW),
            Err(Refusal::Wrong)
        );
        // The time is signed too: moving it forward breaks the signature.
        let mut later = object.clone();
        later[FIELD]["signed_at"] = json!("2026-11-28T10:30:00Z");
        assert_eq!(
            verify(Kind::Job, &later, &keys, now(), DEFAULT_WINDOW),
            Err(Refusal::Wrong)
        );
    }

    #[test]
    fn missing_malformed_old_and_future_signatures_say_which() {
        let key = SenderSecret::generate();
        let keys = [key.public()];
        assert_eq!(
            verify(Kind::Job, &job(), &keys, now(), DEFAULT_WINDOW),
            Err(Refusal::Missing)
        );
        let mut bad = job();
        bad.insert(
            FIELD.into(),
            json!({"signed_at": "yesterday", "ed25519": "AAAA"}),
        );
        assert!(matches!(
            verify(Kind::Job, &bad, &keys, now(), DEFAULT_WINDOW),
            Err(Refusal::Malformed(why)) if why.contains("RFC 3339")
        ));
        bad.insert(
            FIELD.into(),
            json!({"signed_at": "2026-11-28T09:30:00Z", "ed25519": "AAAA"}),
        );
        assert!(matches!(
            verify(Kind::Job, &bad, &keys, now(), DEFAULT_WINDOW),
            Err(Refusal::Malformed(why)) if why.contains("3 bytes")
        ));
        bad.insert(FIELD.into(), json!({"signed_at": "2026-11-28T09:30:00Z"}));
        assert!(matches!(
            verify(Kind::Job, &bad, &keys, now(), DEFAULT_WINDOW),
            Err(Refusal::Malformed(why)) if why.contains("ed25519")
        ));

        let mut old = job();
        key.sign(Kind::Job, &mut old, now() - time::Duration::hours(25))
            .unwrap();
        let refusal = verify(Kind::Job, &old, &keys, now(), DEFAULT_WINDOW).unwrap_err();
        assert_eq!(refusal.word(), "replayed");
        let error = refusal.to_error("signature", Kind::Job, "acme", 1);
        assert!(error.problem.contains("2026-11-27T08:30:00Z"), "{error:?}");
        assert!(error.problem.contains("24 h"), "{error:?}");
        // Within the window it is good.
        assert_eq!(
            verify(
                Kind::Job,
                &old,
                &keys,
                now(),
                Duration::from_secs(26 * 3600)
            ),
            Ok(0)
        );

        let mut ahead = job();
        key.sign(Kind::Job, &mut ahead, now() + time::Duration::minutes(10))
            .unwrap();
        assert_eq!(
            verify(Kind::Job, &ahead, &keys, now(), DEFAULT_WINDOW)
                .unwrap_err()
                .word(),
            "future"
        );
        let mut skewed = job();
        key.sign(Kind::Job, &mut skewed, now() + time::Duration::minutes(2))
            .unwrap();
        assert_eq!(
            verify(Kind::Job, &skewed, &keys, now(), DEFAULT_WINDOW),
            Ok(0)
        );
    }

    #[test]
    fn keys_read_as_base64_der_or_pem_and_private_keys_round_trip() {
        let secret = SenderSecret::generate();
        let public = secret.public();
        let raw = public.to_string();
        assert_eq!(raw.parse::<SenderKey>(), Ok(public.clone()));
        let pem = secret.to_pem();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
        let back = SenderSecret::from_pem(&pem).unwrap();
        assert_eq!(back.public(), public);
        let der = ed25519_dalek::pkcs8::EncodePublicKey::to_public_key_der(&public.0).unwrap();
        assert_eq!(
            STANDARD.encode(der.as_bytes()).parse::<SenderKey>(),
            Ok(public.clone())
        );
        let pem = ed25519_dalek::pkcs8::EncodePublicKey::to_public_key_pem(
            &public.0,
            ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF,
        )
        .unwrap();
        assert_eq!(pem.parse::<SenderKey>(), Ok(public.clone()));

        assert!("AAAA".parse::<SenderKey>().unwrap_err().contains("Ed25519"));
        assert!(
            "not a key!"
                .parse::<SenderKey>()
                .unwrap_err()
                .contains("base64")
        );
        let e = SenderSecret::from_pem(&pem).unwrap_err();
        assert!(e.contains("is a public key"), "{e}");
        let e = SenderSecret::from_pem(
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbg==\n-----END OPENSSH PRIVATE KEY-----",
        )
        .unwrap_err();
        assert!(e.contains("OpenSSH"), "{e}");
        let e = SenderSecret::from_pem("garbage").unwrap_err();
        assert!(e.contains("PKCS#8") && !e.contains("garbage"), "{e}");
        // The private key never shows in a debug print.
        let body: String = secret
            .to_pem()
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        assert!(!format!("{secret:?}").contains(&body), "{secret:?}");
        assert!(format!("{secret:?}").contains(&public.to_string()));
    }

    #[test]
    fn a_whole_number_canonical_json_cannot_keep_exactly_is_refused_on_both_sides() {
        let key = SenderSecret::generate();
        let mut object = job();
        object["variables"]["big"] = json!(9_007_199_254_740_993_u64);
        let e = key.sign(Kind::Job, &mut object, now()).unwrap_err();
        assert!(
            e.starts_with("variables.big is a whole number beyond"),
            "{e}"
        );
        assert!(object.get(FIELD).is_none(), "not signed");
        // 2^53 itself, and small negative numbers, are exact.
        object["variables"]["big"] = json!(9_007_199_254_740_992_u64);
        object["variables"]["small"] = json!([-3]);
        key.sign(Kind::Job, &mut object, now()).unwrap();
        // A signed job whose number was raised past 2^53 on the way is refused as malformed,
        // even where the canonical bytes would still match.
        object["variables"]["big"] = json!(9_007_199_254_740_993_u64);
        assert!(matches!(
            verify(Kind::Job, &object, &[key.public()], now(), DEFAULT_WINDOW),
            Err(Refusal::Malformed(why)) if why.contains("variables.big")
        ));
    }
}
