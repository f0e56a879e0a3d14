//! Cross-account access: the function assumes the customer's role, always with an ExternalId
//! (the confused-deputy guard AWS recommends for third parties), once for its own use of the
//! customer's bucket (credentials refreshed before they expire) and once for terraform, whose
//! credentials reach it only through its environment.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_config::sts::AssumeRoleProvider;
use serde::{Deserialize, Serialize};

/// The customer account a job runs against, from the job's message.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The role the customer created for us, e.g. `arn:aws:iam::123456789012:role/terrace`.
    pub role_arn: String,
    /// The ExternalId the customer's trust policy requires. Required.
    #[serde(default)]
    pub external_id: Option<String>,
    /// The customer's state bucket.
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    /// The DynamoDB lease table in the customer's account; without one, the lease is an S3
    /// lock object.
    #[serde(default)]
    pub lease_table: Option<String>,
    /// The customer's region (the function's own when absent).
    #[serde(default)]
    pub region: Option<String>,
    /// Encrypt every object the function writes with this KMS key (SSE-KMS).
    #[serde(default)]
    pub kms_key_id: Option<String>,
    /// Seal every state before it leaves the runner with a data key from this KMS key of the
    /// customer's (client-side envelope encryption, see `state_backends::sealed`).
    #[serde(default)]
    pub client_side_kms_key: Option<String>,
}

/// Why access was refused.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(
        "target.external_id is missing: the customer's role must require an ExternalId and the job must carry it (sts:AssumeRole without one lets anyone who learns the role ARN use it)"
    )]
    NoExternalId,
    #[error("target.role_arn {0:?} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)")]
    BadRole(String),
    #[error("assuming {role} failed: {message}")]
    Sts { role: String, message: String },
    #[error("target.{0} is empty: leave it out ({1}), or give it a value")]
    Empty(&'static str, &'static str),
    #[error("{0}")]
    Local(String),
}

impl Target {
    /// Checks what can be checked before calling STS.
    ///
    /// # Errors
    /// A missing or empty ExternalId, or a role ARN that is not one.
    pub fn check(&self) -> Result<&str, AccessError> {
        let parts: Vec<&str> = self.role_arn.splitn(6, ':').collect();
        let is_role = parts.len() == 6
            && parts[0] == "arn"
            && parts[2] == "iam"
            && parts[5].starts_with("role/")
            && parts[5].len() > "role/".len();
        if !is_role {
            return Err(AccessError::BadRole(self.role_arn.clone()));
        }
        // An empty optional field (e.g. the quick-create stack's `LeaseTableName` when it made
        // no table) would otherwise be taken as a name.
        for (field, value, without) in [
            (
                "lease_table",
                &self.lease_table,
                "the lease is then a lock object in the bucket",
            ),
            ("region", &self.region, "the function's own region is used"),
            (
                "kms_key_id",
                &self.kms_key_id,
                "the bucket's own encryption applies",
            ),
            (
                "client_side_kms_key",
                &self.client_side_kms_key,
                "states are sealed with the runner's key file, if it has one",
            ),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(AccessError::Empty(field, without));
            }
        }
        match self.external_id.as_deref().map(str::trim) {
            Some(id) if !id.is_empty() => Ok(id),
            _ => Err(AccessError::NoExternalId),
        }
    }
}

/// An STS session name from a job id: at most 64 of `[\w+=,.@-]`.
pub fn session_name(job_id: &str, suffix: &str) -> String {
    let clean: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=,.@-_".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let room = 64 - suffix.len();
    let mut name: String = clean.chars().take(room).collect();
    name.push_str(suffix);
    if name.len() < 2 {
        name.push_str("-job");
    }
    name
}

/// The function's view of the customer account: its configuration with the assumed role's
/// credentials, refreshed by the SDK before they expire.
///
/// # Errors
/// [`AccessError`] when the target is refused before any call.
pub async fn customer_config(
    base: &SdkConfig,
    target: &Target,
    job_id: &str,
) -> Result<SdkConfig, AccessError> {
    let external_id = target.check()?;
    let mut builder = AssumeRoleProvider::builder(&target.role_arn)
        .external_id(external_id)
        .session_name(session_name(job_id, ""))
        .session_length(Duration::from_secs(3600))
        .configure(base);
    if let Some(region) = &target.region {
        builder = builder.region(aws_config::Region::new(region.clone()));
    }
    let provider = builder.build().await;
    let mut config = base
        .to_builder()
        .credentials_provider(aws_sdk_s3::config::SharedCredentialsProvider::new(provider));
    if let Some(region) = &target.region {
        config = config.region(aws_config::Region::new(region.clone()));
    }
    Ok(config.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(role: &str, external_id: Option<&str>) -> Target {
        Target {
            role_arn: role.into(),
            external_id: external_id.map(str::to_owned),
            bucket: "b".into(),
            prefix: String::new(),
            lease_table: None,
            region: None,
            kms_key_id: None,
            client_side_kms_key: None,
        }
    }

    #[test]
    fn a_role_without_an_external_id_is_refused() {
        let role = "arn:aws:iam::123456789012:role/terrace";
        assert!(matches!(
            target(role, None).check(),
            Err(AccessError::NoExternalId)
        ));
        assert!(matches!(
            target(role, Some("  ")).check(),
            Err(AccessError::NoExternalId)
        ));
        assert_eq!(target(role, Some("x-1")).check().unwrap(), "x-1");
        assert!(matches!(
            target("arn:aws:iam::123456789012:user/bob", Some("x")).check(),
            Err(AccessError::BadRole(_))
        ));
        let message = AccessError::NoExternalId.to_string();
        assert!(message.contains("target.external_id"), "{message}");
    }

    #[test]
    fn an_empty_optional_field_is_refused_rather_than_taken_as_a_name() {
        let role = "arn:aws:iam::123456789012:role/terrace";
        let mut t = target(role, Some("x-1"));
        t.lease_table = Some(String::new());
        let message = t.check().unwrap_err().to_string();
        assert!(
            message.starts_with("target.lease_table is empty: leave it out"),
            "{message}"
        );
        t.lease_table = Some("terrace-leases".into());
        t.region = Some(" ".into());
        let message = t.check().unwrap_err().to_string();
        assert!(message.starts_with("target.region is empty"), "{message}");
        t.region = None;
        assert!(t.check().is_ok());
    }

    #[test]
    fn session_names_fit_sts_rules() {
        assert_eq!(session_name("job-1", "-tf"), "job-1-tf");
        let long = "a".repeat(128);
        assert_eq!(session_name(&long, "-tf").len(), 64);
        assert_eq!(session_name("a/b c", ""), "a-b-c");
    }
}
