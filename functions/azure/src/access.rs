//! Who the job is: its own managed identity (for its queues), and, through workload identity
//! federation, the customer's app registration in the customer's tenant (for their container
//! and their subscription). Against an emulator, a SAS and no identity at all.

use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_core::http::ClientMethodOptions;
use azure_identity::{
    ClientAssertion, ClientAssertionCredential, ManagedIdentityCredential,
    ManagedIdentityCredentialOptions, UserAssignedId,
};
use serde::{Deserialize, Serialize};

/// The audience of the token the job's managed identity presents to the customer's tenant.
const EXCHANGE: &str = "api://AzureADTokenExchange/.default";

/// The customer's side of a job, from its message.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The state container: `https://ACCOUNT.blob.core.windows.net/CONTAINER`.
    pub container_url: String,
    #[serde(default)]
    pub prefix: String,
    /// The customer's tenant and the app registration (with a federated credential trusting
    /// this job's managed identity) that the job acts as there.
    #[serde(default)]
    pub tenant_id: Option<String>,
    #[serde(default)]
    pub client_id: Option<String>,
    /// The subscription terraform works in.
    #[serde(default)]
    pub subscription_id: Option<String>,
}

fn is_guid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

impl Target {
    /// Checks what can be checked before any call; `emulator`: a SAS stands in for identities.
    ///
    /// # Errors
    /// Each problem, naming its field, with its fix.
    pub fn check(&self, emulator: bool) -> Vec<(&'static str, String, &'static str)> {
        let mut problems = Vec::new();
        let url = self.container_url.trim();
        // Quoted without its query: a SAS there must not reach a record or a log.
        let shown = url.split('?').next().unwrap_or_default();
        let scheme_ok = url.starts_with("https://") || (emulator && url.starts_with("http://"));
        if !scheme_ok || url.trim_end_matches('/').matches('/').count() < 3 {
            problems.push((
                "target.container_url",
                format!("{shown:?} is not a container URL"),
                "give https://ACCOUNT.blob.core.windows.net/CONTAINER",
            ));
        }
        if url.contains('?') {
            problems.push((
                "target.container_url",
                "carries a query (a SAS?)".to_owned(),
                "send no credentials in messages: the job reaches the container as the customer's app registration",
            ));
        }
        if emulator {
            return problems;
        }
        for (field, value) in [
            ("target.tenant_id", &self.tenant_id),
            ("target.client_id", &self.client_id),
        ] {
            match value.as_deref() {
                Some(v) if is_guid(v) => {}
                Some(v) => problems.push((
                    field,
                    format!("{v:?} is not a GUID"),
                    "give the customer's tenant ID and app registration's client ID",
                )),
                None => problems.push((
                    field,
                    "is missing".to_owned(),
                    "give the customer's tenant ID and app registration's client ID",
                )),
            }
        }
        if let Some(s) = self.subscription_id.as_deref()
            && !is_guid(s)
        {
            problems.push((
                "target.subscription_id",
                format!("{s:?} is not a GUID"),
                "give the customer's subscription ID",
            ));
        }
        problems
    }
}

/// The job's own managed identity.
///
/// # Errors
/// Why it cannot be had, as a sentence.
pub fn own(client_id: Option<&str>) -> Result<Arc<dyn TokenCredential>, String> {
    let options = ManagedIdentityCredentialOptions {
        user_assigned_id: client_id.map(|id| UserAssignedId::ClientId(id.to_owned())),
        ..Default::default()
    };
    let credential = ManagedIdentityCredential::new(Some(options))
        .map_err(|e| format!("this job has no managed identity: {e}"))?;
    Ok(credential)
}

/// The job's managed identity, as the assertion the customer's app registration trusts.
#[derive(Debug)]
struct Federated(Arc<dyn TokenCredential>);

#[async_trait::async_trait]
impl ClientAssertion for Federated {
    async fn secret(&self, _: Option<ClientMethodOptions<'_>>) -> azure_core::Result<String> {
        let token = self.0.get_token(&[EXCHANGE], None).await?;
        Ok(token.token.secret().to_owned())
    }
}

/// The customer's app registration, reached by federation from the job's identity.
///
/// # Errors
/// Why it cannot be built, as a sentence.
pub fn customer(
    target: &Target,
    own: Arc<dyn TokenCredential>,
) -> Result<Arc<dyn TokenCredential>, String> {
    let (Some(tenant), Some(client)) = (&target.tenant_id, &target.client_id) else {
        return Err("target.tenant_id and target.client_id are required".into());
    };
    let credential =
        ClientAssertionCredential::new(tenant.clone(), client.clone(), Federated(own), None)
            .map_err(|e| format!("cannot act as {client} in {tenant}: {e}"))?;
    Ok(credential)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUID: &str = "6f1c2a9e-4b3d-4c5e-8f70-1a2b3c4d5e6f";

    fn target(url: &str, tenant: Option<&str>, client: Option<&str>) -> Target {
        Target {
            container_url: url.into(),
            prefix: String::new(),
            tenant_id: tenant.map(Into::into),
            client_id: client.map(Into::into),
            subscription_id: None,
        }
    }

    #[test]
    fn production_targets_need_https_and_the_customers_ids() {
        let good = target(
            "https://acme.blob.core.windows.net/states",
            Some(GUID),
            Some(GUID),
        );
        assert!(good.check(false).is_empty());
        let fields = |t: Target| {
            t.check(false)
                .into_iter()
                .map(|(f, _, _)| f)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            fields(target(
                "http://acme.blob.core.windows.net/states",
                None,
                Some("nope")
            )),
            [
                "target.container_url",
                "target.tenant_id",
                "target.client_id"
            ]
        );
        assert_eq!(
            fields(target(
                "https://acme.blob.core.windows.net/states?sig=x",
                Some(GUID),
                Some(GUID)
            )),
            ["target.container_url"]
        );
        assert!(
            target("http://127.0.0.1:10000/acct/states", None, None)
                .check(true)
                .is_empty()
        );
    }
}
