//! The customer's GCS bucket ([`GcsBucket`], under the protocol of [`crate::objects`]), with the
//! workspace's lease in a lock object.
//!
//! GCS's conditions are generations: `ifGenerationMatch=0` creates only, `=N` replaces only
//! generation N. The lease is `lease.json`, created with `ifGenerationMatch=0` and changed only
//! with the generation it was read at; its expiry and fence are inside it (the
//! [`LeaseRecord`](crate::lease::LeaseRecord) rules every store shares).
//!
//! Reads and writes go through the official `google-cloud-storage` client. Its other half,
//! `StorageControl`, speaks only gRPC, so metadata reads, listings, server-side copies
//! (`rewriteTo`) and deletes use GCS's JSON API directly, with the same credentials: one
//! path in production and against the emulator. A change mark is cleared by emptying it with
//! the listed generation as the condition, not by a conditional delete, which the emulator
//! does not check; empty marks are skipped by the listing.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use google_cloud_auth::credentials::{CacheableResource, Credentials};
use google_cloud_storage::client::Storage;
use serde::Deserialize;

use crate::objects::{Bucket, BucketStore, Condition, Listed, Object};
use crate::{Result, StoreError};

const BACKEND: &str = "gcs";

/// The customer's bucket.
#[derive(Clone, Debug)]
pub struct GcsConfig {
    pub bucket: String,
    /// Prepended to every object name (`prefix/tenant/workspace/…`); empty for none.
    pub prefix: String,
    /// Encrypt every object with this Cloud KMS key
    /// (`projects/P/locations/L/keyRings/R/cryptoKeys/K`); the bucket's default otherwise.
    pub kms_key: Option<String>,
    /// The JSON API's base URL: `https://storage.googleapis.com`, or an emulator's.
    pub endpoint: String,
    /// How long one attempt of a call may take ([`crate::CALL_TIMEOUT`]) before it is given
    /// up and tried again.
    pub call_timeout: Duration,
}

impl GcsConfig {
    /// GCS itself.
    pub const ENDPOINT: &'static str = "https://storage.googleapis.com";
}

/// The GCS store.
pub type GcsStore = BucketStore<GcsBucket>;

/// How a store's client tries a call again: what may pass (the library's `RetryableErrors`), at
/// most 5 attempts within 30 s. The library's default keeps trying for 5 minutes, longer than
/// a job should wait on one call to a bucket that does not answer: the error is retryable, so
/// the job, its queue or the operator tries again. Give it to
/// `Storage::builder().with_retry_policy`.
pub fn retry_policy() -> impl google_cloud_gax::retry_policy::RetryPolicy {
    use google_cloud_gax::retry_policy::RetryPolicyExt;
    google_cloud_storage::retry_policy::RetryableErrors
        .with_attempt_limit(5)
        .with_time_limit(std::time::Duration::from_secs(30))
}

impl BucketStore<GcsBucket> {
    /// A store over a client the caller built (credentials, endpoint); `credentials` are the
    /// same the client uses, for the JSON API calls.
    pub fn new(storage: Storage, credentials: Credentials, config: GcsConfig) -> Self {
        let bucket = GcsBucket {
            storage,
            json: JsonApi {
                // Every JSON API call is small: one that outlasts the call timeout is a stuck
                // connection, retried as one.
                http: reqwest::Client::builder()
                    .connect_timeout(std::time::Duration::from_secs(10))
                    .timeout(config.call_timeout)
                    .build()
                    .unwrap_or_default(),
                base: config.endpoint.trim_end_matches('/').to_owned(),
                credentials,
            },
            resource: format!("projects/_/buckets/{}", config.bucket),
            name: config.bucket,
            kms_key: config.kms_key,
            call_timeout: config.call_timeout,
        };
        Self::over(bucket, &config.prefix, None)
    }
}

/// One GCS bucket.
#[derive(Clone, Debug)]
pub struct GcsBucket {
    storage: Storage,
    json: JsonApi,
    /// `projects/_/buckets/NAME`, as the client names it.
    resource: String,
    name: String,
    kms_key: Option<String>,
    /// The client sets no time limit on an upload or a read: each attempt is given this.
    call_timeout: Duration,
}

/// How many times a read or write through the client is tried when an attempt gets no answer
/// in time.
const TIMED_OUT_TRIES: u32 = 3;

fn backend_error(message: String, retryable: bool) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        message,
        retryable,
        source: None,
    }
}

fn client_error(what: &str, e: &google_cloud_storage::Error) -> StoreError {
    // A connection that broke mid-request, with no answer (`is_io`, or the transport's error
    // without a status), may have done what was asked or not: the caller's checks
    // (generations, the history) tell, so trying again is safe. A transport error with a
    // status is the status's. `is_exhausted`: the client's own retries ran out.
    let retryable = e.is_timeout()
        || e.is_connect()
        || e.is_io()
        || (e.is_transport() && e.http_status_code().is_none())
        || e.is_exhausted()
        || e.http_status_code()
            .is_some_and(|c| c >= 500 || c == 429 || c == 408);
    backend_error(format!("{what}: {e}"), retryable)
}

fn generation(tag: &str) -> Result<i64> {
    tag.parse()
        .map_err(|_| backend_error(format!("{tag:?} is not a GCS generation"), false))
}

impl GcsBucket {
    /// `call` (a read or write through the client, its own retries included), tried again when
    /// it is not done within `limit`: the client sets no time limit of its own, so a request
    /// sent and never answered would wait for good.
    async fn in_time<T, F, Fut>(&self, what: &str, limit: Duration, call: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        for attempt in 1..=TIMED_OUT_TRIES {
            match tokio::time::timeout(limit, call()).await {
                Ok(done) => return done,
                Err(_) => {
                    tracing::debug!(what, attempt, "no answer within {limit:?}; trying again");
                }
            }
        }
        Err(backend_error(
            format!("{what}: no answer within {limit:?}, {TIMED_OUT_TRIES} times"),
            true,
        ))
    }

    /// How long one upload of `bytes` may take: the call timeout, and a second per MiB on top,
    /// so a large state on a slow link is not cut (the client streams it in one request).
    fn upload_limit(&self, bytes: usize) -> Duration {
        self.call_timeout + Duration::from_secs((bytes / (1 << 20)) as u64)
    }

    /// A read: its answer within the call timeout (tried again when not), then each part of
    /// the object within the call timeout of the last, so a large state that keeps arriving
    /// is never cut, and one that stops is given up.
    async fn read(&self, key: &str) -> Result<Option<Object>> {
        let what = format!("GET {key}");
        let opened = self
            .in_time(&what, self.call_timeout, || async {
                match self.storage.read_object(&self.resource, key).send().await {
                    Ok(r) => Ok(Some(r)),
                    Err(e) if e.http_status_code() == Some(404) => Ok(None),
                    Err(e) => Err(client_error(&what, &e)),
                }
            })
            .await?;
        let Some(mut response) = opened else {
            return Ok(None);
        };
        let facts = response.object();
        let mut data = BytesMut::new();
        loop {
            let chunk = tokio::time::timeout(self.call_timeout, response.next())
                .await
                .map_err(|_| {
                    backend_error(format!("{what}: no data for {:?}", self.call_timeout), true)
                })?;
            let Some(chunk) = chunk else { break };
            data.extend_from_slice(&chunk.map_err(|e| client_error(&what, &e))?);
        }
        Ok(Some(Object {
            data: data.freeze(),
            tag: facts.generation.to_string(),
            metadata: facts.metadata.into_iter().collect(),
        }))
    }

    /// One write, with the client's own retries: the written object's generation, or `None`
    /// when the condition failed.
    async fn put_once(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<String>> {
        // The checksum goes with the request's metadata part: left to be computed while
        // sending, it becomes a trailing part that some servers store as content.
        let crc = crc32c::crc32c(&data);
        let mut write = self
            .storage
            .write_object(&self.resource, key, data)
            .set_content_type("application/json")
            .set_metadata(metadata)
            .with_known_crc32c(crc);
        write = match condition {
            // A whole object written again is the same object: safe for the client to send
            // again when a connection breaks (it retries only what it is told is idempotent;
            // the conditional writes below are, by their precondition).
            Condition::None => write.with_idempotency(true),
            Condition::Absent => write.set_if_generation_match(0),
            Condition::Matches(tag) => write.set_if_generation_match(generation(tag)?),
        };
        if let Some(key) = &self.kms_key {
            write = write.set_kms_key(key);
        }
        match write.send_unbuffered().await {
            Ok(written) => Ok(Some(written.generation.to_string())),
            Err(e) if e.http_status_code() == Some(412) => Ok(None),
            Err(e) => Err(client_error(&format!("PUT {key}"), &e)),
        }
    }
}

#[async_trait]
impl Bucket for GcsBucket {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn get(&self, key: &str) -> Result<Option<Object>> {
        self.read(key).await
    }

    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
        Ok(self
            .json
            .object(&self.name, key)
            .await?
            .map(|o| o.metadata.unwrap_or_default()))
    }

    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<Option<String>>> {
        // A try that got no answer may have landed: a create-only or generation-matched write
        // sent again then finds it taken, by itself, which its caller tells from the content
        // (a version's write mark, a lease's record), as after a lost answer.
        let written = self
            .in_time(&format!("PUT {key}"), self.upload_limit(data.len()), || {
                self.put_once(key, data.clone(), metadata.clone(), condition)
            })
            .await?;
        Ok(written.map(Some))
    }

    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        self.json
            .rewrite(&self.name, from, to, metadata, self.kms_key.as_deref())
            .await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.json.delete(&self.name, key).await
    }

    async fn clear_if(&self, key: &str, tag: &str) -> Result<()> {
        // Emptied, not deleted: the condition is checked on writes (see the module's notes).
        self.put(key, Bytes::new(), HashMap::new(), Condition::Matches(tag))
            .await
            .map(|_| ())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .json
                .list(&self.name, prefix, None, token.as_deref())
                .await?;
            out.extend(page.items.into_iter().map(|o| Listed {
                key: o.name,
                tag: o.generation.to_string(),
                size: u64::try_from(o.size).unwrap_or(0),
            }));
            match page.next_page_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(out),
            }
        }
    }

    async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .json
                .list(&self.name, prefix, Some("/"), token.as_deref())
                .await?;
            out.extend(
                page.prefixes
                    .iter()
                    .filter_map(|p| Some(p.strip_prefix(prefix)?.strip_suffix('/')?.to_owned())),
            );
            match page.next_page_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(out),
            }
        }
    }
}

// ----- the JSON API, for what the client does over gRPC only -----

/// The waits before a JSON API call that failed in a way that may pass is tried again.
const JSON_WAITS: [Duration; 2] = [Duration::from_millis(250), Duration::from_secs(1)];

/// GCS's JSON API with the client's credentials.
#[derive(Clone, Debug)]
struct JsonApi {
    http: reqwest::Client,
    base: String,
    credentials: Credentials,
}

/// An object resource as the JSON API describes it (64-bit numbers are strings there).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct JsonObject {
    name: String,
    #[serde(deserialize_with = "int64")]
    generation: i64,
    #[serde(deserialize_with = "int64")]
    size: i64,
    metadata: Option<HashMap<String, String>>,
}

fn int64<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int64 {
        Text(String),
        Number(i64),
    }
    match Int64::deserialize(d)? {
        Int64::Text(s) => s.parse().map_err(serde::de::Error::custom),
        Int64::Number(n) => Ok(n),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ListPage {
    items: Vec<JsonObject>,
    prefixes: Vec<String>,
    next_page_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RewriteAnswer {
    done: bool,
    rewrite_token: Option<String>,
}

impl JsonApi {
    fn url(&self, segments: &[&str]) -> Result<reqwest::Url> {
        let mut url = reqwest::Url::parse(&self.base)
            .map_err(|e| backend_error(format!("bad GCS endpoint {:?}: {e}", self.base), false))?;
        // Each segment is percent-encoded, the `/`s of an object name included.
        url.path_segments_mut()
            .map_err(|()| backend_error(format!("bad GCS endpoint {:?}", self.base), false))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    /// Sends with the credentials' headers, trying again after each of [`JSON_WAITS`] while
    /// the failure may pass (every call here may be repeated: reads, deletes of a name, a copy
    /// onto a name); `Ok(None)` for a 404.
    async fn send(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Option<reqwest::Response>> {
        let mut waits = JSON_WAITS.iter();
        loop {
            let attempt = request.try_clone().ok_or_else(|| {
                backend_error(format!("{what}: the request cannot be repeated"), false)
            })?;
            match self.send_once(what, attempt).await {
                Err(e) if e.is_retryable() => match waits.next() {
                    Some(wait) => {
                        tracing::debug!(error = %e, "trying again in {wait:?}");
                        tokio::time::sleep(*wait).await;
                    }
                    None => return Err(e),
                },
                done => return done,
            }
        }
    }

    async fn send_once(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Option<reqwest::Response>> {
        let headers = match self.credentials.headers(http::Extensions::new()).await {
            Ok(CacheableResource::New { data, .. }) => data,
            // Only answered to a request that carried an entity tag; this one has none.
            Ok(CacheableResource::NotModified) => http::HeaderMap::new(),
            Err(e) => {
                return Err(backend_error(
                    format!("{what}: no credentials: {e}"),
                    e.is_transient(),
                ));
            }
        };
        let response = request
            .headers(headers)
            .send()
            .await
            .map_err(|e| backend_error(format!("{what}: {e}"), true))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status.is_success() {
            return Ok(Some(response));
        }
        let body = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(body);
        Err(backend_error(
            format!("{what}: {status}: {}", message.trim()),
            status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408,
        ))
    }

    async fn object(&self, bucket: &str, key: &str) -> Result<Option<JsonObject>> {
        let what = format!("HEAD {key}");
        let url = self.url(&["storage", "v1", "b", bucket, "o", key])?;
        match self.send(&what, self.http.get(url)).await? {
            Some(r) => {
                Ok(Some(r.json().await.map_err(|e| {
                    backend_error(format!("{what}: {e}"), true)
                })?))
            }
            None => Ok(None),
        }
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<&str>,
    ) -> Result<ListPage> {
        let what = format!("LIST {prefix}");
        let url = self.url(&["storage", "v1", "b", bucket, "o"])?;
        let mut query = vec![("prefix", prefix)];
        query.extend(delimiter.map(|d| ("delimiter", d)));
        query.extend(token.map(|t| ("pageToken", t)));
        match self.send(&what, self.http.get(url).query(&query)).await? {
            Some(r) => r
                .json()
                .await
                .map_err(|e| backend_error(format!("{what}: {e}"), true)),
            None => Err(backend_error(
                format!("{what}: the bucket {bucket} does not exist"),
                false,
            )),
        }
    }

    /// A server-side copy (`rewriteTo`, repeated until done); `metadata` replaces the
    /// source's when given.
    async fn rewrite(
        &self,
        bucket: &str,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
        kms_key: Option<&str>,
    ) -> Result<()> {
        let what = format!("COPY {from} → {to}");
        let url = self.url(&[
            "storage",
            "v1",
            "b",
            bucket,
            "o",
            from,
            "rewriteTo",
            "b",
            bucket,
            "o",
            to,
        ])?;
        let body = match metadata {
            Some(metadata) => {
                serde_json::json!({ "contentType": "application/json", "metadata": metadata })
            }
            None => serde_json::json!({}),
        };
        let mut token: Option<String> = None;
        loop {
            let mut query: Vec<(&str, &str)> = Vec::new();
            query.extend(kms_key.map(|k| ("destinationKmsKeyName", k)));
            query.extend(token.as_deref().map(|t| ("rewriteToken", t)));
            let request = self.http.post(url.clone()).query(&query).json(&body);
            let Some(response) = self.send(&what, request).await? else {
                return Err(backend_error(
                    format!("{what}: the source does not exist"),
                    false,
                ));
            };
            let answer: RewriteAnswer = response
                .json()
                .await
                .map_err(|e| backend_error(format!("{what}: {e}"), true))?;
            if answer.done {
                return Ok(());
            }
            match answer.rewrite_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => {
                    return Err(backend_error(
                        format!("{what}: GCS answered not done without a rewrite token"),
                        true,
                    ));
                }
            }
        }
    }

    /// Deletes; a missing object is not an error.
    async fn delete(&self, bucket: &str, key: &str) -> Result<()> {
        let url = self.url(&["storage", "v1", "b", bucket, "o", key])?;
        self.send(&format!("DELETE {key}"), self.http.delete(url))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_apis_64_bit_numbers_are_read_from_strings_or_numbers() {
        let o: JsonObject = serde_json::from_str(
            r#"{"name":"a/b","generation":"1795326048501904","size":24,"metadata":{"k":"v"}}"#,
        )
        .unwrap();
        assert_eq!(o.generation, 1_795_326_048_501_904);
        assert_eq!(o.size, 24);
        assert_eq!(o.metadata.unwrap()["k"], "v");
    }

    #[test]
    fn object_names_are_one_percent_encoded_path_segment() {
        let api = JsonApi {
            http: reqwest::Client::new(),
            base: "http://127.0.0.1:4443/".into(),
            credentials: google_cloud_auth::credentials::anonymous::Builder::new().build(),
        };
        let url = api
            .url(&[
                "storage",
                "v1",
                "b",
                "bkt",
                "o",
                "p/t/w/versions/0000000001.tfstate",
            ])
            .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:4443/storage/v1/b/bkt/o/p%2Ft%2Fw%2Fversions%2F0000000001.tfstate"
        );
    }
}
