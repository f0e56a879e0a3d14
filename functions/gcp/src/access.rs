//! The customer's project: the service account of this service impersonates the customer's
//! (short-lived tokens), for the store here and for terraform in its provider.

use std::time::Duration;

use google_cloud_auth::credentials::{self, Credentials};
use serde::{Deserialize, Serialize};

/// The customer project a job runs against, from the job's message.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The customer's service account that this service may impersonate
    /// (`roles/iam.serviceAccountTokenCreator` granted to this service's account).
    pub service_account: String,
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    /// A Cloud KMS key for every object written (`projects/P/locations/L/keyRings/R/cryptoKeys/K`).
    #[serde(default)]
    pub kms_key: Option<String>,
}

impl Target {
    /// Checks what can be checked before any call.
    ///
    /// # Errors
    /// The problem, naming the field.
    pub fn check(&self) -> Result<(), String> {
        let sa = self.service_account.trim();
        let ok = sa.split_once('@').is_some_and(|(name, domain)| {
            !name.is_empty() && domain.ends_with(".gserviceaccount.com")
        });
        if !ok {
            return Err(format!(
                "target.service_account {sa:?} is not a service account email (NAME@PROJECT.iam.gserviceaccount.com)"
            ));
        }
        if self.bucket.trim().is_empty() {
            return Err("target.bucket is empty".into());
        }
        Ok(())
    }
}

/// Credentials for the customer's service account, valid for `lifetime` (GCP allows 1 h
/// unless the customer's organisation allows longer), or none against an emulator.
///
/// # Errors
/// Why the credentials cannot be built, as a sentence.
pub fn customer(
    target: &Target,
    lifetime: Duration,
    anonymous: bool,
) -> Result<Credentials, String> {
    if anonymous {
        return Ok(credentials::anonymous::Builder::new().build());
    }
    let own = credentials::Builder::default()
        .build()
        .map_err(|e| format!("this service has no credentials of its own: {e}"))?;
    credentials::impersonated::Builder::from_source_credentials(own)
        .with_target_principal(target.service_account.trim())
        .with_lifetime(lifetime)
        .build()
        .map_err(|e| format!("cannot impersonate {}: {e}", target.service_account))
}

/// Terraform's settings for the customer project: its Google provider (and `gcloud` in a
/// provisioner) impersonates the customer's service account itself, from this service's
/// ambient credentials, and refreshes the token as it expires, so a job may run longer than
/// the 1 h a token lasts. No token is handed over, so none can be logged or outlive the job.
/// None against an emulator.
#[must_use]
pub fn terraform_settings(target: &Target, anonymous: bool) -> Vec<(String, String)> {
    if anonymous {
        return Vec::new();
    }
    let sa = target.service_account.trim().to_owned();
    vec![
        ("GOOGLE_IMPERSONATE_SERVICE_ACCOUNT".to_owned(), sa.clone()),
        ("CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT".to_owned(), sa),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(sa: &str) -> Target {
        Target {
            service_account: sa.into(),
            bucket: "b".into(),
            prefix: String::new(),
            kms_key: None,
        }
    }

    #[test]
    fn the_customers_service_account_must_be_one() {
        assert!(
            target("terrace@acme-prod.iam.gserviceaccount.com")
                .check()
                .is_ok()
        );
        for bad in [
            "",
            "terrace",
            "@acme.iam.gserviceaccount.com",
            "me@example.com",
        ] {
            let e = target(bad).check().unwrap_err();
            assert!(e.contains("target.service_account"), "{e}");
        }
    }

    #[test]
    fn terraform_impersonates_the_customer_and_gets_no_token() {
        let settings = terraform_settings(&target(" tf@acme.iam.gserviceaccount.com "), false);
        let names: Vec<&str> = settings.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "GOOGLE_IMPERSONATE_SERVICE_ACCOUNT",
                "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT"
            ]
        );
        assert!(
            settings
                .iter()
                .all(|(_, v)| v == "tf@acme.iam.gserviceaccount.com")
        );
        assert!(terraform_settings(&target("tf@acme.iam.gserviceaccount.com"), true).is_empty());
    }
}
