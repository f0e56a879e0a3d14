//! Which terraform client a runner drives, and whether Terrace supports it: Terraform 1.5 and
//! later, OpenTofu 1.6 and later. Read once per process from `version -json` (see
//! [`probe_cached`]), recorded in every result, and checked before a job touches its workspace's
//! state.
//!
//! Both clients print the same `version -json` shape (`terraform_version`, `platform`,
//! `provider_selections`); OpenTofu is told apart by its binary's name (`tofu`) or by providers
//! from its registry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::run::terraform::{self, TerraformConfig};

/// The oldest supported Terraform: `-json` plan and apply UI with `resource_drift`,
/// `plan -refresh-only`, saved-plan apply, `terraform_data`, and flags before positionals.
pub const TERRAFORM_FLOOR: Version = Version::new(1, 5, 0);
/// The oldest supported OpenTofu (its first stable release).
pub const OPENTOFU_FLOOR: Version = Version::new(1, 6, 0);

/// How long `version -json` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Terraform or OpenTofu.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    let output = version_output(config).await?;
    parse(&config.binary, &output)
}

/// What `version -json` prints.
async fn version_output(config: &TerraformConfig) -> Result<Vec<u8>, ClientError> {
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
    Ok(output.stdout)
}

/// [`probe`], remembered for as long as the binary's file is the same one (same path, device,
/// inode, size, and change and modification times):
/// - in this process: every function makes a runner per job, and a probe begun when the process
///   started ([`warm`]) is the first job's;
/// - between processes in `cache` (a folder): a one-job process (`terrace run`) then does not
///   pay for a `version -json` per job;
/// - from the image: [`TerraformConfig::version_record`], the answer recorded as the image was
///   built, while the binary is the recorded file (same real path, size and modification time).
///   A fresh container (a Container Apps execution, a cold Lambda or Cloud Run instance) then
///   starts its first job without starting terraform first (~40 ms).
///
/// The answer kept is terraform's own output, checked against the floors again on every read.
///
/// # Errors
/// See [`ClientError`]; a cache that cannot be read or written is only a cache miss.
pub async fn probe_cached(
    config: &TerraformConfig,
    cache: Option<&Path>,
) -> Result<Client, ClientError> {
    static PROCESS: OnceLock<Answers> = OnceLock::new();
    PROCESS
        .get_or_init(Answers::default)
        .probe(config, cache)
        .await
}

/// Starts reading the client now, in the background, so that the first job finds it read (or
/// being read) instead of waiting for terraform to start and answer. A job that runs terraform
/// as the runner's own user first kills what the job before left running, a read still under
/// way included: that job then reads it again.
pub fn warm(config: &TerraformConfig, cache: Option<PathBuf>) {
    // Outside a runtime there is nothing to read it in the background: the first job reads it.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let config = config.clone();
    runtime.spawn(async move {
        if let Err(e) = probe_cached(&config, cache.as_deref()).await {
            // The first job reads it again, and says why it cannot run.
            tracing::debug!(error = %e, "could not read terraform's version ahead of the first job");
        }
    });
}

/// `version -json` answers by the binary's identity, each read once (callers at the same time
/// share one read). An answer that cannot be read is not kept.
#[derive(Default)]
struct Answers(Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Vec<u8>>>>>);

impl Answers {
    async fn probe(
        &self,
        config: &TerraformConfig,
        cache: Option<&Path>,
    ) -> Result<Client, ClientError> {
        let Some(file) = BinaryFile::find(&config.binary) else {
            return probe(config).await;
        };
        let identity = file.identity(&config.binary);
        let answer = self
            .0
            .lock()
            .expect("no panic holds the answers")
            .entry(identity.clone())
            .or_default()
            .clone();
        let output = answer
            .get_or_try_init(|| async {
                let record = config.version_record.as_deref();
                if let Some(output) = record.and_then(|r| recorded(r, &config.binary, &file)) {
                    return Ok(output);
                }
                let entry = cache.map(|dir| CacheEntry::new(dir, identity));
                if let Some(output) = entry.as_ref().and_then(CacheEntry::read) {
                    return Ok(output);
                }
                let output = version_output(config).await?;
                if let Err(e @ ClientError::Unreadable { .. }) = parse(&config.binary, &output) {
                    return Err(e);
                }
                if let Some(entry) = entry {
                    entry.write(&output);
                }
                Ok(output)
            })
            .await?;
        parse(&config.binary, output)
    }
}

/// The file a binary's name leads to, as found when its client is asked for.
struct BinaryFile {
    /// Its path with every link resolved.
    real: PathBuf,
    meta: std::fs::Metadata,
}

impl BinaryFile {
    /// `None` when it cannot be found.
    fn find(binary: &Path) -> Option<Self> {
        let real = std::fs::canonicalize(resolve(binary)?).ok()?;
        let meta = std::fs::metadata(&real).ok()?;
        Some(Self { real, meta })
    }

    /// What tells one binary's file from another's on this host: its path as named and as
    /// resolved, device, inode, size, and change and modification times.
    fn identity(&self, binary: &Path) -> String {
        use std::os::unix::fs::MetadataExt;
        let meta = &self.meta;
        format!(
            "{}\n{}\n{}:{}:{}:{}.{}:{}.{}",
            binary.display(),
            self.real.display(),
            meta.dev(),
            meta.ino(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec()
        )
    }
}

/// What `deploy/record-terraform-version.sh` writes as an image is built: the binary's
/// `version -json` output, with what identifies its file across the hosts the image runs on (its
/// real path, size, and modification time in seconds, which an image's layers keep; device,
/// inode and change time are the host's own).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Recorded {
    binary: PathBuf,
    size: u64,
    mtime: i64,
    version: serde_json::Value,
}

/// The `version -json` output `file` records for `binary`, while `binary` is still the file it
/// was recorded from (`found`); `None` (and the binary is run) otherwise, with a warning:
/// whoever set `TERRACE_TERRAFORM_VERSION_FILE` meant it to be used.
fn recorded(file: &Path, binary: &Path, found: &BinaryFile) -> Option<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let warn = |why: String| {
        tracing::warn!(
            record = %file.display(),
            "cannot use the recorded terraform version ({why}): terraform is asked instead \
             (record it again with deploy/record-terraform-version.sh, or unset \
             TERRACE_TERRAFORM_VERSION_FILE)"
        );
        None
    };
    let record: Recorded = match std::fs::read(file) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(record) => record,
            Err(e) => return warn(format!("not a record: {e}")),
        },
        Err(e) => return warn(e.to_string()),
    };
    let (real, meta) = (&found.real, &found.meta);
    if record.binary != *real || record.size != meta.len() || record.mtime != meta.mtime() {
        return warn(format!(
            "it is of {} ({} bytes, modified at {}), not of {} ({} bytes, modified at {})",
            record.binary.display(),
            record.size,
            record.mtime,
            real.display(),
            meta.len(),
            meta.mtime()
        ));
    }
    let output = serde_json::to_vec(&record.version).ok()?;
    // A version that cannot be read is a miss: terraform is asked. One below the floor is
    // refused from the record by the caller, as it would be from terraform's own answer.
    if let Err(e @ ClientError::Unreadable { .. }) = parse(binary, &output) {
        return warn(e.to_string());
    }
    tracing::debug!(record = %file.display(), "terraform's version, as recorded");
    Some(output)
}

/// Where one binary's `version -json` answer is kept, and what makes it still valid.
struct CacheEntry {
    path: PathBuf,
    /// The binary's identity; the entry is used only when it is the same.
    identity: String,
}

impl CacheEntry {
    fn new(dir: &Path, identity: String) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        identity.hash(&mut hasher);
        Self {
            path: dir.join(format!("client-{:016x}.json", hasher.finish())),
            identity,
        }
    }

    fn read(&self) -> Option<Vec<u8>> {
        let saved: CachedVersion = serde_json::from_slice(&std::fs::read(&self.path).ok()?).ok()?;
        (saved.identity == self.identity).then(|| saved.output.into_bytes())
    }

    /// Best effort: written whole (a temporary file renamed into place) or not at all.
    fn write(&self, output: &[u8]) {
        let Ok(output) = std::str::from_utf8(output) else {
            return;
        };
        let saved = CachedVersion {
            identity: self.identity.clone(),
            output: output.to_owned(),
        };
        let written = (|| {
            let dir = self.path.parent().expect("an entry is in its folder");
            std::fs::create_dir_all(dir)?;
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            std::io::Write::write_all(&mut tmp, &serde_json::to_vec(&saved)?)?;
            tmp.persist(&self.path)?;
            std::io::Result::Ok(())
        })();
        if let Err(e) = written {
            tracing::debug!(path = %self.path.display(), error = %e, "could not remember terraform's version");
        }
    }
}

#[derive(Serialize, Deserialize)]
struct CachedVersion {
    identity: String,
    output: String,
}

/// The file `binary` names: itself when it has a folder, else the first executable file of
/// that name on `PATH`, as the process is started.
fn resolve(binary: &Path) -> Option<PathBuf> {
    resolve_in(binary, &std::env::var_os("PATH")?)
}

fn resolve_in(binary: &Path, path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if binary.components().count() > 1 {
        return Some(binary.to_owned());
    }
    std::env::split_paths(path)
        .map(|dir| dir.join(binary))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
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

    /// A fake client that prints `version` and counts its runs in `<dir>/runs`.
    fn fake_client(dir: &Path, version: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("terraform");
        let script = format!(
            "#!/bin/sh\necho x >> '{}'\necho '{{\"terraform_version\":\"{version}\",\"platform\":\"linux_amd64\",\"provider_selections\":{{}}}}'\n",
            dir.join("runs").display()
        );
        let tmp = dir.join("terraform.tmp");
        std::fs::write(&tmp, script).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &bin).unwrap();
        bin
    }

    fn runs(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn a_cached_version_is_used_while_the_binary_is_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let config = TerraformConfig {
            binary: fake_client(dir.path(), "1.11.4"),
            ..TerraformConfig::default()
        };
        // Each `Answers` is a process of its own.
        async fn probe(
            config: &TerraformConfig,
            cache: Option<&Path>,
        ) -> Result<Client, ClientError> {
            Answers::default().probe(config, cache).await
        }
        let first = probe(&config, Some(&cache)).await.unwrap();
        assert_eq!(first.version, "1.11.4");
        assert_eq!(runs(dir.path()), 1);
        let again = probe(&config, Some(&cache)).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(runs(dir.path()), 1, "the cached answer was not used");

        // Another binary at the same path (an upgrade, a downgrade) is read again.
        std::thread::sleep(Duration::from_millis(20));
        fake_client(dir.path(), "0.15.0-rc2");
        let err = probe(&config, Some(&cache)).await.unwrap_err();
        assert!(matches!(err, ClientError::Unsupported { .. }), "{err}");
        assert_eq!(runs(dir.path()), 2);
        // A refused version is refused from the cache too, without running it.
        let err = probe(&config, Some(&cache)).await.unwrap_err();
        assert!(matches!(err, ClientError::Unsupported { .. }), "{err}");
        assert_eq!(runs(dir.path()), 2);

        // A damaged cache is a miss, not an error.
        for entry in std::fs::read_dir(&cache).unwrap() {
            std::fs::write(entry.unwrap().path(), b"{not json").unwrap();
        }
        fake_client(dir.path(), "1.11.4");
        let client = probe(&config, Some(&cache)).await.unwrap();
        assert_eq!(client.version, "1.11.4");
        assert_eq!(runs(dir.path()), 3);
        // Without a cache folder every process runs the binary.
        probe(&config, None).await.unwrap();
        assert_eq!(runs(dir.path()), 4);
    }

    /// Records `binary`'s answer with the images' script; the record's path.
    fn record(dir: &Path, binary: &Path) -> PathBuf {
        let out = dir.join("terraform-version.json");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/record-terraform-version.sh");
        let status = std::process::Command::new(script)
            .arg(binary)
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success());
        out
    }

    #[tokio::test]
    async fn a_recorded_version_is_used_while_the_binary_is_the_recorded_file() {
        let dir = tempfile::tempdir().unwrap();
        let binary = fake_client(dir.path(), "1.11.4");
        let file = record(dir.path(), &binary);
        assert_eq!(runs(dir.path()), 1, "the script asked the binary");
        let config = TerraformConfig {
            binary,
            version_record: Some(file.clone()),
            ..TerraformConfig::default()
        };
        let probe = || async { Answers::default().probe(&config, None).await };
        assert_eq!(probe().await.unwrap().version, "1.11.4");
        assert_eq!(runs(dir.path()), 1, "the record was not used");

        // A record that says another version is believed while the file is the same one.
        let mut recorded: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        recorded["version"]["terraform_version"] = "1.11.9".into();
        std::fs::write(&file, recorded.to_string()).unwrap();
        assert_eq!(probe().await.unwrap().version, "1.11.9");
        // A version below the floor is refused from it, without running terraform.
        recorded["version"]["terraform_version"] = "1.4.7".into();
        std::fs::write(&file, recorded.to_string()).unwrap();
        let err = probe().await.unwrap_err();
        assert!(matches!(err, ClientError::Unsupported { .. }), "{err}");
        assert_eq!(runs(dir.path()), 1);

        // Of another file (by path, size or time), unreadable, or missing: terraform is asked.
        let mut tries = 1;
        for (key, value) in [
            ("binary", serde_json::json!("/opt/terrace/bin/terraform")),
            (
                "size",
                recorded["size"].as_u64().unwrap().saturating_add(1).into(),
            ),
            ("mtime", (recorded["mtime"].as_i64().unwrap() - 1).into()),
        ] {
            let mut other = recorded.clone();
            other[key] = value;
            std::fs::write(&file, other.to_string()).unwrap();
            assert_eq!(probe().await.unwrap().version, "1.11.4", "{key}");
            tries += 1;
            assert_eq!(
                runs(dir.path()),
                tries,
                "a record of another {key} was used"
            );
        }
        for damaged in [&b"{not json"[..], br#"{"binary":"x","size":1,"mtime":1}"#] {
            std::fs::write(&file, damaged).unwrap();
            assert_eq!(probe().await.unwrap().version, "1.11.4");
            tries += 1;
            assert_eq!(runs(dir.path()), tries);
        }
        std::fs::remove_file(&file).unwrap();
        assert_eq!(probe().await.unwrap().version, "1.11.4");
        assert_eq!(runs(dir.path()), tries + 1);

        // Another binary at the recorded path (an upgrade) is asked, not the record.
        let file = record(dir.path(), &config.binary);
        std::thread::sleep(Duration::from_millis(1100));
        fake_client(dir.path(), "1.12.10");
        assert_eq!(probe().await.unwrap().version, "1.12.10");
        assert_eq!(runs(dir.path()), tries + 3);
        assert!(file.exists());
    }

    #[tokio::test]
    async fn a_process_reads_the_client_once_however_many_ask() {
        let dir = tempfile::tempdir().unwrap();
        let config = TerraformConfig {
            binary: fake_client(dir.path(), "1.11.4"),
            ..TerraformConfig::default()
        };
        let answers = Answers::default();
        // Jobs that ask at once (a warm-up and the first job) share one read.
        let (a, b) = tokio::join!(answers.probe(&config, None), answers.probe(&config, None));
        assert_eq!(a.unwrap(), b.unwrap());
        assert_eq!(runs(dir.path()), 1);
        let later = answers.probe(&config, None).await.unwrap();
        assert_eq!(later.version, "1.11.4");
        assert_eq!(runs(dir.path()), 1, "a later job read the client again");

        // Another binary at the same path is read again.
        std::thread::sleep(Duration::from_millis(20));
        fake_client(dir.path(), "1.12.0");
        let upgraded = answers.probe(&config, None).await.unwrap();
        assert_eq!(upgraded.version, "1.12.0");
        assert_eq!(runs(dir.path()), 2);

        // An answer that cannot be read is not kept: the next job asks again.
        std::thread::sleep(Duration::from_millis(20));
        fake_client(dir.path(), "one.two");
        for tries in [3, 4] {
            let err = answers.probe(&config, None).await.unwrap_err();
            assert!(matches!(err, ClientError::Unreadable { .. }), "{err}");
            assert_eq!(runs(dir.path()), tries);
        }
    }

    #[test]
    fn a_bare_name_is_the_first_executable_of_that_name_on_the_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        for d in [&a, &b, &c] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(a.join("terraform"), "not executable").unwrap();
        std::fs::write(b.join("terraform"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(b.join("terraform"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let path = std::env::join_paths([&c, &a, &b]).unwrap();
        assert_eq!(
            resolve_in(Path::new("terraform"), &path),
            Some(b.join("terraform"))
        );
        assert_eq!(resolve_in(Path::new("tofu"), &path), None);
        assert_eq!(
            resolve_in(Path::new("./terraform"), &path),
            Some(PathBuf::from("./terraform"))
        );
    }
}
