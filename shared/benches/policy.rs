//! What holding a plan to policies costs: the input made (terraform's plan JSON, masked), then
//! the repository's example policies (`policies/examples`, 6 files) evaluated on it, in-process
//! and, with `TERRACE_BIN` naming a `terrace` binary, in the bounded child process the runner
//! uses. Plans of 10, 1,000 and 5,000 resource changes. Prints p50 and max per size.
//! Run: `make bench-policy` (or `cargo bench -p shared --bench policy`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shared::job::redact::Redactor;
use shared::run::policy::input::{Facts, of_plan};
use shared::run::policy::{Bounds, Policies, PolicySet, evaluate_here};

/// A plan of `n` resource changes across the three clouds' bucket types, tagged, with one
/// sensitive attribute each.
fn plan(n: usize) -> String {
    let tags = json!({"owner": "ops", "cost-center": "42"});
    let changes: Vec<Value> = (0..n)
        .map(|i| {
            let (kind, after) = match i % 3 {
                0 => ("aws_s3_bucket", json!({"bucket": format!("b{i}"), "tags": tags, "secret": "k"})),
                1 => ("google_storage_bucket", json!({"name": format!("b{i}"), "labels": tags, "public_access_prevention": "enforced", "secret": "k"})),
                _ => ("azurerm_storage_account", json!({"name": format!("b{i}"), "tags": tags, "allow_nested_items_to_be_public": false, "secret": "k"})),
            };
            json!({
                "address": format!("{kind}.r{i}"), "type": kind, "name": format!("r{i}"),
                "change": {"actions": ["create"], "before": null, "after": after,
                           "after_sensitive": {"secret": true}, "before_sensitive": false}
            })
        })
        .collect();
    json!({
        "format_version": "1.2",
        "variables": {"password": {"value": "hunter2"}},
        "configuration": {"root_module": {"variables": {"password": {"sensitive": true}}}},
        "resource_changes": changes,
    })
    .to_string()
}

fn report(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what:<44} p50 {:>8.2} ms   max {:>8.2} ms",
        ms(times[times.len() / 2]),
        ms(*times.last().expect("timed"))
    );
}

#[tokio::main]
async fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/examples");
    let set = PolicySet::load(&dir).expect("the example policies parse");
    let child = std::env::var_os("TERRACE_BIN").map(|bin| Policies {
        set: set.clone(),
        bounds: Bounds::default(),
        evaluator: Some(bin.into()),
    });
    let redactor = Redactor::new(["hunter2".to_owned()]);
    for (n, rounds) in [(10, 50), (1_000, 20), (5_000, 5)] {
        let raw = plan(n);
        let facts = Facts {
            job_id: "bench",
            tenant: "acme",
            workspace: "bench",
            operation: shared::job::Operation::Apply,
            template: "bench@1".into(),
            cost: None,
        };
        let mut made = Vec::new();
        let mut input = Value::Null;
        for _ in 0..rounds {
            let started = Instant::now();
            input = of_plan(&raw, &facts, &redactor).expect("the input");
            made.push(started.elapsed());
        }
        let text = input.to_string();
        println!("{n} resource changes: plan JSON {} KB", raw.len() / 1024);
        report("  input made (masked, redacted)", made);
        let mut here = Vec::new();
        for _ in 0..rounds {
            let started = Instant::now();
            let v = evaluate_here(&set.files, &set.digest, &text, Duration::from_secs(60))
                .expect("evaluated");
            assert!(v.deny.is_empty(), "a clean plan: {v:?}");
            here.push(started.elapsed());
        }
        report("  6 example policies, in-process", here);
        if let Some(child) = &child {
            let mut there = Vec::new();
            for _ in 0..rounds {
                let started = Instant::now();
                child.evaluate(&input).await.expect("evaluated");
                there.push(started.elapsed());
            }
            report("  the same in the bounded child process", there);
        }
    }
}
