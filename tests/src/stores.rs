//! Every kind of store, made afresh in its emulator, as `terrace` names it (`TERRACE_STORE` and
//! the environment that reaches the emulator) and as a [`StateStore`] opened here, to read back
//! what the runner wrote. For tests that run the same jobs on every store.

use std::sync::Arc;

use state_backends::{StateStore, WorkspaceId};

use crate::fault_proxy::Matches;

/// The kinds of store, in the order the tests report them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A folder (`fs`).
    Folder,
    /// S3, the lease in a DynamoDB table.
    S3DynamoDb,
    /// S3, the lease a lock object in the bucket.
    S3LockObject,
    Gcs,
    AzureBlob,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Folder => "fs",
            Kind::S3DynamoDb => "s3+dynamodb",
            Kind::S3LockObject => "s3 lock object",
            Kind::Gcs => "gcs",
            Kind::AzureBlob => "azure",
        }
    }
}

/// A store call the proxy can hold.
#[derive(Clone, Copy)]
pub enum Call {
    /// A write of the lease: taking it or renewing it (DynamoDB `UpdateItem`; else a write of
    /// `lease.json`).
    Lease,
    /// A write of a state version.
    Version,
    /// The write of the job's result.
    Result,
    /// The write of a chunk of the job's log.
    LogChunk,
}

impl Call {
    /// Picks the call out of the requests a [`crate::fault_proxy::FaultProxy`] sees.
    pub fn matches(self, kind: Kind) -> Matches {
        let write = |m: &hyper::Method| *m == hyper::Method::PUT || *m == hyper::Method::POST;
        match self {
            Call::Lease if kind == Kind::S3DynamoDb => Box::new(|_, _, headers| {
                headers
                    .get("x-amz-target")
                    .and_then(|t| t.to_str().ok())
                    .is_some_and(|t| t.ends_with("UpdateItem"))
            }),
            // Not Azure's break of a blob lease an earlier runner left (`comp=lease`).
            Call::Lease => Box::new(move |m, path, _| {
                write(m) && path.contains("lease.json") && !path.contains("comp=lease")
            }),
            // Not GCS's `rewriteTo` (a copy), whose path names a version too.
            Call::Version => Box::new(move |m, path, _| {
                write(m) && path.contains("versions") && !path.contains("rewrite")
            }),
            Call::Result => Box::new(move |m, path, _| write(m) && path.contains("result.json")),
            // GCS names an uploaded object in the query, its slashes encoded.
            Call::LogChunk => Box::new(move |m, path, _| {
                write(m) && (path.contains("/log/") || path.contains("%2Flog%2F"))
            }),
        }
    }
}

/// One store under test.
pub struct Under {
    pub kind: Kind,
    /// `TERRACE_STORE` for `terrace`.
    pub url: String,
    /// What else `terrace` needs to reach it (endpoint, test credentials).
    pub env: Vec<(String, String)>,
    /// The same store, opened here (straight to the emulator).
    pub store: Arc<dyn StateStore>,
}

impl Under {
    /// A new store of `kind`. A folder is `folder`; the others are a new bucket or container
    /// with the prefix `prefix`. `terrace` reaches the emulator at `endpoint` when given (a
    /// proxy in front of it), else directly.
    pub async fn new(
        kind: Kind,
        folder: &std::path::Path,
        prefix: &str,
        endpoint: Option<&str>,
    ) -> Self {
        use state_backends::s3::{LeaseMode, S3Config, S3Store};
        let s3 = |lease: LeaseMode, bucket: String| async move {
            let dynamodb = match lease {
                LeaseMode::DynamoDb { .. } => Some(crate::aws::dynamodb().await),
                LeaseMode::LockObject => None,
            };
            let config = S3Config {
                bucket,
                prefix: prefix.to_owned(),
                lease,
                kms_key_id: None,
            };
            Arc::new(S3Store::new(crate::aws::s3().await, dynamodb, config).expect("an S3 store"))
                as Arc<dyn StateStore>
        };
        let aws_env = || {
            let mut env = crate::aws::cli_env();
            if let Some(endpoint) = endpoint {
                env.retain(|(k, _)| k != "AWS_ENDPOINT_URL");
                env.push(("AWS_ENDPOINT_URL".into(), endpoint.to_owned()));
            }
            env
        };
        match kind {
            Kind::Folder => Self {
                kind,
                url: folder.display().to_string(),
                env: Vec::new(),
                store: Arc::new(state_backends::fs::FsStore::new(folder)),
            },
            Kind::S3DynamoDb => {
                let (bucket, table) = (crate::aws::bucket().await, crate::aws::lease_table().await);
                Self {
                    kind,
                    url: format!("s3://{bucket}/{prefix}?lease_table={table}"),
                    env: aws_env(),
                    store: s3(LeaseMode::DynamoDb { table }, bucket).await,
                }
            }
            Kind::S3LockObject => {
                let bucket = crate::aws::bucket().await;
                Self {
                    kind,
                    url: format!("s3://{bucket}/{prefix}"),
                    env: aws_env(),
                    store: s3(LeaseMode::LockObject, bucket).await,
                }
            }
            Kind::Gcs => {
                let bucket = crate::gcs::bucket().await;
                let reach = endpoint.map_or_else(crate::gcs::endpoint, str::to_owned);
                Self {
                    kind,
                    url: format!("gs://{bucket}/{prefix}"),
                    env: vec![
                        ("TERRACE_GCS_ENDPOINT".into(), reach),
                        ("TERRACE_GCS_ANONYMOUS".into(), "1".into()),
                    ],
                    store: Arc::new(crate::gcs::store(&bucket, prefix).await),
                }
            }
            Kind::AzureBlob => {
                let with_sas = crate::azure::container().await;
                let container = with_sas.split('?').next().expect("a URL").to_owned();
                let container = match endpoint {
                    // The container URL with the proxy's origin (Azurite's account stays in
                    // the path).
                    Some(endpoint) => {
                        let path_at = container
                            .match_indices('/')
                            .nth(2)
                            .map_or(container.len(), |(i, _)| i);
                        format!(
                            "{}{}",
                            endpoint.trim_end_matches('/'),
                            &container[path_at..]
                        )
                    }
                    None => container,
                };
                Self {
                    kind,
                    url: format!("{container}/{prefix}"),
                    env: vec![("AZURE_STORAGE_SAS_TOKEN".into(), crate::azure::sas())],
                    store: Arc::new(crate::azure::store(&with_sas, prefix)),
                }
            }
        }
    }

    /// Points `sandbox`'s `terrace` at this store.
    pub fn use_in(&self, sandbox: &mut crate::Sandbox) {
        sandbox.env.push(("TERRACE_STORE".into(), self.url.clone()));
        sandbox.env.extend(self.env.iter().cloned());
    }
}

/// Every kind.
pub const ALL: [Kind; 5] = [
    Kind::Folder,
    Kind::S3DynamoDb,
    Kind::S3LockObject,
    Kind::Gcs,
    Kind::AzureBlob,
];

/// Every accepted version of a workspace, number and bytes.
pub async fn history(store: &dyn StateStore, ws: &WorkspaceId) -> Vec<(u64, Vec<u8>)> {
    let mut all = Vec::new();
    for v in store.versions(ws).await.unwrap() {
        all.push((
            v.number,
            store.version(ws, v.number).await.unwrap().to_vec(),
        ));
    }
    all
}

/// The history is unbroken: numbered 1..n, every version a state of one lineage, serials
/// growing.
pub fn assert_unbroken(history: &[(u64, Vec<u8>)], what: &str) {
    let numbers: Vec<u64> = history.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        numbers,
        (1..=history.len() as u64).collect::<Vec<_>>(),
        "{what}: numbering has a gap"
    );
    let mut last: Option<(String, u64)> = None;
    for (number, data) in history {
        let state: serde_json::Value = serde_json::from_slice(data)
            .unwrap_or_else(|e| panic!("{what}: version {number} is not a state: {e}"));
        let lineage = state["lineage"].as_str().unwrap().to_owned();
        let serial = state["serial"].as_u64().unwrap();
        if let Some((l, s)) = &last {
            assert_eq!(l, &lineage, "{what}: version {number} changed the lineage");
            assert!(
                serial > *s,
                "{what}: version {number} has serial {serial}, not above {s}"
            );
        }
        last = Some((lineage, serial));
    }
}
