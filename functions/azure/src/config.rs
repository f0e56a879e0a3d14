//! The job's settings, from its environment (set by the deployment).

use std::time::Duration;

use shared::host::settings::{ConfigError, Runtime, list, seconds, var};
use shared::host::tenants::Tenants;

use crate::access::Target;

#[derive(Clone, Debug)]
pub struct Config {
    pub runtime: Runtime,
    /// `TERRACE_TENANTS`: each tenant's container, tenant ID and app registration (see
    /// `shared::host::tenants`).
    pub tenants: Tenants<Target>,
    /// `TERRACE_SWEEP_TENANTS`: the registered tenants a scheduled sweep covers (all when unset).
    pub sweep_tenants: Vec<String>,
    /// `TERRACE_QUEUE_URL`: the jobs queue (`https://ACCOUNT.queue.core.windows.net/QUEUE`).
    pub queue_url: String,
    /// `TERRACE_POISON_QUEUE_URL`: where messages that can never run go, with an error record
    /// (default: the jobs queue's URL with `-poison`, as Azure Functions names it).
    pub poison_queue_url: String,
    /// `TERRACE_RESULTS_QUEUE_URL`: where results and rejections are sent, when set.
    pub results_queue_url: Option<String>,
    /// `TERRACE_MAX_DEQUEUES` (5): a message received more often than this goes to the poison
    /// queue instead of running again.
    pub max_dequeues: i64,
    /// `TERRACE_VISIBILITY_TIMEOUT` (60 s): how long a received message stays invisible; it is
    /// extended every third of that while its job runs.
    pub visibility: Duration,
    /// `TERRACE_REPLICA_TIMEOUT` (1800 s): the Container Apps job's replica timeout. A job
    /// must finish within it, less `TERRACE_DEADLINE_MARGIN` (30 s).
    pub replica_timeout: Duration,
    pub margin: Duration,
    /// `TERRACE_RETRY_DELAY` (30 s): how long a message waits when it must run again but its
    /// trouble gives no time (a busy workspace gives its lease's).
    pub retry_delay: Duration,
    /// `TERRACE_AZURE_SAS`: a SAS appended to every storage URL, and no Entra ID credential at
    /// all: for an emulator only.
    pub sas: Option<String>,
    /// `TERRACE_MANAGED_IDENTITY_CLIENT_ID`: the job's user-assigned managed identity, if it
    /// has one (else the system-assigned one).
    pub managed_identity: Option<String>,
}

impl Config {
    /// Reads the settings.
    ///
    /// # Errors
    /// A missing or malformed setting, named.
    pub fn from_env() -> Result<Self, ConfigError> {
        let queue_url = var("TERRACE_QUEUE_URL").ok_or(
            "TERRACE_QUEUE_URL is not set: set it to the jobs queue's URL (https://ACCOUNT.queue.core.windows.net/QUEUE)",
        )?;
        let poison_queue_url =
            var("TERRACE_POISON_QUEUE_URL").unwrap_or_else(|| format!("{queue_url}-poison"));
        let max_dequeues = match var("TERRACE_MAX_DEQUEUES") {
            None => 5,
            Some(n) => n.parse::<i64>().ok().filter(|n| *n >= 1).ok_or(format!(
                "TERRACE_MAX_DEQUEUES={n:?} is not a count of 1 or more"
            ))?,
        };
        let visibility = seconds("TERRACE_VISIBILITY_TIMEOUT", 60)?;
        if visibility < Duration::from_secs(3) {
            return Err("TERRACE_VISIBILITY_TIMEOUT must be 3 s or more".into());
        }
        let sas = var("TERRACE_AZURE_SAS").map(|s| s.trim_start_matches('?').to_owned());
        let emulator = sas.is_some();
        Ok(Self {
            runtime: Runtime::from_env()?.isolate_terraform()?.on_cloud("azure"),
            tenants: Tenants::from_env(
                |t: &Target| {
                    t.check(emulator)
                        .into_iter()
                        .map(|(field, problem, fix)| format!("{field} {problem}: {fix}"))
                        .collect()
                },
                r#"{"acme": {"container_url": "https://ACCOUNT.blob.core.windows.net/states", "tenant_id": "…", "client_id": "…"}}"#,
            )?,
            sweep_tenants: list("TERRACE_SWEEP_TENANTS"),
            queue_url,
            poison_queue_url,
            results_queue_url: var("TERRACE_RESULTS_QUEUE_URL"),
            max_dequeues,
            visibility,
            replica_timeout: seconds("TERRACE_REPLICA_TIMEOUT", 1800)?,
            margin: seconds("TERRACE_DEADLINE_MARGIN", 30)?,
            retry_delay: seconds("TERRACE_RETRY_DELAY", 30)?,
            sas,
            managed_identity: var("TERRACE_MANAGED_IDENTITY_CLIENT_ID"),
        })
    }

    /// A storage URL as the clients get it: with the SAS, when there is one.
    pub fn storage_url(&self, url: &str) -> String {
        match &self.sas {
            Some(sas) if !url.contains('?') => format!("{url}?{sas}"),
            Some(sas) => format!("{url}&{sas}"),
            None => url.to_owned(),
        }
    }
}
