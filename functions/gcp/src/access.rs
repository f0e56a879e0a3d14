//! The customer's project: the service account of this service impersonates the customer's
//! (short-lived tokens), once for the store and once for terraform.

use std::time::Duration;

use google_cloud_auth::credentials::{self, CacheableResource, Credentials};
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

/// Terraform's environment for the customer project: an access token of a separate
/// impersonation (`GOOGLE_OAUTH_ACCESS_TOKEN`), never this service's own credentials. None
/// against an emulator.
///
/// # Errors
/// Why no token could be had, as a sentence.
pub async fn terraform_env(
    target: &Target,
    job_timeout: Duration,
    anonymous: bool,
) -> Result<Vec<(String, String)>, String> {
    if anonymous {
        return Ok(Vec::new());
    }
    let lifetime = (job_timeout + Duration::from_secs(300))
        .clamp(Duration::from_secs(900), Duration::from_secs(3600));
    let credentials = customer(target, lifetime, false)?;
    let headers = match credentials.headers(http::Extensions::new()).await {
        Ok(CacheableResource::New { data, .. }) => data,
        Ok(CacheableResource::NotModified) => http::HeaderMap::new(),
        Err(e) => return Err(format!("no token for {}: {e}", target.service_account)),
    };
    let token = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| format!("no access token for {}", target.service_account))?;
    Ok(vec![(
        "GOOGLE_OAUTH_ACCESS_TOKEN".to_owned(),
        token.to_owned(),
    )])
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
}
