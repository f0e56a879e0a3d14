//! The Cloud Run service under test: a signing key and its JWKS served on loopback (standing in
//! for Google's published keys), tokens signed with it, and the real `terrace-gcp` binary.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header, jwk::Jwk};
use serde_json::{Value, json};

use crate::{Sandbox, terraform, workspace_bin};

/// The audience the service expects.
pub const AUDIENCE: &str = "https://terrace.test/pubsub";
/// The push subscription's service account.
pub const PUSHER: &str = "pubsub-push@platform.iam.gserviceaccount.com";
pub const ISSUER: &str = "https://accounts.google.com";

/// An RSA key made for this test run, with its JWK.
pub struct SigningKey {
    pub kid: String,
    pub encoding: EncodingKey,
    pub jwk: Value,
}

impl SigningKey {
    pub fn new(kid: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let pem = dir.path().join("key.pem");
        let made = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&pem)
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(made.success(), "openssl made a key");
        let encoding =
            EncodingKey::from_rsa_pem(&std::fs::read(&pem).expect("key read")).expect("an RSA key");
        let mut jwk = serde_json::to_value(
            Jwk::from_encoding_key(&encoding, Algorithm::RS256).expect("a JWK"),
        )
        .expect("JWK serializes");
        jwk["kid"] = json!(kid);
        Self {
            kid: kid.to_owned(),
            encoding,
            jwk,
        }
    }

    /// A token with these claims over the usual ones (issuer, audience, pusher, an hour).
    pub fn token(&self, claims: Value) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut all = json!({
            "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 3600,
            "email": PUSHER, "email_verified": true, "sub": "1234",
        });
        for (k, v) in claims.as_object().expect("an object") {
            all[k] = v.clone();
        }
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &all, &self.encoding).expect("signed")
    }

    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.token(json!({})))
    }
}

/// Serves `{"keys": [...]}` on loopback until dropped; returns its URL.
pub async fn serve_jwks(keys: Vec<Value>) -> (String, tokio::task::JoinHandle<()>) {
    serve_changing_jwks(std::sync::Arc::new(std::sync::Mutex::new(keys))).await
}

/// Serves `{"keys": [...]}`, whatever `keys` holds at each request (keys published and
/// withdrawn), on loopback until dropped; returns its URL.
pub async fn serve_changing_jwks(
    keys: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/certs", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/certs",
        axum::routing::get(move || {
            let body = json!({ "keys": keys.lock().unwrap().clone() });
            async move { axum::Json(body) }
        }),
    );
    let handle = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, handle)
}

/// The running service; killed when dropped.
pub struct Service {
    pub child: Child,
    pub url: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until something listens on loopback `port`; fails the test after `within`.
pub async fn wait_for_port(port: u16, within: Duration, what: &str) {
    let give_up = std::time::Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < give_up,
            "{what} did not listen on {port} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Service {
    /// `terrace-gcp` set up for `sb` against the emulator.
    pub fn command(sb: &Sandbox, jwks_url: &str, extra: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(workspace_bin("terrace-gcp"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TERRACE_PUSH_AUDIENCE", AUDIENCE)
            .env("TERRACE_OIDC_JWKS_URL", jwks_url)
            .env("TERRACE_PUSH_SERVICE_ACCOUNTS", PUSHER)
            .env("TERRACE_GCS_ENDPOINT", crate::gcs::endpoint())
            .env("TERRACE_GCS_ANONYMOUS", "1")
            .env("TERRACE_TEMPLATES", &sb.templates)
            .env("TERRACE_TERRAFORM", terraform())
            .env("TERRACE_TF_CLI_CONFIG", &sb.cli_config)
            .env(
                "TERRACE_PASS_ENV",
                "TESTCLOUD_ROOT,TESTCLOUD_CREATE_DELAY_MS",
            )
            .env("TESTCLOUD_ROOT", &sb.cloud)
            .env("TERRACE_GRACE", "5")
            .env("TERRACE_LEASE_TTL", "10")
            .env("TERRACE_REQUEST_TIMEOUT", "900")
            .env("TERRACE_LOG", "info")
            .envs(extra.iter().copied())
            .stderr(if std::env::var_os("TERRACE_TEST_VERBOSE").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        cmd
    }

    /// Starts `terrace-gcp` for `sb` against the emulator, and waits until it answers.
    pub async fn start(sb: &Sandbox, jwks_url: &str, extra: &[(&str, &str)]) -> Self {
        Self::spawn(Self::command(sb, jwks_url, extra)).await
    }

    /// Starts `cmd` (a [`Service::command`], changed as the caller needs) on a free port, and
    /// waits until it answers.
    pub async fn spawn(mut cmd: Command) -> Self {
        let port = free_port();
        cmd.env("PORT", port.to_string()).stdout(Stdio::null());
        let child = cmd.spawn().expect("terrace-gcp starts");
        let service = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        wait_for_port(port, Duration::from_secs(10), "terrace-gcp").await;
        service
    }

    /// Sends SIGTERM, as Cloud Run does when it stops an instance.
    pub fn terminate(&self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signalled");
    }
}

/// A Pub/Sub push envelope around `data`, as Pub/Sub sends it (the id and time under two
/// names each).
pub fn push_envelope(message_id: &str, data: &Value) -> Value {
    use base64::Engine;
    json!({
        "message": {
            "data": base64::engine::general_purpose::STANDARD.encode(data.to_string()),
            "attributes": {},
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": "2026-11-22T06:00:00Z",
            "publish_time": "2026-11-22T06:00:00Z",
        },
        "subscription": "projects/platform/subscriptions/terrace-jobs",
    })
}
