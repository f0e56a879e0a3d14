//! Approved plans (see `docs/approval.md`): a `plan` job keeps its plan file, always encrypted,
//! with a record of what it was made against; an apply (or destroy) job that names it applies
//! exactly that file, and is refused before anything runs when the plan no longer fits.
//!
//! In `runs/<plan job>/`:
//! - `plan.tfplan`: terraform's plan file. Sealed with the workspace's key when the store seals
//!   (`state_backends::sealed`); otherwise sealed here with a key of its own ([`seal`]), which
//!   is given to the platform once, in the plan's result, and never stored: the bucket alone
//!   can neither read the plan's values nor apply it.
//! - `plan.json`: the [`PlanRecord`].
//! - `plan-applied.json`: the [`Applied`] claim of the job that applies it, written under that
//!   job's lease before terraform runs, so a plan is applied at most once.
//!
//! And in `runs/_workspace/plans.json`, the workspace's [`KeptPlans`]: which plans it keeps and
//! until when, for the hourly sweep to delete each plan file once it has expired
//! ([`crate::sweeps::plans`]) with one read per workspace.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::job::TemplateRef;
use crate::run::records::RecordError;
use crate::run::result::Changes;

/// The plan file, in `runs/<plan job>/`.
pub const PLAN_FILE: &str = "plan.tfplan";
/// What the plan was made against ([`PlanRecord`]), in `runs/<plan job>/`.
pub const PLAN_RECORD: &str = "plan.json";
/// Which job applied the plan ([`Applied`]), in `runs/<plan job>/`.
pub const PLAN_APPLIED: &str = "plan-applied.json";

/// The workspace's kept plans ([`KeptPlans`]), under [`crate::run::records::WORKSPACE_RECORDS`].
pub const PLANS_INDEX: &str = "plans.json";

/// The format of a [`PlanRecord`] written now.
pub const PLAN_RECORD_SCHEMA: u32 = 1;

/// How long a plan may wait for its approval by default.
pub const DEFAULT_PLAN_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The first bytes of a plan sealed with a key of its own.
const MAGIC: &[u8] = b"TERRACE-PLAN/1\n";
const NONCE_BYTES: usize = 12;

/// How a kept plan is encrypted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Sealing {
    /// By the store, with the workspace's key (a KMS key or a key file).
    WorkspaceKey,
    /// With a key of its own, given to the platform in the plan's result (`plan.key`) and
    /// given back by the apply job (`plan_key`).
    PlanKey,
}

/// The state a plan was made against; `None` in [`PlanRecord::state`] for an empty workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFacts {
    /// The store's version number.
    pub version: u64,
    pub serial: u64,
    pub lineage: String,
}

impl StateFacts {
    pub fn of(v: &state_backends::VersionInfo) -> Self {
        Self {
            version: v.number,
            serial: v.serial,
            lineage: v.lineage.clone(),
        }
    }
}

/// `plan.json`: what an approved plan was made against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanRecord {
    pub schema: u32,
    pub job_id: String,
    pub tenant: String,
    pub workspace: String,
    /// A destroy plan (`plan -destroy`), applied by a `destroy` job.
    pub destroy: bool,
    pub template: TemplateRef,
    /// The SHA-256 of the template version's published listing, for a template from a bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_digest: Option<String>,
    /// SHA-256 of the plan's variables as JSON (ephemeral ones left out: no plan keeps them).
    pub variables_sha256: String,
    /// The state the plan was made from; `None`: the workspace had none.
    pub state: Option<StateFacts>,
    /// `terraform` or `tofu`.
    pub flavour: String,
    pub terraform_version: String,
    /// SHA-256 of the provider lock file `init` left (`.terraform.lock.hcl`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_sha256: Option<String>,
    /// SHA-256 of the plan file as terraform wrote it (before it was sealed).
    pub plan_sha256: String,
    pub sealing: Sealing,
    pub changes: Changes,
    /// The policies' verdicts on the plan (warnings only: a denied plan is never kept), for
    /// the platform's approval screen; its apply is judged again, by the policies of then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::run::policy::Verdicts>,
    #[serde(with = "time::serde::rfc3339")]
    pub made_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

impl PlanRecord {
    /// Reads a record.
    ///
    /// # Errors
    /// Bytes that are not a record, or a record of a newer schema.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        let record: Self =
            serde_json::from_slice(bytes).map_err(|source| RecordError::Malformed {
                name: PLAN_RECORD,
                source,
            })?;
        if record.schema > PLAN_RECORD_SCHEMA {
            return Err(RecordError::Newer {
                name: PLAN_RECORD,
                found: record.schema,
                supported: PLAN_RECORD_SCHEMA,
            });
        }
        Ok(record)
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec_pretty(self).unwrap_or_default())
    }
}

/// `plan-applied.json`: the job that applies (or applied) the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub job_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

impl Applied {
    /// Reads a claim.
    ///
    /// # Errors
    /// Bytes that are not one.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        serde_json::from_slice(bytes).map_err(|source| RecordError::Malformed {
            name: PLAN_APPLIED,
            source,
        })
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec_pretty(self).unwrap_or_default())
    }
}

/// `plans.json`: the plans a workspace keeps, each until it expires.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptPlans {
    pub plans: Vec<Kept>,
}

/// A kept plan in [`KeptPlans`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub job_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

impl KeptPlans {
    /// Reads an index.
    ///
    /// # Errors
    /// Bytes that are not one.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        serde_json::from_slice(bytes).map_err(|source| RecordError::Malformed {
            name: PLANS_INDEX,
            source,
        })
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec_pretty(self).unwrap_or_default())
    }

    /// The plans expired at `now`.
    pub fn expired(&self, now: OffsetDateTime) -> impl Iterator<Item = &Kept> {
        self.plans.iter().filter(move |k| k.expires_at <= now)
    }
}

/// The workspace's kept plans; none when it has no index.
///
/// # Errors
/// The store's, or an index that is not one.
pub async fn kept(
    store: &dyn state_backends::StateStore,
    ws: &state_backends::WorkspaceId,
) -> Result<KeptPlans, crate::run::records::ReadError> {
    match store
        .artifact(ws, crate::run::records::WORKSPACE_RECORDS, PLANS_INDEX)
        .await?
    {
        None => Ok(KeptPlans::default()),
        Some(raw) => Ok(KeptPlans::parse(&raw)?),
    }
}

/// Writes the workspace's kept plans, fenced by the lease of whoever holds the workspace.
///
/// # Errors
/// The store's; [`state_backends::StoreError::LeaseLost`] when `fence` is not the live lease.
pub async fn record_kept(
    store: &dyn state_backends::StateStore,
    ws: &state_backends::WorkspaceId,
    kept: &KeptPlans,
    fence: &state_backends::Fence,
) -> Result<(), state_backends::StoreError> {
    use state_backends::StateStoreExt;
    store
        .put_artifact_fenced(
            ws,
            crate::run::records::WORKSPACE_RECORDS,
            PLANS_INDEX,
            kept.to_bytes(),
            fence,
        )
        .await
}

/// The plan's summary in its result: what a platform shows the person who approves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PlanSummary {
    /// The plan job's id: what the apply job names as `plan`.
    pub id: String,
    pub destroy: bool,
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(schema_with = "crate::job::schema::date_time")]
    pub expires_at: OffsetDateTime,
    pub sealing: Sealing,
    /// With [`Sealing::PlanKey`], the plan's key (unpadded base64url), which the apply job gives
    /// back as `plan_key`. Only in the result as it is delivered (the results channel, the
    /// CLI's output); the stored `result.json` never holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Why a kept plan cannot be opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("the plan was sealed with a key of its own, and the job gives none")]
    NoKey,
    #[error(
        "the plan does not open with the given plan_key (another plan's key, or the plan was changed)"
    )]
    WrongKey,
    #[error("the stored plan is not one sealed with a key of its own")]
    NotSealed,
    #[error("the stored plan is not this plan job's (it was made by another job, or changed)")]
    OtherPlan,
}

/// What a plan sealed with the workspace's key holds before the plan file: the plan job's id,
/// so that a plan sealed for another job of the same workspace (the store's sealing binds the
/// workspace, not the object's name) never passes for this one.
const BOUND: &str = "TERRACE-PLAN-OF/1 ";

/// The plan file with the id of the job that made it in front, to be sealed by the store.
pub fn bind(job_id: &str, plan: &[u8]) -> Bytes {
    let mut out = format!("{BOUND}{job_id}\n").into_bytes();
    out.extend_from_slice(plan);
    Bytes::from(out)
}

/// The plan file [`bind`] bound to `job_id`, opened by the store.
///
/// # Errors
/// [`OpenError::OtherPlan`] when it is bound to another job, or to none.
pub fn unbind(job_id: &str, opened: &[u8]) -> Result<Vec<u8>, OpenError> {
    let head = format!("{BOUND}{job_id}\n");
    opened
        .strip_prefix(head.as_bytes())
        .map(<[u8]>::to_vec)
        .ok_or(OpenError::OtherPlan)
}

/// A fresh plan key (32 random bytes).
pub fn new_key() -> [u8; 32] {
    rand::random()
}

/// The key as the plan's result gives it.
pub fn encode_key(key: &[u8; 32]) -> String {
    B64URL.encode(key)
}

/// What authenticates a sealed plan: it opens only as this workspace's plan of this job.
fn aad(tenant: &str, workspace: &str, job_id: &str) -> Vec<u8> {
    format!("terrace-plan/1\n{tenant}/{workspace}/{job_id}").into_bytes()
}

/// Seals `plan` with `key` (AES-256-GCM, a random nonce), bound to the workspace and job.
pub fn seal(key: &[u8; 32], plan: &[u8], (tenant, workspace, job_id): (&str, &str, &str)) -> Bytes {
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plan,
                aad: &aad(tenant, workspace, job_id),
            },
        )
        .expect("AES-GCM encrypts any plan of a size a store holds");
    let mut out = Vec::with_capacity(MAGIC.len() + NONCE_BYTES + sealed.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    Bytes::from(out)
}

/// Opens a plan [`seal`]ed with the key `key` (as the job gives it) for this workspace and job.
///
/// # Errors
/// [`OpenError`]: no key, a key that does not open it, or bytes that are not a sealed plan.
pub fn open(
    key: Option<&str>,
    stored: &[u8],
    (tenant, workspace, job_id): (&str, &str, &str),
) -> Result<Vec<u8>, OpenError> {
    let Some(body) = stored.strip_prefix(MAGIC) else {
        return Err(OpenError::NotSealed);
    };
    let key = key.ok_or(OpenError::NoKey)?;
    let key: [u8; 32] = B64URL
        .decode(key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or(OpenError::WrongKey)?;
    if body.len() < NONCE_BYTES {
        return Err(OpenError::NotSealed);
    }
    let (nonce, sealed) = body.split_at(NONCE_BYTES);
    Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key))
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: sealed,
                aad: &aad(tenant, workspace, job_id),
            },
        )
        .map_err(|_| OpenError::WrongKey)
}

/// Why an approved plan may not be applied: what a person reads, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The state moved since the plan: a later run changed it (the job is `superseded`).
    pub superseded: bool,
    pub message: String,
    pub fix: String,
}

/// What an approved plan's apply is checked against, besides the plan's record.
#[derive(Clone, Copy)]
pub struct Applying<'a> {
    pub job_id: &'a str,
    pub destroy: bool,
    pub template: &'a TemplateRef,
    pub flavour: &'a str,
    pub terraform_version: &'a str,
    /// The workspace's current state version.
    pub state: Option<&'a StateFacts>,
    pub now: OffsetDateTime,
    /// Who claimed the plan already, if anyone.
    pub applied: Option<&'a Applied>,
}

const PLAN_AGAIN: &str = "send a new plan job, have its plan approved, then apply that one";

/// Whether `record`'s plan may be applied now by the job `a` describes.
///
/// # Errors
/// The first reason it may not, in the order a person would look: the plan's own standing
/// (applied, expired), what it is (destroy or not), then what changed since it was made.
pub fn check(record: &PlanRecord, a: &Applying<'_>) -> Result<(), Refusal> {
    let refuse = |message: String, fix: &str| {
        Err(Refusal {
            superseded: false,
            message,
            fix: fix.to_owned(),
        })
    };
    let plan = &record.job_id;
    if let Some(applied) = a.applied.filter(|c| c.job_id != a.job_id) {
        return refuse(
            format!(
                "plan {plan} was already applied by job {} at {}; a plan is applied once",
                applied.job_id,
                state_backends::display_time(applied.at)
            ),
            PLAN_AGAIN,
        );
    }
    if a.now >= record.expires_at {
        return refuse(
            format!(
                "plan {plan} expired at {}",
                state_backends::display_time(record.expires_at)
            ),
            PLAN_AGAIN,
        );
    }
    match (record.destroy, a.destroy) {
        (true, false) => {
            return refuse(
                format!("plan {plan} is a destroy plan"),
                "apply it with operation destroy",
            );
        }
        (false, true) => {
            return refuse(
                format!("plan {plan} is not a destroy plan"),
                "apply it with operation apply, or plan a destroy (operation plan, destroy: true) and have that approved",
            );
        }
        _ => {}
    }
    if &record.template != a.template {
        return refuse(
            format!(
                "plan {plan} was made with template {}, and this job names {}",
                record.template, a.template
            ),
            "name the plan's template and version, or plan again with this one",
        );
    }
    if record.flavour != a.flavour || record.terraform_version != a.terraform_version {
        return refuse(
            format!(
                "plan {plan} was made by {} {}, and this runner has {} {}; a plan file is applied by the version that made it",
                record.flavour, record.terraform_version, a.flavour, a.terraform_version
            ),
            "apply it on a runner with the plan's version, or plan again on this one",
        );
    }
    if record.state.as_ref() != a.state {
        let show = |s: Option<&StateFacts>| match s {
            Some(s) => format!("version {} (serial {})", s.version, s.serial),
            None => "no state".to_owned(),
        };
        return Err(Refusal {
            superseded: true,
            message: format!(
                "the workspace's state moved since plan {plan} was made (then {}, now {}): a later run changed it, and the plan would undo or repeat what that run did",
                show(record.state.as_ref()),
                show(a.state)
            ),
            fix: PLAN_AGAIN.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
