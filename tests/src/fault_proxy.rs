//! A fault-injecting HTTP proxy between a runner and an emulator: real HTTP on loopback, every
//! request forwarded to the emulator unless a fault is drawn for it. At a set rate it delays a
//! request, resets the connection before or after the emulator saw the request (the second is
//! the hard case: the change landed but its answer was lost), answers 500 or 503, or throttles
//! in the cloud's own words (S3 `SlowDown`, DynamoDB `ThrottlingException`, GCS 429, Azure
//! `ServerBusy`). [`FaultProxy::partition`] cuts the network for a while: requests hang until
//! it ends, then their connections drop.
//!
//! Faults are drawn from a seeded generator, so a run can be repeated (the order requests
//! arrive in still varies).
//!
//! [`FaultProxy::hold`] keeps one chosen request in flight for good, before or after the
//! emulator saw it, so a test can kill the runner during that store call.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// What a drawn fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwarded after a pause of 50 to 500 ms.
    Delay,
    /// The connection is dropped before the request is forwarded: nothing happened.
    ResetBefore,
    /// Forwarded, the emulator answered, then the connection is dropped: what was asked may
    /// have happened, and the client cannot know.
    ResetAfter,
    /// 500, not forwarded.
    InternalError,
    /// 503, not forwarded.
    Unavailable,
    /// The cloud's throttling answer, not forwarded.
    Throttled,
}

const KINDS: [Fault; 6] = [
    Fault::Delay,
    Fault::ResetBefore,
    Fault::ResetAfter,
    Fault::InternalError,
    Fault::Unavailable,
    Fault::Throttled,
];

/// Which cloud's words the faults are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cloud {
    /// S3 (XML) and DynamoDB (JSON, told apart by `x-amz-target`).
    Aws,
    Gcs,
    Azure,
}

/// What the proxy did.
#[derive(Debug, Default)]
pub struct Counts {
    requests: AtomicU64,
    faults: [AtomicU64; 6],
    partitioned: AtomicU64,
    /// `ResetAfter` on a write of a state version: the version landed, its answer was lost.
    lost_version_answers: AtomicU64,
}

impl Counts {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn of(&self, fault: Fault) -> u64 {
        let i = KINDS.iter().position(|k| *k == fault).expect("a kind");
        self.faults[i].load(Ordering::Relaxed)
    }

    /// Every fault, partitions included.
    pub fn faults(&self) -> u64 {
        self.faults
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.partitioned()
    }

    /// Requests dropped by a partition.
    pub fn partitioned(&self) -> u64 {
        self.partitioned.load(Ordering::Relaxed)
    }

    /// One line: every count.
    pub fn summary(&self) -> String {
        let faults: Vec<String> = KINDS
            .iter()
            .map(|k| format!("{k:?} {}", self.of(*k)))
            .collect();
        format!(
            "{} requests, {} faults ({}, partitioned {}; answers to state version writes lost {})",
            self.requests(),
            self.faults(),
            faults.join(", "),
            self.partitioned(),
            self.lost_version_answers.load(Ordering::Relaxed)
        )
    }
}

/// What [`FaultProxy::hold`] looks for.
pub type Matches = Box<dyn Fn(&hyper::Method, &str, &hyper::HeaderMap) -> bool + Send + Sync>;

/// A request to hold: the first one `matches` accepts.
struct Hold {
    matches: Matches,
    landed: bool,
    tell: tokio::sync::oneshot::Sender<String>,
}

struct Shared {
    /// `http://127.0.0.1:PORT`: the proxy itself.
    own: String,
    upstream: String,
    authority: String,
    cloud: Cloud,
    rate: f64,
    rng: Mutex<StdRng>,
    partition_until: Mutex<Option<Instant>>,
    hold: Mutex<Option<Hold>>,
    /// Requests to fault on purpose: which, how many more, and how.
    failing: Mutex<Option<(Matches, u32, Fault)>>,
    /// Requests forwarded only after a set pause, every time.
    slow: Mutex<Option<(Matches, Duration)>>,
    /// Where each request is written once answered, when set (see [`FaultProxy::log_to`]).
    log: Mutex<Option<std::fs::File>>,
    counts: Counts,
    client: Client<HttpConnector, Incoming>,
}

/// The proxy, serving until dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 in front of `upstream` (`http://HOST:PORT`), drawing a
    /// fault for `rate` of the requests (0.3: 30 %) from `seed`.
    pub async fn start(upstream: &str, cloud: Cloud, rate: f64, seed: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the proxy");
        let addr = listener.local_addr().expect("its address");
        let upstream = upstream.trim_end_matches('/').to_owned();
        let authority = upstream
            .split_once("://")
            .map_or(upstream.as_str(), |(_, rest)| rest)
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let shared = Arc::new(Shared {
            own: format!("http://{addr}"),
            upstream,
            authority,
            cloud,
            rate,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            partition_until: Mutex::new(None),
            hold: Mutex::new(None),
            failing: Mutex::new(None),
            slow: Mutex::new(None),
            log: Mutex::new(None),
            counts: Counts::default(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        });
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let shared = shared.clone();
                        async move { shared.handle(request).await }
                    });
                    // A handler's error drops the connection: that is how a reset is made.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn counts(&self) -> &Counts {
        &self.shared.counts
    }

    /// The network is cut for the next `length`: a request hangs until then, and its connection
    /// drops.
    pub fn partition(&self, length: Duration) {
        *self.shared.partition_until.lock().expect("not poisoned") = Some(Instant::now() + length);
    }

    /// The next `n` requests `matches` accepts get `fault`, whatever the rate draws.
    pub fn fail(&self, matches: Matches, n: u32, fault: Fault) {
        *self.shared.failing.lock().expect("not poisoned") = Some((matches, n, fault));
    }

    /// Every request `matches` accepts is forwarded only after `pause`, until `slow` is called
    /// again (`None`: no request).
    pub fn slow(&self, matches: Option<Matches>, pause: Duration) {
        *self.shared.slow.lock().expect("not poisoned") = matches.map(|m| (m, pause));
    }

    /// From now on, one JSON line per answered request is appended to `file`: `{"start_ms",
    /// "end_ms"` (Unix time, as floats), `"what"` (method and path, see `describe`), `"sent"`
    /// and `"received"` (the bodies' `Content-Length`, 0 when it has none)`}`. The start is
    /// the request's arrival (before any pause), the end the answer head's.
    pub fn log_to(&self, file: std::fs::File) {
        *self.shared.log.lock().expect("not poisoned") = Some(file);
    }

    /// The next request `matches` accepts (given its method, path and query, and headers) is
    /// held for good: never forwarded, or, when `landed`, forwarded and answered by the
    /// emulator but the answer never passed on. Its client waits until it gives up or dies.
    /// The receiver gets the request's method and path once it is held.
    pub fn hold(&self, matches: Matches, landed: bool) -> tokio::sync::oneshot::Receiver<String> {
        let (tell, told) = tokio::sync::oneshot::channel();
        *self.shared.hold.lock().expect("not poisoned") = Some(Hold {
            matches,
            landed,
            tell,
        });
        told
    }
}

/// A request, told briefly: its method and path, and from its query only the object's name
/// (GCS puts it there) and Azure's `restype` and `comp` (what a Blob request does); DynamoDB's
/// operation. Never a signature.
fn describe(request: &Request<Incoming>, path: &str) -> String {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let mut what = format!("{} {path}", request.method());
    let told = query
        .split('&')
        .filter(|pair| {
            ["name=", "restype=", "comp="]
                .iter()
                .any(|k| pair.starts_with(k))
        })
        .collect::<Vec<_>>();
    if !told.is_empty() {
        what = format!("{what}?{}", told.join("&"));
    }
    if let Some(target) = request
        .headers()
        .get("x-amz-target")
        .and_then(|t| t.to_str().ok())
    {
        what = format!("{what} ({})", target.rsplit('.').next().unwrap_or(target));
    }
    what
}

/// Why a connection was dropped (never seen by the client: it sees the connection close).
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped by the fault proxy")
    }
}

impl std::error::Error for Dropped {}

type Body = BoxBody<Bytes, hyper::Error>;

impl Shared {
    fn draw(&self) -> (Option<Fault>, u64) {
        let mut rng = self.rng.lock().expect("not poisoned");
        let fault =
            (rng.random::<f64>() < self.rate).then(|| KINDS[rng.random_range(0..KINDS.len())]);
        (fault, rng.random_range(50..=500))
    }

    fn count(&self, fault: Fault) {
        let i = KINDS.iter().position(|k| *k == fault).expect("a kind");
        self.counts.faults[i].fetch_add(1, Ordering::Relaxed);
    }

    async fn handle(&self, mut request: Request<Incoming>) -> Result<Response<Body>, Dropped> {
        self.counts.requests.fetch_add(1, Ordering::Relaxed);
        let arrived = unix_ms();
        let partition = *self.partition_until.lock().expect("not poisoned");
        if let Some(until) = partition.filter(|until| Instant::now() < *until) {
            // Nothing comes back while the network is cut: the request hangs until the
            // partition ends (or the client gives up), then its connection drops.
            self.counts.partitioned.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep_until(until.into()).await;
            return Err(Dropped);
        }
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let held = {
            let mut hold = self.hold.lock().expect("not poisoned");
            match &*hold {
                Some(h) if (h.matches)(request.method(), &path, request.headers()) => hold.take(),
                _ => None,
            }
        };
        let chosen = {
            let mut failing = self.failing.lock().expect("not poisoned");
            match &mut *failing {
                Some((matches, left, fault))
                    if held.is_none()
                        && *left > 0
                        && matches(request.method(), &path, request.headers()) =>
                {
                    *left -= 1;
                    Some(*fault)
                }
                _ => None,
            }
        };
        let slow = match &*self.slow.lock().expect("not poisoned") {
            Some((matches, pause)) if matches(request.method(), &path, request.headers()) => {
                Some(*pause)
            }
            _ => None,
        };
        if let Some(pause) = slow {
            tokio::time::sleep(pause).await;
        }
        let (fault, pause_ms) = match (&held, chosen) {
            (Some(_), _) => (None, 0),
            (None, Some(fault)) => (Some(fault), 50),
            (None, None) => self.draw(),
        };
        if let Some(fault) = fault {
            self.count(fault);
        }
        match fault {
            Some(Fault::ResetBefore) => return Err(Dropped),
            Some(fault @ (Fault::InternalError | Fault::Unavailable | Fault::Throttled)) => {
                return Ok(self.answer(&request, fault));
            }
            Some(Fault::Delay) => tokio::time::sleep(Duration::from_millis(pause_ms)).await,
            Some(Fault::ResetAfter) | None => {}
        }
        let what = describe(&request, &path);
        let held = match held {
            Some(hold) if !hold.landed => {
                let _ = hold.tell.send(what);
                return std::future::pending().await;
            }
            held => held,
        };
        *request.uri_mut() = format!("{}{path}", self.upstream)
            .parse()
            .expect("an upstream URI");
        request.headers_mut().insert(
            hyper::header::HOST,
            self.authority.parse().expect("a host header"),
        );
        // An Azure copy names its source by URL, which the client made from the proxy's
        // address: the emulator must find the source in itself, as a cloud does.
        if let Some(source) = request
            .headers()
            .get("x-ms-copy-source")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix(&self.own))
        {
            let source = format!("{}{source}", self.upstream);
            request.headers_mut().insert(
                "x-ms-copy-source",
                source.parse().expect("a copy source header"),
            );
        }
        let version_write =
            matches!(request.method().as_str(), "PUT" | "POST") && path.contains("versions");
        let sent = content_length(request.headers());
        let answer = self.client.request(request).await.map_err(|_| Dropped)?;
        self.note(arrived, &what, sent, content_length(answer.headers()));
        if let Some(hold) = held {
            // The emulator has done what was asked; its answer never reaches the client.
            let _ = answer.into_body().collect().await;
            let _ = hold.tell.send(what);
            return std::future::pending().await;
        }
        if fault == Some(Fault::ResetAfter) {
            if version_write {
                self.counts
                    .lost_version_answers
                    .fetch_add(1, Ordering::Relaxed);
            }
            // Read the whole answer, so the emulator is done, then lose it.
            let _ = answer.into_body().collect().await;
            return Err(Dropped);
        }
        Ok(answer.map(BodyExt::boxed))
    }

    /// One line in the request log, if there is one.
    fn note(&self, arrived: f64, what: &str, sent: u64, received: u64) {
        use std::io::Write;
        if let Some(file) = self.log.lock().expect("not poisoned").as_mut() {
            let line = serde_json::json!({
                "start_ms": arrived,
                "end_ms": unix_ms(),
                "what": what,
                "sent": sent,
                "received": received,
            });
            let _ = writeln!(file, "{line}");
        }
    }

    /// An error answer in the cloud's words, for a fault that is not forwarded.
    fn answer(&self, request: &Request<Incoming>, fault: Fault) -> Response<Body> {
        const DYNAMODB: &str = "com.amazonaws.dynamodb.v20120810#";
        let dynamodb = request.headers().contains_key("x-amz-target");
        let (status, code, message) = match fault {
            Fault::Throttled => match self.cloud {
                Cloud::Aws if dynamodb => (
                    400,
                    "ThrottlingException",
                    "Rate of requests exceeds the allowed throughput.",
                ),
                Cloud::Aws => (503, "SlowDown", "Please reduce your request rate."),
                Cloud::Gcs => (
                    429,
                    "rateLimitExceeded",
                    "The rate of change requests to the object is too high.",
                ),
                Cloud::Azure => (
                    503,
                    "ServerBusy",
                    "The server is currently unable to receive requests. Please retry your request.",
                ),
            },
            Fault::Unavailable => match self.cloud {
                Cloud::Gcs => (503, "backendError", "Backend Error"),
                _ => (
                    503,
                    "ServiceUnavailable",
                    "Service is unable to handle request.",
                ),
            },
            _ => match self.cloud {
                Cloud::Aws if dynamodb => (500, "InternalServerError", "Internal server error"),
                Cloud::Gcs => (500, "backendError", "Backend Error"),
                _ => (
                    500,
                    "InternalError",
                    "We encountered an internal error. Please try again.",
                ),
            },
        };
        let (content_type, body) = match self.cloud {
            Cloud::Aws if dynamodb => (
                "application/x-amz-json-1.0",
                serde_json::json!({ "__type": format!("{DYNAMODB}{code}"), "message": message }).to_string(),
            ),
            Cloud::Gcs => (
                "application/json",
                serde_json::json!({ "error": { "code": status, "message": message, "errors": [{ "reason": code, "message": message }] } }).to_string(),
            ),
            Cloud::Aws | Cloud::Azure => (
                "application/xml",
                format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>"),
            ),
        };
        let mut answer = Response::builder()
            .status(StatusCode::from_u16(status).expect("a status"))
            .header(hyper::header::CONTENT_TYPE, content_type);
        if self.cloud == Cloud::Azure {
            answer = answer.header("x-ms-error-code", code);
        }
        answer
            .body(
                Full::new(Bytes::from(body))
                    .map_err(|never: Infallible| match never {})
                    .boxed(),
            )
            .expect("an answer")
    }
}

/// Now, in milliseconds since the Unix epoch.
fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// A message's `Content-Length` (0 when it has none, as a chunked body).
fn content_length(headers: &hyper::HeaderMap) -> u64 {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
