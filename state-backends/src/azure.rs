//! The customer's Azure Blob container ([`AzureBucket`], under the protocol of
//! [`crate::objects`]), with the workspace's lease held as a blob lease ([`BlobLeases`]).
//!
//! Blob Storage's conditions are ETags: `If-None-Match: *` creates only, `If-Match: ETAG`
//! replaces (or deletes) only that revision. Blob versioning is not used (the emulator has
//! none, and it is an account-wide setting the customer may not want): versions are our own
//! create-once blobs, as on the other clouds.
//!
//! The official `azure_storage_blob` crate does everything but one call: its listing has no
//! delimiter, so the "folders" of a prefix (the workspaces of a tenant) are listed with one
//! REST call of the same API, authorised the same way (a bearer token from the same
//! credential, or the SAS in the container's URL).
//!
//! Production authenticates with an Entra ID [`TokenCredential`] (managed identity, workload
//! identity federation) over https; the tests use an account SAS in the container URL against
//! Azurite over http.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use azure_core::http::{Etag, NoFormat, RequestContent, Url};
use azure_storage_blob::models::{
    BlobClientAcquireLeaseOptions, BlobClientBreakLeaseOptions, BlobClientDeleteOptions,
    BlobClientGetPropertiesResultHeaders, BlobClientStartCopyFromUrlOptions,
    BlobClientStartCopyFromUrlResultHeaders, BlobContainerClientListBlobsOptions,
    BlockBlobClientUploadOptions, CopyStatus,
};
use azure_storage_blob::{BlobClient, BlobContainerClient};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::lease::LeaseRecord;
use crate::objects::{Bucket, Condition, LeaseKeeper, Listed, Object, ObjectStore};
use crate::{Lease, LeaseRequest, Result, StoreError, WorkspaceId};

const BACKEND: &str = "azure";
/// The scope of an Entra ID token for Blob Storage.
const SCOPE: &str = "https://storage.azure.com/.default";
/// The blob lease's duration: the longest Azure allows short of infinite, so a holder that
/// died frees it within a minute; the holder renews it with every renewal of its lease.
const BLOB_LEASE_SECS: i32 = 60;

/// The customer's container.
#[derive(Clone, Debug)]
pub struct AzureConfig {
    /// `https://ACCOUNT.blob.core.windows.net/CONTAINER`; against an emulator, its URL with a
    /// SAS query (`http://127.0.0.1:P/devstoreaccount1/CONTAINER?sv=…&sig=…`).
    pub container_url: String,
    /// Prepended to every blob name (`prefix/tenant/workspace/…`); empty for none.
    pub prefix: String,
}

/// The Azure store.
pub type AzureStore = ObjectStore<AzureBucket>;

impl ObjectStore<AzureBucket> {
    /// A store over the container, with `credential` (none: the URL carries a SAS).
    ///
    /// # Errors
    /// A malformed URL, or a credential over plain http.
    pub fn new(config: &AzureConfig, credential: Option<Arc<dyn TokenCredential>>) -> Result<Self> {
        let bucket = AzureBucket::new(&config.container_url, credential)?;
        let leases = BlobLeases {
            bucket: bucket.clone(),
        };
        Ok(ObjectStore::over(
            bucket,
            &config.prefix,
            Some(Arc::new(leases)),
        ))
    }
}

/// A body without copying it (the type's own `from` takes a `Vec`).
fn content(data: Bytes) -> RequestContent<Bytes, NoFormat> {
    From::from(data)
}

/// Azure's metadata names must be C# identifiers: the protocol's `terrace-number` is stored
/// as `terrace_number` and read back as it was written (its names have no `_`).
fn to_azure(metadata: HashMap<String, String>) -> HashMap<String, String> {
    metadata
        .into_iter()
        .map(|(k, v)| (k.replace('-', "_"), v))
        .collect()
}

fn from_azure(metadata: HashMap<String, String>) -> HashMap<String, String> {
    metadata
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase().replace('_', "-"), v))
        .collect()
}

fn backend_error(message: String, retryable: bool) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        message,
        retryable,
        source: None,
    }
}

/// The service's error code (`BlobAlreadyExists`, `LeaseAlreadyPresent`), when it sent one.
fn error_code(e: &azure_core::Error) -> Option<&str> {
    match e.kind() {
        azure_core::error::ErrorKind::HttpResponse { error_code, .. } => error_code.as_deref(),
        _ => None,
    }
}

fn status(e: &azure_core::Error) -> Option<u16> {
    e.http_status().map(u16::from)
}

fn client_error(what: &str, e: &azure_core::Error) -> StoreError {
    use azure_core::error::ErrorKind;
    let retryable = matches!(e.kind(), ErrorKind::Connection | ErrorKind::Io)
        || status(e).is_some_and(|c| c >= 500 || c == 429 || c == 408);
    let detail = match (status(e), error_code(e)) {
        (Some(s), Some(code)) => format!("{s} {code}"),
        (Some(s), None) => s.to_string(),
        _ => e.to_string(),
    };
    backend_error(format!("{what}: {detail}"), retryable)
}

/// The container.
#[derive(Clone)]
pub struct AzureBucket {
    container: Arc<BlobContainerClient>,
    /// For the one REST call the client lacks (a listing with a delimiter).
    http: reqwest::Client,
    credential: Option<Arc<dyn TokenCredential>>,
}

impl std::fmt::Debug for AzureBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL's path only: its query may be a SAS.
        f.debug_struct("AzureBucket")
            .field("container", &self.container.url().path())
            .finish_non_exhaustive()
    }
}

impl AzureBucket {
    fn new(url: &str, credential: Option<Arc<dyn TokenCredential>>) -> Result<Self> {
        let url = Url::parse(url).map_err(|e| {
            backend_error(format!("container URL {url:?} is not a URL: {e}"), false)
        })?;
        if credential.is_some() && url.scheme() != "https" {
            return Err(backend_error(
                format!("container URL {url}: a credential needs https"),
                false,
            ));
        }
        let container = BlobContainerClient::new(url, credential.clone(), None)
            .map_err(|e| backend_error(format!("container client: {e}"), false))?;
        Ok(Self {
            container: Arc::new(container),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap_or_default(),
            credential,
        })
    }

    fn blob(&self, key: &str) -> BlobClient {
        self.container.blob_client(key)
    }

    /// The container's URL without its query (a SAS): for messages.
    fn shown(&self, key: &str) -> String {
        format!("{}/{key}", self.container.url().path())
    }

    async fn upload(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
        lease_id: Option<&str>,
    ) -> Result<bool> {
        let mut options = BlockBlobClientUploadOptions {
            blob_content_type: Some("application/json".into()),
            metadata: Some(to_azure(metadata)),
            lease_id: lease_id.map(str::to_owned),
            ..Default::default()
        };
        match condition {
            Condition::None => {}
            Condition::Absent => options.if_none_match = Some(Etag::from("*")),
            Condition::Matches(tag) => options.if_match = Some(Etag::from(tag)),
        }
        match self
            .blob(key)
            .block_blob_client()
            .upload(content(data), Some(options))
            .await
        {
            Ok(_) => Ok(true),
            // 412: the condition failed; 409: a concurrent create won (BlobAlreadyExists).
            Err(e)
                if status(&e) == Some(412)
                    || (status(&e) == Some(409) && error_code(&e) == Some("BlobAlreadyExists")) =>
            {
                Ok(false)
            }
            Err(e) => Err(client_error(&format!("PUT {}", self.shown(key)), &e)),
        }
    }

    /// The blob's properties once a pending copy has finished.
    async fn wait_for_copy(&self, to: &str, mut status: Option<CopyStatus>) -> Result<()> {
        let what = format!("COPY to {}", self.shown(to));
        for attempt in 0..120u32 {
            match status {
                None | Some(CopyStatus::Success) => return Ok(()),
                Some(CopyStatus::Pending) => {}
                Some(other) => {
                    return Err(backend_error(
                        format!("{what}: the copy ended {other:?}"),
                        true,
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt.min(8) + 1))).await;
            let properties = self
                .blob(to)
                .get_properties(None)
                .await
                .map_err(|e| client_error(&what, &e))?;
            status = properties
                .copy_status()
                .map_err(|e| client_error(&what, &e))?;
        }
        Err(backend_error(format!("{what}: still pending"), true))
    }

    /// One page of a listing with a delimiter, by REST (the client has none).
    async fn list_prefixes(
        &self,
        prefix: &str,
        marker: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>)> {
        let mut url = self.container.url().clone();
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("restype", "container")
                .append_pair("comp", "list")
                .append_pair("prefix", prefix)
                .append_pair("delimiter", "/");
            if let Some(marker) = marker {
                query.append_pair("marker", marker);
            }
        }
        let what = format!("LIST {}", self.shown(prefix));
        let mut request = self
            .http
            .get(url.as_str())
            .header("x-ms-version", API_VERSION);
        if let Some(credential) = &self.credential {
            let token = credential
                .get_token(&[SCOPE], None)
                .await
                .map_err(|e| backend_error(format!("{what}: no token: {e}"), true))?;
            request = request.bearer_auth(token.token.secret());
        }
        let response = request
            .send()
            .await
            .map_err(|e| backend_error(format!("{what}: {e}"), true))?;
        let code = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| backend_error(format!("{what}: {e}"), true))?;
        if !code.is_success() {
            return Err(backend_error(
                format!("{what}: {code}"),
                code.is_server_error() || code.as_u16() == 429,
            ));
        }
        let page: EnumerationResults = azure_core::xml::from_xml(body)
            .map_err(|e| backend_error(format!("{what}: unreadable answer: {e}"), false))?;
        let names = page.blobs.prefixes.into_iter().map(|p| p.name).collect();
        Ok((names, page.next_marker.filter(|m| !m.is_empty())))
    }
}

/// The REST API version of the listing call (the client's own).
const API_VERSION: &str = "2026-04-06";

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct EnumerationResults {
    blobs: Blobs,
    next_marker: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Blobs {
    #[serde(rename = "BlobPrefix")]
    prefixes: Vec<BlobPrefix>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct BlobPrefix {
    name: String,
}

#[async_trait]
impl Bucket for AzureBucket {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn get(&self, key: &str) -> Result<Option<Object>> {
        let what = format!("GET {}", self.shown(key));
        let response = match self.blob(key).download(None).await {
            Ok(r) => r,
            Err(e) if status(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(client_error(&what, &e)),
        };
        let tag = response
            .properties
            .etag
            .as_ref()
            .map(ToString::to_string)
            .ok_or_else(|| backend_error(format!("{what}: no ETag"), false))?;
        let metadata = from_azure(response.properties.metadata.clone());
        let data = response
            .body
            .collect()
            .await
            .map_err(|e| client_error(&what, &e))?;
        Ok(Some(Object {
            data,
            tag,
            metadata,
        }))
    }

    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
        let what = format!("HEAD {}", self.shown(key));
        match self.blob(key).get_properties(None).await {
            Ok(p) => Ok(Some(from_azure(
                p.metadata().map_err(|e| client_error(&what, &e))?,
            ))),
            Err(e) if status(&e) == Some(404) => Ok(None),
            Err(e) => Err(client_error(&what, &e)),
        }
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<bool> {
        self.upload(key, data, metadata, condition, None).await
    }

    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        let what = format!("COPY {} → {}", self.shown(from), self.shown(to));
        // Without new metadata, the copy keeps the source's.
        let options = BlobClientStartCopyFromUrlOptions {
            metadata: metadata.map(to_azure),
            ..Default::default()
        };
        // Same account: the source URL carries the same authorisation (the SAS, if any).
        let source = self.blob(from).url().to_string();
        match self
            .blob(to)
            .start_copy_from_url(source, Some(options))
            .await
        {
            Ok(r) => {
                let status = r.copy_status().map_err(|e| client_error(&what, &e))?;
                self.wait_for_copy(to, status).await
            }
            Err(e) if status(&e) == Some(404) => Err(backend_error(
                format!("{what}: the source does not exist"),
                false,
            )),
            Err(e) => Err(client_error(&what, &e)),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        match self.blob(key).delete(None).await {
            Ok(_) => Ok(()),
            Err(e) if status(&e) == Some(404) => Ok(()),
            Err(e) => Err(client_error(&format!("DELETE {}", self.shown(key)), &e)),
        }
    }

    async fn clear_if(&self, key: &str, tag: &str) -> Result<()> {
        let options = BlobClientDeleteOptions {
            if_match: Some(Etag::from(tag)),
            ..Default::default()
        };
        match self.blob(key).delete(Some(options)).await {
            // Written again since it was listed (412), or already gone: it stays, or is gone.
            Ok(_) => Ok(()),
            Err(e) if matches!(status(&e), Some(404 | 412)) => Ok(()),
            Err(e) => Err(client_error(&format!("DELETE {}", self.shown(key)), &e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let what = format!("LIST {}", self.shown(prefix));
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(prefix.to_owned()),
            ..Default::default()
        };
        let mut pager = self
            .container
            .list_blobs(Some(options))
            .map_err(|e| client_error(&what, &e))?;
        let mut out = Vec::new();
        while let Some(item) = pager
            .try_next()
            .await
            .map_err(|e| client_error(&what, &e))?
        {
            let (Some(key), Some(properties)) = (item.name, item.properties) else {
                continue;
            };
            out.push(Listed {
                key,
                tag: properties
                    .etag
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                size: properties.content_length.unwrap_or(0),
            });
        }
        Ok(out)
    }

    async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let (names, next) = self.list_prefixes(prefix, marker.as_deref()).await?;
            out.extend(
                names
                    .iter()
                    .filter_map(|p| Some(p.strip_prefix(prefix)?.strip_suffix('/')?.to_owned())),
            );
            match next {
                Some(next) => marker = Some(next),
                None => return Ok(out),
            }
        }
    }
}

// ----- the lease: a blob lease on `lease.json`, the record inside it -----

/// The workspace's lease as a blob lease on its `lease.json`, whose content is the
/// [`LeaseRecord`] every store keeps (holder, expiry, fence) and the blob lease's id.
///
/// - Taking the lease takes the blob lease (60 s), reads the record and, if no live lease is
///   recorded, writes the new one with the blob lease's id: only the blob lease's holder can
///   change the record.
/// - Renewing renews the blob lease (or takes it again under the same id, if it lapsed and
///   nobody else holds it) and writes the new expiry under it.
/// - A blob lease is broken only when the record says its lease expired (or none is held):
///   its holder died, or stalled past its expiry. A live recorded lease makes the taker wait.
/// - Releasing clears the record under the blob lease, then releases it.
#[derive(Clone, Debug)]
pub struct BlobLeases {
    bucket: AzureBucket,
}

/// `lease.json`'s content: the record, and the id of the blob lease its holder took.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
struct BlobRecord {
    #[serde(flatten)]
    record: LeaseRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    blob_lease: Option<String>,
}

/// How often taking or renewing a lease is tried before giving up on a contended blob lease.
const ATTEMPTS: u32 = 8;

fn new_lease_id() -> String {
    let n: u128 = rand::random();
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl BlobLeases {
    fn key(base: &str) -> String {
        format!("{base}/lease.json")
    }

    async fn read(&self, key: &str) -> Result<BlobRecord> {
        match self.bucket.get(key).await? {
            None => Ok(BlobRecord::default()),
            Some(obj) if obj.data.is_empty() => Ok(BlobRecord::default()),
            Some(obj) => serde_json::from_slice(&obj.data).map_err(|e| StoreError::Corrupt {
                path: key.to_owned(),
                detail: format!("not a lease record: {e}"),
            }),
        }
    }

    async fn write(&self, key: &str, record: &BlobRecord, lease_id: &str) -> Result<bool> {
        let data = Bytes::from(serde_json::to_vec(record).expect("lease record serializes"));
        match self
            .bucket
            .upload(key, data, HashMap::new(), Condition::None, Some(lease_id))
            .await
        {
            Ok(written) => Ok(written),
            Err(e) => Err(e),
        }
    }

    /// A blob must exist to be leased: an empty one, created once.
    async fn ensure(&self, key: &str) -> Result<()> {
        self.bucket
            .put(key, Bytes::new(), HashMap::new(), Condition::Absent)
            .await
            .map(|_| ())
    }

    /// Takes the blob lease under `id`; `Ok(false)` when another holds it.
    async fn take(&self, key: &str, id: &str) -> Result<bool> {
        let options = BlobClientAcquireLeaseOptions {
            proposed_lease_id: Some(id.to_owned()),
            ..Default::default()
        };
        match self
            .bucket
            .blob(key)
            .acquire_lease(BLOB_LEASE_SECS, Some(options))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if status(&e) == Some(409) => Ok(false),
            Err(e) => Err(client_error(
                &format!("LEASE {}", self.bucket.shown(key)),
                &e,
            )),
        }
    }

    async fn give_back(&self, key: &str, id: &str) {
        if let Err(e) = self
            .bucket
            .blob(key)
            .release_lease(id.to_owned(), None)
            .await
        {
            tracing::debug!(key, error = %e, "could not release a blob lease (it lapses within a minute)");
        }
    }

    async fn break_now(&self, key: &str) -> Result<()> {
        let options = BlobClientBreakLeaseOptions {
            break_period: Some(0),
            ..Default::default()
        };
        match self.bucket.blob(key).break_lease(Some(options)).await {
            Ok(_) => Ok(()),
            // Not leased (any more): nothing to break.
            Err(e) if status(&e) == Some(409) => Ok(()),
            Err(e) => Err(client_error(
                &format!("BREAK {}", self.bucket.shown(key)),
                &e,
            )),
        }
    }

    fn contended(key: &str) -> StoreError {
        backend_error(
            format!("the blob lease on {key} stayed contended; try again"),
            true,
        )
    }
}

#[async_trait]
impl LeaseKeeper for BlobLeases {
    async fn record(&self, base: &str) -> Result<LeaseRecord> {
        Ok(self.read(&Self::key(base)).await?.record)
    }

    async fn acquire(&self, ws: &WorkspaceId, base: &str, request: &LeaseRequest) -> Result<Lease> {
        let key = Self::key(base);
        self.ensure(&key).await?;
        for _ in 0..ATTEMPTS {
            let id = new_lease_id();
            if !self.take(&key, &id).await? {
                let now = OffsetDateTime::now_utc();
                if let Some(holder) = self.read(&key).await?.record.held
                    && !holder.is_expired_at(now)
                {
                    return Err(StoreError::LeaseHeld {
                        workspace: ws.clone(),
                        holder: Box::new(holder),
                    });
                }
                // Our record holds no live lease, yet the blob is leased: by a holder that
                // died or stalled past its expiry, or by a taker in the middle of taking it.
                // Breaking is safe either way: only a blob lease's holder writes the record.
                self.break_now(&key).await?;
                continue;
            }
            let mut current = self.read(&key).await?;
            match current.record.acquire(request, OffsetDateTime::now_utc()) {
                Err(holder) => {
                    self.give_back(&key, &id).await;
                    return Err(StoreError::LeaseHeld {
                        workspace: ws.clone(),
                        holder,
                    });
                }
                Ok(lease) => {
                    current.blob_lease = Some(id.clone());
                    if self.write(&key, &current, &id).await? {
                        return Ok(lease);
                    }
                    // Broken by another taker between our take and our write.
                }
            }
        }
        Err(Self::contended(&key))
    }

    async fn renew(
        &self,
        ws: &WorkspaceId,
        base: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease> {
        let key = Self::key(base);
        let lost = |reason: String| StoreError::LeaseLost {
            workspace: ws.clone(),
            owner: lease.owner.clone(),
            fence: lease.fence,
            reason,
        };
        for attempt in 0..ATTEMPTS {
            let mut current = self.read(&key).await?;
            let renewed = current
                .record
                .renew(lease, ttl, OffsetDateTime::now_utc())
                .map_err(&lost)?;
            let id = current
                .blob_lease
                .clone()
                .ok_or_else(|| lost("the record names no blob lease".into()))?;
            let kept = match self.bucket.blob(&key).renew_lease(id.clone(), None).await {
                Ok(_) => true,
                // Lapsed and taken since (by a taker who then saw our live record and let go,
                // or who is reading it now): take it again under the same id once it is free.
                Err(e) if status(&e) == Some(409) => self.take(&key, &id).await?,
                Err(e) => {
                    return Err(client_error(
                        &format!("RENEW {}", self.bucket.shown(&key)),
                        &e,
                    ));
                }
            };
            if kept && self.write(&key, &current, &id).await? {
                return Ok(renewed);
            }
            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
        }
        Err(lost("its blob lease is held by another".into()))
    }

    async fn release(&self, _ws: &WorkspaceId, base: &str, lease: &Lease) -> Result<()> {
        let key = Self::key(base);
        let mut current = self.read(&key).await?;
        if !current.record.release(lease) {
            // Not ours any more: nothing to give back.
            return Ok(());
        }
        let Some(id) = current.blob_lease.take() else {
            return Ok(());
        };
        // If our blob lease was broken, the record is no longer ours to change.
        if self.write(&key, &current, &id).await? {
            self.give_back(&key, &id).await;
        }
        Ok(())
    }

    async fn break_lease(&self, _ws: &WorkspaceId, base: &str) -> Result<Option<Lease>> {
        let key = Self::key(base);
        self.ensure(&key).await?;
        for _ in 0..ATTEMPTS {
            self.break_now(&key).await?;
            let id = new_lease_id();
            if !self.take(&key, &id).await? {
                continue;
            }
            let mut current = self.read(&key).await?;
            let broken = current.record.break_lease();
            current.blob_lease = None;
            let written = self.write(&key, &current, &id).await?;
            self.give_back(&key, &id).await;
            if written {
                return Ok(broken);
            }
        }
        Err(Self::contended(&key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_names_are_identifiers_in_azure_and_read_back_as_written() {
        let ours: HashMap<String, String> = [("terrace-number", "7"), ("terrace-sha256", "ab")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let stored = to_azure(ours.clone());
        assert!(stored.contains_key("terrace_number"), "{stored:?}");
        assert!(stored.keys().all(|k| !k.contains('-')));
        assert_eq!(from_azure(stored), ours);
    }

    #[test]
    fn lease_ids_are_guids() {
        let id = new_lease_id();
        let parts: Vec<usize> = id.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{id}");
        assert_ne!(id, new_lease_id());
    }

    #[test]
    fn a_listing_page_gives_its_prefixes_and_marker() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="http://127.0.0.1:10000/devstoreaccount1" ContainerName="c">
  <Prefix>t/acme/</Prefix><Delimiter>/</Delimiter>
  <Blobs>
    <BlobPrefix><Name>t/acme/one/</Name></BlobPrefix>
    <BlobPrefix><Name>t/acme/two/</Name></BlobPrefix>
  </Blobs>
  <NextMarker>abc</NextMarker>
</EnumerationResults>"#;
        let page: EnumerationResults = azure_core::xml::from_xml(Bytes::from(xml)).unwrap();
        let names: Vec<&str> = page
            .blobs
            .prefixes
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["t/acme/one/", "t/acme/two/"]);
        assert_eq!(page.next_marker.as_deref(), Some("abc"));
    }

    #[test]
    fn a_record_keeps_the_blob_lease_id_beside_the_shared_fields() {
        let record = BlobRecord {
            record: LeaseRecord {
                last_fence: 3,
                held: None,
            },
            blob_lease: Some("id".into()),
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["last_fence"], 3);
        assert_eq!(json["blob_lease"], "id");
        let back: BlobRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back.record.last_fence, 3);
    }
}
