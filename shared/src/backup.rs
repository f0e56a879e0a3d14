//! The backup sweep: for every workspace whose state changed since its last sweep, a copy of
//! the current state as `backups/<UTC hour>` (a server-side copy on cloud stores), then
//! retention. It visits only the changed workspaces ([`StateStore::changed`]), so its cost
//! follows the changes, not the number of workspaces. Run hourly by a schedule (EventBridge,
//! Cloud Scheduler, a timer) or `terrace backup`.

use state_backends::{BackupInfo, StateStore, StoreError};
use time::OffsetDateTime;

/// How many backups a workspace keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// The newest backups, one per hour with a change.
    pub hourly: usize,
    /// Beyond those, the newest backup of each of this many most recent days.
    pub daily: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            hourly: 48,
            daily: 30,
        }
    }
}

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

/// The labels retention drops: all but the newest `hourly`, and beyond those the newest of
/// each of the `daily` most recent days.
pub fn to_prune(labels: &[String], keep: Retention) -> Vec<String> {
    let mut sorted: Vec<&String> = labels.iter().collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    let mut kept: Vec<&String> = sorted.iter().take(keep.hourly).copied().collect();
    let mut days: Vec<&str> = Vec::new();
    for label in &sorted {
        let day = label.get(..10).unwrap_or(label);
        if days.contains(&day) {
            continue;
        }
        if days.len() == keep.daily {
            break;
        }
        days.push(day);
        kept.push(label);
    }
    sorted
        .into_iter()
        .filter(|l| !kept.contains(l))
        .cloned()
        .collect()
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

/// Backs up every changed workspace as of `now`, applies `keep`, and clears the marks of what
/// it handled. One workspace's failure does not stop the others.
///
/// # Errors
/// Only when the changed workspaces cannot be listed.
pub async fn sweep(
    store: &dyn StateStore,
    now: OffsetDateTime,
    keep: Retention,
) -> Result<SweepReport, StoreError> {
    let label = hour_label(now);
    let changed = store.changed().await?;
    let mut report = SweepReport {
        changed: changed.len(),
        ..SweepReport::default()
    };
    for mark in changed {
        let name = mark.ws.to_string();
        let done = async {
            match store.snapshot(&mark.ws, &label).await? {
                Some(backup) => {
                    let labels: Vec<String> = store
                        .backups(&mark.ws)
                        .await?
                        .into_iter()
                        .map(|b| b.label)
                        .collect();
                    let mut pruned = Vec::new();
                    for old in to_prune(&labels, keep) {
                        store.delete_backup(&mark.ws, &old).await?;
                        pruned.push(old);
                    }
                    Ok::<_, StoreError>((Some(backup), pruned))
                }
                None => Ok((None, Vec::new())),
            }
        }
        .await;
        match done {
            Ok((backup, pruned)) => {
                // Cleared only now: a write since the listing keeps its mark for next time.
                if let Err(e) = store.clear_changed(&mark).await {
                    report.failed.push((name.clone(), e.to_string()));
                }
                match backup {
                    Some(b) => report.backed_up.push((name.clone(), b)),
                    None => report.unchanged.push(name.clone()),
                }
                report
                    .pruned
                    .extend(pruned.into_iter().map(|l| (name.clone(), l)));
            }
            Err(e) => {
                tracing::warn!(workspace = %name, error = %e, "backup failed; it is retried at the next sweep");
                report.failed.push((name, e.to_string()));
            }
        }
    }
    Ok(report)
}

/// One bucket's hourly sweep, as a function reports it: what [`sweep`] did with the default
/// retention, or why it could not run (`store` is the bucket, or why it cannot be reached).
pub async fn bucket_report(
    bucket: &str,
    store: Result<std::sync::Arc<dyn StateStore>, String>,
    now: OffsetDateTime,
) -> serde_json::Value {
    let swept = match store {
        Ok(store) => sweep(&*store, now, Retention::default())
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    match swept {
        Ok(r) => serde_json::json!({
            "bucket": bucket, "changed": r.changed,
            "backed_up": r.backed_up.len(), "pruned": r.pruned.len(),
            "failed": r.failed,
        }),
        Err(e) => serde_json::json!({ "bucket": bucket, "error": e }),
    }
}

/// Whether a sweep's bucket report (backup or drift) says something was not done.
pub fn report_failed(report: &serde_json::Value) -> bool {
    report.get("error").is_some()
        || report["failed"]
            .as_array()
            .is_some_and(|failed| !failed.is_empty())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use state_backends::memory::MemoryStore;
    use state_backends::{NewState, PutMode, WorkspaceId};

    use super::*;

    fn labels(hours: &[&str]) -> Vec<String> {
        hours.iter().map(|h| (*h).to_owned()).collect()
    }

    #[test]
    fn labels_are_utc_hours() {
        let t = time::macros::datetime!(2026-11-22 03:59:59 +02:00);
        assert_eq!(hour_label(t), "2026-11-22T01");
    }

    #[test]
    fn retention_keeps_the_newest_hours_and_one_per_recent_day() {
        let all = labels(&[
            "2026-11-20T01",
            "2026-11-20T23",
            "2026-11-21T05",
            "2026-11-21T06",
            "2026-11-22T01",
            "2026-11-22T02",
        ]);
        let keep = Retention {
            hourly: 2,
            daily: 2,
        };
        // Hourly: 22T02, 22T01. Daily (2 newest days): 22T02, 21T06.
        assert_eq!(
            to_prune(&all, keep),
            labels(&["2026-11-21T05", "2026-11-20T23", "2026-11-20T01"])
        );
        assert!(to_prune(&all, Retention::default()).is_empty());
        // A workspace that rarely changes keeps its few backups, however old.
        assert!(to_prune(&labels(&["2025-01-01T00"]), keep).is_empty());
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
