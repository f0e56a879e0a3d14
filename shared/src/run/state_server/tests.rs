//! Unit tests of `state_server`.

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use state_backends::memory::MemoryStore;
use state_backends::tfstate::empty_state;
use state_backends::{LeaseRequest, NewState, PutMode, StateStore};
use tower::ServiceExt;

use super::*;

struct Fixture {
    shared: Arc<Shared>,
    store: Arc<dyn StateStore>,
    ws: WorkspaceId,
}

/// A store with job-1 holding `t/w`'s lease, and the config of a server for it.
async fn leased(ttl: Duration, max_body: usize) -> (Arc<dyn StateStore>, WorkspaceId, Config) {
    leased_in(Arc::new(MemoryStore::new()), ttl, max_body).await
}

/// [`leased`], in `store`.
async fn leased_in(
    store: Arc<dyn StateStore>,
    ttl: Duration,
    max_body: usize,
) -> (Arc<dyn StateStore>, WorkspaceId, Config) {
    let ws = WorkspaceId::new("t", "w").unwrap();
    let lease = store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "job-1".into(),
                ttl,
                info: serde_json::Value::Null,
            },
        )
        .await
        .unwrap();
    let config = Config {
        store: store.clone(),
        ws: ws.clone(),
        fence: Vouched::unvouched(lease.fence(), CancellationToken::new()),
        password: "pw".into(),
        logger: None,
        max_body,
        header_read_timeout: HEADER_READ_TIMEOUT,
    };
    (store, ws, config)
}

/// A server's state, without a socket, with the password `pw`.
fn shared(config: Config) -> Arc<Shared> {
    Arc::new(Shared {
        config,
        password: "pw".into(),
        lock: Mutex::new(None),
        activity: std::sync::Mutex::new(Activity::default()),
        current: std::sync::Mutex::new(View::default()),
        in_doubt: std::sync::Mutex::new(None),
    })
}

async fn fixture(ttl: Duration) -> Fixture {
    let (store, ws, config) = leased(ttl, MAX_STATE_BYTES).await;
    let shared = shared(config);
    Fixture { shared, store, ws }
}

async fn send(f: &Fixture, method: &str, uri: &str, body: impl Into<Body>) -> (StatusCode, String) {
    let auth = base64::engine::general_purpose::STANDARD.encode("terrace:pw");
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Basic {auth}"))
        .body(body.into())
        .unwrap();
    let response = router(f.shared.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn writes_are_checked_versioned_and_refusals_change_nothing() {
    let f = fixture(Duration::from_secs(60)).await;
    assert_eq!(
        send(&f, "GET", "/state", Body::empty()).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 1)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 2)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 2)).await.0,
        StatusCode::OK,
        "same bytes again"
    );

    let (status, body) = send(&f, "POST", "/state", empty_state("l", 1)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body.contains("older than the current serial 2"), "{body}");
    let (status, body) = send(&f, "POST", "/state", empty_state("other", 3)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body.contains("lineage"), "{body}");
    let (status, body) = send(&f, "POST", "/state", "{\"version\":3}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("version 3"), "{body}");

    let versions = f.store.versions(&f.ws).await.unwrap();
    assert_eq!(
        versions.iter().map(|v| v.serial).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let (status, body) = send(&f, "GET", "/state", Body::empty()).await;
    assert_eq!(
        (status, body.as_bytes()),
        (StatusCode::OK, &empty_state("l", 2)[..])
    );
    let activity = f.shared.activity.lock().unwrap().clone();
    assert_eq!(activity.versions, vec![1, 2]);
    assert_eq!(activity.refused.len(), 3);
}

#[tokio::test]
async fn reads_are_served_from_the_last_read_and_a_stale_view_never_writes() {
    let f = fixture(Duration::from_secs(60)).await;
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 1)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&f, "GET", "/state", Body::empty()).await.1.as_bytes(),
        &empty_state("l", 1)[..]
    );
    // A write behind the server's back (no writer can do this under the job's lease; the
    // test reaches into the store) is not seen by reads: they come from the last read.
    let token = f.store.current(&f.ws).await.unwrap().unwrap().token;
    f.store
        .put(
            &f.ws,
            NewState::parse(empty_state("l", 5)).unwrap(),
            PutMode::Update(token),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        send(&f, "GET", "/state", Body::empty()).await.1.as_bytes(),
        &empty_state("l", 1)[..]
    );
    // A write from that stale view still meets the store's compare-and-swap: refused, and
    // the server reads afresh.
    let (status, body) = send(&f, "POST", "/state", empty_state("l", 2)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        send(&f, "GET", "/state", Body::empty()).await.1.as_bytes(),
        &empty_state("l", 5)[..]
    );
    assert_eq!(
        f.store
            .versions(&f.ws)
            .await
            .unwrap()
            .iter()
            .map(|v| v.serial)
            .collect::<Vec<_>>(),
        vec![1, 5]
    );
}

#[tokio::test]
async fn lock_protocol_and_lock_ids_on_writes() {
    let f = fixture(Duration::from_secs(60)).await;
    let info = r#"{"ID":"abc","Operation":"OperationTypeApply","Who":"me"}"#;
    assert_eq!(send(&f, "LOCK", "/state", info).await.0, StatusCode::OK);
    let (status, body) = send(&f, "LOCK", "/state", r#"{"ID":"other"}"#).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(
        body.contains("\"ID\":\"abc\""),
        "the holder's lock info is returned: {body}"
    );
    let (status, _) = send(&f, "POST", "/state?ID=wrong", empty_state("l", 1)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        send(&f, "POST", "/state?ID=abc", empty_state("l", 1))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        send(&f, "UNLOCK", "/state", r#"{"ID":"zzz"}"#).await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(send(&f, "UNLOCK", "/state", info).await.0, StatusCode::OK);
    assert_eq!(
        send(&f, "LOCK", "/state", r#"{"ID":"other"}"#).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_job_whose_lease_expired_can_neither_lock_nor_write() {
    let f = fixture(Duration::from_millis(100)).await;
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 1)).await.0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, body) = send(&f, "LOCK", "/state", r#"{"ID":"x"}"#).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(body.contains("lease"), "{body}");
    let (status, body) = send(&f, "POST", "/state", empty_state("l", 2)).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(body.contains("expired"), "{body}");
    let (status, _) = send(&f, "POST", "/state", empty_state("l", 1)).await;
    assert_eq!(
        status,
        StatusCode::LOCKED,
        "even a no-op write is refused without the lease"
    );
    assert_eq!(f.store.versions(&f.ws).await.unwrap().len(), 1);
}

#[tokio::test]
async fn wrong_credentials_are_refused_before_anything_else() {
    let f = fixture(Duration::from_secs(60)).await;
    let request = Request::builder()
        .method("POST")
        .uri("/state")
        .header(header::AUTHORIZATION, "Basic dGVycmFjZTp3cm9uZw==")
        .body(Body::from(empty_state("l", 1)))
        .unwrap();
    let response = router(f.shared.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(f.store.current(&f.ws).await.unwrap().is_none());
}

#[tokio::test]
async fn once_the_lease_is_lost_every_write_is_refused_and_nothing_changes() {
    let f = fixture(Duration::from_secs(60)).await;
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 1)).await.0,
        StatusCode::OK
    );
    f.shared.config.fence.lost().cancel();
    let (status, body) = send(&f, "POST", "/state", empty_state("l", 2)).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(body.contains("lease is lost"), "{body}");
    assert_eq!(
        send(&f, "DELETE", "/state", Body::empty()).await.0,
        StatusCode::LOCKED
    );
    assert_eq!(
        send(&f, "LOCK", "/state", r#"{"ID":"x"}"#).await.0,
        StatusCode::LOCKED
    );
    // Reads go on (terraform reads before it stops).
    assert_eq!(
        send(&f, "GET", "/state", Body::empty()).await.0,
        StatusCode::OK
    );
    assert_eq!(f.store.versions(&f.ws).await.unwrap().len(), 1);
}

/// A server on a socket, with a small body cap, for the tests that need real connections.
async fn serving(max_body: usize) -> (StateServer, Arc<dyn StateStore>, WorkspaceId) {
    serving_with(max_body, HEADER_READ_TIMEOUT).await
}

async fn serving_with(
    max_body: usize,
    header_read_timeout: Duration,
) -> (StateServer, Arc<dyn StateStore>, WorkspaceId) {
    let (store, ws, mut config) = leased(Duration::from_secs(60), max_body).await;
    config.header_read_timeout = header_read_timeout;
    let server = StateServer::start(config).await.unwrap();
    (server, store, ws)
}

/// Sends `head` (and nothing more) on a new connection; the status line of the answer, if one
/// comes within two seconds.
async fn status_line(addr: &str, head: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().map(str::to_owned)
}

fn host(server: &StateServer) -> String {
    server
        .endpoint()
        .address
        .trim_start_matches("http://")
        .trim_end_matches("/state")
        .to_owned()
}

#[tokio::test]
async fn an_unauthenticated_request_is_answered_without_its_body_being_read() {
    let (server, store, ws) = serving(MAX_STATE_BYTES).await;
    // A gigabyte announced and never sent: a server that read it first would wait forever.
    let answer = status_line(
        &host(&server),
        "POST /state HTTP/1.1\r\nhost: x\r\ncontent-length: 1073741824\r\n\r\n{",
    )
    .await;
    assert_eq!(answer.as_deref(), Some("HTTP/1.1 401 Unauthorized"));
    assert!(store.versions(&ws).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_body_over_the_cap_is_refused_before_it_is_read() {
    let (server, store, ws) = serving(1024).await;
    let auth = base64::engine::general_purpose::STANDARD.encode("terrace:pw");
    let answer = status_line(
        &host(&server),
        &format!(
            "POST /state HTTP/1.1\r\nhost: x\r\nauthorization: Basic {auth}\r\ncontent-length: 4096\r\n\r\n{{"
        ),
    )
    .await;
    assert_eq!(answer.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
    assert!(store.versions(&ws).await.unwrap().is_empty());
}

#[tokio::test]
async fn connections_beyond_the_bound_wait_until_one_closes() {
    use tokio::io::AsyncWriteExt;
    let (server, _, _) = serving(MAX_STATE_BYTES).await;
    let addr = host(&server);
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        conn.write_all(b"GET /state HTTP/1.1\r\n").await.unwrap(); // never finished
        idle.push(conn);
    }
    let probe = "GET /state HTTP/1.1\r\nhost: x\r\n\r\n";
    assert_eq!(
        status_line(&addr, probe).await,
        None,
        "not served past the bound"
    );
    idle.truncate(MAX_CONNECTIONS - 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        status_line(&addr, probe).await.as_deref(),
        Some("HTTP/1.1 401 Unauthorized"),
        "served once a connection closed"
    );
}

#[tokio::test]
async fn connections_that_never_send_a_request_are_closed_and_give_their_place_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, _, _) = serving_with(MAX_STATE_BYTES, Duration::from_millis(300)).await;
    let addr = host(&server);
    let mut stalled = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        conn.write_all(b"GET /state HTTP/1.1\r\n").await.unwrap(); // never finished
        stalled.push(conn);
    }
    // Closed by the server once the head is late: each read ends (EOF or an error answer).
    for conn in &mut stalled {
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut buf))
            .await
            .expect("the server closed the stalled connection")
            .ok();
    }
    // Their places are free again, with every stalled socket still open on this side.
    let probe = "GET /state HTTP/1.1\r\nhost: x\r\n\r\n";
    assert_eq!(
        status_line(&addr, probe).await.as_deref(),
        Some("HTTP/1.1 401 Unauthorized")
    );
    drop(stalled);
}

/// A memory bucket whose next state version write lands and then loses its answer: the call
/// fails (a reset after the request was sent), or, with `stall`, never returns.
#[derive(Clone, Debug, Default)]
struct LosesAnswers {
    inner: state_backends::memory::MemoryBucket,
    lose: Arc<std::sync::atomic::AtomicBool>,
    stall: bool,
}

#[async_trait::async_trait]
impl state_backends::objects::Bucket for LosesAnswers {
    fn backend(&self) -> &'static str {
        "loses-answers"
    }
    async fn get(
        &self,
        key: &str,
    ) -> state_backends::Result<Option<state_backends::objects::Object>> {
        self.inner.get(key).await
    }
    async fn head(
        &self,
        key: &str,
    ) -> state_backends::Result<Option<std::collections::HashMap<String, String>>> {
        self.inner.head(key).await
    }
    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: std::collections::HashMap<String, String>,
        condition: state_backends::objects::Condition<'_>,
    ) -> state_backends::Result<Option<Option<String>>> {
        let lose = key.contains("/versions/")
            && self.lose.swap(false, std::sync::atomic::Ordering::SeqCst);
        let put = self
            .inner
            .put_tagged(key, data, metadata, condition)
            .await?;
        if !lose {
            return Ok(put);
        }
        if self.stall {
            std::future::pending::<()>().await;
        }
        Err(StoreError::Backend {
            backend: "loses-answers",
            message: format!("PUT {key}: connection reset after the request was sent"),
            retryable: true,
            source: None,
        })
    }
    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<std::collections::HashMap<String, String>>,
    ) -> state_backends::Result<()> {
        self.inner.copy(from, to, metadata).await
    }
    async fn delete(&self, key: &str) -> state_backends::Result<()> {
        self.inner.delete(key).await
    }
    async fn clear_if(&self, key: &str, tag: &str) -> state_backends::Result<()> {
        self.inner.clear_if(key, tag).await
    }
    async fn list(
        &self,
        prefix: &str,
    ) -> state_backends::Result<Vec<state_backends::objects::Listed>> {
        self.inner.list(prefix).await
    }
    async fn folders(&self, prefix: &str) -> state_backends::Result<Vec<String>> {
        self.inner.folders(prefix).await
    }
}

/// A fixture over a bucket store holding version 1 (serial 1, written through the server),
/// whose next version write loses its answer.
async fn losing(stall: bool) -> Fixture {
    let bucket = LosesAnswers {
        stall,
        ..LosesAnswers::default()
    };
    let store = state_backends::objects::BucketStore::over(bucket.clone(), "p", None);
    let (store, ws, config) =
        leased_in(Arc::new(store), Duration::from_secs(60), MAX_STATE_BYTES).await;
    let shared = shared(config);
    let f = Fixture { shared, store, ws };
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 1)).await.0,
        StatusCode::OK
    );
    bucket.lose.store(true, std::sync::atomic::Ordering::SeqCst);
    f
}

/// A state write that landed but whose answer was lost is answered 503; terraform sends the
/// same POST again, and it is this job's version: answered 200, counted in the job's versions,
/// and nothing written twice. Before, the second POST found the state current ("unchanged")
/// and the job's result left the version out (and a rollback thought nothing changed).
#[tokio::test]
async fn a_write_whose_answer_was_lost_sent_again_is_counted_as_the_jobs_version() {
    let f = losing(false).await;
    let (status, _) = send(&f, "POST", "/state", empty_state("l", 2)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, body) = send(&f, "POST", "/state", empty_state("l", 2)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let versions = f.store.versions(&f.ws).await.unwrap();
    assert_eq!(
        versions.iter().map(|v| v.serial).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let activity = f.shared.activity.lock().unwrap().clone();
    assert_eq!(activity.versions, vec![1, 2]);
    assert!(activity.refused.is_empty(), "{:?}", activity.refused);
    // And the next write follows it.
    assert_eq!(
        send(&f, "POST", "/state", empty_state("l", 3)).await.0,
        StatusCode::OK
    );
    assert_eq!(f.shared.activity.lock().unwrap().versions, vec![1, 2, 3]);
}

/// A state write whose request is dropped while it is out (terraform killed) leaves no view
/// of the state before it: the next GET (a clean-up's terraform) reads what the store holds,
/// and the job's activity counts the version once the server stops.
#[tokio::test]
async fn a_write_dropped_while_out_leaves_no_stale_view_and_is_counted_if_it_landed() {
    let f = losing(true).await;
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        send(&f, "POST", "/state", empty_state("l", 2)),
    )
    .await;
    assert!(dropped.is_err(), "the request was dropped");
    let (status, body) = send(&f, "GET", "/state", Body::empty()).await;
    assert_eq!(
        (status, body.as_bytes()),
        (StatusCode::OK, &empty_state("l", 2)[..])
    );
    assert_eq!(f.shared.activity.lock().unwrap().versions, vec![1, 2]);
}
