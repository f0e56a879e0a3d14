//! gcloud's Pub/Sub emulator (started by `scripts/with-emulators.sh`): topics, pull and push
//! subscriptions (with dead-letter policies, which it honours), pulls, and a relay between its
//! push subscription and the service that adds the OIDC token the emulator cannot sign, and
//! records each delivery.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine;
use serde_json::{Value, json};

use crate::http::{call, post_json};

/// The emulator's base URL.
///
/// # Panics
/// When `scripts/with-emulators.sh` did not start it.
pub fn endpoint() -> String {
    std::env::var("TERRACE_TEST_PUBSUB").unwrap_or_else(|_| {
        panic!("TERRACE_TEST_PUBSUB is not set: run the tests through scripts/with-emulators.sh (make test)")
    })
}

/// The project every test's topics live in.
pub const PROJECT: &str = "platform";

/// A name no other test uses.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn url(path: &str) -> String {
    format!("{}/v1/{path}", endpoint())
}

/// Creates a topic; its full name.
pub async fn topic(prefix: &str) -> String {
    let name = format!("projects/{PROJECT}/topics/{}", unique(prefix));
    let made = call("PUT", &url(&name), &[], "").await;
    assert_eq!(made.status, 200, "{}", made.body);
    name
}

async fn subscription(prefix: &str, body: Value) -> String {
    let name = format!("projects/{PROJECT}/subscriptions/{}", unique(prefix));
    let made = call(
        "PUT",
        &url(&name),
        &[("content-type", "application/json")],
        &body.to_string(),
    )
    .await;
    assert_eq!(made.status, 200, "{}", made.body);
    name
}

/// A pull subscription to `topic`.
pub async fn pull_subscription(topic: &str) -> String {
    subscription("pull", json!({ "topic": topic })).await
}

/// A push subscription from `topic` to `endpoint`, dead-lettering a message to `dead_letter`
/// after `max_attempts` deliveries that were not acknowledged, retrying after 1–2 s.
pub async fn push_subscription(
    topic: &str,
    endpoint: &str,
    dead_letter: &str,
    max_attempts: u32,
) -> String {
    subscription(
        "push",
        json!({
            "topic": topic,
            "pushConfig": { "pushEndpoint": endpoint },
            "ackDeadlineSeconds": 600,
            "deadLetterPolicy": { "deadLetterTopic": dead_letter, "maxDeliveryAttempts": max_attempts },
            "retryPolicy": { "minimumBackoff": "1s", "maximumBackoff": "2s" },
        }),
    )
    .await
}

/// Publishes `message` (a JSON document) to `topic`.
pub async fn publish(topic: &str, message: &Value) {
    let data = base64::engine::general_purpose::STANDARD.encode(message.to_string());
    let sent = post_json(
        &url(&format!("{topic}:publish")),
        &[],
        &json!({ "messages": [{ "data": data }] }),
    )
    .await;
    assert_eq!(sent.status, 200, "{}", sent.body);
}

/// Pulls (and acknowledges) what `subscription` has now: each message's JSON data.
pub async fn pull(subscription: &str) -> Vec<Value> {
    let pulled = post_json(
        &url(&format!("{subscription}:pull")),
        &[],
        &json!({ "maxMessages": 100, "returnImmediately": true }),
    )
    .await;
    assert_eq!(pulled.status, 200, "{}", pulled.body);
    let pulled: Value = serde_json::from_str(&pulled.body).unwrap();
    let received = pulled["receivedMessages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ack_ids: Vec<Value> = received.iter().map(|m| m["ackId"].clone()).collect();
    if !ack_ids.is_empty() {
        let acked = post_json(
            &url(&format!("{subscription}:acknowledge")),
            &[],
            &json!({ "ackIds": ack_ids }),
        )
        .await;
        assert_eq!(acked.status, 200, "{}", acked.body);
    }
    received
        .iter()
        .map(|m| {
            let data = base64::engine::general_purpose::STANDARD
                .decode(m["message"]["data"].as_str().unwrap_or_default())
                .unwrap();
            serde_json::from_slice(&data).unwrap_or(Value::Null)
        })
        .collect()
}

/// Pulls from `subscription` until a message satisfies `pred`, for at most `within`; every
/// message pulled meanwhile.
pub async fn pull_until(
    subscription: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let give_up = std::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        seen.extend(pull(subscription).await);
        if seen.iter().any(&pred) || std::time::Instant::now() > give_up {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One push the relay passed on: the message's id, its job's id, and the service's answer.
#[derive(Clone, Debug)]
pub struct Pushed {
    pub message_id: String,
    pub job_id: String,
    pub status: u16,
}

/// Between the emulator's push subscription and the service: adds the bearer token and
/// records each delivery.
pub struct Relay {
    pub url: String,
    pushed: Arc<Mutex<Vec<Pushed>>>,
    _server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Forward {
    service: String,
    bearer: String,
    pushed: Arc<Mutex<Vec<Pushed>>>,
}

async fn forward(State(f): State<Forward>, _: HeaderMap, body: String) -> StatusCode {
    let envelope: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let job_id = base64::engine::general_purpose::STANDARD
        .decode(envelope["message"]["data"].as_str().unwrap_or_default())
        .ok()
        .and_then(|d| serde_json::from_slice::<Value>(&d).ok())
        .and_then(|m| m["job"]["id"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let answer = call(
        "POST",
        &format!("{}/pubsub", f.service),
        &[
            ("content-type", "application/json"),
            ("authorization", &f.bearer),
        ],
        &body,
    )
    .await;
    f.pushed.lock().unwrap().push(Pushed {
        message_id: envelope["message"]["messageId"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        job_id,
        status: answer.status,
    });
    StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY)
}

impl Relay {
    /// Listens on loopback and passes each push on to `service` with `bearer`.
    pub async fn start(service: &str, bearer: String) -> Self {
        let pushed = Arc::new(Mutex::new(Vec::new()));
        let state = Forward {
            service: service.to_owned(),
            bearer,
            pushed: pushed.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/push", listener.local_addr().unwrap());
        let router = axum::Router::new()
            .route("/push", post(forward))
            .with_state(state);
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Self {
            url,
            pushed,
            _server: server,
        }
    }

    /// Every push so far.
    pub fn pushed(&self) -> Vec<Pushed> {
        self.pushed.lock().unwrap().clone()
    }
}
