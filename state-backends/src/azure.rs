//! The customer's Azure Blob container ([`AzureBucket`], under the protocol of
//! [`crate::objects`]), with the workspace's lease as a lock object (`lease.json` changed
//! under its ETag), as on the other clouds.
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
use azure_core::http::{ClientOptions, Etag, NoFormat, RequestContent, Transport, Url};
use azure_storage_blob::models::{
    BlobClientBreakLeaseOptions, BlobClientDeleteOptions, BlobClientGetPropertiesResultHeaders,
    BlobClientStartCopyFromUrlOptions, BlobClientStartCopyFromUrlResultHeaders,
    BlobContainerClientListBlobsOptions, BlockBlobClientUploadOptions, CopyStatus,
};
use azure_storage_blob::{BlobClient, BlobContainerClient, BlobContainerClientOptions};
use bytes::Bytes;
use futures::TryStreamExt;

use crate::objects::{Bucket, BucketStore, Condition, Listed, Object};
use crate::{Result, StoreError};

const BACKEND: &str = "azure";
/// The scope of an Entra ID token for Blob Storage.
const SCOPE: &str = "https://storage.azure.com/.default";

/// The customer's container.
#[derive(Clone, Debug)]
pub struct AzureConfig {
    /// `https://ACCOUNT.blob.core.windows.net/CONTAINER`; against an emulator, its URL with a
    /// SAS query (`http://127.0.0.1:P/devstoreaccount1/CONTAINER?sv=…&sig=…`).
    pub container_url: String,
    /// Prepended to every blob name (`prefix/tenant/workspace/…`); empty for none.
    pub prefix: String,
    /// How long one attempt of a call may take ([`crate::CALL_TIMEOUT`]) before it is given
    /// up and tried again.
    pub call_timeout: Duration,
}

/// The Azure store.
pub type AzureStore = BucketStore<AzureBucket>;

impl BucketStore<AzureBucket> {
    /// A store over the container, with `credential` (none: the URL carries a SAS).
    ///
    /// # Errors
    /// A malformed URL, or a credential over plain http.
    pub fn new(config: &AzureConfig, credential: Option<Arc<dyn TokenCredential>>) -> Result<Self> {
        let bucket = AzureBucket::new(&config.container_url, credential, config.call_timeout)?;
        Ok(BucketStore::over(bucket, &config.prefix, None))
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

/// One HTTP client for the SDK's calls and raw ones, set as the SDK sets its own (no
/// redirects), but for how long a read may wait: an attempt that gets nothing for
/// `call_timeout` (a stalled connection) is given up, and the SDK's retry policy tries again.
/// A large body that keeps arriving is never cut.
///
/// # Errors
/// The client cannot be built (its TLS roots).
pub fn http_client(call_timeout: Duration) -> std::result::Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(call_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// `text` with the value of every SAS signature (`sig=…`) masked: an error that quotes a URL
/// must not carry the SAS it was sent with.
#[must_use]
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sig=") {
        out.push_str(&rest[..at + 4]);
        out.push_str("REDACTED");
        rest = &rest[at + 4..];
        let end = rest
            .find(|c: char| c == '&' || c == ')' || c == '"' || c == '\'' || c.is_whitespace())
            .unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn client_error(what: &str, e: &azure_core::Error) -> StoreError {
    use azure_core::error::ErrorKind;
    let retryable = matches!(e.kind(), ErrorKind::Connection | ErrorKind::Io)
        || status(e).is_some_and(|c| c >= 500 || c == 429 || c == 408);
    let detail = match (status(e), error_code(e)) {
        (Some(s), Some(code)) => format!("{s} {code}"),
        (Some(s), None) => s.to_string(),
        _ => scrub(&e.to_string()),
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
    fn new(
        url: &str,
        credential: Option<Arc<dyn TokenCredential>>,
        call_timeout: Duration,
    ) -> Result<Self> {
        let url = Url::parse(url).map_err(|e| {
            backend_error(
                format!("container URL {:?} is not a URL: {e}", scrub(url)),
                false,
            )
        })?;
        if credential.is_some() && url.scheme() != "https" {
            return Err(backend_error(
                format!("container URL {url}: a credential needs https"),
                false,
            ));
        }
        let http = http_client(call_timeout)
            .map_err(|e| backend_error(format!("HTTP client: {e}"), false))?;
        let options = BlobContainerClientOptions {
            client_options: ClientOptions {
                transport: Some(Transport::new(Arc::new(http.clone()))),
                ..Default::default()
            },
            ..Default::default()
        };
        let container =
            BlobContainerClient::new(url, credential.clone(), Some(options)).map_err(|e| {
                backend_error(
                    format!("container client: {}", scrub(&e.to_string())),
                    false,
                )
            })?;
        Ok(Self {
            container: Arc::new(container),
            http,
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

    /// Puts `data` at `key` if `condition` holds: the blob's new ETag, `None` when the
    /// condition failed or a blob lease kept the write out (see [`Bucket::unlock`]).
    async fn upload(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<String>> {
        let mut options = BlockBlobClientUploadOptions {
            blob_content_type: Some("application/json".into()),
            metadata: Some(to_azure(metadata)),
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
            Ok(done) => done
                .etag
                .map(|tag| Some(tag.to_string()))
                .ok_or_else(|| backend_error(format!("PUT {}: no ETag", self.shown(key)), false)),
            // 412: the condition failed, or the blob is leased (`LeaseIdMissing`); 409: a
            // concurrent create won (BlobAlreadyExists).
            Err(e)
                if status(&e) == Some(412)
                    || (status(&e) == Some(409) && error_code(&e) == Some("BlobAlreadyExists")) =>
            {
                Ok(None)
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
            let token = credential.get_token(&[SCOPE], None).await.map_err(|e| {
                backend_error(format!("{what}: no token: {}", scrub(&e.to_string())), true)
            })?;
            request = request.bearer_auth(token.token.secret());
        }
        let response = request
            .send()
            .await
            .map_err(|e| backend_error(format!("{what}: {}", e.without_url()), true))?;
        let code = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| backend_error(format!("{what}: {}", e.without_url()), true))?;
        if !code.is_success() {
            return Err(backend_error(
                format!("{what}: {code}"),
                code.is_server_error() || code.as_u16() == 429,
            ));
        }
        let text = String::from_utf8_lossy(&body);
        Ok(prefixes_page(&text))
    }
}

/// The REST API version of the listing call (the client's own).
const API_VERSION: &str = "2026-04-06";

/// The `<BlobPrefix><Name>` values and the `<NextMarker>` of a listing page. Scanned rather
/// than deserialized: the service may interleave `<Blob>` and `<BlobPrefix>` elements, which
/// a field-per-element deserializer refuses.
fn prefixes_page(xml: &str) -> (Vec<String>, Option<String>) {
    fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
        let start = text.find(open)? + open.len();
        let end = start + text[start..].find(close)?;
        Some((&text[start..end], &text[end + close.len()..]))
    }
    fn unescape(s: &str) -> String {
        s.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&")
    }
    let mut names = Vec::new();
    let mut rest = xml;
    while let Some((prefix, after)) = between(rest, "<BlobPrefix>", "</BlobPrefix>") {
        if let Some((name, _)) = between(prefix, "<Name>", "</Name>") {
            names.push(unescape(name));
        }
        rest = after;
    }
    let marker = between(xml, "<NextMarker>", "</NextMarker>")
        .map(|(m, _)| unescape(m))
        .filter(|m| !m.is_empty());
    (names, marker)
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

    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<Option<String>>> {
        Ok(self.upload(key, data, metadata, condition).await?.map(Some))
    }

    /// Breaks the blob lease on `key` at once. Runners up to 2026-11-29 changed `lease.json`
    /// only under a blob lease, and held one for a whole job (for good, so one that died held
    /// it until broken); a lock object's write is refused while one is there.
    /// Runners up to 2026-11-29 made `lease.json` empty, only to blob-lease it, before any
    /// lease was recorded in it.
    fn empty_lock_object_is_unrecorded(&self) -> bool {
        true
    }
    async fn unlock(&self, key: &str) -> Result<()> {
        let options = BlobClientBreakLeaseOptions {
            break_period: Some(0),
            ..Default::default()
        };
        match self.blob(key).break_lease(Some(options)).await {
            Ok(_) => {
                tracing::info!(
                    key,
                    "broke a blob lease an earlier runner left on a lease record"
                );
                Ok(())
            }
            // Not leased (any more), or gone: nothing to break.
            Err(e) if matches!(status(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(client_error(&format!("BREAK {}", self.shown(key)), &e)),
        }
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
    fn sas_signatures_are_masked_in_messages() {
        let text = "error sending request for url (http://h/c/b?sv=1&sig=abc%2Bdef&se=2) sig=x";
        assert_eq!(
            scrub(text),
            "error sending request for url (http://h/c/b?sv=1&sig=REDACTED&se=2) sig=REDACTED"
        );
    }

    #[test]
    fn a_listing_page_gives_its_prefixes_and_marker_whatever_lies_between() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="http://127.0.0.1:10000/acct" ContainerName="c">
  <Prefix>t/acme/</Prefix><Delimiter>/</Delimiter>
  <Blobs>
    <BlobPrefix><Name>t/acme/one/</Name></BlobPrefix>
    <Blob><Name>t/acme/loose.json</Name><Properties><Etag>0x1</Etag></Properties></Blob>
    <BlobPrefix><Name>t/acme/a&amp;b/</Name></BlobPrefix>
  </Blobs>
  <NextMarker>abc</NextMarker>
</EnumerationResults>"#;
        let (names, marker) = prefixes_page(xml);
        assert_eq!(names, ["t/acme/one/", "t/acme/a&b/"]);
        assert_eq!(marker.as_deref(), Some("abc"));
        let (none, end) =
            prefixes_page("<EnumerationResults><Blobs/><NextMarker/></EnumerationResults>");
        assert!(none.is_empty());
        assert_eq!(end, None);
    }
}
