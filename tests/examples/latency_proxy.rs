//! A store's latency on loopback: the tests' fault proxy, with no fault drawn, holding every
//! request for a fixed delay before it reaches the emulator, and logging each one. A cloud store
//! in the same region answers in some 10-30 ms; an emulator in about 1 ms, which hides how many
//! requests a job waits on one after the other.
//!
//! `latency_proxy UPSTREAM aws|gcs|azure DELAY_MS LOG_FILE` prints `http://127.0.0.1:PORT` on
//! its first line and serves until killed. Every answered request is a JSON line in LOG_FILE
//! (see `FaultProxy::log_to`). Used by `benches/store-latency.sh`.

use std::time::Duration;

use tests::fault_proxy::{Cloud, FaultProxy};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [upstream, cloud, delay, log] = args.as_slice() else {
        eprintln!("usage: latency_proxy UPSTREAM aws|gcs|azure DELAY_MS LOG_FILE");
        std::process::exit(64);
    };
    let cloud = match cloud.as_str() {
        "aws" => Cloud::Aws,
        "gcs" => Cloud::Gcs,
        "azure" => Cloud::Azure,
        other => {
            eprintln!("latency_proxy: {other:?} is not aws, gcs or azure");
            std::process::exit(64);
        }
    };
    let Ok(delay) = delay.parse::<u64>() else {
        eprintln!("latency_proxy: DELAY_MS {delay:?} is not a whole number of milliseconds");
        std::process::exit(64);
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| {
            eprintln!("latency_proxy: cannot open {log}: {e}");
            std::process::exit(73);
        });
    let proxy = FaultProxy::start(upstream, cloud, 0.0, 0).await;
    proxy.slow(Some(Box::new(|_, _, _| true)), Duration::from_millis(delay));
    proxy.log_to(log);
    println!("{}", proxy.url());
    std::future::pending::<()>().await;
}
