//! What sealing a state costs (`SealedStore` with a key file over the in-memory store): a
//! `put` (a fresh data key, wrapped, and AES-256-GCM over the state) and a `current` (unwrap
//! and decrypt), against the same store unsealed, for states of about 6 KB, 600 KB and 6 MB.
//! Prints the median and p99 per operation. Run: `cargo bench -p state-backends --bench sealing`.
//! (A KMS key adds one GenerateDataKey call per write and one Decrypt per read; KMS's own
//! latency is not measured here.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use state_backends::memory::MemoryStore;
use state_backends::sealed::{KeyFile, Keyring, SealedStore};
use state_backends::{NewState, PutMode, StateStore, WorkspaceId};

/// A state of `resources` resources, about 600 bytes each.
fn state(serial: u64, resources: usize) -> bytes::Bytes {
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
    bytes::Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "version": 4, "terraform_version": "1.11.4", "serial": serial,
            "lineage": "3f1d2c4b-bench", "outputs": {}, "resources": resources
        }))
        .unwrap(),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn measure(
    store: &dyn StateStore,
    resources: usize,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let ws = WorkspaceId::new("bench", &format!("w{resources}")).unwrap();
    let (mut puts, mut reads) = (Vec::new(), Vec::new());
    for serial in 1..=rounds as u64 {
        let mode = match store.current(&ws).await.unwrap() {
            Some(c) => PutMode::Update(c.token),
            None => PutMode::Create,
        };
        let new = NewState::parse(state(serial, resources)).unwrap();
        let t = Instant::now();
        store.put(&ws, new, mode, None).await.unwrap();
        puts.push(t.elapsed());
        let t = Instant::now();
        store.current(&ws).await.unwrap().unwrap();
        reads.push(t.elapsed());
    }
    puts.sort();
    reads.sort();
    (puts, reads)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let key = Arc::new(KeyFile::from_bytes(&[7; 32]));
    println!(
        "{:<10} {:>10} {:>14} {:>14} {:>14} {:>14}",
        "state", "bytes", "put plain", "put sealed", "read plain", "read sealed"
    );
    for (resources, rounds) in [(10, 400), (1_000, 100), (10_000, 20)] {
        let bytes = state(1, resources).len();
        let plain: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
        let sealed = SealedStore::wrap(
            Arc::new(MemoryStore::new()),
            Some(Keyring::new(key.clone())),
        );
        let (pp, pr) = measure(&*plain, resources, rounds).await;
        let (sp, sr) = measure(&*sealed, resources, rounds).await;
        let cell = |d: &[Duration]| {
            format!(
                "{:.2}/{:.2} ms",
                percentile(d, 0.5).as_secs_f64() * 1e3,
                percentile(d, 0.99).as_secs_f64() * 1e3
            )
        };
        println!(
            "{:<10} {:>10} {:>14} {:>14} {:>14} {:>14}",
            format!("{resources} res"),
            bytes,
            cell(&pp),
            cell(&sp),
            cell(&pr),
            cell(&sr)
        );
    }
    println!(
        "(median/p99 per operation, {} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}
