//! Terraform's access to the customer's tenant: access tokens of the customer's app
//! registration, handed out by this job's broker on loopback, never the job's own identity.
//!
//! The job reaches the customer's app by workload identity federation: its managed identity's
//! token for `api://AzureADTokenExchange` is the assertion the app trusts. That assertion is
//! good for signing in to *any* customer's app that trusts this runner, so terraform must never
//! see it. Instead the broker speaks the managed identity endpoint's protocol (what the
//! azurerm and azuread providers call with `ARM_USE_MSI` and `ARM_MSI_ENDPOINT`): for
//! `GET <endpoint>?resource=R` with `Metadata: true`, it exchanges the assertion itself and
//! answers with an access token of the customer's app for `R`. A token acts only as that app in
//! that tenant, and lasts about an hour; the providers ask again as tokens expire. The endpoint's
//! path holds a random per-job secret, so another local process cannot use it either.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use azure_core::credentials::TokenCredential;
use serde::Deserialize;
use serde_json::json;
use shared::host::broker::{Keys, Loopback};
use time::OffsetDateTime;

/// One job's broker: what it needs to answer.
struct Broker {
    /// The customer's app registration, by federation.
    customer: Arc<dyn TokenCredential>,
    /// The app's client ID, as the answers name it.
    client_id: String,
    /// The secret part of the endpoint's path, and every token handed out for the job's
    /// redactor.
    keys: Keys,
}

#[derive(Deserialize)]
struct TokenQuery {
    resource: Option<String>,
}

/// A `resource` as a scope: `https://management.azure.com/` → `https://management.azure.com/.default`.
fn scope_of(resource: &str) -> String {
    format!("{}/.default", resource.trim_end_matches('/'))
}

async fn serve(
    State(broker): State<Arc<Broker>>,
    Path(secret): Path<String>,
    Query(query): Query<TokenQuery>,
    headers: HeaderMap,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    let refuse = |status, why: &str| (status, axum::Json(json!({ "error": why })));
    if !broker.keys.admits(&secret) {
        return refuse(StatusCode::NOT_FOUND, "no such endpoint");
    }
    // What the managed identity endpoints require, against request forgery.
    if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the Metadata: true header is required",
        );
    }
    let Some(resource) = query.resource.filter(|r| !r.trim().is_empty()) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the resource parameter is required",
        );
    };
    let scope = scope_of(&resource);
    match broker.customer.get_token(&[scope.as_str()], None).await {
        Ok(token) => {
            let secret = token.token.secret().to_owned();
            broker.keys.handed_out.add(&secret);
            let now = OffsetDateTime::now_utc();
            let expires_in = (token.expires_on - now).whole_seconds().max(0);
            (
                StatusCode::OK,
                axum::Json(json!({
                    "access_token": secret,
                    "token_type": "Bearer",
                    "expires_in": expires_in.to_string(),
                    "expires_on": token.expires_on.unix_timestamp().to_string(),
                    "resource": resource,
                    "client_id": broker.client_id,
                })),
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, resource, "the customer's app registration gave no token");
            refuse(
                StatusCode::BAD_GATEWAY,
                &format!("the customer's app registration gave no token: {e}"),
            )
        }
    }
}

/// Terraform's access to the customer's tenant for one job. Dropping it stops the broker.
pub struct ForTerraform {
    /// Secret: the endpoint (its path holds the broker's secret).
    pub env: Vec<(String, String)>,
    /// Not secret: the tenant, the client and subscription IDs, and the switch to the
    /// managed identity protocol.
    pub settings: Vec<(String, String)>,
    /// The tokens handed out, for the job's redactor.
    pub late: shared::job::redact::LateSecrets,
    _broker: Loopback,
}

/// Starts the broker for the customer's app `client_id` in `tenant_id` (`customer`, its
/// federated credential) and returns terraform's settings for it.
///
/// # Errors
/// Why its socket cannot be opened, as a sentence.
pub async fn for_terraform(
    customer: Arc<dyn TokenCredential>,
    tenant_id: &str,
    client_id: &str,
    subscription_id: Option<&str>,
) -> Result<ForTerraform, String> {
    let broker = Arc::new(Broker {
        customer,
        client_id: client_id.to_owned(),
        keys: Keys::new(),
    });
    let app = axum::Router::new()
        .route("/{secret}/metadata/identity/oauth2/token", get(serve))
        .with_state(broker.clone());
    let served = Loopback::serve("the token broker", app)
        .await
        .map_err(|e| format!("cannot open the token broker's socket: {e}"))?;
    let endpoint = format!(
        "http://{}/{}/metadata/identity/oauth2/token",
        served.address, broker.keys.secret
    );
    let mut settings = vec![
        ("ARM_USE_MSI".to_owned(), "true".to_owned()),
        ("ARM_TENANT_ID".to_owned(), tenant_id.to_owned()),
        ("ARM_CLIENT_ID".to_owned(), client_id.to_owned()),
    ];
    if let Some(subscription) = subscription_id {
        settings.push(("ARM_SUBSCRIPTION_ID".to_owned(), subscription.to_owned()));
    }
    Ok(ForTerraform {
        env: vec![("ARM_MSI_ENDPOINT".to_owned(), endpoint)],
        settings,
        late: broker.keys.handed_out.clone(),
        _broker: served,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_core::credentials::{AccessToken, TokenRequestOptions};
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The customer's app registration: a token per scope, and the scopes asked for.
    #[derive(Debug, Default)]
    struct App(Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl TokenCredential for App {
        async fn get_token(
            &self,
            scopes: &[&str],
            _: Option<TokenRequestOptions<'_>>,
        ) -> azure_core::Result<AccessToken> {
            self.0.lock().unwrap().push(scopes.join(" "));
            Ok(AccessToken::new(
                format!("token-for-{}", scopes[0]),
                OffsetDateTime::now_utc() + time::Duration::minutes(60),
            ))
        }
    }

    /// A GET over a plain socket, as a provider sends it: the status and the body.
    async fn get(url: &str, metadata: bool) -> (u16, String) {
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_at(rest.find('/').unwrap());
        let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
        let header = if metadata { "Metadata: true\r\n" } else { "" };
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{header}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status = answer[9..12].parse().unwrap();
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap();
        (status, body)
    }

    #[tokio::test]
    async fn terraform_gets_tokens_of_the_customers_app_never_the_jobs_assertion() {
        let app = Arc::new(App::default());
        let access = for_terraform(app.clone(), "tenant-1", "client-1", Some("sub-1"))
            .await
            .unwrap();
        let names: Vec<&str> = access
            .env
            .iter()
            .chain(&access.settings)
            .map(|(n, _)| n.as_str())
            .collect();
        assert!(!names.contains(&"ARM_OIDC_TOKEN"), "{names:?}");
        assert!(!names.contains(&"ARM_USE_OIDC"), "{names:?}");
        assert!(
            access
                .settings
                .contains(&("ARM_USE_MSI".into(), "true".into()))
        );
        assert!(
            access
                .settings
                .contains(&("ARM_SUBSCRIPTION_ID".into(), "sub-1".into()))
        );
        let endpoint = &access.env[0].1;

        // What the azurerm provider asks.
        let url = format!(
            "{endpoint}?api-version=2018-02-01&resource=https%3A%2F%2Fmanagement.azure.com%2F&client_id=client-1"
        );
        let (status, body) = get(&url, true).await;
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            answer["access_token"],
            "token-for-https://management.azure.com/.default"
        );
        assert_eq!(answer["token_type"], "Bearer");
        assert_eq!(answer["client_id"], "client-1");
        let expires_in: i64 = answer["expires_in"].as_str().unwrap().parse().unwrap();
        assert!((3500..=3600).contains(&expires_in), "{answer}");
        assert_eq!(
            *app.0.lock().unwrap(),
            ["https://management.azure.com/.default"]
        );
        // The token handed out is masked in the job's log from then on.
        let redactor = shared::job::redact::Redactor::default().with_late(access.late.clone());
        let line = redactor.redact("got token-for-https://management.azure.com/.default");
        assert!(!line.contains("token-for"), "{line}");

        // Without the Metadata header (a forged request), or the path's secret: nothing.
        assert_eq!(get(&url, false).await.0, 400);
        let guessed = url.replacen(
            &access.env[0].1,
            &endpoint.replace("/metadata", "x/metadata"),
            1,
        );
        assert_eq!(get(&guessed, true).await.0, 404);
        assert_eq!(
            app.0.lock().unwrap().len(),
            1,
            "no other token was asked for"
        );

        // Dropped with the job: the endpoint is gone.
        drop(access);
        tokio::task::yield_now().await;
        assert!(
            tokio::net::TcpStream::connect(url[7..].split('/').next().unwrap())
                .await
                .is_err()
        );
    }
}
