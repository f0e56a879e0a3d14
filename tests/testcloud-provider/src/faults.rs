//! Deterministic fault injection for tests: `<root>/faults.json` lists faults, and each fires
//! for its next `times` matching operations (the count is kept in the file itself, so it holds
//! across the provider processes of successive terraform commands).
//!
//! ```json
//! [{ "resource": "testcloud_cluster", "name": "demo", "op": "create", "kind": "transient", "times": 3 }]
//! ```
//! `name` may be omitted to match every resource of the type. `slow` and `hang` apply to creates:
//! a slow create waits `delay_ms` (default 60 000) and gives up when the provider is
//! interrupted, creating nothing; a hanging create never returns and ignores interrupts, so only
//! a kill ends it.

use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file in the root folder that holds the faults.
pub const FILE: &str = "faults.json";

/// An operation of the fake cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Create,
    Update,
    Delete,
}

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Throttling: retrying later succeeds.
    Transient,
    /// An exhausted quota: retrying does not help.
    Quota,
    /// Missing permissions.
    Auth,
    /// The operation is carried out, but an error is returned (the next create then meets
    /// "already exists").
    FalseFailure,
    /// The create takes `delay_ms`, and is cancelled (nothing created) when terraform is
    /// interrupted.
    Slow,
    /// The create never returns, whatever happens: only killing the provider ends it.
    Hang,
}

impl Kind {
    /// The cloud's error message for this fault.
    pub fn message(self, type_name: &str, name: &str) -> String {
        match self {
            Kind::Transient => format!(
                "RequestLimitExceeded: request limit exceeded for {type_name} \"{name}\" (503 Service Unavailable, please retry)"
            ),
            Kind::Quota => "QuotaExceeded: vCPU limit 32 reached in us-east-1".to_owned(),
            Kind::Auth => format!(
                "AccessDenied: the caller is not authorized to perform this operation on {type_name} \"{name}\""
            ),
            Kind::FalseFailure => {
                "InternalError: the request timed out while the resource was being provisioned"
                    .to_owned()
            }
            Kind::Slow | Kind::Hang => {
                format!("the create of {type_name} \"{name}\" was cancelled; nothing was created")
            }
        }
    }
}

impl Kind {
    /// Whether an update or delete with this fault fails without doing anything.
    pub fn fails_at_once(self) -> bool {
        matches!(self, Kind::Transient | Kind::Quota | Kind::Auth)
    }
}

/// One configured fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub op: Op,
    pub kind: Kind,
    pub times: u32,
    /// How long a `slow` create takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

impl Fault {
    /// How long a `slow` create takes.
    pub fn delay(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.delay_ms.unwrap_or(60_000))
    }
}

/// Consumes one firing of the first fault matching the operation, if any.
///
/// # Errors
/// When the faults file cannot be read, parsed or rewritten.
pub fn take(root: &Path, type_name: &str, name: &str, op: Op) -> io::Result<Option<Fault>> {
    let path = root.join(FILE);
    if !path.exists() {
        return Ok(None);
    }
    // One provider process at a time may count down (terraform runs operations in parallel).
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(".faults.lock"))?;
    crate::store::shared_by_all(&root.join(".faults.lock"), 0o666);
    lock.lock()?;
    let mut faults: Vec<Fault> = serde_json::from_slice(&fs::read(&path)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })?;
    let hit = faults.iter_mut().find(|f| {
        f.times > 0
            && f.op == op
            && f.resource == type_name
            && f.name.as_deref().is_none_or(|n| n == name)
    });
    let Some(fault) = hit else {
        return Ok(None);
    };
    fault.times -= 1;
    let fired = fault.clone();
    let tmp = root.join(".faults.json.tmp");
    fs::write(
        &tmp,
        serde_json::to_vec_pretty(&faults).map_err(io::Error::other)?,
    )?;
    crate::store::shared_by_all(&tmp, 0o666);
    fs::rename(&tmp, &path)?;
    Ok(Some(fired))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_as_often_as_configured_and_only_where_they_match() {
        let dir = tempfile::tempdir().unwrap();
        let faults = vec![Fault {
            resource: "testcloud_cluster".into(),
            name: Some("a".into()),
            op: Op::Create,
            kind: Kind::Transient,
            times: 2,
            delay_ms: None,
        }];
        fs::write(dir.path().join(FILE), serde_json::to_vec(&faults).unwrap()).unwrap();
        let take_a = || {
            take(dir.path(), "testcloud_cluster", "a", Op::Create)
                .unwrap()
                .map(|f| f.kind)
        };
        assert_eq!(
            take(dir.path(), "testcloud_cluster", "b", Op::Create).unwrap(),
            None::<Fault>
        );
        assert_eq!(
            take(dir.path(), "testcloud_cluster", "a", Op::Delete).unwrap(),
            None::<Fault>
        );
        assert_eq!(take_a(), Some(Kind::Transient));
        assert_eq!(take_a(), Some(Kind::Transient));
        assert_eq!(take_a(), None);
        assert!(Kind::Transient.message("t", "a").contains("please retry"));
    }

    #[test]
    fn no_file_no_fault() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(take(dir.path(), "x", "y", Op::Create).unwrap(), None);
    }
}
