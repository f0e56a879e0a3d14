//! The customer's S3 bucket ([`S3Bucket`], under the protocol of [`crate::objects`]), with the
//! workspace's lease in a DynamoDB table ([`DynamoLeases`]) or in an S3 lock object.
//!
//! S3's conditions: `If-None-Match: *` creates only, `If-Match: ETAG` replaces only that
//! version; DeleteObject honours `If-Match` too, so a change mark is deleted when cleared.
//!
//! In DynamoDB mode the lease is an item per workspace (partition key `pk` = the workspace's
//! key prefix) whose conditions carry the rules themselves: taken only when free or expired
//! (`attribute_not_exists(owner) OR expires_at <= :now`, so expiry does not wait for TTL
//! deletion), renewed and released only by its owner and fence; `last_fence` only grows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ServerSideEncryption;
use bytes::Bytes;

use crate::objects::{Bucket, BucketStore, Condition, LeaseKeeper, Listed, Object};
use crate::{Result, StoreError};

mod dynamo;
pub use dynamo::DynamoLeases;

const BACKEND: &str = "s3";

/// Where the workspace's lease lives.
#[derive(Clone, Debug)]
pub enum LeaseMode {
    /// An item per workspace in a DynamoDB table whose partition key is the string `pk`.
    DynamoDb { table: String },
    /// `lease.json` beside the state, changed with `If-Match` on its ETag.
    LockObject,
}

impl LeaseMode {
    /// In the DynamoDB `table` when there is one, else a lock object.
    pub fn from_table(table: Option<String>) -> Self {
        match table {
            Some(table) => Self::DynamoDb { table },
            None => Self::LockObject,
        }
    }
}

/// The customer's bucket.
#[derive(Clone, Debug)]
pub struct S3Config {
    pub bucket: String,
    /// Prepended to every key (`prefix/tenant/workspace/…`); empty for none.
    pub prefix: String,
    pub lease: LeaseMode,
    /// Encrypt every object with this KMS key (SSE-KMS); the bucket's default otherwise.
    pub kms_key_id: Option<String>,
}

/// The S3 (+ DynamoDB) store.
pub type S3Store = BucketStore<S3Bucket>;

impl BucketStore<S3Bucket> {
    /// A store over clients the caller configured (region, credentials, endpoint). The
    /// DynamoDB client is needed only in [`LeaseMode::DynamoDb`].
    ///
    /// # Errors
    /// [`StoreError::Backend`] when DynamoDB mode is asked for without a DynamoDB client.
    pub fn new(
        s3: aws_sdk_s3::Client,
        dynamodb: Option<aws_sdk_dynamodb::Client>,
        config: S3Config,
    ) -> Result<Self> {
        let leases: Option<Arc<dyn LeaseKeeper>> = match (&config.lease, dynamodb) {
            (LeaseMode::LockObject, _) => None,
            (LeaseMode::DynamoDb { table }, Some(client)) => Some(Arc::new(DynamoLeases {
                client,
                table: table.clone(),
            })),
            (LeaseMode::DynamoDb { .. }, None) => {
                return Err(backend_error(
                    "the DynamoDB lease mode needs a DynamoDB client".into(),
                    false,
                ));
            }
        };
        let bucket = S3Bucket {
            client: s3,
            bucket: config.bucket,
            kms_key_id: config.kms_key_id,
        };
        Ok(Self::over(bucket, &config.prefix, leases))
    }
}

impl BucketStore<S3Bucket> {
    /// A store over clients made from `sdk` (region, credentials, endpoint): S3, path-style
    /// when `path_style` (S3-compatible endpoints, emulators), and DynamoDB when the lease is
    /// kept there.
    ///
    /// # Errors
    /// As [`BucketStore::new`].
    pub fn from_sdk(
        sdk: &aws_config::SdkConfig,
        path_style: bool,
        config: S3Config,
    ) -> Result<Self> {
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(sdk)
                .force_path_style(path_style)
                .build(),
        );
        let dynamodb = matches!(config.lease, LeaseMode::DynamoDb { .. })
            .then(|| aws_sdk_dynamodb::Client::new(sdk));
        Self::new(s3, dynamodb, config)
    }
}

/// One S3 bucket.
#[derive(Clone, Debug)]
pub struct S3Bucket {
    client: aws_sdk_s3::Client,
    bucket: String,
    kms_key_id: Option<String>,
}

#[async_trait]
impl Bucket for S3Bucket {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn get(&self, key: &str) -> Result<Option<Object>> {
        match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => {
                let tag = out.e_tag().unwrap_or_default().to_owned();
                let metadata = out.metadata().cloned().unwrap_or_default();
                let data = out
                    .body
                    .collect()
                    .await
                    .map_err(|e| backend_error(format!("reading {key}: {e}"), true))?
                    .into_bytes();
                Ok(Some(Object {
                    data,
                    tag,
                    metadata,
                }))
            }
            Err(e) if status(&e) == Some(404) => Ok(None),
            Err(e) => Err(sdk_error(&format!("GET {key}"), e)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => Ok(Some(out.metadata().cloned().unwrap_or_default())),
            Err(e) if status(&e) == Some(404) => Ok(None),
            Err(e) => Err(sdk_error(&format!("HEAD {key}"), e)),
        }
    }

    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<Option<String>>> {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type("application/json")
            .set_metadata((!metadata.is_empty()).then_some(metadata))
            .body(ByteStream::from(data));
        req = match condition {
            Condition::None => req,
            Condition::Absent => req.if_none_match("*"),
            Condition::Matches(etag) => req.if_match(etag),
        };
        if let Some(kms) = &self.kms_key_id {
            req = req
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .ssekms_key_id(kms);
        }
        match req.send().await {
            Ok(written) => Ok(Some(written.e_tag().map(str::to_owned))),
            Err(e) if matches!(status(&e), Some(412 | 409)) => Ok(None),
            Err(e) => Err(sdk_error(&format!("PUT {key}"), e)),
        }
    }

    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        let mut req = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .copy_source(copy_source(&self.bucket, from))
            .key(to);
        if let Some(metadata) = metadata {
            req = req
                .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                .content_type("application/json")
                .set_metadata(Some(metadata));
        }
        if let Some(kms) = &self.kms_key_id {
            req = req
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .ssekms_key_id(kms);
        }
        req.send()
            .await
            .map_err(|e| sdk_error(&format!("COPY {from} → {to}"), e))?;
        Ok(())
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("DELETE {key}"), e))?;
        Ok(())
    }

    fn deletes_per_request(&self) -> usize {
        1000
    }

    async fn delete_many(&self, keys: &[String]) -> Result<()> {
        use aws_sdk_s3::types::{Delete, ObjectIdentifier};
        // One request per 1,000 keys (S3's limit), reporting only the keys that failed.
        for chunk in keys.chunks(self.deletes_per_request()) {
            let objects = chunk
                .iter()
                .map(|key| ObjectIdentifier::builder().key(key).build())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| backend_error(format!("DELETE (batch): {e}"), false))?;
            let delete = Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build()
                .map_err(|e| backend_error(format!("DELETE (batch): {e}"), false))?;
            let done = self
                .client
                .delete_objects()
                .bucket(&self.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| sdk_error(&format!("DELETE {} keys", chunk.len()), e))?;
            if let Some(failed) = done.errors().first() {
                let code = failed.code().unwrap_or_default();
                return Err(backend_error(
                    format!(
                        "DELETE {}: {code}: {} ({} of {} keys not deleted)",
                        failed.key().unwrap_or_default(),
                        failed.message().unwrap_or_default(),
                        done.errors().len(),
                        chunk.len()
                    ),
                    code == "InternalError" || code == "SlowDown" || code == "ServiceUnavailable",
                ));
            }
        }
        Ok(())
    }

    async fn clear_if(&self, key: &str, tag: &str) -> Result<()> {
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .if_match(tag)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            // Written again since it was listed, or already gone: keep what is there.
            Err(e) if matches!(status(&e), Some(412 | 404)) => Ok(()),
            Err(e) => Err(sdk_error(&format!("DELETE {key}"), e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| sdk_error(&format!("LIST {prefix}"), e))?;
            out.extend(page.contents().iter().filter_map(|o| {
                Some(Listed {
                    key: o.key()?.to_owned(),
                    tag: o.e_tag().unwrap_or_default().to_owned(),
                    size: o.size().and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                })
            }));
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_owned()),
                _ => return Ok(out),
            }
        }
    }

    async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .delimiter("/")
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| sdk_error(&format!("LIST {prefix} (folders)"), e))?;
            out.extend(page.common_prefixes().iter().filter_map(|p| {
                let name = p.prefix()?.strip_prefix(prefix)?.strip_suffix('/')?;
                Some(name.to_owned())
            }));
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_owned()),
                _ => return Ok(out),
            }
        }
    }
}

fn backend_error(message: String, retryable: bool) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        message,
        retryable,
        source: None,
    }
}

type SdkError<E> = aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>;

fn status<E>(e: &SdkError<E>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// The AWS SDK's timeouts for every caller (the CLI and the function): connect within 10 s, and
/// give one attempt of a call up after `call` ([`crate::CALL_TIMEOUT`] by default), so a request
/// never answered cannot hold a job, its result or its lease for good.
pub fn timeouts(call: Duration) -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(10))
        .operation_attempt_timeout(call)
        .build()
}

/// An SDK error in one line: the service's code and message, or what failed on the way (the
/// SDK's own rendering of a service error carries the whole raw response).
pub fn brief<E, R>(e: &aws_sdk_s3::error::SdkError<E, R>) -> String
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match e {
        aws_sdk_s3::error::SdkError::ServiceError(s) => {
            let err = s.err();
            match (err.code(), err.message()) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(code), None) => code.to_owned(),
                _ => err.to_string(),
            }
        }
        other => aws_sdk_s3::error::DisplayErrorContext(other).to_string(),
    }
}

/// Whether a failed AWS call may succeed if made again: it never got an answer, or got a 5xx,
/// a 429, or an error code the SDK itself counts as throttling or transient. DynamoDB throttles
/// with a 400 (`ThrottlingException`, `ProvisionedThroughputExceededException`), so the status
/// alone would call a busy table a permanent failure.
pub(crate) fn may_pass<E>(e: &SdkError<E>) -> bool
where
    E: aws_sdk_s3::error::ProvideErrorMetadata,
{
    use aws_runtime::retries::classifiers::{THROTTLING_ERRORS, TRANSIENT_ERRORS};
    match e {
        aws_sdk_s3::error::SdkError::TimeoutError(_)
        | aws_sdk_s3::error::SdkError::DispatchFailure(_)
        | aws_sdk_s3::error::SdkError::ResponseError(_) => true,
        aws_sdk_s3::error::SdkError::ServiceError(s)
            if s.err().code().is_some_and(|c| {
                THROTTLING_ERRORS.contains(&c) || TRANSIENT_ERRORS.contains(&c)
            }) =>
        {
            true
        }
        _ => status(e).is_some_and(|c| c >= 500 || c == 429),
    }
}

/// A failed SDK call as a store error, retryable as [`may_pass`] says.
fn sdk_error<E>(what: &str, e: SdkError<E>) -> StoreError
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let retryable = may_pass(&e);
    let detail = brief(&e);
    StoreError::Backend {
        backend: BACKEND,
        message: format!("{what}: {detail}"),
        retryable,
        source: Some(Box::new(e)),
    }
}

// ----- DynamoDB lease items -----

/// `CopySource` names the object URL-encoded (`bucket/key`, `/` kept): a key with a space, a
/// `+` or non-ASCII text would otherwise name another object, or none.
fn copy_source(bucket: &str, key: &str) -> String {
    let mut out = String::with_capacity(bucket.len() + key.len() + 1);
    for b in format!("{bucket}/{key}").bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::dynamo::{n, record_from_item};
    use super::*;
    use aws_sdk_dynamodb::types::AttributeValue;

    #[test]
    fn a_copy_source_is_url_encoded_but_its_slashes() {
        assert_eq!(
            copy_source("b", "p q/a+b/ü.json"),
            "b/p%20q/a%2Bb/%C3%BC.json"
        );
        assert_eq!(
            copy_source("b", "states/acme/x_1.tfstate"),
            "b/states/acme/x_1.tfstate"
        );
    }

    #[test]
    fn a_lease_item_reads_back_as_the_lease_it_records() {
        let item = HashMap::from([
            ("pk".to_owned(), AttributeValue::S("t/w".into())),
            ("last_fence".to_owned(), n(4)),
            ("owner".to_owned(), AttributeValue::S("job-1".into())),
            ("fence".to_owned(), n(4)),
            ("acquired_at".to_owned(), n(1_700_000_000_000)),
            ("expires_at".to_owned(), n(1_700_000_060_000)),
            (
                "info".to_owned(),
                AttributeValue::S("{\"op\":\"apply\"}".into()),
            ),
        ]);
        let record = record_from_item(Some(&item));
        assert_eq!(record.last_fence, 4);
        let held = record.held.unwrap();
        assert_eq!((held.owner.as_str(), held.fence), ("job-1", 4));
        assert_eq!(held.info["op"], "apply");
        assert_eq!(
            held.expires_at - held.acquired_at,
            time::Duration::seconds(60)
        );
        let mut released = item.clone();
        released.remove("owner");
        assert!(record_from_item(Some(&released)).held.is_none());
    }

    fn answered(
        status: u16,
        code: &str,
    ) -> SdkError<aws_sdk_dynamodb::operation::get_item::GetItemError> {
        let meta = aws_sdk_s3::error::ErrorMetadata::builder()
            .code(code)
            .build();
        let raw = aws_sdk_s3::config::http::HttpResponse::new(
            status.try_into().unwrap(),
            aws_sdk_s3::primitives::SdkBody::empty(),
        );
        aws_sdk_s3::error::SdkError::service_error(
            aws_sdk_dynamodb::operation::get_item::GetItemError::generic(meta),
            raw,
        )
    }

    #[test]
    fn a_throttled_or_failing_call_may_pass_and_a_refused_one_does_not() {
        // DynamoDB throttles with a 400: the code, not the status, says it may pass.
        assert!(may_pass(&answered(400, "ThrottlingException")));
        assert!(may_pass(&answered(
            400,
            "ProvisionedThroughputExceededException"
        )));
        assert!(may_pass(&answered(400, "RequestTimeout")));
        assert!(may_pass(&answered(503, "SlowDown")));
        assert!(may_pass(&answered(500, "InternalError")));
        assert!(!may_pass(&answered(400, "ValidationException")));
        assert!(!may_pass(&answered(403, "AccessDenied")));
        let e = sdk_error("DynamoDB GetItem", answered(400, "ThrottlingException"));
        assert!(e.is_retryable(), "{e}");
    }
}
