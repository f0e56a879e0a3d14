//! The sweeps as every function runs them ([`crate::host::sweep`]), over the fake trigger.

use std::collections::BTreeSet;

use time::OffsetDateTime;

use super::*;
use crate::host::sweep::sweep;
use crate::sweeps::report::SweepKind;

fn targets(buckets: &[&str]) -> Vec<(Bucket, BTreeSet<String>)> {
    buckets
        .iter()
        .map(|b| {
            let target = Bucket {
                bucket: (*b).to_owned(),
                key: None,
            };
            (target, BTreeSet::from(["acme".to_owned()]))
        })
        .collect()
}

/// A workspace of `acme` whose last apply (`j1`) a drift check can repeat.
async fn applied(store: &MemoryStore, name: &str) {
    let ws = WorkspaceId::new("acme", name).unwrap();
    let record = json!({
        "id": "j1", "tenant": "acme", "workspace": name, "operation": "apply",
        "template": { "name": "demo", "version": "1.0.0" },
        "variables": { "cluster_name": name }, "timeout": 600,
    });
    store
        .put_artifact(
            &ws,
            "j1",
            crate::run::records::JOB_FILE,
            Bytes::from(record.to_string()),
        )
        .await
        .unwrap();
    crate::run::records::record_last_apply(store, &ws, "j1")
        .await
        .unwrap();
    let state =
        state_backends::NewState::parse(state_backends::tfstate::empty_state("sweep", 1)).unwrap();
    store
        .put(&ws, state, state_backends::PutMode::Create, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_backup_sweep_reports_each_bucket_and_one_it_cannot_reach_fails_the_sweep() {
    let fake = Fake::new();
    applied(&fake.store, "net").await;
    let report = sweep(
        &fake,
        SweepKind::Backup,
        &targets(&["b1"]),
        OffsetDateTime::now_utc(),
    )
    .await;
    assert_eq!(report.sweep, SweepKind::Backup);
    let bucket = &report.buckets[0];
    assert_eq!(bucket.bucket, "b1");
    assert_eq!(
        bucket.backup.as_ref().map(|b| b.backed_up),
        Some(1),
        "{report:?}"
    );
    assert!(!report.failed());

    let mut unreachable = Fake::new();
    unreachable.store_fails = true;
    let report = sweep(
        &unreachable,
        SweepKind::Backup,
        &targets(&["b1", "b2"]),
        OffsetDateTime::now_utc(),
    )
    .await;
    assert_eq!(
        report.buckets.len(),
        2,
        "one bucket's trouble stops no other"
    );
    assert_eq!(
        report.buckets[1].error.as_deref(),
        Some("the role cannot be assumed now")
    );
    assert!(report.failed());
}

#[tokio::test]
async fn a_drift_sweep_queues_a_check_per_workspace_and_names_each_it_could_not_queue() {
    let fake = Fake::new();
    for name in ["net", "db"] {
        applied(&fake.store, name).await;
    }
    let report = sweep(
        &fake,
        SweepKind::Drift,
        &targets(&["b1"]),
        OffsetDateTime::now_utc(),
    )
    .await;
    assert_eq!(
        report.buckets[0].drift.as_ref().map(|d| d.queued),
        Some(2),
        "{report:?}"
    );
    let queued: Vec<Value> = fake.requeued().into_iter().map(|(body, _)| body).collect();
    assert_eq!(queued.len(), 2);
    assert!(
        queued
            .iter()
            .all(|m| m["job"]["operation"] == "drift-check" && m.get("target").is_none()),
        "a check names its tenant, never a target: {queued:?}"
    );

    let mut refusing = Fake::new();
    refusing.requeue_fails = true;
    applied(&refusing.store, "net").await;
    let report = sweep(
        &refusing,
        SweepKind::Drift,
        &targets(&["b1"]),
        OffsetDateTime::now_utc(),
    )
    .await;
    let bucket = &report.buckets[0];
    assert_eq!(bucket.drift.as_ref().map(|d| d.queued), Some(0));
    assert_eq!(bucket.failed.len(), 1);
    assert_eq!(bucket.failed[0].workspace, "acme/net");
    assert_eq!(bucket.failed[0].error, "the queue refused it");
    assert!(report.failed());
}
