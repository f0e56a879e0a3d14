//! The backup sweep over 10, 1,000 and 10,000 workspaces with 1 % changed (at least one), on
//! each object-store emulator: store calls, SDK requests (S3) and time of a sweep after the
//! changes, to show its cost follows the changed workspaces, not the total.
//!
//! `make bench-sweep` (the emulators started by `scripts/with-emulators.sh`). Knobs:
//! `TERRACE_SWEEP_SIZES` (default `10,1000,10000`), `TERRACE_SWEEP_STORES` (default
//! `s3,gcs,azure`).

use state_backends::s3::{LeaseMode, S3Config, S3Store};
use tests::sweep::{CALLS_PER_CHANGED, Figures, copies_only_what_changed};
use tests::{aws, azure, gcs};

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes: Vec<usize> = list("TERRACE_SWEEP_SIZES", "10,1000,10000")
        .iter()
        .map(|s| {
            s.parse()
                .expect("TERRACE_SWEEP_SIZES: numbers, e.g. 10,1000")
        })
        .collect();
    let stores = list("TERRACE_SWEEP_STORES", "s3,gcs,azure");
    let mut rows: Vec<(String, Figures)> = Vec::new();
    for store in &stores {
        for &total in &sizes {
            let figures = match store.as_str() {
                "s3" => {
                    let counter = aws::CallCounter::default();
                    let config = S3Config {
                        bucket: aws::bucket().await,
                        prefix: "states".into(),
                        lease: LeaseMode::LockObject,
                        kms_key_id: None,
                    };
                    let s3 = S3Store::new(aws::s3_counted(&counter).await, None, config).unwrap();
                    copies_only_what_changed(s3, "S3", total, 100, Some(&counter)).await
                }
                "gcs" => {
                    let gcs = gcs::store(&gcs::bucket().await, "states").await;
                    copies_only_what_changed(gcs, "GCS", total, 100, None).await
                }
                "azure" => {
                    let azure = azure::store(&azure::container().await, "states");
                    copies_only_what_changed(azure, "Azure", total, 100, None).await
                }
                other => panic!("TERRACE_SWEEP_STORES: unknown store {other:?} (s3, gcs, azure)"),
            };
            rows.push((store.clone(), figures));
        }
    }
    println!();
    println!(
        "| store | workspaces | changed | calls | per changed | S3 requests | sweep after the changes | first sweep (all new) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (store, f) in rows {
        println!(
            "| {store} | {} | {} | {} | {:.1} | {} | {:.0} ms | {:.1} s |",
            f.total,
            f.changed,
            f.calls,
            (f.calls.saturating_sub(1)) as f64 / f.changed as f64,
            f.requests.map_or("—".to_owned(), |r| r.to_string()),
            f.second.as_secs_f64() * 1000.0,
            f.first.as_secs_f64(),
        );
    }
    println!("\n(calls: the listing, then at most {CALLS_PER_CHANGED} per changed workspace)");
}
