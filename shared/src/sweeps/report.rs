//! One report for every sweep, whichever function ran it: what it did to each bucket it
//! covered, and whether anything was left undone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SweepKind {
    /// The hourly backups ([`crate::sweeps::backup`]).
    Backup,
    /// The drift checks queued as jobs ([`crate::sweeps::drift`]).
    Drift,
}

impl SweepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Backup => "backup",
            Self::Drift => "drift",
        }
    }
}

/// What one sweep did, bucket by bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SweepReport {
    pub sweep: SweepKind,
    pub buckets: Vec<BucketReport>,
}

impl SweepReport {
    /// Whether any bucket says something was not done: the schedule should try again.
    pub fn failed(&self) -> bool {
        self.buckets.iter().any(BucketReport::failed)
    }
}

/// What a sweep did to one bucket (a container on Azure).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BucketReport {
    pub bucket: String,
    /// Why the sweep could not run over this bucket at all (its store, its queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupDone>,
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftDone>,
    /// Workspaces it could not handle, with why (they are tried again at the next sweep).
    #[serde(default)]
    pub failed: Vec<WorkspaceFailure>,
}

impl BucketReport {
    /// A bucket the sweep could not run over.
    pub fn error(bucket: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            error: Some(why.into()),
            ..Self::default()
        }
    }

    /// Whether something was not done.
    pub fn failed(&self) -> bool {
        self.error.is_some() || !self.failed.is_empty()
    }
}

/// A workspace a sweep could not handle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkspaceFailure {
    /// `tenant/workspace`.
    pub workspace: String,
    pub error: String,
}

/// What a backup sweep did to a bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BackupDone {
    /// Workspaces with a change mark.
    pub changed: usize,
    /// New backups.
    pub backed_up: usize,
    /// Backups dropped by retention.
    pub pruned: usize,
    /// Plans kept for approval deleted after they expired ([`crate::sweeps::plans`]).
    #[serde(default)]
    pub expired_plans: usize,
}

/// What a drift sweep did to a bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DriftDone {
    /// Drift checks queued.
    pub queued: usize,
    /// Workspaces whose last apply had sensitive variables: not checked (their values are not
    /// kept), with the variables' names.
    pub needs_secrets: Vec<NeedsSecrets>,
    /// Workspaces with nothing to compare against (never applied, or no state now).
    pub never_applied: usize,
    /// Workspaces of tenants not registered with this bucket: not checked.
    pub unregistered: Vec<String>,
    /// Per tenant, workspaces left for a later sweep (over the bound per tenant).
    pub deferred: BTreeMap<String, usize>,
}

/// A workspace a drift check would need secrets for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NeedsSecrets {
    pub workspace: String,
    pub sensitive_variables: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_report_reads_as_each_sweep_always_wrote_it() {
        let backup = BucketReport {
            bucket: "acme-states".into(),
            backup: Some(BackupDone {
                changed: 3,
                backed_up: 2,
                pruned: 1,
                expired_plans: 2,
            }),
            failed: vec![WorkspaceFailure {
                workspace: "acme/net".into(),
                error: "503".into(),
            }],
            ..BucketReport::default()
        };
        assert_eq!(
            serde_json::to_value(&backup).unwrap(),
            serde_json::json!({
                "bucket": "acme-states", "changed": 3, "backed_up": 2, "pruned": 1,
                "expired_plans": 2, "failed": [{ "workspace": "acme/net", "error": "503" }],
            })
        );
        assert!(backup.failed());
        let drift = BucketReport {
            bucket: "acme-states".into(),
            drift: Some(DriftDone {
                queued: 4,
                ..DriftDone::default()
            }),
            ..BucketReport::default()
        };
        let value = serde_json::to_value(&drift).unwrap();
        assert_eq!(value["queued"], 4);
        assert!(value.get("changed").is_none(), "{value}");
        assert!(!drift.failed());
        let back: BucketReport = serde_json::from_value(value).unwrap();
        assert_eq!(back.drift, drift.drift);
        assert!(BucketReport::error("b", "no role").failed());
    }
}
