//! What each fuzz target checks, as plain functions of the fuzzer's bytes. `fuzz/` (cargo-fuzz,
//! nightly, libFuzzer) calls them with generated inputs; `tests/corpus.rs` replays the checked-in
//! corpus (`fuzz/corpus/<target>/`) through them on stable, so every input that once found
//! something stays a test. Each panics when what it checks does not hold.
//!
//! - [`job`]: a job document, parsed and validated against the repository's templates.
//! - [`tfstate`]: two states, parsed, checked as successors, and a serial raised.
//! - [`state_server`]: up to four requests to a state server of its own over TCP; the
//!   workspace's history must stay a chain of valid states whatever arrives.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use state_backends::memory::MemoryStore;
use state_backends::tfstate::{StateMeta, WriteCheck, check_successor, with_serial_at_least};
use state_backends::{LeaseRequest, StateStore, WorkspaceId};

/// Where the template a job names is: the repository's demo template, or the test templates.
fn templates(raw: &shared::job::RawJob) -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let name = raw.0.get("template").and_then(|t| t.get("name"));
    if name.and_then(|n| n.as_str()) == Some("demo") {
        here.join("../../templates")
    } else {
        here.join("../templates")
    }
}

/// A job document (YAML or JSON): parsing and validation never panic; a valid job names a
/// workspace the stores accept; an invalid one says why, and never quotes the demo template's
/// secret (`admin_password`, given a canary value the input cannot otherwise contain).
pub fn job(data: &[u8]) {
    const CANARY: &str = "canary-5f1d0c-admin-password";
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut raw) = shared::job::RawJob::parse(text) else {
        return;
    };
    let secret = match raw.0.get_mut("variables").and_then(|v| v.as_object_mut()) {
        Some(vars) if vars.contains_key("admin_password") && !text.contains(CANARY) => {
            vars.insert("admin_password".into(), CANARY.into());
            true
        }
        _ => false,
    };
    match shared::job::validate::validate(&raw, &templates(&raw)) {
        Ok(job) => {
            WorkspaceId::new(&job.job.tenant, &job.job.workspace)
                .expect("a valid job's workspace is one every store accepts");
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "an invalid job says why");
            for e in errors.iter().filter(|_| secret) {
                assert!(
                    !e.to_string().contains(CANARY) && !e.field.contains(CANARY),
                    "a sensitive value quoted: {e}"
                );
            }
        }
    }
}

/// Two states (the input split at its first NUL): parsing never panics; a state is its own
/// unchanged successor; a serial raised keeps the lineage, reaches the floor and succeeds the
/// state; of two states, at most one direction is a successor with a new version.
pub fn tfstate(data: &[u8]) {
    let (a, b) = match data.iter().position(|&x| x == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &data[..0]),
    };
    let _ = StateMeta::parse_stored(a);
    let Ok(meta_a) = StateMeta::parse(a) else {
        return;
    };
    assert!(
        matches!(
            check_successor(Some((&meta_a, a)), &meta_a, a),
            Ok(WriteCheck::Unchanged)
        ),
        "a state is its own unchanged successor"
    );
    let floor = meta_a
        .serial
        .saturating_add(u64::from(b.first().copied().unwrap_or(1)));
    if let Ok(raised) = with_serial_at_least(a, floor) {
        let meta = StateMeta::parse(&raised).expect("a raised state still parses");
        assert!(meta.serial >= floor);
        assert_eq!(meta.lineage, meta_a.lineage);
        // At u64::MAX the floor cannot rise above the serial: nothing to succeed then.
        if meta.serial > meta_a.serial {
            assert!(
                matches!(
                    check_successor(Some((&meta_a, a)), &meta, &raised),
                    Ok(WriteCheck::Accept)
                ),
                "a raised serial is a successor"
            );
        }
    }
    if let Ok(meta_b) = StateMeta::parse(b) {
        let forward = check_successor(Some((&meta_a, a)), &meta_b, b);
        let backward = check_successor(Some((&meta_b, b)), &meta_a, a);
        assert!(
            !(matches!(forward, Ok(WriteCheck::Accept))
                && matches!(backward, Ok(WriteCheck::Accept))),
            "two states cannot each succeed the other"
        );
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// A state server of its own for one input: a workspace leased to it in a new in-memory store,
/// so no input's lock or writes carry over to the next.
async fn serve() -> (
    shared::run::state_server::StateServer,
    Arc<dyn StateStore>,
    WorkspaceId,
) {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let ws = WorkspaceId::new("fuzz", "ws").expect("a workspace");
    let lease = store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "fuzz".into(),
                ttl: Duration::from_secs(3600),
                info: serde_json::Value::Null,
            },
        )
        .await
        .expect("the lease");
    let server = shared::run::state_server::StateServer::start(shared::run::state_server::Config {
        store: store.clone(),
        ws: ws.clone(),
        fence: shared::run::vouched::Vouched::unvouched(
            lease.fence(),
            tokio_util::sync::CancellationToken::new(),
        ),
        password: "fuzz-password".into(),
        logger: None,
        max_body: 1 << 20,
        header_read_timeout: Duration::from_millis(500),
    })
    .await
    .expect("the state server starts");
    (server, store, ws)
}

fn basic(credentials: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(credentials)
    )
}

/// The bytes of one request. A first byte with the high bit set: the rest is sent as it is
/// (raw HTTP). Otherwise its low 5 bits pick the method (`GET`, `POST`, `LOCK`, `UNLOCK`,
/// `DELETE`, `PUT`), 0x40 leaves the credentials out, 0x20 names the lock (`?ID=fuzz`), and
/// the rest is the body.
fn request(part: &[u8], host: &str, authorization: &str) -> Vec<u8> {
    match part.split_first() {
        Some((&first, rest)) if first & 0x80 == 0 => {
            let methods = ["GET", "POST", "LOCK", "UNLOCK", "DELETE", "PUT"];
            let method = methods[usize::from(first & 0x1f) % methods.len()];
            let auth = if first & 0x40 == 0 {
                format!("Authorization: {authorization}\r\n")
            } else {
                String::new()
            };
            let query = if first & 0x20 == 0 { "" } else { "?ID=fuzz" };
            let mut request = format!(
                "{method} /state{query} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
                rest.len()
            )
            .into_bytes();
            request.extend_from_slice(rest);
            request
        }
        Some((_, rest)) => rest.to_vec(),
        None => Vec::new(),
    }
}

/// Up to four requests (the input split at 0xFF bytes) to a state server of its own, one
/// connection each, so a lock can be followed by a write. Whatever arrives, the server answers
/// with HTTP or closes within 5 s, and the workspace's history stays a chain: every version a
/// valid state, and between two deletions (which take a number each) one lineage with serials
/// growing.
pub fn state_server(data: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    runtime().block_on(async {
        let (server, store, ws) = serve().await;
        let endpoint = server.endpoint().clone();
        let host = endpoint
            .address
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let authorization = basic(&format!("{}:{}", endpoint.username, endpoint.password));
        for part in data.split(|&b| b == 0xFF).take(4) {
            let bytes = request(part, &host, &authorization);
            if bytes.is_empty() {
                continue;
            }
            let Ok(mut conn) = tokio::net::TcpStream::connect(&host).await else {
                continue;
            };
            let _ = conn.write_all(&bytes).await;
            // Raw bytes need not ask to close: say it is all, rather than wait for the
            // server's idle timeout (a structured request says `Connection: close`).
            if part.first().is_some_and(|&b| b & 0x80 != 0) {
                let _ = conn.shutdown().await;
            }
            let mut answer = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut answer));
            assert!(read.await.is_ok(), "the server answers or closes in time");
            if !answer.is_empty() {
                assert!(answer.starts_with(b"HTTP/1."), "an HTTP answer");
            }
        }
        let versions = store.versions(&ws).await.expect("the history reads");
        let mut previous: Option<(u64, StateMeta)> = None;
        for v in versions {
            let data = store.version(&ws, v.number).await.expect("a version reads");
            let meta = StateMeta::parse(&data).expect("every stored version is a valid state");
            if let Some((number, p)) = &previous
                && *number + 1 == v.number
            {
                assert_eq!(meta.lineage, p.lineage, "one lineage until a deletion");
                assert!(meta.serial > p.serial, "serials grow");
            }
            previous = Some((v.number, meta));
        }
        drop(server);
    });
}
