//! Which terraform client a runner drives, and whether Terrace supports it: Terraform 1.5 and
//! later, OpenTofu 1.6 and later. Read once per runner from `version -json`, recorded in every
//! result, and checked before a job touches its workspace's state.
//!
//! Both clients print the same `version -json` shape (`terraform_version`, `platform`,
//! `provider_selections`); OpenTofu is told apart by its binary's name (`tofu`) or by providers
//! from its registry.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::terraform::{self, TerraformConfig};

/// The oldest supported Terraform: `-json` plan and apply UI with `resource_drift`,
/// `plan -refresh-only`, saved-plan apply, `terraform_data`, and flags before positionals.
pub const TERRAFORM_FLOOR: Version = Version::new(1, 5, 0);
/// The oldest supported OpenTofu (its first stable release).
pub const OPENTOFU_FLOOR: Version = Version::new(1, 6, 0);

/// How long `version -json` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Terraform or OpenTofu.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavour {
    Terraform,
    #[serde(rename = "opentofu")]
    OpenTofu,
}

impl Flavour {
    /// The product's name, as its users write it.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Terraform => "Terraform",
            Flavour::OpenTofu => "OpenTofu",
        }
    }

    /// The oldest version Terrace supports.
    pub fn floor(self) -> Version {
        match self {
            Flavour::Terraform => TERRAFORM_FLOOR,
            Flavour::OpenTofu => OPENTOFU_FLOOR,
        }
    }
}

/// A release number, `MAJOR.MINOR.PATCH[-PRE]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// A pre-release (`-rc2`, `-alpha20240101`): sorts before the release of the same number.
    pub pre_release: bool,
}

impl Version {
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self {
            major,
            minor,
            patch,
            pre_release: false,
        }
    }

    /// Parses `1.11.4`, `v1.6.0`, `0.15.0-rc2`, `1.9.0-beta1+build`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim().trim_start_matches('v');
        let (numbers, pre) = match text.split_once(['-', '+']) {
            Some((numbers, rest)) => (
                numbers,
                text[numbers.len()..].starts_with('-') && !rest.is_empty(),
            ),
            None => (text, false),
        };
        let mut parts = numbers.split('.').map(str::parse::<u64>);
        let version = Self {
            major: parts.next()?.ok()?,
            minor: parts.next()?.ok()?,
            patch: parts.next().unwrap_or(Ok(0)).ok()?,
            pre_release: pre,
        };
        parts.next().is_none().then_some(version)
    }

    /// Whether this is `floor` or later (a pre-release of the floor itself is not).
    pub fn at_least(&self, floor: &Version) -> bool {
        let (a, b) = (
            (self.major, self.minor, self.patch),
            (floor.major, floor.minor, floor.patch),
        );
        a > b || (a == b && !self.pre_release)
    }
}

/// The client a runner drives, as recorded in `result.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Client {
    pub flavour: Flavour,
    /// As the binary prints it (`1.11.4`).
    pub version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub platform: String,
}

/// `version -json`, as Terraform and OpenTofu print it.
#[derive(Deserialize)]
struct VersionJson {
    terraform_version: String,
    #[serde(default)]
    platform: String,
    #[serde(default)]
    provider_selections: std::collections::BTreeMap<String, String>,
}

/// Why a client cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("cannot run `{binary} version -json`: {reason}")]
    Unavailable { binary: String, reason: String },
    #[error("`{binary} version -json` printed something that is not a version: {output}")]
    Unreadable { binary: String, output: String },
    #[error(
        "{name} {found} is not supported: Terrace needs {name} {floor} or later (Terraform >= {tf}, OpenTofu >= {tofu})",
        name = flavour.name(),
        tf = TERRAFORM_FLOOR,
        tofu = OPENTOFU_FLOOR
    )]
    Unsupported {
        flavour: Flavour,
        found: String,
        floor: Version,
    },
}

impl ClientError {
    /// What the operator does about it.
    pub fn hint(&self) -> &'static str {
        match self {
            ClientError::Unavailable { .. } | ClientError::Unreadable { .. } => {
                "install Terraform >= 1.5 or OpenTofu >= 1.6 and point the runner at it (TERRACE_TERRAFORM)"
            }
            ClientError::Unsupported { .. } => {
                "upgrade the runner's terraform (Terraform >= 1.5 or OpenTofu >= 1.6) and point TERRACE_TERRAFORM at it; nothing ran and no state was touched"
            }
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Reads the client from its `version -json` output; `binary` tells OpenTofu apart.
///
/// # Errors
/// Output that is not a version, or a version below its floor.
pub fn parse(binary: &Path, output: &[u8]) -> Result<Client, ClientError> {
    let unreadable = || ClientError::Unreadable {
        binary: binary.display().to_string(),
        output: String::from_utf8_lossy(output).chars().take(200).collect(),
    };
    let json: VersionJson = serde_json::from_slice(output).map_err(|_| unreadable())?;
    let version = Version::parse(&json.terraform_version).ok_or_else(unreadable)?;
    let named_tofu = binary
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("tofu"));
    let tofu_registry = json
        .provider_selections
        .keys()
        .any(|p| p.starts_with("registry.opentofu.org/"));
    let flavour = if named_tofu || tofu_registry {
        Flavour::OpenTofu
    } else {
        Flavour::Terraform
    };
    if !version.at_least(&flavour.floor()) {
        return Err(ClientError::Unsupported {
            flavour,
            found: json.terraform_version,
            floor: flavour.floor(),
        });
    }
    Ok(Client {
        flavour,
        version: json.terraform_version,
        platform: json.platform,
    })
}

/// Runs `version -json` with terraform's scrubbed environment and reads the client.
///
/// # Errors
/// See [`ClientError`].
pub async fn probe(config: &TerraformConfig) -> Result<Client, ClientError> {
    let binary = config.binary.display().to_string();
    let unavailable = |reason: String| ClientError::Unavailable {
        binary: binary.clone(),
        reason,
    };
    let home = std::env::temp_dir();
    let mut cmd = tokio::process::Command::new(&config.binary);
    cmd.args(["version", "-json"])
        .current_dir(&home)
        .env_clear()
        .envs(terraform::environment(config, &home))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(PROBE_TIMEOUT, cmd.output())
        .await
        .map_err(|_| unavailable(format!("no answer within {PROBE_TIMEOUT:?}")))?
        .map_err(|e| unavailable(e.to_string()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(unavailable(format!(
            "{} ({})",
            output.status,
            stderr.lines().next().unwrap_or_default()
        )));
    }
    parse(&config.binary, &output.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_as(binary: &str, json: &str) -> Result<Client, ClientError> {
        parse(Path::new(binary), json.as_bytes())
    }

    #[test]
    fn terraform_1_11_is_read_from_its_own_output() {
        // `terraform version -json` of the binary on these machines, as printed.
        let out = r#"{
  "terraform_version": "1.11.4",
  "platform": "linux_amd64",
  "provider_selections": {},
  "terraform_outdated": false
}"#;
        let client = parse_as("/usr/local/bin/terraform", out).unwrap();
        assert_eq!(client.flavour, Flavour::Terraform);
        assert_eq!(client.version, "1.11.4");
        assert_eq!(client.platform, "linux_amd64");
    }

    #[test]
    fn opentofu_is_told_apart_by_its_binary_or_its_registry() {
        // The shape OpenTofu's docs show for `tofu version -json`.
        let docs = r#"{"terraform_version": "1.6.0", "platform": "darwin_amd64",
            "provider_selections": {"registry.opentofu.org/opentofu/null": "3.0.0"}}"#;
        assert_eq!(
            parse_as("terraform", docs).unwrap().flavour,
            Flavour::OpenTofu
        );
        let bare = r#"{"terraform_version": "1.8.3", "platform": "linux_arm64", "provider_selections": {}}"#;
        let tofu = parse_as("/opt/bin/tofu", bare).unwrap();
        assert_eq!(
            (tofu.flavour, tofu.version.as_str()),
            (Flavour::OpenTofu, "1.8.3")
        );
        assert_eq!(
            parse_as("terraform", bare).unwrap().flavour,
            Flavour::Terraform
        );
    }

    #[test]
    fn versions_below_the_floor_are_refused_naming_what_was_found() {
        let old = parse_as("terraform", r#"{"terraform_version": "0.15.0-rc2"}"#).unwrap_err();
        assert_eq!(
            old.to_string(),
            "Terraform 0.15.0-rc2 is not supported: Terrace needs Terraform 1.5.0 or later (Terraform >= 1.5.0, OpenTofu >= 1.6.0)"
        );
        assert!(parse_as("terraform", r#"{"terraform_version": "1.4.7"}"#).is_err());
        assert!(parse_as("terraform", r#"{"terraform_version": "1.5.0-rc1"}"#).is_err());
        assert!(parse_as("terraform", r#"{"terraform_version": "1.5.0"}"#).is_ok());
        // OpenTofu's floor is its own: 1.5.x was never an OpenTofu release.
        let tofu = parse_as("tofu", r#"{"terraform_version": "1.6.0-alpha1"}"#).unwrap_err();
        assert!(
            tofu.to_string().starts_with(
                "OpenTofu 1.6.0-alpha1 is not supported: Terrace needs OpenTofu 1.6.0 or later"
            ),
            "{tofu}"
        );
        assert!(parse_as("tofu", r#"{"terraform_version": "1.10.2"}"#).is_ok());
    }

    #[test]
    fn output_that_is_not_a_version_is_named() {
        // What the 0.15 vendor build printed on stdout, with its prefix.
        let e = parse_as("terraform", r#"o:{"terraform_version":"0.15.0-rc2"}"#).unwrap_err();
        assert!(matches!(e, ClientError::Unreadable { .. }), "{e:?}");
        assert!(e.to_string().contains("o:{"), "{e}");
        assert!(parse_as("terraform", r#"{"terraform_version": "one.two"}"#).is_err());
    }

    #[test]
    fn version_numbers_parse_and_order() {
        let v = |s| Version::parse(s).unwrap();
        assert_eq!(v("v1.6.0"), Version::new(1, 6, 0));
        assert!(v("1.9.0-beta1+build").pre_release);
        assert!(!v("1.9.0+build").pre_release);
        assert!(v("1.10.0").at_least(&Version::new(1, 9, 5)));
        assert!(v("2.0.0").at_least(&TERRAFORM_FLOOR));
        assert!(!v("1.4.99").at_least(&TERRAFORM_FLOOR));
        assert_eq!(Version::parse("1.2.3.4"), None);
        assert_eq!(Version::parse(""), None);
    }
}
