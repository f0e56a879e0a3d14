//! Time per request of the state server on the `fs` store, over real HTTP on loopback:
//! GET, POST (a validated, fenced, versioned write of a ~30 KB state), LOCK and UNLOCK.
//! Prints p50 / p95 / p99 per operation. Run: `cargo bench -p shared --bench state_server`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use shared::run::state_server::{Config, StateServer};
use state_backends::fs::FsStore;
use state_backends::{LeaseRequest, StateStore, WorkspaceId};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const ROUNDS: usize = 500;

/// A state of `resources` resources, about 600 bytes each.
fn state(serial: u64, resources: usize) -> Vec<u8> {
    let resources: Vec<serde_json::Value> = (0..resources)
        .map(|i| {
            serde_json::json!({
                "mode": "managed", "type": "testcloud_cluster", "name": format!("c{i}"),
                "provider": "provider[\"registry.terraform.io/terrace/testcloud\"]",
                "instances": [{ "schema_version": 0, "attributes": {
                    "id": format!("cls-{i:08x}"), "name": format!("cluster-{i}"), "region": "eu-west-1",
                    "node_count": 3, "instance_type": "small", "network_id": "net-0000beef",
                    "endpoint": format!("https://cluster-{i}.eu-west-1.testcloud.local")
                }, "sensitive_attributes": [], "private": "bnVsbA==" }]
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "version": 4, "terraform_version": "1.9.0", "serial": serial,
        "lineage": "3f1d2c4b-bench", "outputs": {}, "resources": resources
    }))
    .unwrap()
}

struct Client {
    reader: BufReader<TcpStream>,
    auth: String,
    path: String,
}

impl Client {
    async fn request(&mut self, method: &str, body: &[u8]) -> u16 {
        let head = format!(
            "{method} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {}\r\nContent-Length: {}\r\n\r\n",
            self.path,
            self.auth,
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).await.unwrap();
        let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut length = 0;
        loop {
            line.clear();
            self.reader.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).await.unwrap();
        status
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn StateStore> = Arc::new(FsStore::new(dir.path()));
    let ws = WorkspaceId::new("bench", "ws").unwrap();
    let lease = store
        .acquire_lease(
            &ws,
            &LeaseRequest {
                owner: "bench".into(),
                ttl: Duration::from_secs(3600),
                info: serde_json::Value::Null,
            },
        )
        .await
        .unwrap();
    let server = StateServer::start(Config {
        store,
        ws,
        fence: shared::run::vouched::Vouched::unvouched(
            lease.fence(),
            tokio_util::sync::CancellationToken::new(),
        ),
        password: shared::run::state_server::random_secret(),
        logger: None,
        max_body: shared::run::state_server::MAX_STATE_BYTES,
        header_read_timeout: shared::run::state_server::HEADER_READ_TIMEOUT,
    })
    .await
    .unwrap();
    let ep = server.endpoint().clone();
    let url = ep.address.strip_prefix("http://").unwrap();
    let (addr, path) = url.split_once('/').unwrap();
    // Like Go's HTTP client (terraform's), no Nagle delay between a request's head and body.
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut client = Client {
        reader: BufReader::new(stream),
        auth: base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", ep.username, ep.password)),
        path: format!("/{path}"),
    };
    let size = state(1, 50).len();
    let mut times: Vec<(&str, Vec<Duration>)> = vec![
        ("GET", vec![]),
        ("POST", vec![]),
        ("LOCK", vec![]),
        ("UNLOCK", vec![]),
    ];
    for round in 0..ROUNDS {
        let lock =
            format!(r#"{{"ID":"lock-{round}","Operation":"OperationTypeApply","Who":"bench"}}"#);
        let body = state(round as u64 + 1, 50);
        for (op, samples) in &mut times {
            let payload: &[u8] = match *op {
                "POST" => &body,
                "LOCK" | "UNLOCK" => lock.as_bytes(),
                _ => b"",
            };
            // LOCK before POST in real use; the order here only matters for the lock ID check.
            let started = Instant::now();
            let status = client.request(op, payload).await;
            samples.push(started.elapsed());
            assert!(
                status == 200 || (status == 204 && *op == "GET"),
                "{op} -> {status}"
            );
        }
    }
    println!(
        "state server on the fs store, {ROUNDS} rounds, state of {size} bytes, keep-alive HTTP/1.1 on loopback"
    );
    println!("{:<8} {:>10} {:>10} {:>10}", "request", "p50", "p95", "p99");
    for (op, mut samples) in times {
        samples.sort();
        println!(
            "{op:<8} {:>10.3?} {:>10.3?} {:>10.3?}",
            percentile(&samples, 0.5),
            percentile(&samples, 0.95),
            percentile(&samples, 0.99)
        );
    }
    server.shutdown().await;
}
