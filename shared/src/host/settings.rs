//! Settings every function reads from its environment (set by its deployment), and the helpers
//! that read them.

use std::path::PathBuf;
use std::time::Duration;

use state_backends::StateStore;

use crate::job::template::source::{Location, Published, Templates};
use crate::run::runner::RunnerConfig;
use crate::run::terraform::TerraformConfig;

mod terraform;
use terraform::terraform_user;
pub use terraform::{cpu_limit, job_limits, memory_limit};

/// The variables that hold a cloud function's own credentials, or lead to them (an endpoint,
/// a token file, the runner's signing key): a function refuses to pass any of them to terraform, which gets the
/// customer's access from the runner instead.
pub const RUNNER_CREDENTIALS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "TERRACE_SIGNING_KEY",
    "AWS_LAMBDA_RUNTIME_API",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "MSI_ENDPOINT",
    "MSI_SECRET",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AZURE_FEDERATED_TOKEN_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE",
    "CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE",
];

/// An on/off setting: `1` or `true` is on; anything else, unset or blank, is off.
pub fn flag(name: &str) -> bool {
    var(name).is_some_and(|v| v == "1" || v == "true")
}

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

/// The keys states are sealed with (see [`state_backends::sealed`]): `key_file` seals, `old`
/// (after a rotation) still open what they sealed. None without a key file.
///
/// # Errors
/// A key file that cannot be read or is not a key, named by its setting; old keys without a
/// current one.
pub fn keyring(
    key_file: Option<&std::path::Path>,
    old: &[PathBuf],
) -> Result<Option<state_backends::sealed::Keyring>, ConfigError> {
    use state_backends::sealed::{KeyFile, KeySource, Keyring};
    let read = |name: &str, path: &std::path::Path| {
        KeyFile::read(path)
            .map(|k| std::sync::Arc::new(k) as std::sync::Arc<dyn KeySource>)
            .map_err(|e| ConfigError::Invalid(format!("{name}: {e}")))
    };
    let Some(current) = key_file else {
        if old.is_empty() {
            return Ok(None);
        }
        return Err(
            "TERRACE_STATE_OLD_KEY_FILES needs TERRACE_STATE_KEY_FILE: the key new states are sealed with"
                .into(),
        );
    };
    let mut keys = Keyring::new(read("TERRACE_STATE_KEY_FILE", current)?);
    for path in old {
        keys.older.push(read("TERRACE_STATE_OLD_KEY_FILES", path)?);
    }
    Ok(Some(keys))
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

/// `TERRACE_CALL_TIMEOUT` ([`state_backends::CALL_TIMEOUT`], at least 1 s): how long one
/// attempt of a call to the store (and, in the AWS function, to any AWS service) may take before
/// its client gives it up and tries again.
///
/// # Errors
/// A value that is not a number of seconds, named.
pub fn call_timeout() -> Result<Duration, ConfigError> {
    Ok(seconds(
        "TERRACE_CALL_TIMEOUT",
        state_backends::CALL_TIMEOUT.as_secs(),
    )?
    .max(Duration::from_secs(1)))
}

/// `TERRACE_SIGNATURE_WINDOW`: how long after it was made a sender's signature is accepted
/// (24 h by default; never 0, which would refuse every signed job).
///
/// # Errors
/// A value that is not a whole number of seconds above 0.
pub fn signature_window() -> Result<Duration, ConfigError> {
    let window = seconds(
        "TERRACE_SIGNATURE_WINDOW",
        crate::job::signature::DEFAULT_WINDOW.as_secs(),
    )?;
    if window.is_zero() {
        return Err(ConfigError::Malformed {
            name: "TERRACE_SIGNATURE_WINDOW".into(),
            value: "0".into(),
            expected: "seconds above 0 (a window of 0 refuses every signed job)",
        });
    }
    Ok(window)
}

/// The policies plans are held to (`docs/policy.md`): the runner's set and each tenant's, as
/// the settings name them, then as [`Runtime::open_buckets`] loaded them.
#[derive(Clone, Debug, Default)]
pub struct PolicySettings {
    /// `TERRACE_POLICIES`: a folder, or a published set (`BUCKET_URL/NAME/VERSION`).
    pub source: Option<crate::run::policy::source::SetRef>,
    /// `TERRACE_POLICY_TIMEOUT` (10 s) and `TERRACE_POLICY_MEMORY_MB` (1024).
    pub bounds: crate::run::policy::Bounds,
    /// `TERRACE_POLICY_CACHE` (`/tmp/terrace/policies`): where published sets are fetched to.
    pub cache: PathBuf,
    /// The runner's set, once loaded.
    pub runner: Option<std::sync::Arc<crate::run::policy::Policies>>,
    /// Each tenant's set (named by its `policies` in the registry), with the runner's beside
    /// it, once loaded.
    pub tenants: std::collections::BTreeMap<String, std::sync::Arc<crate::run::policy::Policies>>,
}

impl PolicySettings {
    /// Reads the settings; nothing is loaded yet.
    ///
    /// # Errors
    /// A malformed bound or place, named.
    pub fn from_env() -> Result<Self, ConfigError> {
        use crate::run::policy::Bounds;
        let source = match var("TERRACE_POLICIES") {
            None => None,
            Some(text) => Some(
                crate::run::policy::source::SetRef::parse(&text)
                    .map_err(|why| ConfigError::Invalid(format!("TERRACE_POLICIES: {why}")))?,
            ),
        };
        let time = seconds("TERRACE_POLICY_TIMEOUT", Bounds::default().time.as_secs())?;
        if time > Duration::from_secs(600) {
            return Err(ConfigError::Malformed {
                name: "TERRACE_POLICY_TIMEOUT".into(),
                value: time.as_secs().to_string(),
                expected: "a number of seconds from 1 to 600",
            });
        }
        let memory_mb = match var("TERRACE_POLICY_MEMORY_MB") {
            None => Bounds::default().memory_bytes >> 20,
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|mb| (64..=1 << 20).contains(mb))
                .ok_or(ConfigError::Malformed {
                    name: "TERRACE_POLICY_MEMORY_MB".into(),
                    value: v,
                    expected: "a number of MiB from 64 to 1048576",
                })?,
        };
        Ok(Self {
            source,
            bounds: Bounds {
                time: time.max(Duration::from_secs(1)),
                memory_bytes: memory_mb << 20,
            },
            cache: var("TERRACE_POLICY_CACHE")
                .unwrap_or_else(|| "/tmp/terrace/policies".into())
                .into(),
            runner: None,
            tenants: std::collections::BTreeMap::new(),
        })
    }

    /// Loads the runner's set and each tenant's in `tenant_sets` (tenant → the place its
    /// registry entry names), reaching buckets with `open`.
    ///
    /// # Errors
    /// A set that cannot be read or fetched, or does not parse, named with its setting.
    pub async fn load<F, Opened>(
        &mut self,
        tenant_sets: &std::collections::BTreeMap<String, String>,
        open: &F,
    ) -> Result<(), ConfigError>
    where
        F: Fn(Location) -> Opened,
        Opened: std::future::Future<
                Output = Result<std::sync::Arc<dyn state_backends::objects::Bucket>, String>,
            >,
    {
        use crate::run::policy::Policies;
        use crate::run::policy::source::SetRef;
        if tenant_sets.is_empty() && self.source.is_none() {
            return Ok(());
        }
        let evaluator = std::env::current_exe().map_err(|e| {
            ConfigError::Invalid(format!("TERRACE_POLICIES: this binary's path: {e}"))
        })?;
        let bounds = self.bounds;
        let policies = |set| {
            std::sync::Arc::new(Policies {
                set,
                bounds,
                evaluator: Some(evaluator.clone()),
            })
        };
        let runner = match &self.source {
            Some(source) => Some(self.read(source, "TERRACE_POLICIES", open).await?),
            None => None,
        };
        for (tenant, text) in tenant_sets {
            let setting = format!(
                "{} tenant {tenant:?} {}",
                super::tenants::SETTING,
                super::tenants::POLICIES_FIELD
            );
            let source = SetRef::parse(text)
                .map_err(|why| ConfigError::Invalid(format!("{setting}: {why}")))?;
            let own = self.read(&source, &setting, open).await?;
            let set = match &runner {
                Some(runner) => runner.with(&own, &source.label()),
                None => own,
            };
            self.tenants.insert(tenant.clone(), policies(set));
        }
        self.runner = runner.map(policies);
        Ok(())
    }

    async fn read<F, Opened>(
        &self,
        source: &crate::run::policy::source::SetRef,
        setting: &str,
        open: &F,
    ) -> Result<crate::run::policy::PolicySet, ConfigError>
    where
        F: Fn(Location) -> Opened,
        Opened: std::future::Future<
                Output = Result<std::sync::Arc<dyn state_backends::objects::Bucket>, String>,
            >,
    {
        use crate::run::policy::source::{SetRef, fetch};
        let read = match source {
            SetRef::Folder(path) => crate::run::policy::PolicySet::load(path),
            SetRef::Published {
                base,
                location,
                name,
                version,
            } => {
                let bucket = open(location.clone())
                    .await
                    .map_err(|why| ConfigError::Invalid(format!("{setting}={source}: {why}")))?;
                fetch(
                    bucket,
                    &prefix_of(location),
                    base,
                    (name, version),
                    &self.cache,
                )
                .await
            }
        };
        read.map_err(|e| ConfigError::Invalid(format!("{setting}: {e}")))
    }
}

/// The prefix a bucket location names (none for a folder).
fn prefix_of(location: &Location) -> String {
    match location {
        Location::S3 { prefix, .. }
        | Location::Gcs { prefix, .. }
        | Location::Azure { prefix, .. } => prefix.clone(),
        Location::Folder(_) => String::new(),
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
    /// `TERRACE_TEMPLATES` (default `/opt/terrace/templates`): a folder, or a bucket whose
    /// published templates are copied into `TERRACE_TEMPLATE_CACHE` (default
    /// `/tmp/terrace/templates`) as jobs need them.
    pub templates: Templates,
    /// The bucket `TERRACE_TEMPLATES` names, until the function opens it with its own
    /// identity ([`Runtime::open_buckets`]).
    pub templates_bucket: Option<Location>,
    /// `TERRACE_PRICE_BOOKS` (default `/opt/terrace/price-books`): plans are estimated when the
    /// folder exists.
    pub price_books: PathBuf,
    /// `TERRACE_TERRAFORM`, `TERRACE_PLUGIN_CACHE`, `TERRACE_TF_CLI_CONFIG`,
    /// `TERRACE_TERRAFORM_VERSION_FILE`, `TERRACE_PASS_ENV`, `TERRACE_GRACE` (30 s).
    pub terraform: TerraformConfig,
    /// `TERRACE_LEASE_TTL` (60 s).
    pub lease_ttl: Duration,
    /// `TERRACE_PLAN_TTL` (86400 s): how long a plan job's plan may wait for its approval.
    pub plan_ttl: Duration,
    /// [`call_timeout`]: one attempt of a store call.
    pub call_timeout: Duration,
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
    /// `TERRACE_DRIFT_PER_TENANT` (100): the most workspaces of one tenant a drift sweep
    /// checks; the others wait for later sweeps, in turn ([`crate::sweeps::drift::plan`]).
    pub drift_per_tenant: usize,
    /// `TERRACE_METRICS` (`emf`, `json` or `off`; the function's default): one metrics record
    /// per job on stderr.
    pub metrics: Option<crate::run::metrics::Format>,
    /// `TERRACE_STATE_KEY_FILE` and `TERRACE_STATE_OLD_KEY_FILES`: the keys states are sealed
    /// with before they leave the runner (none: states are stored as terraform wrote them).
    pub keys: Option<state_backends::sealed::Keyring>,
    /// Where this runner runs (`aws`, `gcp`, `azure`, `local`): which of a template's
    /// per-cloud `defaults` apply.
    pub cloud: Option<&'static str>,
    /// `TERRACE_OUTPUTS_RECIPIENT`: the platform's age key (`age1…`) sensitive outputs are
    /// sealed to, for tenants the registry gives none (`docs/outputs.md`).
    pub outputs_recipient: Option<crate::run::sealed_outputs::OutputsRecipient>,
    /// `TERRACE_SIGNATURE_WINDOW` (86400 s): how long after it was made a sender's signature
    /// is accepted (`docs/signing.md`).
    pub signature_window: Duration,
    /// `TERRACE_SIGNING_KEY` (PKCS#8 PEM, or the path of a file holding it): the runner's own
    /// sender key, which signs the
    /// drift checks its sweep queues for tenants that take only signed jobs.
    pub signing_key: Option<std::sync::Arc<crate::job::signature::SenderSecret>>,
    /// A live copy of each job's log besides the stored one (none from the environment: a
    /// self-hosted worker's log exchange sets it).
    pub log_tap: Option<std::sync::Arc<dyn crate::run::logs::LogTap>>,
    /// The policies every plan is held to (`docs/policy.md`), loaded by
    /// [`Runtime::open_buckets`].
    pub policy: PolicySettings,
}

impl Runtime {
    /// Reads the settings.
    ///
    /// # Errors
    /// A setting that is present but malformed, named.
    pub fn from_env() -> Result<Self, ConfigError> {
        let who = terraform_user(false)?;
        let location = Location::parse(
            &var("TERRACE_TEMPLATES").unwrap_or_else(|| "/opt/terrace/templates".into()),
        )
        .map_err(|why| ConfigError::Invalid(format!("TERRACE_TEMPLATES: {why}")))?;
        let (templates, templates_bucket) = match location {
            Location::Folder(path) => (Templates::folder(path), None),
            bucket => (
                Templates::folder(
                    var("TERRACE_TEMPLATE_CACHE")
                        .unwrap_or_else(|| "/tmp/terrace/templates".into()),
                ),
                Some(bucket),
            ),
        };
        let mut runtime = Self {
            templates,
            templates_bucket,
            price_books: var("TERRACE_PRICE_BOOKS")
                .unwrap_or_else(|| "/opt/terrace/price-books".into())
                .into(),
            terraform: TerraformConfig {
                binary: var("TERRACE_TERRAFORM")
                    .unwrap_or_else(|| "terraform".into())
                    .into(),
                plugin_cache: var("TERRACE_PLUGIN_CACHE").map(Into::into),
                cli_config: var("TERRACE_TF_CLI_CONFIG").map(Into::into),
                version_record: var("TERRACE_TERRAFORM_VERSION_FILE").map(Into::into),
                pass_env: list("TERRACE_PASS_ENV"),
                env: Vec::new(),
                settings: Vec::new(),
                late_secrets: crate::job::redact::LateSecrets::default(),
                grace: seconds("TERRACE_GRACE", 30)?,
                user: None,
                per_job_users: false,
                shared_user: crate::run::terraform::SharedUser::Unguarded,
                limits: job_limits()?,
                job_user: None,
                backend: Vec::new(),
            },
            outputs_recipient: match var("TERRACE_OUTPUTS_RECIPIENT") {
                None => None,
                Some(text) => Some(text.parse().map_err(|why| {
                    ConfigError::Invalid(format!(
                        "TERRACE_OUTPUTS_RECIPIENT {why}: {}",
                        crate::run::sealed_outputs::RECIPIENT_FIX
                    ))
                })?),
            },
            signature_window: signature_window()?,
            log_tap: None,
            policy: PolicySettings::from_env()?,
            signing_key: match var("TERRACE_SIGNING_KEY") {
                None => None,
                // The PEM itself (from a secret store), or the path of a file holding it.
                Some(pem) if pem.trim_start().starts_with("-----BEGIN") => {
                    Some(std::sync::Arc::new(
                        crate::job::signature::SenderSecret::from_pem(&pem).map_err(|why| {
                            ConfigError::Invalid(format!("TERRACE_SIGNING_KEY {why}"))
                        })?,
                    ))
                }
                Some(path) => {
                    let text = std::fs::read_to_string(path.trim()).map_err(|e| {
                        ConfigError::Invalid(format!(
                            // Not quoted: a key pasted in the wrong form would be.
                            "TERRACE_SIGNING_KEY: give the runner's signing key as PKCS#8 PEM or the path of a file holding it; as a path it cannot be read: {e}"
                        ))
                    })?;
                    let key =
                        crate::job::signature::SenderSecret::from_pem(&text).map_err(|why| {
                            ConfigError::Invalid(format!("TERRACE_SIGNING_KEY {why}"))
                        })?;
                    Some(std::sync::Arc::new(key))
                }
            },
            lease_ttl: seconds("TERRACE_LEASE_TTL", 60)?,
            plan_ttl: seconds(
                "TERRACE_PLAN_TTL",
                crate::run::plans::DEFAULT_PLAN_TTL.as_secs(),
            )?,
            call_timeout: call_timeout()?,
            task_lease_wait: seconds("TERRACE_TASK_LEASE_WAIT", 240)?,
            client_cache: var("TERRACE_CACHE_DIR").map(Into::into),
            console: false,
            metrics: match var("TERRACE_METRICS").as_deref() {
                None | Some("json") => Some(crate::run::metrics::Format::Json),
                Some("emf") => Some(crate::run::metrics::Format::Emf),
                Some("off") => None,
                Some(other) => {
                    return Err(ConfigError::Malformed {
                        name: "TERRACE_METRICS".into(),
                        value: other.into(),
                        expected: "emf, json or off",
                    });
                }
            },
            max_state_bytes: match var("TERRACE_MAX_STATE_BYTES") {
                None => crate::run::state_server::MAX_STATE_BYTES,
                Some(v) => v.parse().map_err(|_| ConfigError::Malformed {
                    name: "TERRACE_MAX_STATE_BYTES".into(),
                    value: v,
                    expected: "a number of bytes",
                })?,
            },
            drift_per_tenant: match var("TERRACE_DRIFT_PER_TENANT") {
                None => crate::sweeps::drift::PER_TENANT,
                Some(v) => v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(ConfigError::Malformed {
                        name: "TERRACE_DRIFT_PER_TENANT".into(),
                        value: v,
                        expected: "a number of workspaces, at least 1",
                    })?,
            },
            keys: None,
            cloud: None,
        };
        runtime.terraform.set_user(who);
        let old: Vec<PathBuf> = list("TERRACE_STATE_OLD_KEY_FILES")
            .into_iter()
            .map(PathBuf::from)
            .collect();
        runtime.keys = keyring(
            var("TERRACE_STATE_KEY_FILE").map(PathBuf::from).as_deref(),
            &old,
        )?;
        Ok(runtime)
    }

    /// What a cloud function (whose identity can reach every customer) requires of how
    /// terraform runs: as `nobody` when the runner is root (unless `TERRACE_TERRAFORM_USER`
    /// says otherwise), and with none of the function's own credentials passed through.
    ///
    /// # Errors
    /// `TERRACE_PASS_ENV` naming a credential, or a plugin cache terraform's user cannot be
    /// given.
    pub fn isolate_terraform(mut self) -> Result<Self, ConfigError> {
        if let Some(name) = self
            .terraform
            .pass_env
            .iter()
            .find(|n| RUNNER_CREDENTIALS.contains(&n.as_str()))
        {
            return Err(format!(
                "TERRACE_PASS_ENV names {name}, which holds or leads to this function's own credentials: remove it (terraform gets the customer's access from the runner, never the function's)"
            )
            .into());
        }
        // A function's container runs nothing but the function.
        self.terraform.serve_jobs(true)?;
        // A cache written by one job's user and run by another's would let a job plant code for
        // the next: with terraform as users of their own, providers come from a read-only
        // mirror (the images' `/opt/terrace/providers`, through `TERRACE_TF_CLI_CONFIG`).
        if let Some(cache) = &self.terraform.plugin_cache
            && (self.terraform.user.is_some() || self.terraform.per_job_users)
        {
            return Err(format!(
                "TERRACE_PLUGIN_CACHE={} cannot be shared by terraform's users: unset it and install the providers as a filesystem mirror named in TERRACE_TF_CLI_CONFIG (as the images do)",
                cache.display()
            )
            .into());
        }
        Ok(self)
    }

    /// `format` for the metrics records unless `TERRACE_METRICS` chose.
    #[must_use]
    pub fn metrics_default(mut self, format: crate::run::metrics::Format) -> Self {
        if var("TERRACE_METRICS").is_none() {
            self.metrics = Some(format);
        }
        self
    }

    /// Opens the bucket `TERRACE_TEMPLATES` names, if it names one, and loads the policy sets
    /// (the runner's, and those `tenant_sets` names for each tenant), with `open` (the
    /// function's own identity): `open` answers the bucket, or why this runner cannot read
    /// that kind of place.
    ///
    /// # Errors
    /// `open`'s refusal, or a policy set that cannot be read or does not parse, naming the
    /// setting: the function stops at start.
    pub async fn open_buckets<F, Opened>(
        &mut self,
        tenant_sets: &std::collections::BTreeMap<String, String>,
        open: F,
    ) -> Result<(), ConfigError>
    where
        F: Fn(Location) -> Opened,
        Opened: std::future::Future<
                Output = Result<std::sync::Arc<dyn state_backends::objects::Bucket>, String>,
            >,
    {
        if let Some(location) = self.templates_bucket.take() {
            let bucket = open(location.clone()).await.map_err(|why| {
                ConfigError::Invalid(format!("TERRACE_TEMPLATES={location}: {why}"))
            })?;
            self.templates = Templates::published(Published::new(
                bucket,
                &prefix_of(&location),
                self.templates.root().to_owned(),
                location.to_string(),
            ));
        }
        self.policy.load(tenant_sets, &open).await
    }

    /// This runtime on `cloud`, whose template defaults apply.
    #[must_use]
    pub fn on_cloud(mut self, cloud: &'static str) -> Self {
        self.cloud = Some(cloud);
        self
    }

    /// `store`, sealing states with this runtime's keys (and refusing sealed ones without).
    pub fn seal(&self, store: std::sync::Arc<dyn StateStore>) -> std::sync::Arc<dyn StateStore> {
        state_backends::sealed::SealedStore::wrap(store, self.keys.clone())
    }

    /// Starts reading terraform's version in the background (see
    /// [`crate::run::client::warm`]): a host calls it as it starts, before its first job.
    pub fn warm_client(&self) {
        crate::run::client::warm(&self.terraform, self.client_cache.clone());
    }

    /// A runner's settings: these, with the function's own defaults for the rest.
    pub fn runner_config(&self) -> RunnerConfig {
        RunnerConfig {
            terraform: self.terraform.clone(),
            lease_ttl: self.lease_ttl,
            plan_ttl: self.plan_ttl,
            templates: Some(self.templates.clone()),
            price_books: Some(self.price_books.clone()),
            client_cache: self.client_cache.clone(),
            console: self.console,
            max_state_bytes: self.max_state_bytes,
            metrics: self.metrics,
            outputs_recipient: self.outputs_recipient.clone(),
            log_tap: self.log_tap.clone(),
            policies: self.policy.runner.clone(),
            ..RunnerConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::terraform::{Who, user_from};
    use super::*;
    use crate::run::terraform::RunAs;

    #[test]
    fn a_function_running_as_root_gives_each_job_a_user_unless_told() {
        assert_eq!(user_from(None, true, 0).unwrap(), Who::PerJob);
        assert_eq!(
            user_from(None, true, 1000).unwrap(),
            Who::Runner,
            "not root: its own user"
        );
        assert_eq!(
            user_from(None, false, 0).unwrap(),
            Who::Runner,
            "the local runner: you"
        );
        assert_eq!(
            user_from(Some("1001:1002"), true, 0).unwrap(),
            Who::One(RunAs {
                uid: 1001,
                gid: 1002
            })
        );
        assert_eq!(
            user_from(Some("1001"), true, 0).unwrap(),
            Who::One(RunAs {
                uid: 1001,
                gid: 1001
            })
        );
        assert_eq!(user_from(Some("per-job"), false, 0).unwrap(), Who::PerJob);
        assert_eq!(user_from(Some("root"), true, 0).unwrap(), Who::Runner);
        let bad = user_from(Some("nobody"), true, 0).unwrap_err().to_string();
        assert!(
            bad.contains("TERRACE_TERRAFORM_USER") && bad.contains("UID[:GID]"),
            "{bad}"
        );
        let unswitchable = user_from(Some("per-job"), true, 1000)
            .unwrap_err()
            .to_string();
        assert!(
            unswitchable.contains("needs the runner to run as root"),
            "{unswitchable}"
        );
    }

    #[test]
    fn a_function_refuses_to_pass_its_own_credentials_to_terraform() {
        let mut runtime = Runtime {
            templates: Templates::folder(PathBuf::new()),
            templates_bucket: None,
            price_books: PathBuf::new(),
            keys: None,
            cloud: None,
            outputs_recipient: None,
            signature_window: Duration::from_secs(60),
            signing_key: None,
            log_tap: None,
            policy: PolicySettings::default(),
            terraform: TerraformConfig {
                pass_env: vec!["TESTCLOUD_ROOT".into(), "AWS_SECRET_ACCESS_KEY".into()],
                ..TerraformConfig::default()
            },
            lease_ttl: Duration::from_secs(60),
            plan_ttl: Duration::from_secs(3600),
            call_timeout: state_backends::CALL_TIMEOUT,
            task_lease_wait: Duration::from_secs(1),
            client_cache: None,
            console: false,
            metrics: None,
            max_state_bytes: 1,
            drift_per_tenant: 1,
        };
        let e = runtime.clone().isolate_terraform().unwrap_err().to_string();
        assert!(
            e.contains("TERRACE_PASS_ENV names AWS_SECRET_ACCESS_KEY"),
            "{e}"
        );
        runtime.terraform.pass_env = vec!["TESTCLOUD_ROOT".into()];
        assert!(runtime.clone().isolate_terraform().is_ok());
        // As root, jobs run as users of their own: a plugin cache they all write is refused.
        runtime.terraform.plugin_cache = Some("/tmp/terrace-plugin-cache-test".into());
        let cached = runtime.isolate_terraform();
        if nix::unistd::geteuid().is_root() {
            let e = cached.unwrap_err().to_string();
            assert!(e.contains("cannot be shared by terraform's users"), "{e}");
        } else {
            assert!(cached.is_ok());
        }
    }
}
