//! The per-job state server: terraform's `http` backend, served on 127.0.0.1 on a random port
//! with a random per-job credential, backed by a [`StateStore`] and the job's lease.
//!
//! | terraform sends | we do |
//! |---|---|
//! | `GET` | the current state (204 when there is none) |
//! | `POST ?ID=<lock>` | check the write (format 4, same lineage, serial not going back), then a fenced compare-and-swap: a new version |
//! | `DELETE` | remove the current state (history kept) |
//! | `LOCK` / `UNLOCK` | terraform's lock, held inside the job's lease; refused once the lease is lost |
//!
//! A refused write gets a 4xx with a one-line reason, is logged to the job's log, and changes
//! nothing. Only this module knows HTTP.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use state_backends::{CurrentState, Fence, StateStore, StoreError, WorkspaceId};

use crate::run::vouched::Vouched;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::run::logs::Logger;

mod methods;
use methods::{delete, get, lock, post, unlock, write_state};

mod connections;

/// The user name terraform presents; the password is random per job.
pub const USERNAME: &str = "terrace";

/// How to reach a running state server, for terraform's backend configuration.
#[derive(Clone)]
pub struct Endpoint {
    pub address: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &"(redacted)")
            .finish()
    }
}

impl Endpoint {
    /// Terraform's `http` backend configuration as its environment variables (`TF_HTTP_*`).
    ///
    /// Given this way rather than with `-backend-config`, none of it is written into a saved
    /// plan: `-backend-config` values are kept in the plan file (the password with them), and
    /// an approved plan applied later by another run would carry the old run's address and
    /// password. Values from the environment are read afresh by each command.
    pub fn backend_env(&self) -> Vec<(String, String)> {
        [
            ("TF_HTTP_ADDRESS", self.address.as_str()),
            ("TF_HTTP_LOCK_ADDRESS", self.address.as_str()),
            ("TF_HTTP_UNLOCK_ADDRESS", self.address.as_str()),
            ("TF_HTTP_LOCK_METHOD", "LOCK"),
            ("TF_HTTP_UNLOCK_METHOD", "UNLOCK"),
            ("TF_HTTP_USERNAME", self.username.as_str()),
            ("TF_HTTP_PASSWORD", self.password.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

/// What the server did, for the job's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Numbers of the versions accepted during the job.
    pub versions: Vec<u64>,
    /// Writes refused, with the reason.
    pub refused: Vec<String>,
    /// Bytes of the last version accepted.
    pub state_bytes: Option<u64>,
    /// Requests answered 503 because the store failed with an error that may pass (it did
    /// not answer, throttled, broke the connection).
    pub store_failures: u64,
}

/// What the server needs: the store, the workspace, the job's fence, the password terraform
/// must present (see [`random_secret`]; the caller adds it to the job's redactor) and a logger.
pub struct Config {
    pub store: Arc<dyn StateStore>,
    pub ws: WorkspaceId,
    /// The job's fence: vouched for while the lease is not lost, so that the store writes
    /// without reading the lease first and terraform's LOCK is granted without a read; once
    /// the lease is lost, every write is refused (terraform gets 423), whatever the store
    /// would say.
    pub fence: Vouched,
    pub password: String,
    pub logger: Option<Logger>,
    /// The largest request body accepted (413 beyond it).
    pub max_body: usize,
    /// A connection whose next request's head has not arrived within this is closed
    /// ([`HEADER_READ_TIMEOUT`]).
    pub header_read_timeout: std::time::Duration,
}

/// The default largest state the server accepts: the largest real states are tens of MB.
pub const MAX_STATE_BYTES: usize = 256 << 20;

/// At most this many connections at once (terraform keeps one or two); more wait to be
/// accepted, so a flood cannot grow the server's memory.
pub const MAX_CONNECTIONS: usize = 16;

/// A connection whose next request's head has not arrived within this is closed, so one that
/// never sends a request, or idles, cannot hold a place for long.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

struct Shared {
    config: Config,
    password: String,
    /// terraform's lock: its lock info JSON, while held.
    lock: Mutex<Option<serde_json::Value>>,
    activity: std::sync::Mutex<Activity>,
    /// The workspace's current state as this server last read it: within the job's lease
    /// nobody else writes (every other writer is fenced out), so terraform's repeated reads
    /// are served from here. Empty until read, and again while a write or deletion is out
    /// and after a refused one, which read afresh.
    current: std::sync::Mutex<View>,
    /// A version write sent whose answer never came for sure (its call failed in a way that
    /// may have landed, or its request was dropped): the next read tells whether it landed.
    in_doubt: std::sync::Mutex<Option<InDoubt>>,
}

/// The cached current state and how many times it changed: a read fills it only if nothing
/// changed it meanwhile, so a slow read cannot bring back a state older than a write's.
#[derive(Default)]
struct View {
    changes: u64,
    state: Option<Option<CurrentState>>,
}

/// A version write whose answer never came for sure.
#[derive(Clone, Debug)]
struct InDoubt {
    /// The SHA-256 of the state it sent.
    sha256: String,
    /// The version it followed (`None`: no state).
    after: Option<u64>,
    /// The view's change count once the write was given up: a read started after it tells.
    since: u64,
}

impl Shared {
    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn current(&self) -> Result<Option<CurrentState>, StoreError> {
        Ok(self.read().await?.0)
    }

    /// The current state, from the cache or read afresh, and the view's change count when a
    /// fresh read started (`None`: from the cache).
    async fn read(&self) -> Result<(Option<CurrentState>, Option<u64>), StoreError> {
        let started = {
            let view = self.view();
            if let Some(cached) = view.state.clone() {
                return Ok((cached, None));
            }
            view.changes
        };
        let fresh = self.config.store.current(&self.config.ws).await?;
        let mut view = self.view();
        if view.changes == started {
            view.state = Some(fresh.clone());
        }
        Ok((fresh, Some(started)))
    }

    /// Empties the view; returns its change count after.
    fn forget_current(&self) -> u64 {
        let mut view = self.view();
        view.changes += 1;
        view.state = None;
        view.changes
    }

    /// The workspace's current state as known without a store read: after a write of its own
    /// (within the lease nobody else writes), or as read when the run started.
    fn know_current(&self, state: Option<CurrentState>) {
        let mut view = self.view();
        view.changes += 1;
        view.state = Some(state);
    }

    /// Notes a version write whose answer never came for sure; the view is read afresh.
    fn doubt(&self, sha256: String, after: Option<u64>) {
        let since = self.forget_current();
        *self.in_doubt.lock().unwrap_or_else(|e| e.into_inner()) = Some(InDoubt {
            sha256,
            after,
            since,
        });
    }

    /// When a version write is in doubt, reads the current state afresh and tells whether the
    /// write landed: then the version is recorded as this job's, as if it had been answered,
    /// and returned. A read that started before the write was given up tells nothing.
    async fn settle_doubt(&self) -> Result<Option<CurrentState>, StoreError> {
        let doubt = self
            .in_doubt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(doubt) = doubt else {
            return Ok(None);
        };
        let (current, started) = self.read().await?;
        if started.is_none_or(|started| started < doubt.since) {
            return Ok(None);
        }
        {
            let mut in_doubt = self.in_doubt.lock().unwrap_or_else(|e| e.into_inner());
            if in_doubt.as_ref().is_some_and(|d| d.since == doubt.since) {
                *in_doubt = None;
            }
        }
        let landed = current.filter(|cur| {
            cur.version.sha256 == doubt.sha256 && Some(cur.version.number) > doubt.after
        });
        if let Some(cur) = &landed {
            {
                let mut activity = self.activity.lock().unwrap_or_else(|e| e.into_inner());
                activity.versions.push(cur.version.number);
                activity.state_bytes = Some(cur.version.size);
            }
            if let Some(logger) = &self.config.logger {
                let line = format!(
                    "state version {} saved (serial {}); the answer to its write was lost, and the store holds it",
                    cur.version.number, cur.version.serial
                );
                logger.runner("", &line).await;
            }
        }
        Ok(landed)
    }

    /// The job's fence for a write now (see [`Config::fence`]).
    fn fence(&self) -> Fence {
        self.config.fence.fence()
    }
}

/// A running state server; stops when dropped or [`StateServer::shutdown`] is called.
pub struct StateServer {
    endpoint: Endpoint,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl StateServer {
    /// Binds 127.0.0.1 on a random port and serves until shut down.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub async fn start(config: Config) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr: SocketAddr = listener.local_addr()?;
        let password = config.password.clone();
        let shared = Arc::new(Shared {
            config,
            password: password.clone(),
            lock: Mutex::new(None),
            activity: std::sync::Mutex::new(Activity::default()),
            current: std::sync::Mutex::new(View::default()),
            in_doubt: std::sync::Mutex::new(None),
        });
        let stop = CancellationToken::new();
        let app = router(shared.clone());
        let stopped = stop.clone();
        let timeout = shared.config.header_read_timeout;
        let task = tokio::spawn(connections::serve(listener, app, timeout, stopped));
        Ok(Self {
            endpoint: Endpoint {
                address: format!("http://{addr}/state"),
                username: USERNAME.to_owned(),
                password,
            },
            shared,
            stop,
            task: Some(task),
        })
    }

    /// The workspace's current state, read through the server's view of it: the read
    /// terraform's first GET is then served from.
    ///
    /// # Errors
    /// The store's.
    pub async fn current(&self) -> Result<Option<CurrentState>, StoreError> {
        self.shared.current().await
    }

    /// The workspace's current state as the caller read it under the job's lease, so that
    /// terraform's first read needs no store read of its own.
    pub fn seed(&self, current: Option<CurrentState>) {
        self.shared.know_current(current);
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Writes a state on the runner's own behalf, such as the `errored.tfstate` terraform left
    /// when it could not save, with the checks and the fence of a write from terraform.
    /// `Ok(None)`: the store already holds exactly this state.
    ///
    /// # Errors
    /// Why the write was refused or failed, as a sentence, and whether trying again may help
    /// (the store failed, rather than refused).
    pub async fn push(&self, body: Bytes) -> Result<Option<u64>, (String, bool)> {
        if self.shared.config.fence.is_lost() {
            return Err((
                "the job's lease is lost or could not be confirmed: no more writes".into(),
                false,
            ));
        }
        write_state(&self.shared, body)
            .await
            .map_err(|r| (r.message, r.status == StatusCode::SERVICE_UNAVAILABLE))
    }

    /// What was accepted and refused so far.
    pub fn activity(&self) -> Activity {
        self.shared
            .activity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether terraform still holds its lock (it should not after a clean exit).
    pub async fn terraform_lock(&self) -> Option<serde_json::Value> {
        self.shared.lock.lock().await.clone()
    }

    /// What was accepted and refused so far, once a version write whose answer never came
    /// is known to have landed or not (one store read, only when one is in doubt). When the
    /// store cannot be read, the activity says what was answered.
    pub async fn settled_activity(&self) -> Activity {
        if let Err(e) = self.shared.settle_doubt().await {
            tracing::warn!(workspace = %self.shared.config.ws, error = %e, "a state write's answer was lost, and the store could not be read to tell whether it landed");
        }
        self.activity()
    }

    /// Stops serving and waits for in-flight requests.
    pub async fn shutdown(mut self) -> Activity {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.settled_activity().await
    }
}

impl Drop for StateServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// 32 random bytes, hex.
pub fn random_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The router, without a socket, for tests.
fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/state", axum::routing::any(handle))
        .with_state(shared)
}

#[derive(Deserialize)]
struct LockQuery {
    #[serde(rename = "ID")]
    id: Option<String>,
}

/// Checks the credentials before anything else, the body included: an unauthenticated
/// request is answered without its body being read, and an authenticated one may send at most
/// `max_body` bytes.
async fn handle(State(shared): State<Arc<Shared>>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    if !authorized(&parts.headers, &shared.password) {
        return (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, "Basic realm=\"terrace\""),
                (header::CONNECTION, "close"),
            ],
            "missing or wrong credentials\n",
        )
            .into_response();
    }
    let max = shared.config.max_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request is larger than the state server accepts ({max} bytes; TERRACE_MAX_STATE_BYTES)"
            ),
        )
        .into_response()
    };
    if declared.is_some_and(|n| n > max as u64) {
        return too_large();
    }
    let Ok(body) = axum::body::to_bytes(body, max).await else {
        return too_large();
    };
    let lock_id = Query::<LockQuery>::try_from_uri(&parts.uri)
        .ok()
        .and_then(|q| q.0.id);
    let method = parts.method;
    let started = std::time::Instant::now();
    let response = answer(&shared, &method, lock_id.as_deref(), body).await;
    tracing::debug!(
        method = %method,
        status = response.status().as_u16(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "state request"
    );
    response
}

async fn answer(shared: &Shared, method: &Method, lock_id: Option<&str>, body: Bytes) -> Response {
    let writes = matches!(method.as_str(), "POST" | "DELETE" | "LOCK");
    let result = if writes && shared.config.fence.is_lost() {
        Err(Refusal::new(
            StatusCode::LOCKED,
            "the job's lease is lost or could not be confirmed: no more writes",
        ))
    } else {
        route(shared, method, lock_id, body).await
    };
    respond(shared, method, result).await
}

async fn route(shared: &Shared, method: &Method, lock_id: Option<&str>, body: Bytes) -> Handled {
    match method.as_str() {
        "GET" => get(shared).await,
        "POST" => post(shared, lock_id, body).await,
        "DELETE" => delete(shared).await,
        "LOCK" => lock(shared, body).await,
        "UNLOCK" => unlock(shared, body).await,
        other => Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method {other} is not part of terraform's http backend"),
        )),
    }
}

async fn respond(shared: &Shared, method: &Method, result: Handled) -> Response {
    match result {
        Ok(response) => response,
        Err(refusal) => {
            if let Some(logger) = &shared.config.logger {
                logger
                    .runner(
                        "",
                        &format!("state server refused {method}: {}", refusal.message),
                    )
                    .await;
            }
            let mut activity = shared.activity.lock().unwrap_or_else(|e| e.into_inner());
            if refusal.status.is_client_error() && method.as_str() == "POST" {
                activity.refused.push(refusal.message.clone());
            }
            if refusal.store_may_pass {
                activity.store_failures += 1;
            }
            drop(activity);
            refusal.into_response()
        }
    }
}

fn authorized(headers: &HeaderMap, password: &str) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let expected = format!("{USERNAME}:{password}");
    constant_time_eq(&decoded, expected.as_bytes())
}

/// Compares secrets in time that depends on their length only.
#[must_use]
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A refused request: a status and a one-line reason for the person reading terraform's log.
struct Refusal {
    status: StatusCode,
    message: String,
    body: Option<serde_json::Value>,
    /// The store failed with an error that may pass (counted in [`Activity::store_failures`]).
    store_may_pass: bool,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            body: None,
            store_may_pass: false,
        }
    }

    fn from_store(e: &StoreError) -> Self {
        let status = match e {
            StoreError::Conflict { .. } => StatusCode::CONFLICT,
            StoreError::LeaseLost { .. } | StoreError::LeaseHeld { .. } => StatusCode::LOCKED,
            StoreError::InvalidState(_) | StoreError::OtherLineage { .. } => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Internals (paths, backend messages) go to our log, not to the client.
            tracing::error!(error = %e, "state store failed");
            return Self {
                store_may_pass: e.is_retryable(),
                ..Self::new(status, "the state store failed; see the runner's log")
            };
        }
        Self::new(status, e.to_string())
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self.body {
            Some(body) => (self.status, axum::Json(body)).into_response(),
            None => (self.status, format!("{}\n", self.message)).into_response(),
        }
    }
}

type Handled = Result<Response, Refusal>;

#[cfg(test)]
mod tests;
