//! Who may call the service: every request carries a Google-signed OIDC token (Pub/Sub push
//! and Cloud Scheduler both send one), checked before anything else. Its signature against
//! Google's published keys (JWKS, cached for `TERRACE_OIDC_KEYS_MAX_AGE`, an hour, so a key
//! Google withdraws stops being accepted; fetched again sooner for a key it does not know), its
//! issuer, its audience (this service), its expiry, and, when configured, the service account
//! it was issued to.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;
use tokio::sync::RwLock;

/// What a token must be.
#[derive(Clone, Debug)]
pub struct OidcConfig {
    /// The `aud` the token must carry: the push subscription's (or the scheduler job's)
    /// configured audience, usually the service's URL.
    pub audience: String,
    pub issuers: Vec<String>,
    pub jwks_url: String,
    /// The service accounts allowed to call (the token's `email`, verified). Required: any
    /// Google account can get a Google-signed token for any audience.
    pub service_accounts: Vec<String>,
    /// How long fetched keys are used before they are fetched again (a key Google withdrew is
    /// refused from then on).
    pub keys_max_age: Duration,
}

/// Why a request was refused: 401 (no valid token) or 403 (a valid token, not for us).
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: String,
}

fn unauthorized(reason: impl Into<String>) -> Refusal {
    Refusal {
        status: StatusCode::UNAUTHORIZED,
        reason: reason.into(),
    }
}

fn forbidden(reason: impl Into<String>) -> Refusal {
    Refusal {
        status: StatusCode::FORBIDDEN,
        reason: reason.into(),
    }
}

#[derive(Debug, Deserialize)]
pub struct Claims {
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    pub email_verified: Option<bool>,
}

/// The keys, when they were last fetched, and when a fetch was last tried.
struct Keys {
    set: JwkSet,
    fetched: Option<Instant>,
    tried: Option<Instant>,
}

pub struct Verifier {
    config: OidcConfig,
    http: reqwest::Client,
    keys: RwLock<Keys>,
}

/// The keys are fetched again at most this often (for a key the cache does not know, or after
/// a failed fetch).
const REFETCH_AFTER: Duration = Duration::from_secs(30);

/// When the keys cannot be fetched again, the old ones are used for at most this long after
/// their own fetch (Google's endpoint being down should not stop every job at once), then every
/// request is refused.
const STALE_LIMIT: Duration = Duration::from_secs(6 * 3600);

impl Verifier {
    pub fn new(config: OidcConfig) -> Self {
        Self {
            config,
            // A hung fetch must not hold the key cache's lock for long.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
            keys: RwLock::new(Keys {
                set: JwkSet { keys: Vec::new() },
                fetched: None,
                tried: None,
            }),
        }
    }

    async fn key(&self, kid: &str) -> Result<DecodingKey, Refusal> {
        let find = |set: &JwkSet| set.find(kid).map(DecodingKey::from_jwk);
        let fresh = |keys: &Keys| {
            keys.fetched
                .is_some_and(|t| t.elapsed() < self.config.keys_max_age)
        };
        {
            let keys = self.keys.read().await;
            if fresh(&keys)
                && let Some(key) = find(&keys.set)
            {
                return key.map_err(|e| unauthorized(format!("signing key {kid}: {e}")));
            }
        }
        let mut keys = self.keys.write().await;
        let unknown = find(&keys.set).is_none();
        let aged = !fresh(&keys);
        // Keys that aged out are fetched again at once; otherwise (a key id the cache does not
        // know, a fetch that failed) at most every REFETCH_AFTER: made-up key ids, or an
        // endpoint that is down, cannot make every request fetch again.
        let last_failed = keys.tried != keys.fetched;
        let may_try =
            (aged && !last_failed) || keys.tried.is_none_or(|t| t.elapsed() >= REFETCH_AFTER);
        if (unknown || aged) && may_try {
            keys.tried = Some(Instant::now());
            match self.fetch().await {
                Ok(set) => {
                    keys.set = set;
                    keys.fetched = keys.tried;
                }
                Err(e) => {
                    tracing::error!(error = %e, url = %self.config.jwks_url, "cannot fetch the token signing keys");
                }
            }
        }
        let usable = keys.fetched.is_some_and(|t| t.elapsed() < STALE_LIMIT);
        if !usable {
            return Err(Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                reason: "the token signing keys cannot be fetched".into(),
            });
        }
        match find(&keys.set) {
            Some(key) => key.map_err(|e| unauthorized(format!("signing key {kid}: {e}"))),
            None => Err(unauthorized(format!(
                "the token's signing key {kid} is not Google's"
            ))),
        }
    }

    async fn fetch(&self) -> anyhow::Result<JwkSet> {
        let response = self
            .http
            .get(&self.config.jwks_url)
            .send()
            .await?
            .error_for_status()?;
        Ok(response.json().await?)
    }

    /// Checks the request's bearer token.
    ///
    /// # Errors
    /// The [`Refusal`] to answer with.
    pub async fn verify(&self, headers: &HeaderMap) -> Result<Claims, Refusal> {
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("no bearer token"))?;
        let header =
            decode_header(token).map_err(|e| unauthorized(format!("not a valid token: {e}")))?;
        if header.alg != Algorithm::RS256 {
            return Err(unauthorized(format!(
                "tokens signed with {:?} are not accepted (Google signs with RS256)",
                header.alg
            )));
        }
        let kid = header
            .kid
            .ok_or_else(|| unauthorized("the token names no signing key"))?;
        let key = self.key(&kid).await?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_audience(&[&self.config.audience]);
        validation.set_issuer(&self.config.issuers);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = decode::<Claims>(token, &key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::InvalidAudience => forbidden("the token is for another audience"),
                ErrorKind::InvalidIssuer => forbidden("the token is from another issuer"),
                ErrorKind::ExpiredSignature => unauthorized("the token has expired"),
                _ => unauthorized(format!("the token is not valid: {e}")),
            }
        })?;
        let claims = data.claims;
        let allowed: HashSet<&str> = self
            .config
            .service_accounts
            .iter()
            .map(String::as_str)
            .collect();
        let email = claims.email.as_deref().unwrap_or_default();
        if claims.email_verified != Some(true) || !allowed.contains(email) {
            return Err(forbidden(format!(
                "the token's service account {email:?} may not call this service"
            )));
        }
        Ok(claims)
    }
}
