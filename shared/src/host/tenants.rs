//! The tenant registry: which customer account each tenant's jobs run against. It is the
//! runner's operator's, read from the runner's own configuration (`TERRACE_TENANTS`), never
//! from a message: a job message names its tenant, and whoever can enqueue cannot point a job
//! at an account that tenant was not registered with.
//!
//! A message may still carry a target (older platforms send one); it must then agree with the
//! registry field by field, and fields that only the registry may give (the ExternalId on AWS)
//! must be absent. Anything else is rejected before anything runs.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::host::settings::{ConfigError, var};
use crate::host::trigger::problem;
use crate::job::signature::{SENDER_FIX, SenderKey};
use crate::job::validate::ValidationError;
use crate::run::sealed_outputs::{OutputsRecipient, RECIPIENT_FIX};

/// The setting that holds the registry: a JSON object, or the path of a JSON or YAML file.
pub const SETTING: &str = "TERRACE_TENANTS";

const FIX: &str = "send the job without a target (the runner's tenant registry names it), or ask the runner's operator to register this one";

/// Tenant name → its target, the key its sensitive outputs are sealed to, and the keys
/// allowed to send its jobs.
#[derive(Clone, Debug)]
pub struct Tenants<T> {
    targets: BTreeMap<String, T>,
    recipients: BTreeMap<String, OutputsRecipient>,
    senders: BTreeMap<String, Vec<SenderKey>>,
    policy_sets: BTreeMap<String, String>,
}

/// A tenant's field, beside its target's, listing the Ed25519 public keys allowed to send its
/// jobs and cancels (`docs/signing.md`): with any, an unsigned message is refused.
pub const SENDERS_FIELD: &str = "senders";

/// A tenant's field, beside its target's, naming a policy set its plans are held to besides
/// the runner's (`docs/policy.md`): a folder, or `BUCKET_URL/NAME/VERSION`.
pub const POLICIES_FIELD: &str = "policies";

/// A tenant's field, beside its target's, naming the platform's age key (`age1…`) its
/// sensitive outputs are sealed to (`docs/outputs.md`).
pub const RECIPIENT_FIELD: &str = "outputs_recipient";

impl<T: DeserializeOwned + Serialize + Clone> Tenants<T> {
    /// Reads the registry from [`SETTING`]. `check` lists the problems of one target, each a
    /// sentence naming its field.
    ///
    /// # Errors
    /// An unset setting, an unreadable file, a malformed document, a tenant name Terrace
    /// refuses, or a target that is not one: each named, with its fix.
    pub fn from_env(check: impl Fn(&T) -> Vec<String>, example: &str) -> Result<Self, ConfigError> {
        let Some(setting) = var(SETTING) else {
            return Err(format!(
                "{SETTING} is not set: give the tenant registry, a JSON object (or the path of a JSON or YAML file holding one) mapping each tenant to its target, e.g. {example}"
            )
            .into());
        };
        let (text, source) = if setting.trim_start().starts_with('{') {
            (setting, SETTING.to_owned())
        } else {
            let text = std::fs::read_to_string(setting.trim()).map_err(|e| {
                format!(
                    "{SETTING}={:?}: cannot read the tenant registry: {e}",
                    setting.trim()
                )
            })?;
            (text, format!("{SETTING} ({})", setting.trim()))
        };
        Self::parse(&text, &source, check)
    }

    /// Reads a registry document; `source` names it in errors.
    ///
    /// # Errors
    /// As [`Tenants::from_env`].
    pub fn parse(
        text: &str,
        source: &str,
        check: impl Fn(&T) -> Vec<String>,
    ) -> Result<Self, ConfigError> {
        // Strict: a tenant given twice is an error, not the last one winning.
        let doc = crate::job::RawJob::parse(text).map_err(|e| {
            format!(
                "{source}: {}: write the tenant registry as a mapping of tenant names to targets",
                e.problem
            )
        })?;
        let mut targets = BTreeMap::new();
        let mut recipients = BTreeMap::new();
        let mut senders = BTreeMap::new();
        let mut policy_sets = BTreeMap::new();
        let mut problems = Vec::new();
        for (tenant, mut value) in doc.0 {
            if let Err(e) = state_backends::check_name(&tenant) {
                problems.push(format!("tenant {tenant:?} {}", e.reason));
                continue;
            }
            let recipient = value
                .as_object_mut()
                .and_then(|entry| entry.remove(RECIPIENT_FIELD));
            match recipient.as_ref().map(|r| {
                r.as_str()
                    .ok_or_else(|| "is not text".to_owned())
                    .and_then(str::parse::<OutputsRecipient>)
            }) {
                None => {}
                Some(Ok(recipient)) => {
                    recipients.insert(tenant.clone(), recipient);
                }
                Some(Err(why)) => problems.push(format!(
                    "tenant {tenant:?}: {RECIPIENT_FIELD} {why}: {RECIPIENT_FIX}"
                )),
            }
            let keys = value
                .as_object_mut()
                .and_then(|entry| entry.remove(SENDERS_FIELD));
            match keys.map(|keys| parse_senders(&keys)) {
                None => {}
                Some(Ok(keys)) => {
                    senders.insert(tenant.clone(), keys);
                }
                Some(Err(why)) => problems.push(format!(
                    "tenant {tenant:?}: {SENDERS_FIELD} {why}: {SENDER_FIX}"
                )),
            }
            let policies = value
                .as_object_mut()
                .and_then(|entry| entry.remove(POLICIES_FIELD));
            match policies.map(|p| {
                p.as_str()
                    .ok_or_else(|| "is not text".to_owned())
                    .and_then(|text| {
                        crate::run::policy::source::SetRef::parse(text).map(|_| text.to_owned())
                    })
            }) {
                None => {}
                Some(Ok(text)) => {
                    policy_sets.insert(tenant.clone(), text);
                }
                Some(Err(why)) => problems.push(format!(
                    "tenant {tenant:?}: {POLICIES_FIELD} {why}: give a folder of .rego files, or a published set (BUCKET_URL/NAME/VERSION)"
                )),
            }
            match serde_json::from_value::<T>(value) {
                Ok(target) => {
                    for why in check(&target) {
                        problems.push(format!("tenant {tenant:?}: {why}"));
                    }
                    targets.insert(tenant, target);
                }
                Err(e) => problems.push(format!("tenant {tenant:?}: {e}")),
            }
        }
        if !problems.is_empty() {
            return Err(format!("{source}: {}", problems.join("; ")).into());
        }
        if targets.is_empty() {
            return Err(format!("{source} registers no tenant: no job could run").into());
        }
        Ok(Self {
            targets,
            recipients,
            senders,
            policy_sets,
        })
    }

    /// The policy set each tenant's entry names (`policies`), as written; tenants without one
    /// are held to the runner's alone.
    pub fn policy_sets(&self) -> &BTreeMap<String, String> {
        &self.policy_sets
    }

    /// The keys allowed to send `tenant`'s jobs and cancels: none when any sender may.
    pub fn senders(&self, tenant: &str) -> &[SenderKey] {
        self.senders.get(tenant).map_or(&[], Vec::as_slice)
    }

    /// The key `tenant`'s sensitive outputs are sealed to, if the registry gives one.
    pub fn outputs_recipient(&self, tenant: &str) -> Option<&OutputsRecipient> {
        self.recipients.get(tenant)
    }

    /// The registered tenants.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.targets.keys().map(String::as_str)
    }

    /// The target of `tenant`, if it is registered.
    pub fn get(&self, tenant: &str) -> Option<&T> {
        self.targets.get(tenant)
    }

    /// The target a message's job runs against: the registry's for `tenant`. A target in the
    /// message must agree with it field by field, and leave out every field of
    /// `registry_only`.
    ///
    /// # Errors
    /// Every problem, as a rejection lists them. No value is quoted (the rejection goes back to
    /// whoever sent the message).
    pub fn resolve(
        &self,
        tenant: &str,
        message: Option<&T>,
        registry_only: &[&str],
    ) -> Result<T, Vec<ValidationError>> {
        let Some(registered) = self.targets.get(tenant) else {
            return Err(vec![problem(
                "tenant",
                format!("{tenant:?} is not registered with this runner"),
                "ask the runner's operator to add the tenant to its registry (TERRACE_TENANTS)",
            )]);
        };
        let Some(message) = message else {
            return Ok(registered.clone());
        };
        let problems = disagreements(
            &serde_json::to_value(message).unwrap_or(Value::Null),
            &serde_json::to_value(registered).unwrap_or(Value::Null),
            tenant,
            registry_only,
        );
        if problems.is_empty() {
            Ok(registered.clone())
        } else {
            Err(problems)
        }
    }

    /// The registry's targets, each once, with the tenants registered to it (several tenants
    /// may share a bucket), limited to `only` when it names any.
    ///
    /// # Errors
    /// A name in `only` that is not registered.
    pub fn grouped(&self, only: &[String]) -> Result<Vec<(T, BTreeSet<String>)>, String> {
        if let Some(unknown) = only.iter().find(|t| !self.targets.contains_key(*t)) {
            return Err(format!(
                "tenant {unknown:?} is not registered with this runner"
            ));
        }
        let mut groups: Vec<(Value, T, BTreeSet<String>)> = Vec::new();
        for (tenant, target) in &self.targets {
            if !only.is_empty() && !only.contains(tenant) {
                continue;
            }
            let key = serde_json::to_value(target).unwrap_or(Value::Null);
            match groups.iter_mut().find(|(k, _, _)| *k == key) {
                Some((_, _, tenants)) => {
                    tenants.insert(tenant.clone());
                }
                None => groups.push((key, target.clone(), BTreeSet::from([tenant.clone()]))),
            }
        }
        Ok(groups.into_iter().map(|(_, t, names)| (t, names)).collect())
    }
}

/// A tenant's `senders`: a non-empty list of keys.
///
/// # Errors
/// What is wrong, naming the entry (never quoting a key).
pub fn parse_senders(value: &Value) -> Result<Vec<SenderKey>, String> {
    let Some(list) = value.as_array().filter(|l| !l.is_empty()) else {
        return Err("must be a list of one or more public keys".into());
    };
    list.iter()
        .enumerate()
        .map(|(i, key)| {
            key.as_str()
                .ok_or_else(|| "is not text".to_owned())
                .and_then(str::parse)
                .map_err(|why| format!("[{i}] {why}"))
        })
        .collect()
}

/// `target` with the `fields` only the registry gives left out (they are optional, since a
/// message must be able to leave them out).
pub fn without<T: Serialize + DeserializeOwned + Clone>(target: &T, fields: &[&str]) -> T {
    let Ok(Value::Object(mut map)) = serde_json::to_value(target) else {
        return target.clone();
    };
    for field in fields {
        map.remove(*field);
    }
    serde_json::from_value(Value::Object(map)).unwrap_or_else(|_| target.clone())
}

/// Where a message's target (`message`) departs from the registered one.
fn disagreements(
    message: &Value,
    registered: &Value,
    tenant: &str,
    registry_only: &[&str],
) -> Vec<ValidationError> {
    let empty = serde_json::Map::new();
    let given = message.as_object().unwrap_or(&empty);
    let known = registered.as_object().unwrap_or(&empty);
    let fields: BTreeSet<&String> = given.keys().chain(known.keys()).collect();
    let mut problems = Vec::new();
    for field in fields {
        let mine = given.get(field).unwrap_or(&Value::Null);
        if registry_only.contains(&field.as_str()) {
            if !mine.is_null() {
                problems.push(problem(
                    &format!("target.{field}"),
                    "comes only from the runner's tenant registry, never from a message",
                    "remove it from the message",
                ));
            }
            continue;
        }
        if mine != known.get(field).unwrap_or(&Value::Null) {
            // Neither value is quoted: the registry's is not the sender's to learn, and the
            // message's may carry a credential (a SAS in a URL).
            problems.push(problem(
                &format!("target.{field}"),
                format!("is not what the runner's tenant registry holds for tenant {tenant:?}"),
                FIX,
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
    #[serde(deny_unknown_fields)]
    struct Role {
        role: String,
        #[serde(default)]
        secret: Option<String>,
        #[serde(default)]
        prefix: String,
    }

    fn check(r: &Role) -> Vec<String> {
        if r.secret.is_none() {
            vec!["secret is missing".into()]
        } else {
            Vec::new()
        }
    }

    fn registry() -> Tenants<Role> {
        Tenants::parse(
            r#"{"acme": {"role": "r-acme", "secret": "s-1"}, "beta": {"role": "r-beta", "secret": "s-2", "prefix": "b"}, "beta-eu": {"role": "r-beta", "secret": "s-2", "prefix": "b"}}"#,
            "test",
            check,
        )
        .unwrap()
    }

    fn fields(problems: &[ValidationError]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    #[test]
    fn a_message_without_a_target_gets_its_tenants() {
        let target = registry().resolve("acme", None, &["secret"]).unwrap();
        assert_eq!(target.role, "r-acme");
        assert_eq!(target.secret.as_deref(), Some("s-1"));
    }

    #[test]
    fn a_tenant_may_name_the_key_its_outputs_are_sealed_to_and_a_bad_one_is_refused() {
        let key = crate::run::sealed_outputs::Identity::generate()
            .to_public()
            .to_string();
        let text = format!(
            r#"{{"acme": {{"role": "r-acme", "secret": "s", "outputs_recipient": "{key}"}}, "beta": {{"role": "r-beta", "secret": "s"}}}}"#
        );
        let tenants = Tenants::<Role>::parse(&text, "test", check).unwrap();
        assert_eq!(
            tenants.outputs_recipient("acme").map(ToString::to_string),
            Some(key)
        );
        assert!(tenants.outputs_recipient("beta").is_none());
        assert_eq!(
            tenants.get("acme").unwrap().role,
            "r-acme",
            "the target reads as before"
        );
        let bad = r#"{"acme": {"role": "r-acme", "secret": "s", "outputs_recipient": "age1nope"}}"#;
        let e = Tenants::<Role>::parse(bad, "test", check)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tenant \"acme\": outputs_recipient is not an age X25519 recipient")
                && e.contains("age-keygen")
                && !e.contains("age1nope"),
            "{e}"
        );
    }

    #[test]
    fn an_unregistered_tenant_is_refused() {
        let problems = registry().resolve("evil", None, &["secret"]).unwrap_err();
        assert_eq!(fields(&problems), ["tenant"]);
        assert!(problems[0].problem.contains("not registered"));
    }

    #[test]
    fn a_target_that_points_elsewhere_is_refused_without_quoting_the_registry() {
        let other = Role {
            role: "r-beta".into(),
            secret: None,
            prefix: String::new(),
        };
        let problems = registry()
            .resolve("acme", Some(&other), &["secret"])
            .unwrap_err();
        assert_eq!(fields(&problems), ["target.role"]);
        let text = problems[0].to_string();
        assert!(!text.contains("r-acme"), "the registry leaked: {text}");
        assert!(!text.contains("r-beta"), "a value was quoted: {text}");
    }

    #[test]
    fn a_registry_only_field_in_a_message_is_refused_even_when_it_is_right() {
        let same = Role {
            role: "r-acme".into(),
            secret: Some("s-1".into()),
            prefix: String::new(),
        };
        let problems = registry()
            .resolve("acme", Some(&same), &["secret"])
            .unwrap_err();
        assert_eq!(fields(&problems), ["target.secret"]);
        assert!(!problems[0].to_string().contains("s-1"));
        let agreeing = Role {
            secret: None,
            ..same
        };
        let target = registry()
            .resolve("acme", Some(&agreeing), &["secret"])
            .unwrap();
        assert_eq!(target.secret.as_deref(), Some("s-1"));
    }

    #[test]
    fn tenants_sharing_a_target_are_grouped() {
        let groups = registry().grouped(&[]).unwrap();
        assert_eq!(groups.len(), 2);
        let beta = groups.iter().find(|(t, _)| t.role == "r-beta").unwrap();
        assert_eq!(
            beta.1.iter().map(String::as_str).collect::<Vec<_>>(),
            ["beta", "beta-eu"]
        );
        let only = registry().grouped(&["acme".into()]).unwrap();
        assert_eq!(only.len(), 1);
        assert!(registry().grouped(&["nope".into()]).is_err());
    }

    #[test]
    fn a_bad_registry_names_each_problem() {
        let e = Tenants::<Role>::parse(
            r#"{"acme": {"role": "r"}, "Bad": {"role": "r", "secret": "s"}, "x": {"rol": "r"}}"#,
            "TERRACE_TENANTS",
            check,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(r#"tenant "acme": secret is missing"#), "{e}");
        assert!(e.contains(r#"tenant "Bad""#), "{e}");
        assert!(e.contains(r#"tenant "x": unknown field `rol`"#), "{e}");
        let twice = Tenants::<Role>::parse(
            r#"{"acme": {"role": "a", "secret": "s"}, "acme": {"role": "b", "secret": "s"}}"#,
            "TERRACE_TENANTS",
            check,
        )
        .unwrap_err()
        .to_string();
        assert!(twice.contains("acme"), "{twice}");
        let yaml =
            Tenants::<Role>::parse("acme:\n  role: r\n  secret: s\n", "file", check).unwrap();
        assert_eq!(yaml.names().collect::<Vec<_>>(), ["acme"]);
        assert!(Tenants::<Role>::parse("{}", "f", check).is_err());
    }
}
