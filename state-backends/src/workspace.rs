//! Names of workspaces: a tenant and a workspace name, safe to use as path segments and keys.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A tenant's workspace: the unit that has one state, one lease and one history.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkspaceId {
    tenant: String,
    workspace: String,
}

/// A name that cannot be used for a tenant or workspace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid name: {reason}")]
pub struct InvalidName {
    pub value: String,
    pub reason: &'static str,
}

/// The rule names follow, for error messages.
pub const NAME_RULE: &str = "use 1 to 63 characters: lowercase letters, digits, '-', '_' or '.', starting with a letter or digit and not ending with '.'";

impl WorkspaceId {
    /// A workspace id from a tenant and a workspace name.
    ///
    /// # Errors
    /// [`InvalidName`] when either is not 1–63 of `[a-z0-9._-]` starting with `[a-z0-9]`.
    pub fn new(tenant: &str, workspace: &str) -> Result<Self, InvalidName> {
        check_name(tenant)?;
        check_name(workspace)?;
        Ok(Self {
            tenant: tenant.to_owned(),
            workspace: workspace.to_owned(),
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// The key prefix of this workspace in a bucket: `<tenant>/<workspace>`.
    pub fn prefix(&self) -> String {
        format!("{}/{}", self.tenant, self.workspace)
    }
}

/// Checks one tenant or workspace name against [`NAME_RULE`].
///
/// # Errors
/// [`InvalidName`] saying what is wrong.
pub fn check_name(value: &str) -> Result<(), InvalidName> {
    let err = |reason| {
        Err(InvalidName {
            value: value.to_owned(),
            reason,
        })
    };
    if value.is_empty() || value.len() > 63 {
        return err("must be 1 to 63 characters long");
    }
    if !value.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return err("must start with a lowercase letter or a digit");
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
    {
        return err("may only contain lowercase letters, digits, '-', '_' and '.'");
    }
    // Azure Blob drops a trailing dot from each segment: `a.` and `a` would share a folder.
    if value.ends_with('.') {
        return err("must not end with '.'");
    }
    Ok(())
}

impl fmt::Display for WorkspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.workspace)
    }
}

impl FromStr for WorkspaceId {
    type Err = InvalidName;

    /// Parses `tenant/workspace`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((tenant, workspace)) = s.split_once('/') else {
            return Err(InvalidName {
                value: s.to_owned(),
                reason: "expected TENANT/WORKSPACE",
            });
        };
        Self::new(tenant, workspace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_parses_tenant_slash_workspace() {
        let ws: WorkspaceId = "acme/cluster-production".parse().unwrap();
        assert_eq!(ws.tenant(), "acme");
        assert_eq!(ws.workspace(), "cluster-production");
        assert_eq!(ws.prefix(), "acme/cluster-production");
    }

    #[test]
    fn refuses_names_that_could_escape_a_folder() {
        for bad in [
            "",
            "..",
            ".hidden",
            "a/b",
            "UPPER",
            "a b",
            "a.",
            "v1.2.",
            &"x".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} was accepted");
        }
        assert!("acme".parse::<WorkspaceId>().is_err());
    }
}
