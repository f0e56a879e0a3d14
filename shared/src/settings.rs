//! Settings every function reads from its environment (set by its deployment), and the helpers
//! that read them.

use std::path::PathBuf;
use std::time::Duration;

use crate::runner::RunnerConfig;
use crate::terraform::TerraformConfig;

/// A variable's value; unset and blank are the same.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A comma-separated list.
pub fn list(name: &str) -> Vec<String> {
    var(name)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A setting that is missing, malformed, or at odds with another; each names its variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}={value:?} is not {expected}")]
    Malformed {
        name: String,
        value: String,
        expected: &'static str,
    },
    /// Anything else, as a sentence that names the variable and the fix.
    #[error("{0}")]
    Invalid(String),
}

impl From<String> for ConfigError {
    fn from(why: String) -> Self {
        ConfigError::Invalid(why)
    }
}

impl From<&str> for ConfigError {
    fn from(why: &str) -> Self {
        ConfigError::Invalid(why.to_owned())
    }
}

/// A number of seconds, `default` when unset.
///
/// # Errors
/// A value that is not a number, named.
pub fn seconds(name: &str, default: u64) -> Result<Duration, ConfigError> {
    match var(name) {
        None => Ok(Duration::from_secs(default)),
        Some(v) => v
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| ConfigError::Malformed {
                name: name.to_owned(),
                value: v,
                expected: "a number of seconds",
            }),
    }
}

/// What runs a job, in every function.
#[derive(Clone, Debug)]
pub struct Runtime {
    /// `TERRACE_TEMPLATES` (default `/opt/terrace/templates`).
    pub templates: PathBuf,
    /// `TERRACE_TERRAFORM`, `TERRACE_PLUGIN_CACHE`, `TERRACE_TF_CLI_CONFIG`, `TERRACE_PASS_ENV`,
    /// `TERRACE_GRACE` (30 s).
    pub terraform: TerraformConfig,
    /// `TERRACE_LEASE_TTL` (60 s).
    pub lease_ttl: Duration,
    /// `TERRACE_TASK_LEASE_WAIT` (240 s): how long a handed-off task waits for a busy
    /// workspace before its job goes back on the queue.
    pub task_lease_wait: Duration,
    /// `TERRACE_CACHE_DIR`: where terraform's `version -json` answer is kept between jobs
    /// (none: read once per process).
    pub client_cache: Option<PathBuf>,
    /// Print each job's log on the console as well (the functions log JSON instead).
    pub console: bool,
    /// `TERRACE_MAX_STATE_BYTES` (256 MiB): the largest state the state server accepts.
    pub max_state_bytes: usize,
}

impl Runtime {
    /// Reads the settings.
    ///
    /// # Errors
    /// A setting that is present but malformed, named.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self {
            templates: var("TERRACE_TEMPLATES")
                .unwrap_or_else(|| "/opt/terrace/templates".into())
                .into(),
            terraform: TerraformConfig {
                binary: var("TERRACE_TERRAFORM")
                    .unwrap_or_else(|| "terraform".into())
                    .into(),
                plugin_cache: var("TERRACE_PLUGIN_CACHE").map(Into::into),
                cli_config: var("TERRACE_TF_CLI_CONFIG").map(Into::into),
                pass_env: list("TERRACE_PASS_ENV"),
                env: Vec::new(),
                settings: Vec::new(),
                late_secrets: crate::redact::LateSecrets::default(),
                grace: seconds("TERRACE_GRACE", 30)?,
            },
            lease_ttl: seconds("TERRACE_LEASE_TTL", 60)?,
            task_lease_wait: seconds("TERRACE_TASK_LEASE_WAIT", 240)?,
            client_cache: var("TERRACE_CACHE_DIR").map(Into::into),
            console: false,
            max_state_bytes: match var("TERRACE_MAX_STATE_BYTES") {
                None => crate::state_server::MAX_STATE_BYTES,
                Some(v) => v.parse().map_err(|_| ConfigError::Malformed {
                    name: "TERRACE_MAX_STATE_BYTES".into(),
                    value: v,
                    expected: "a number of bytes",
                })?,
            },
        })
    }

    /// A runner's settings: these, with the function's own defaults for the rest.
    pub fn runner_config(&self) -> RunnerConfig {
        RunnerConfig {
            terraform: self.terraform.clone(),
            lease_ttl: self.lease_ttl,
            templates: Some(self.templates.clone()),
            client_cache: self.client_cache.clone(),
            console: self.console,
            max_state_bytes: self.max_state_bytes,
            ..RunnerConfig::default()
        }
    }
}
