//! What a run's steps find as they go ([`Report`]), what came before ([`Earlier`]), and what its
//! plans are priced with ([`Costing`]): the context the steps share.

use std::collections::BTreeSet;

use crate::run::client::Client;
use crate::run::cost;
use crate::run::recover::Recovery;
use crate::run::result::{Attempt, Changes, Cleanup, DriftedResource, StepTiming, UnsavedState};

/// What the steps found, gathered as they run.
#[derive(Default)]
pub(super) struct Report {
    pub(super) steps: Vec<StepTiming>,
    pub(super) changes: Option<Changes>,
    pub(super) cost: Option<cost::Estimate>,
    pub(super) policy: Option<crate::run::policy::Verdicts>,
    pub(super) drift: Option<bool>,
    pub(super) outputs: std::collections::BTreeMap<String, crate::run::result::Output>,
    pub(super) sealed_outputs: Option<crate::run::sealed_outputs::SealedOutputs>,
    pub(super) versions: Vec<u64>,
    /// Bytes of the last state version written.
    pub(super) state_bytes: Option<u64>,
    pub(super) attempts: Vec<Attempt>,
    pub(super) cleanup: Option<Cleanup>,
    /// Drift checks: what changed outside terraform, attribute by attribute.
    pub(super) drifted: Vec<DriftedResource>,
    /// The terraform client that ran the job.
    pub(super) client: Option<Client>,
    pub(super) recovered: Vec<Recovery>,
    /// Objects this job's applies may have made (`recover::ApplyCreates::may_have_made`).
    pub(super) creating: BTreeSet<String>,
    /// What earlier runs of the workspace may have made.
    pub(super) earlier: Earlier,
    pub(super) unsaved_state: Option<UnsavedState>,
    /// Something in the workdir could not be saved elsewhere: do not delete it.
    pub(super) keep_workdir: bool,
    /// A plan job's plan, kept for approval.
    pub(super) plan: Option<crate::run::plans::PlanSummary>,
    /// When terraform's first command of the run started.
    pub(super) first_command: Option<tokio::time::Instant>,
    /// A successful apply: the job whose record holds its variables (the plan job, for an
    /// approved plan), recorded for a later rollback as the run ends.
    pub(super) applied: Option<String>,
}

/// Earlier runs of the workspace that ended without finishing (failed, timed out, killed),
/// newest first, and what their stored logs say they may have made, read once when an import
/// first needs it.
#[derive(Debug, Default)]
pub(super) struct Earlier {
    pub(super) runs: Vec<String>,
    /// This attempt's lease fence: its own log chunks (a job delivered again runs under its
    /// old id) are not an earlier run's.
    pub(super) fence: u64,
    pub(super) made: Option<BTreeSet<String>>,
}

/// What a job's plans are priced with.
pub(super) struct Costing {
    pub(super) books: cost::PriceBooks,
    pub(super) budget: Option<crate::job::Budget>,
}
