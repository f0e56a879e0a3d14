//! The backup sweep: for every workspace whose state changed since its last sweep, a copy of
//! the current state as `backups/<UTC hour>` (a server-side copy on cloud stores), then
//! retention. It visits only the changed workspaces ([`StateStore::changed`]), so its cost
//! follows the changes, not the number of workspaces. Run hourly by a schedule (EventBridge,
//! Cloud Scheduler, a timer) or `terrace backup`.

pub use state_backends::retention::{Retention, to_prune};
use state_backends::{BackupInfo, StateStore, StoreError};
use time::OffsetDateTime;

use crate::sweeps::report::{BackupDone, BucketReport, WorkspaceFailure};

/// The label of a backup taken at `now`: its UTC hour, `2026-11-22T03` (sorts by time).
pub fn hour_label(now: OffsetDateTime) -> String {
    let now = now.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour()
    )
}

/// What one sweep did.
#[derive(Clone, Debug, Default)]
pub struct SweepReport {
    /// Workspaces with a change mark.
    pub changed: usize,
    /// New backups, by workspace (`tenant/workspace`).
    pub backed_up: Vec<(String, BackupInfo)>,
    /// Marked workspaces whose state needed no new backup (deleted, or the same as the last).
    pub unchanged: Vec<String>,
    /// Backups dropped by retention, by workspace.
    pub pruned: Vec<(String, String)>,
    /// Workspaces the sweep could not back up, with why; their marks stay for the next sweep.
    pub failed: Vec<(String, String)>,
}

/// How many changed workspaces a sweep handles at once: a sweep's time is round trips (on a
/// bucket, a copy and the marks' deletion per changed workspace), and one at a time a bucket
/// with thousands of changes would outlast a function's time limit.
pub const SWEEP_CONCURRENCY: usize = 16;

/// Backs up every changed workspace as of `now`, applies `keep`, and clears the marks of what
/// it handled, [`SWEEP_CONCURRENCY`] workspaces at a time (a slow one holds up no other); the
/// report lists workspaces by name.
/// One workspace's failure does not stop the others.
///
/// # Errors
/// Only when the changed workspaces cannot be listed.
pub async fn sweep(
    store: &dyn StateStore,
    now: OffsetDateTime,
    keep: Retention,
) -> Result<SweepReport, StoreError> {
    use futures::StreamExt as _;

    let label = hour_label(now);
    let changed = store.changed().await?;
    let mut report = SweepReport {
        changed: changed.len(),
        ..SweepReport::default()
    };
    let label = &label;
    let mut done = futures::stream::iter(changed)
        .map(|mark| async move {
            let made = store.back_up(&mark, label, keep).await;
            // Cleared only after its backup: a write since the listing keeps its mark for
            // next time.
            let cleared = match &made {
                Ok(_) => store.clear_changed(&mark).await,
                Err(_) => Ok(()),
            };
            (mark.ws.to_string(), made, cleared)
        })
        .buffer_unordered(SWEEP_CONCURRENCY);
    while let Some((name, made, cleared)) = done.next().await {
        match made {
            Ok(made) => {
                if let Err(e) = cleared {
                    report.failed.push((name.clone(), e.to_string()));
                }
                match made {
                    Some(made) => {
                        report
                            .pruned
                            .extend(made.pruned.into_iter().map(|l| (name.clone(), l)));
                        report.backed_up.push((name, made.backup));
                    }
                    None => report.unchanged.push(name),
                }
            }
            Err(e) => {
                tracing::warn!(workspace = %name, error = %e, "backup failed; it is retried at the next sweep");
                report.failed.push((name, e.to_string()));
            }
        }
    }
    report.backed_up.sort_by(|a, b| a.0.cmp(&b.0));
    report.unchanged.sort();
    report.pruned.sort();
    report.failed.sort();
    Ok(report)
}

/// One bucket's hourly sweep, as a function reports it: what [`sweep`] did with the default
/// retention and the expired plans it deleted ([`super::plans::sweep`]), or why it could not
/// run.
pub async fn bucket_report(
    bucket: &str,
    store: &dyn StateStore,
    now: OffsetDateTime,
) -> BucketReport {
    let (backups, plans) = tokio::join!(
        sweep(store, now, Retention::default()),
        super::plans::sweep(store, now)
    );
    let (plans_done, plans_failed) = match plans {
        Ok(p) => (p.deleted.len(), p.failed),
        Err(e) => (
            0,
            vec![(
                "(every workspace)".to_owned(),
                format!("expired plans: {e}"),
            )],
        ),
    };
    match backups {
        Ok(r) => BucketReport {
            bucket: bucket.to_owned(),
            backup: Some(BackupDone {
                changed: r.changed,
                backed_up: r.backed_up.len(),
                pruned: r.pruned.len(),
                expired_plans: plans_done,
            }),
            failed: r
                .failed
                .into_iter()
                .chain(plans_failed)
                .map(|(workspace, error)| WorkspaceFailure { workspace, error })
                .collect(),
            ..BucketReport::default()
        },
        Err(e) => BucketReport::error(bucket, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use state_backends::memory::MemoryStore;
    use state_backends::{NewState, PutMode, WorkspaceId};

    use super::*;

    #[test]
    fn labels_are_utc_hours() {
        let t = time::macros::datetime!(2026-11-22 03:59:59 +02:00);
        assert_eq!(hour_label(t), "2026-11-22T01");
    }

    fn state(serial: u64) -> NewState {
        NewState::parse(state_backends::tfstate::empty_state("l", serial)).unwrap()
    }

    #[tokio::test]
    async fn a_sweep_backs_up_only_what_changed_and_clears_its_marks() {
        let store = Arc::new(MemoryStore::default());
        let names: Vec<WorkspaceId> = (0..6)
            .map(|i| WorkspaceId::new("t", &format!("w{i}")).unwrap())
            .collect();
        for ws in &names {
            store
                .put(ws, state(1), PutMode::Create, None)
                .await
                .unwrap();
        }
        let t0 = time::macros::datetime!(2026-11-22 01:05 UTC);
        let first = sweep(&*store, t0, Retention::default()).await.unwrap();
        assert_eq!(first.backed_up.len(), 6);
        assert!(store.changed().await.unwrap().is_empty());

        for ws in &names[..2] {
            let token = store.current(ws).await.unwrap().unwrap().token;
            store
                .put(ws, state(2), PutMode::Update(token), None)
                .await
                .unwrap();
        }
        let second = sweep(&*store, t0 + time::Duration::hours(1), Retention::default())
            .await
            .unwrap();
        assert_eq!(second.changed, 2);
        let backed: Vec<&str> = second.backed_up.iter().map(|(w, _)| w.as_str()).collect();
        assert_eq!(backed, ["t/w0", "t/w1"]);
        assert_eq!(second.backed_up[0].1.label, "2026-11-22T02");
        assert_eq!(second.backed_up[0].1.version, 2);
        let nothing = sweep(&*store, t0 + time::Duration::hours(2), Retention::default())
            .await
            .unwrap();
        assert_eq!(nothing.changed, 0);
    }
}
