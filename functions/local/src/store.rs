//! `--store` / `TERRACE_STORE`: the store a command works on, named by a URL, so an operator
//! reaches a customer's bucket with the same commands as the local folder.
//!
//! | URL | store |
//! |---|---|
//! | `PATH` or `file://PATH` | a local folder |
//! | `s3://BUCKET[/PREFIX]` | S3, the lease in a DynamoDB table (`?lease_table=`) or a lock object |
//! | `gs://BUCKET[/PREFIX]` | Google Cloud Storage |
//! | `az://ACCOUNT/CONTAINER[/PREFIX]`, `https://ACCOUNT.blob.core.windows.net/CONTAINER[/PREFIX]` | Azure Blob Storage |
//!
//! Settings of the store go in the URL's query (`?lease_table=…&role_arn=…`), so one
//! `TERRACE_STORE` names it completely; credentials never do. They come from the usual places:
//! the AWS chain (environment, profile, instance or web identity), Google's application
//! default credentials, and for Azure a SAS in `AZURE_STORAGE_SAS_TOKEN`, `az login`, or a
//! managed identity. Emulators are reached with the settings the functions read
//! (`AWS_ENDPOINT_URL` with `TERRACE_S3_FORCE_PATH_STYLE`, `TERRACE_GCS_ENDPOINT` with
//! `TERRACE_GCS_ANONYMOUS`, an `http://HOST:PORT/ACCOUNT/CONTAINER` URL with a SAS).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use shared::job::template::source::Location;
use state_backends::StateStore;
use state_backends::objects::Bucket;
use state_backends::sealed::{Keyring, SealedStore};

/// A parsed `--store`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    Fs(PathBuf),
    S3(S3Url),
    Gcs(GcsUrl),
    Azure(AzureUrl),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    pub prefix: String,
    /// The DynamoDB lease table; without one, the lease is a lock object in the bucket.
    pub lease_table: Option<String>,
    /// A role to assume first (the customer's cross-account role).
    pub role_arn: Option<String>,
    pub external_id: Option<String>,
    pub region: Option<String>,
    /// SSE-KMS key for every object written.
    pub kms_key_id: Option<String>,
    /// A KMS key whose data keys seal every state before it leaves this machine.
    pub client_side_kms_key: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcsUrl {
    pub bucket: String,
    pub prefix: String,
    /// A service account to impersonate (the customer's).
    pub impersonate: Option<String>,
    pub kms_key: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AzureUrl {
    /// `https://ACCOUNT.blob.core.windows.net/CONTAINER`, or an emulator's
    /// `http://HOST:PORT/ACCOUNT/CONTAINER`; never with a SAS.
    pub container_url: String,
    pub prefix: String,
    pub identity: AzureIdentity,
}

/// Who reaches an Azure container when no SAS is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AzureIdentity {
    /// `az login` or `azd auth login`.
    DeveloperTools,
    /// The machine's managed identity; a user-assigned one by client id.
    Managed { client_id: Option<String> },
}

const STORES: &str =
    "a folder, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://ACCOUNT/CONTAINER/PREFIX";
/// Query names of an Azure SAS: a SAS in the URL would show in process listings and logs.
const SAS_FIELDS: [&str; 8] = ["sig", "sv", "se", "sp", "ss", "srt", "sr", "st"];

impl FromStr for StoreUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(format!("is empty: give {STORES}"));
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Self::Fs(PathBuf::from(text)));
        };
        if scheme == "file" {
            return Ok(Self::Fs(PathBuf::from(rest)));
        }
        if !matches!(scheme, "s3" | "gs" | "az" | "http" | "https") {
            return Err(format!("{scheme}:// is not a kind of store: give {STORES}"));
        }
        // Never the text itself in a refusal: it may carry a secret.
        let url = url::Url::parse(text)
            .map_err(|e| format!("the {scheme}:// URL cannot be read ({e}): give {STORES}"))?;
        let mut query = Query::of(&url)?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let path: Vec<String> = url
            .path()
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        let parsed = match scheme {
            "s3" => {
                let s3 = S3Url {
                    bucket: named(&host, "the bucket", "s3://BUCKET/PREFIX")?,
                    prefix: path.join("/"),
                    lease_table: query.take("lease_table")?,
                    role_arn: query.take("role_arn")?,
                    external_id: query.take("external_id")?,
                    region: query.take("region")?,
                    kms_key_id: query.take("kms_key_id")?,
                    client_side_kms_key: query.take("client_side_kms_key")?,
                };
                if s3.external_id.is_some() && s3.role_arn.is_none() {
                    return Err("external_id is for assuming a role: add role_arn=… too".into());
                }
                if let Some(role) = &s3.role_arn {
                    let parts: Vec<&str> = role.splitn(6, ':').collect();
                    let is_role = parts.len() == 6
                        && parts[..3] == ["arn", parts[1], "iam"]
                        && parts[5]
                            .strip_prefix("role/")
                            .is_some_and(|n| !n.is_empty());
                    if !is_role {
                        return Err(format!(
                            "role_arn {role:?} is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)"
                        ));
                    }
                }
                Self::S3(s3)
            }
            "gs" => Self::Gcs(GcsUrl {
                bucket: named(&host, "the bucket", "gs://BUCKET/PREFIX")?,
                prefix: path.join("/"),
                impersonate: query.take("impersonate")?,
                kms_key: query.take("kms_key")?,
            }),
            _ => {
                if let Some(field) = SAS_FIELDS.iter().find(|f| query.has(f)) {
                    return Err(format!(
                        "the URL carries a SAS (its `{field}` field): set the SAS in \
                         AZURE_STORAGE_SAS_TOKEN instead, as a URL shows in process listings and logs"
                    ));
                }
                let host_port = match url.port() {
                    Some(port) => format!("{host}:{port}"),
                    None => host.clone(),
                };
                let (container_url, prefix) =
                    shared::job::template::source::azure_container(scheme, &host_port, &path)?;
                let client_id = query.take("client_id")?;
                let identity = match query.take("identity")?.as_deref() {
                    None | Some("cli") if client_id.is_none() => AzureIdentity::DeveloperTools,
                    None | Some("managed") => AzureIdentity::Managed { client_id },
                    Some("cli") => {
                        return Err(
                            "client_id is for a managed identity: use identity=managed".into()
                        );
                    }
                    Some(other) => {
                        return Err(format!("identity={other} is not one: use cli or managed"));
                    }
                };
                Self::Azure(AzureUrl {
                    container_url,
                    prefix,
                    identity,
                })
            }
        };
        query.finish()?;
        Ok(parsed)
    }
}

fn named(value: &str, what: &str, form: &str) -> Result<String, String> {
    if value.is_empty() {
        Err(format!("{what} is missing: {form}"))
    } else {
        Ok(value.to_owned())
    }
}

/// A URL's query: each setting once, none unknown, none empty.
struct Query(BTreeMap<String, String>);

impl Query {
    fn of(url: &url::Url) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for (k, v) in url.query_pairs() {
            if map.insert(k.to_string(), v.to_string()).is_some() {
                return Err(format!("{k} is given twice in the URL's query"));
            }
        }
        Ok(Self(map))
    }

    fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    fn take(&mut self, name: &str) -> Result<Option<String>, String> {
        match self.0.remove(name) {
            Some(v) if v.trim().is_empty() => Err(format!(
                "{name} is empty in the URL's query: leave it out or give it a value"
            )),
            v => Ok(v),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(k) => Err(format!(
                "{k} is not a setting of this store (s3: lease_table, role_arn, external_id, \
                 region, kms_key_id, client_side_kms_key; gs: impersonate, kms_key; az: identity, \
                 client_id)"
            )),
        }
    }
}

impl StoreUrl {
    /// Where the store is, without its settings: the place a templates URL names too.
    pub fn location(&self) -> Location {
        match self {
            Self::Fs(path) => Location::Folder(path.clone()),
            Self::S3(s) => Location::S3 {
                bucket: s.bucket.clone(),
                prefix: s.prefix.clone(),
            },
            Self::Gcs(g) => Location::Gcs {
                bucket: g.bucket.clone(),
                prefix: g.prefix.clone(),
            },
            Self::Azure(a) => Location::Azure {
                container_url: a.container_url.clone(),
                prefix: a.prefix.clone(),
            },
        }
    }
}

impl fmt::Display for StoreUrl {
    /// The store as people read it in messages (settings left out; never a secret).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.location().fmt(f)
    }
}

#[cfg(not(all(feature = "aws", feature = "gcp", feature = "azure")))]
fn not_built(kind: &str, feature: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "this terrace was built without {kind} stores: build it with `--features {feature}`"
    )
}

/// Opens the store `url` names, with the credentials of this machine.
///
/// # Errors
/// Missing credentials or settings, or a store kind this build leaves out.
pub async fn open(url: &StoreUrl, keys: Option<Keyring>) -> anyhow::Result<Arc<dyn StateStore>> {
    let seal = |store: Arc<dyn StateStore>| SealedStore::wrap(store, keys.clone());
    match url {
        StoreUrl::Fs(path) => Ok(seal(Arc::new(state_backends::fs::FsStore::new(path)))),
        #[cfg(feature = "aws")]
        StoreUrl::S3(s3) => open_s3(s3, keys.clone()).await,
        #[cfg(not(feature = "aws"))]
        StoreUrl::S3(_) => Err(not_built("S3", "aws")),
        #[cfg(feature = "gcp")]
        StoreUrl::Gcs(gcs) => Ok(seal(Arc::new(gcs_store(gcs).await?))),
        #[cfg(not(feature = "gcp"))]
        StoreUrl::Gcs(_) => Err(not_built("GCS", "gcp")),
        #[cfg(feature = "azure")]
        StoreUrl::Azure(azure) => Ok(seal(Arc::new(azure_store(azure)?))),
        #[cfg(not(feature = "azure"))]
        StoreUrl::Azure(_) => Err(not_built("Azure", "azure")),
    }
}

/// The bucket `--to` names for `template publish` and `policy publish`; a folder or a URL that
/// is not one is told on stderr and answered with the usage exit code.
pub(crate) fn publish_target(to: &str) -> Result<StoreUrl, u8> {
    match to.parse() {
        Ok(StoreUrl::Fs(_)) => {
            eprintln!(
                "error: --to: give a bucket (s3://, gs://, az://); a folder needs no publishing"
            );
            Err(crate::exit::USAGE)
        }
        Ok(url) => Ok(url),
        Err(e) => {
            eprintln!("error: --to: {e}");
            Err(crate::exit::USAGE)
        }
    }
}

/// The bucket (or container) `url` names, and the prefix under it, for templates: with the
/// credentials of this machine.
///
/// # Errors
/// A folder, missing credentials or settings, or a kind this build leaves out.
pub async fn open_bucket(url: &StoreUrl) -> anyhow::Result<(Arc<dyn Bucket>, String)> {
    match url {
        StoreUrl::Fs(path) => anyhow::bail!("{} is a folder, not a bucket", path.display()),
        #[cfg(feature = "aws")]
        StoreUrl::S3(s3) => Ok((
            Arc::new(s3_store(s3).await?.0.into_bucket()),
            s3.prefix.clone(),
        )),
        #[cfg(not(feature = "aws"))]
        StoreUrl::S3(_) => Err(not_built("S3", "aws")),
        #[cfg(feature = "gcp")]
        StoreUrl::Gcs(gcs) => Ok((
            Arc::new(gcs_store(gcs).await?.into_bucket()),
            gcs.prefix.clone(),
        )),
        #[cfg(not(feature = "gcp"))]
        StoreUrl::Gcs(_) => Err(not_built("GCS", "gcp")),
        #[cfg(feature = "azure")]
        StoreUrl::Azure(azure) => Ok((
            Arc::new(azure_store(azure)?.into_bucket()),
            azure.prefix.clone(),
        )),
        #[cfg(not(feature = "azure"))]
        StoreUrl::Azure(_) => Err(not_built("Azure", "azure")),
    }
}

#[cfg(feature = "aws")]
async fn open_s3(s3: &S3Url, keys: Option<Keyring>) -> anyhow::Result<Arc<dyn StateStore>> {
    let (store, config) = s3_store(s3).await?;
    // With a client-side KMS key, it seals; the key files still open what they sealed.
    let keys = match &s3.client_side_kms_key {
        Some(key) => {
            let kms = Arc::new(state_backends::kms::KmsKey::new(&config, key));
            Some(Keyring::new(kms).then(keys))
        }
        None => keys,
    };
    Ok(SealedStore::wrap(Arc::new(store), keys))
}

/// The S3 store `s3` names, and the AWS settings it was made with.
#[cfg(feature = "aws")]
async fn s3_store(
    s3: &S3Url,
) -> anyhow::Result<(state_backends::s3::S3Store, aws_config::SdkConfig)> {
    use aws_config::{BehaviorVersion, Region};
    use state_backends::s3::{LeaseMode, S3Config, S3Store};
    let timeouts = state_backends::s3::timeouts(shared::host::settings::call_timeout()?);
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(timeouts);
    if let Some(region) = &s3.region {
        loader = loader.region(Region::new(region.clone()));
    }
    let mut config = loader.load().await;
    if config.region().is_none_or(|r| r.as_ref().trim().is_empty()) {
        anyhow::bail!(
            "{}: no AWS region: add ?region=… to the store URL or set AWS_REGION",
            StoreUrl::S3(s3.clone())
        );
    }
    if let Some(role) = &s3.role_arn {
        let user = std::env::var("USER").unwrap_or_else(|_| "operator".into());
        let session: String = format!("terrace-cli-{user}")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "+=,.@-_".contains(*c))
            .take(64)
            .collect();
        let mut provider = aws_config::sts::AssumeRoleProvider::builder(role)
            .session_name(session)
            .configure(&config);
        if let Some(id) = &s3.external_id {
            provider = provider.external_id(id);
        }
        let provider = provider.build().await;
        config = config
            .to_builder()
            .credentials_provider(aws_sdk_s3::config::SharedCredentialsProvider::new(provider))
            .build();
    }
    let store = S3Store::from_sdk(
        &config,
        shared::host::settings::flag("TERRACE_S3_FORCE_PATH_STYLE"),
        S3Config {
            bucket: s3.bucket.clone(),
            prefix: s3.prefix.clone(),
            lease: LeaseMode::from_table(s3.lease_table.clone()),
            kms_key_id: s3.kms_key_id.clone(),
        },
    )?;
    Ok((store, config))
}

#[cfg(feature = "gcp")]
async fn gcs_store(gcs: &GcsUrl) -> anyhow::Result<state_backends::gcs::GcsStore> {
    use google_cloud_auth::credentials;
    use state_backends::gcs::{GcsConfig, GcsStore};
    let endpoint = std::env::var("TERRACE_GCS_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| GcsConfig::ENDPOINT.to_owned());
    let credentials = if shared::host::settings::flag("TERRACE_GCS_ANONYMOUS") {
        credentials::anonymous::Builder::new().build()
    } else {
        let own = credentials::Builder::default().build().map_err(|e| {
            anyhow::anyhow!(
                "no Google credentials: run `gcloud auth application-default login` \
                 or set GOOGLE_APPLICATION_CREDENTIALS ({e})"
            )
        })?;
        match &gcs.impersonate {
            Some(sa) => credentials::impersonated::Builder::from_source_credentials(own)
                .with_target_principal(sa)
                .build()
                .map_err(|e| anyhow::anyhow!("cannot impersonate {sa}: {e}"))?,
            None => own,
        }
    };
    let call_timeout = shared::host::settings::call_timeout()?;
    let storage = google_cloud_storage::client::Storage::builder()
        .with_retry_policy(state_backends::gcs::retry_policy())
        .with_endpoint(&endpoint)
        .with_credentials(credentials.clone())
        .build()
        .await
        .map_err(|e| anyhow::anyhow!("cannot make a GCS client for {endpoint}: {e}"))?;
    Ok(GcsStore::new(
        storage,
        credentials,
        GcsConfig {
            bucket: gcs.bucket.clone(),
            prefix: gcs.prefix.clone(),
            kms_key: gcs.kms_key.clone(),
            endpoint,
            call_timeout,
        },
    ))
}

#[cfg(feature = "azure")]
fn azure_store(azure: &AzureUrl) -> anyhow::Result<state_backends::azure::AzureStore> {
    use azure_core::credentials::TokenCredential;
    use state_backends::azure::{AzureConfig, AzureStore};
    let sas = std::env::var("AZURE_STORAGE_SAS_TOKEN")
        .ok()
        .map(|s| s.trim().trim_start_matches('?').to_owned())
        .filter(|s| !s.is_empty());
    let (container_url, credential) = match sas {
        Some(sas) => (format!("{}?{sas}", azure.container_url), None),
        None if azure.container_url.starts_with("http://") => anyhow::bail!(
            "{}: a credential is never sent over plain http: for an emulator, set its SAS in \
             AZURE_STORAGE_SAS_TOKEN",
            StoreUrl::Azure(azure.clone())
        ),
        None => {
            let credential: Arc<dyn TokenCredential> = match &azure.identity {
                AzureIdentity::DeveloperTools => {
                    azure_identity::DeveloperToolsCredential::new(None)
                        .map_err(|e| anyhow::anyhow!("cannot use `az login`: {e}"))?
                }
                AzureIdentity::Managed { client_id } => {
                    let options = azure_identity::ManagedIdentityCredentialOptions {
                        user_assigned_id: client_id
                            .clone()
                            .map(azure_identity::UserAssignedId::ClientId),
                        ..Default::default()
                    };
                    azure_identity::ManagedIdentityCredential::new(Some(options))
                        .map_err(|e| anyhow::anyhow!("this machine has no managed identity: {e}"))?
                }
            };
            (azure.container_url.clone(), Some(credential))
        }
    };
    AzureStore::new(
        &AzureConfig {
            container_url,
            prefix: azure.prefix.clone(),
            call_timeout: shared::host::settings::call_timeout()?,
        },
        credential,
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", StoreUrl::Azure(azure.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> StoreUrl {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str) -> String {
        s.parse::<StoreUrl>().expect_err(s)
    }

    #[test]
    fn a_path_or_file_url_is_a_folder() {
        assert_eq!(parse(".terrace"), StoreUrl::Fs(".terrace".into()));
        assert_eq!(
            parse("file:///srv/state"),
            StoreUrl::Fs("/srv/state".into())
        );
    }

    #[test]
    fn an_s3_url_carries_its_settings_in_the_query() {
        let StoreUrl::S3(s3) = parse(
            "s3://acme-state/terrace/prod?lease_table=leases&role_arn=arn:aws:iam::123456789012:role/terrace&external_id=x-1&region=eu-west-1",
        ) else {
            panic!("not s3")
        };
        assert_eq!(s3.bucket, "acme-state");
        assert_eq!(s3.prefix, "terrace/prod");
        assert_eq!(s3.lease_table.as_deref(), Some("leases"));
        assert_eq!(
            s3.role_arn.as_deref(),
            Some("arn:aws:iam::123456789012:role/terrace")
        );
        assert_eq!(s3.external_id.as_deref(), Some("x-1"));
        assert_eq!(s3.region.as_deref(), Some("eu-west-1"));
        assert_eq!(parse("s3://b").to_string(), "s3://b");
        assert_eq!(parse("s3://b/p/?region=x").to_string(), "s3://b/p");
    }

    #[test]
    fn gs_and_azure_urls() {
        let StoreUrl::Gcs(g) = parse("gs://bkt/pre?impersonate=sa@p.iam.gserviceaccount.com")
        else {
            panic!("not gcs")
        };
        assert_eq!((g.bucket.as_str(), g.prefix.as_str()), ("bkt", "pre"));
        assert_eq!(
            g.impersonate.as_deref(),
            Some("sa@p.iam.gserviceaccount.com")
        );
        for (url, container, prefix) in [
            (
                "az://acct/state/terrace",
                "https://acct.blob.core.windows.net/state",
                "terrace",
            ),
            (
                "https://acct.blob.core.windows.net/state",
                "https://acct.blob.core.windows.net/state",
                "",
            ),
            (
                "http://127.0.0.1:10000/devstoreaccount1/state/a/b",
                "http://127.0.0.1:10000/devstoreaccount1/state",
                "a/b",
            ),
        ] {
            let StoreUrl::Azure(a) = parse(url) else {
                panic!("{url}: not azure")
            };
            assert_eq!(a.container_url, container, "{url}");
            assert_eq!(a.prefix, prefix, "{url}");
            assert_eq!(a.identity, AzureIdentity::DeveloperTools);
        }
        let StoreUrl::Azure(a) = parse("az://acct/state?identity=managed&client_id=abc") else {
            panic!("not azure")
        };
        assert_eq!(
            a.identity,
            AzureIdentity::Managed {
                client_id: Some("abc".into())
            }
        );
    }

    #[test]
    fn bad_urls_are_refused_naming_the_fix() {
        assert!(refused("ftp://x/y").contains("not a kind of store"));
        assert!(refused("s3://b?lease_tabel=x").starts_with("lease_tabel is not a setting"));
        assert!(refused("s3://b?region=").starts_with("region is empty"));
        assert!(refused("s3://b?region=a&region=b").contains("given twice"));
        assert!(refused("s3://b?external_id=x").contains("add role_arn"));
        assert!(
            refused("s3://b?role_arn=arn:aws:iam::1:user/bob").contains("is not an IAM role ARN")
        );
        assert!(refused("az://acct").contains("the container is missing"));
        assert!(refused("az://acct/c?identity=root").contains("use cli or managed"));
        let sas = refused("https://acct.blob.core.windows.net/c?sv=2025-11-05&sig=abc");
        assert!(sas.contains("AZURE_STORAGE_SAS_TOKEN"), "{sas}");
        assert!(
            !sas.contains("abc"),
            "the refusal must not repeat the SAS: {sas}"
        );
        assert!(refused("").starts_with("is empty"));
        let bad = refused("https://acct.blob.core.windows.net:bad/c?sv=1&sig=SECRET");
        assert!(!bad.contains("SECRET"), "{bad}");
        let bad = refused("s3://b?external_id=SECRET&region=");
        assert!(!bad.contains("SECRET"), "{bad}");
        assert!(
            refused("https://storage.googleapis.com/b/p").contains("is not an Azure Blob endpoint")
        );
        assert!(refused("http://127.0.0.1:10000").contains("names its storage account first"));
    }
}
