//! How many backups a workspace keeps, and which ones retention drops. The folder store applies
//! it in the same index write that records a new backup; a bucket store lists a workspace's
//! backups for it every so many versions ([`crate::objects::PRUNE_EVERY`]), so a sweep pays a
//! listing now and then rather than an index read and write per backup.

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

/// The labels retention drops: all but the newest `hourly`, and beyond those the newest of
/// each of the `daily` most recent days. Labels are UTC hours (`2026-11-22T03`), which sort by
/// time.
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

/// Records `backup` in a workspace's backup index (oldest first), replacing one of the same
/// label, and drops from it what `keep` no longer keeps; returns the dropped labels.
pub fn record(
    index: &mut Vec<crate::BackupInfo>,
    backup: crate::BackupInfo,
    keep: Retention,
) -> Vec<String> {
    index.retain(|b| b.label != backup.label);
    index.push(backup);
    let labels: Vec<String> = index.iter().map(|b| b.label.clone()).collect();
    let pruned = to_prune(&labels, keep);
    index.retain(|b| !pruned.contains(&b.label));
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(hours: &[&str]) -> Vec<String> {
        hours.iter().map(|h| (*h).to_owned()).collect()
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
}
