//! A Lambda Runtime API on loopback, so the real function binary runs as it does on Lambda:
//! it long-polls `GET /2018-06-01/runtime/invocation/next` and posts each answer to
//! `…/invocation/{id}/response` (or `/error`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

type Answers = Arc<Mutex<HashMap<String, oneshot::Sender<Result<Value, Value>>>>>;

#[derive(Clone)]
struct Api {
    events: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<(String, Value, u64)>>>,
    answers: Answers,
}

/// The runtime API server and a handle to invoke through it.
pub struct RuntimeApi {
    pub address: String,
    send: mpsc::UnboundedSender<(String, Value, u64)>,
    answers: Answers,
    counter: std::sync::atomic::AtomicU64,
}

impl RuntimeApi {
    pub async fn start() -> Self {
        let (send, events) = mpsc::unbounded_channel();
        let answers: Answers = Arc::default();
        let api = Api {
            events: Arc::new(tokio::sync::Mutex::new(events)),
            answers: answers.clone(),
        };
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(api);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            address,
            send,
            answers,
            counter: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Invokes the function with `event`, giving it `time` before its deadline; returns its
    /// answer (`Err` for an error answer).
    pub async fn invoke(&self, event: Value, time: Duration) -> Result<Value, Value> {
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let id = format!("req-{n}");
        let (tx, rx) = oneshot::channel();
        self.answers.lock().unwrap().insert(id.clone(), tx);
        let deadline = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            + time.as_millis() as u64;
        self.send.send((id, event, deadline)).unwrap();
        tokio::time::timeout(time + Duration::from_secs(60), rx)
            .await
            .expect("the function answered in time")
            .expect("the answer arrived")
    }
}

async fn next(State(api): State<Api>) -> (HeaderMap, String) {
    let (id, event, deadline) = api
        .events
        .lock()
        .await
        .recv()
        .await
        .expect("the test keeps the sender");
    let mut headers = HeaderMap::new();
    headers.insert(
        "Lambda-Runtime-Aws-Request-Id",
        HeaderValue::from_str(&id).unwrap(),
    );
    headers.insert(
        "Lambda-Runtime-Deadline-Ms",
        HeaderValue::from_str(&deadline.to_string()).unwrap(),
    );
    headers.insert(
        "Lambda-Runtime-Invoked-Function-Arn",
        HeaderValue::from_static("arn:aws:lambda:us-east-1:123456789012:function:terrace"),
    );
    (headers, event.to_string())
}

fn answer(api: &Api, id: &str, value: Result<Value, Value>) -> StatusCode {
    if let Some(tx) = api.answers.lock().unwrap().remove(id) {
        let _ = tx.send(value);
    }
    StatusCode::ACCEPTED
}

async fn response(State(api): State<Api>, Path(id): Path<String>, body: String) -> StatusCode {
    answer(
        &api,
        &id,
        Ok(serde_json::from_str(&body).unwrap_or(Value::String(body))),
    )
}

async fn error(State(api): State<Api>, Path(id): Path<String>, body: String) -> StatusCode {
    answer(
        &api,
        &id,
        Err(serde_json::from_str(&body).unwrap_or(Value::String(body))),
    )
}

async fn init_error(body: String) -> StatusCode {
    panic!("the function failed to start: {body}");
}
