//! The customer's S3 bucket, with the workspace's lease in a DynamoDB table or in an S3 lock
//! object.
//!
//! Layout under `<prefix>/<tenant>/<workspace>/`:
//! - `versions/<n:010>.tfstate`: every accepted state, created once with `If-None-Match: *`.
//!   That conditional create **is** the commit: of two writers that read version `n`, exactly
//!   one creates `n + 1`, the other gets 412 (a conflict). The version's facts (serial,
//!   lineage, sha256, time) are its object metadata. A deletion is a marker version (empty,
//!   `terrace-kind: deleted`), so numbering goes on and history stays.
//! - `terraform.tfstate`: a server-side copy of the current version, carrying its number in
//!   its metadata. It is where a reader starts; a reader then checks that version `n + 1` does
//!   not exist (a writer may have died between its commit and its copy), so the copy is a hint
//!   that can lag, never a source of truth.
//! - `lease.json` (lock-object mode): the [`LeaseRecord`], changed only with `If-Match` on its
//!   ETag (`If-None-Match: *` the first time). In DynamoDB mode the lease is an item whose
//!   conditions carry the rules themselves: taken only when free or expired, renewed and
//!   released only by its owner and fence.
//! - `backups/<label>.tfstate` (server-side copies) and `backups/index.json`.
//! - `runs/<job-id>/…`: run artifacts.
//!
//! and `<prefix>/_changes/<tenant>/<workspace>`, written after every commit and deleted (with
//! `If-Match` on its ETag) by the backup sweep once it has copied that state: the sweep lists
//! only these, so it costs calls in proportion to the changed workspaces.
//!
//! Writes are fenced by reading the lease immediately before the conditional create: S3 has no
//! condition across two objects (or across S3 and DynamoDB), so a writer whose lease runs out
//! in the milliseconds between the two can still land one write, and that write is still a
//! checked successor of the version it read.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ServerSideEncryption;
use bytes::Bytes;
use time::OffsetDateTime;

use crate::lease::{LeaseRecord, check_put, plus};
use crate::{
    BackupInfo, Changed, CurrentState, Fence, Lease, LeaseRequest, NewState, PutMode, Result,
    StateStore, StoreError, TakenOver, VersionInfo, VersionToken, WorkspaceId, sha256_hex,
};

const BACKEND: &str = "s3";

/// Where the workspace's lease lives.
#[derive(Clone, Debug)]
pub enum LeaseMode {
    /// An item per workspace in a DynamoDB table whose partition key is the string `pk`.
    DynamoDb { table: String },
    /// `lease.json` beside the state, changed with `If-Match` on its ETag.
    LockObject,
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
#[derive(Clone, Debug)]
pub struct S3Store {
    s3: aws_sdk_s3::Client,
    dynamodb: Option<aws_sdk_dynamodb::Client>,
    config: S3Config,
}

impl S3Store {
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
        if matches!(config.lease, LeaseMode::DynamoDb { .. }) && dynamodb.is_none() {
            return Err(backend_error(
                "the DynamoDB lease mode needs a DynamoDB client".into(),
                false,
            ));
        }
        Ok(Self {
            s3,
            dynamodb,
            config,
        })
    }

    fn base(&self, ws: &WorkspaceId) -> String {
        let prefix = self.config.prefix.trim_matches('/');
        if prefix.is_empty() {
            format!("{}/{}", ws.tenant(), ws.workspace())
        } else {
            format!("{prefix}/{}/{}", ws.tenant(), ws.workspace())
        }
    }

    fn key(&self, ws: &WorkspaceId, rest: &str) -> String {
        format!("{}/{rest}", self.base(ws))
    }

    fn changes_prefix(&self) -> String {
        let prefix = self.config.prefix.trim_matches('/');
        if prefix.is_empty() {
            "_changes/".to_owned()
        } else {
            format!("{prefix}/_changes/")
        }
    }

    fn change_key(&self, ws: &WorkspaceId) -> String {
        format!(
            "{}{}/{}",
            self.changes_prefix(),
            ws.tenant(),
            ws.workspace()
        )
    }

    /// After a commit: the workspace has a change for the backup sweep. A lost mark (the writer
    /// died right after its commit) only delays a backup until the next write.
    async fn mark_changed(&self, ws: &WorkspaceId, number: u64) -> Result<()> {
        self.put_object(
            &self.change_key(ws),
            Bytes::from(number.to_string()),
            HashMap::new(),
            Condition::None,
        )
        .await
        .map(|_| ())
    }

    fn version_key(&self, ws: &WorkspaceId, number: u64) -> String {
        self.key(ws, &format!("versions/{number:010}.tfstate"))
    }

    // ----- objects -----

    async fn get(&self, key: &str) -> Result<Option<Object>> {
        match self
            .s3
            .get_object()
            .bucket(&self.config.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => {
                let etag = out.e_tag().unwrap_or_default().to_owned();
                let metadata = out.metadata().cloned().unwrap_or_default();
                let data = out
                    .body
                    .collect()
                    .await
                    .map_err(|e| backend_error(format!("reading {key}: {e}"), true))?
                    .into_bytes();
                Ok(Some(Object {
                    data,
                    etag,
                    metadata,
                }))
            }
            Err(e) if status(&e) == Some(404) => Ok(None),
            Err(e) => Err(sdk_error(&format!("GET {key}"), e)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
        match self
            .s3
            .head_object()
            .bucket(&self.config.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => Ok(Some(out.metadata().cloned().unwrap_or_default())),
            Err(e) if status(&e) == Some(404) => Ok(None),
            Err(e) => Err(sdk_error(&format!("HEAD {key}"), e)),
        }
    }

    /// PUT with an optional condition; `Ok(false)` when the condition failed (412, or 409 for
    /// a concurrent conditional write).
    async fn put_object(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<bool> {
        let mut req = self
            .s3
            .put_object()
            .bucket(&self.config.bucket)
            .key(key)
            .content_type("application/json")
            .set_metadata((!metadata.is_empty()).then_some(metadata))
            .body(ByteStream::from(data));
        req = match condition {
            Condition::None => req,
            Condition::Absent => req.if_none_match("*"),
            Condition::Matches(etag) => req.if_match(etag),
        };
        if let Some(kms) = &self.config.kms_key_id {
            req = req
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .ssekms_key_id(kms);
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) if matches!(status(&e), Some(412 | 409)) => Ok(false),
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
            .s3
            .copy_object()
            .bucket(&self.config.bucket)
            .copy_source(format!("{}/{from}", self.config.bucket))
            .key(to);
        if let Some(metadata) = metadata {
            req = req
                .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                .content_type("application/json")
                .set_metadata(Some(metadata));
        }
        if let Some(kms) = &self.config.kms_key_id {
            req = req
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .ssekms_key_id(kms);
        }
        req.send()
            .await
            .map_err(|e| sdk_error(&format!("COPY {from} → {to}"), e))?;
        Ok(())
    }

    async fn delete_object(&self, key: &str) -> Result<()> {
        self.s3
            .delete_object()
            .bucket(&self.config.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("DELETE {key}"), e))?;
        Ok(())
    }

    /// Every object under `prefix`: key, ETag and size.
    async fn list_objects(&self, prefix: &str) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .s3
                .list_objects_v2()
                .bucket(&self.config.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| sdk_error(&format!("LIST {prefix}"), e))?;
            out.extend(page.contents().iter().filter_map(|o| {
                Some(Listed {
                    key: o.key()?.to_owned(),
                    etag: o.e_tag().unwrap_or_default().to_owned(),
                    size: o.size().and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                })
            }));
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_owned()),
                _ => return Ok(out),
            }
        }
    }

    /// The names of the "folders" right under `prefix` (which ends with `/`).
    async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .s3
                .list_objects_v2()
                .bucket(&self.config.bucket)
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

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .list_objects(prefix)
            .await?
            .into_iter()
            .map(|o| o.key)
            .collect())
    }

    // ----- versions -----

    /// The number of the newest committed version (0: none), and whether it is a deletion.
    async fn head_version(&self, ws: &WorkspaceId) -> Result<(u64, bool)> {
        let (number, deleted, _) = self.newest(ws, false).await?;
        Ok((number, deleted))
    }

    /// The newest committed version: its number (0: none), whether it is a deletion, and, when
    /// `with_data` and the copy is of that version, the copy itself (its content and facts, so
    /// a reader needs nothing more). Copies are only ever made of states, and the copy is
    /// removed by a deletion, so an existing copy is never of a marker.
    async fn newest(
        &self,
        ws: &WorkspaceId,
        with_data: bool,
    ) -> Result<(u64, bool, Option<Object>)> {
        let copy_key = self.key(ws, "terraform.tfstate");
        let number_in = |meta: &HashMap<String, String>| {
            meta.get(META_NUMBER)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let copy = if with_data {
            self.get(&copy_key)
                .await?
                .map(|o| (number_in(&o.metadata), Some(o)))
        } else {
            self.head(&copy_key).await?.map(|m| (number_in(&m), None))
        };
        let (mut number, mut marker, mut copy): (u64, bool, Option<Object>) = match copy {
            Some((n, obj)) => (n, false, obj.filter(|_| n > 0)),
            // No copy: a new or deleted workspace. The listing (strongly consistent) says
            // which, and needs no probe after it.
            None => {
                let n = self.highest_listed(ws).await?;
                let mut marker = false;
                if n > 0 {
                    let key = self.version_key(ws, n);
                    let meta = self
                        .head(&key)
                        .await?
                        .ok_or_else(|| corrupt(&key, "a listed version does not exist"))?;
                    marker = is_deleted(&meta);
                }
                return Ok((n, n == 0 || marker, None));
            }
        };
        // The copy may lag a writer that died between its commit and its copy.
        while let Some(meta) = self.head(&self.version_key(ws, number + 1)).await? {
            number += 1;
            marker = is_deleted(&meta);
            copy = None;
        }
        Ok((number, number == 0 || marker, copy))
    }

    async fn highest_listed(&self, ws: &WorkspaceId) -> Result<u64> {
        Ok(self
            .list(&self.key(ws, "versions/"))
            .await?
            .iter()
            .filter_map(|k| version_number(k))
            .max()
            .unwrap_or(0))
    }

    async fn version_info(&self, ws: &WorkspaceId, number: u64) -> Result<Option<VersionInfo>> {
        let key = self.version_key(ws, number);
        let Some(meta) = self.head(&key).await? else {
            return Ok(None);
        };
        if is_deleted(&meta) {
            return Ok(None);
        }
        info_from_metadata(number, &meta)
            .map(Some)
            .map_err(|detail| corrupt(&key, &detail))
    }

    /// Checks a write (fence and expected version) and commits `data` as the next version.
    async fn commit(
        &self,
        ws: &WorkspaceId,
        mode: &PutMode,
        fence: Option<&Fence>,
        data: Bytes,
        metadata: HashMap<String, String>,
    ) -> Result<u64> {
        let (number, deleted) = self.head_version(ws).await?;
        let current = (!deleted).then(|| VersionToken(number.to_string()));
        let record = match fence {
            Some(_) => self.lease_record(ws).await?,
            None => LeaseRecord::default(),
        };
        check_put(ws, &record, current.as_ref(), mode, fence)?;
        let next = number + 1;
        if !self
            .put_object(
                &self.version_key(ws, next),
                data,
                metadata,
                Condition::Absent,
            )
            .await?
        {
            return Err(StoreError::Conflict {
                workspace: ws.clone(),
                detail: format!("version {next} was written by another writer first"),
            });
        }
        Ok(next)
    }

    // ----- leases -----

    async fn lease_record(&self, ws: &WorkspaceId) -> Result<LeaseRecord> {
        match &self.config.lease {
            LeaseMode::LockObject => Ok(self.lock_object(ws).await?.0),
            LeaseMode::DynamoDb { table } => {
                let item = self
                    .ddb()
                    .get_item()
                    .table_name(table)
                    .key("pk", AttributeValue::S(self.base(ws)))
                    .consistent_read(true)
                    .send()
                    .await
                    .map_err(|e| sdk_error("DynamoDB GetItem", e))?;
                Ok(record_from_item(item.item()))
            }
        }
    }

    /// An update of the workspace's lease item.
    fn lease_item(
        &self,
        ws: &WorkspaceId,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.ddb()
            .update_item()
            .table_name(self.table())
            .key("pk", AttributeValue::S(self.base(ws)))
    }

    fn ddb(&self) -> &aws_sdk_dynamodb::Client {
        self.dynamodb
            .as_ref()
            .expect("checked in new(): DynamoDB mode has a client")
    }

    fn table(&self) -> &str {
        match &self.config.lease {
            LeaseMode::DynamoDb { table } => table,
            LeaseMode::LockObject => unreachable!("only called in DynamoDB mode"),
        }
    }

    async fn lock_object(&self, ws: &WorkspaceId) -> Result<(LeaseRecord, Option<String>)> {
        let key = self.key(ws, "lease.json");
        match self.get(&key).await? {
            None => Ok((LeaseRecord::default(), None)),
            Some(obj) => {
                let record =
                    serde_json::from_slice(&obj.data).map_err(|e| corrupt(&key, &e.to_string()))?;
                Ok((record, Some(obj.etag)))
            }
        }
    }

    /// Reads the lock object, applies `change`, and writes it back if its ETag still matches,
    /// retrying on a concurrent change. `change` returns what to answer and whether to write.
    async fn with_lock_object<T>(
        &self,
        ws: &WorkspaceId,
        mut change: impl FnMut(&mut LeaseRecord) -> Result<(T, bool)>,
    ) -> Result<T> {
        let key = self.key(ws, "lease.json");
        for _ in 0..20 {
            let (mut record, etag) = self.lock_object(ws).await?;
            let (answer, write) = change(&mut record)?;
            if !write {
                return Ok(answer);
            }
            let data = Bytes::from(serde_json::to_vec(&record).expect("lease record serializes"));
            let condition = match &etag {
                Some(etag) => Condition::Matches(etag),
                None => Condition::Absent,
            };
            if self
                .put_object(&key, data, HashMap::new(), condition)
                .await?
            {
                return Ok(answer);
            }
        }
        Err(backend_error(
            format!("{key} kept changing under 20 attempts to update it"),
            true,
        ))
    }
}

/// How a PUT is conditioned.
enum Condition<'a> {
    None,
    /// `If-None-Match: *`: only if the key does not exist.
    Absent,
    /// `If-Match: ETAG`.
    Matches(&'a str),
}

struct Listed {
    key: String,
    etag: String,
    size: u64,
}

struct Object {
    data: Bytes,
    etag: String,
    metadata: HashMap<String, String>,
}

const META_NUMBER: &str = "terrace-number";
const META_KIND: &str = "terrace-kind";
const META_SERIAL: &str = "terrace-serial";
const META_LINEAGE: &str = "terrace-lineage";
const META_SHA256: &str = "terrace-sha256";
const META_CREATED: &str = "terrace-created";

fn is_deleted(meta: &HashMap<String, String>) -> bool {
    meta.get(META_KIND).is_some_and(|k| k == "deleted")
}

fn version_number(key: &str) -> Option<u64> {
    key.rsplit('/')
        .next()?
        .strip_suffix(".tfstate")?
        .parse()
        .ok()
}

fn info_metadata(info: &VersionInfo) -> HashMap<String, String> {
    HashMap::from([
        (META_KIND.to_owned(), "state".to_owned()),
        (META_NUMBER.to_owned(), info.number.to_string()),
        (META_SERIAL.to_owned(), info.serial.to_string()),
        (META_LINEAGE.to_owned(), info.lineage.clone()),
        (META_SHA256.to_owned(), info.sha256.clone()),
        (
            META_CREATED.to_owned(),
            info.created_at
                .format(&time::format_description::well_known::Rfc3339)
                .expect("a UTC time formats"),
        ),
    ])
}

fn info_from_metadata(
    number: u64,
    meta: &HashMap<String, String>,
) -> std::result::Result<VersionInfo, String> {
    let get = |k: &str| {
        meta.get(k)
            .ok_or_else(|| format!("metadata {k} is missing"))
    };
    Ok(VersionInfo {
        number,
        serial: get(META_SERIAL)?
            .parse()
            .map_err(|e| format!("serial: {e}"))?,
        lineage: get(META_LINEAGE)?.clone(),
        created_at: OffsetDateTime::parse(
            get(META_CREATED)?,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|e| format!("created: {e}"))?,
        size: 0,
        sha256: get(META_SHA256)?.clone(),
    })
}

fn corrupt(key: &str, detail: &str) -> StoreError {
    StoreError::Corrupt {
        path: format!("s3 {key}"),
        detail: detail.to_owned(),
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

/// The HTTP status of a failed SDK call, when it got one.
fn status<E>(e: &SdkError<E>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// A failed SDK call as a store error: retryable when it never got an answer, or got a 5xx or
/// a throttling answer.
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

fn sdk_error<E>(what: &str, e: SdkError<E>) -> StoreError
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let retryable = match &e {
        aws_sdk_s3::error::SdkError::TimeoutError(_)
        | aws_sdk_s3::error::SdkError::DispatchFailure(_)
        | aws_sdk_s3::error::SdkError::ResponseError(_) => true,
        _ => status(&e).is_some_and(|c| c >= 500 || c == 429),
    };
    let detail = brief(&e);
    StoreError::Backend {
        backend: BACKEND,
        message: format!("{what}: {detail}"),
        retryable,
        source: Some(Box::new(e)),
    }
}

// ----- DynamoDB lease items -----

/// Frees a lease item, keeping its fence counter.
const FREE: &str = "REMOVE #owner, fence, acquired_at, expires_at, info";

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn millis(t: OffsetDateTime) -> u64 {
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

fn from_millis(ms: u64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn num(item: &HashMap<String, AttributeValue>, key: &str) -> Option<u64> {
    item.get(key)?.as_n().ok()?.parse().ok()
}

fn string(item: &HashMap<String, AttributeValue>, key: &str) -> Option<String> {
    item.get(key)?.as_s().ok().cloned()
}

/// The lease a DynamoDB item records as held, if any.
fn lease_from_item(item: &HashMap<String, AttributeValue>) -> Option<Lease> {
    Some(Lease {
        owner: string(item, "owner")?,
        fence: num(item, "fence")?,
        acquired_at: from_millis(num(item, "acquired_at")?),
        expires_at: from_millis(num(item, "expires_at")?),
        info: string(item, "info")
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(serde_json::Value::Null),
        took_over: None,
    })
}

fn record_from_item(item: Option<&HashMap<String, AttributeValue>>) -> LeaseRecord {
    match item {
        None => LeaseRecord::default(),
        Some(item) => LeaseRecord {
            last_fence: num(item, "last_fence").unwrap_or(0),
            held: lease_from_item(item),
        },
    }
}

#[async_trait]
impl StateStore for S3Store {
    fn kind(&self) -> &'static str {
        "s3"
    }

    async fn current(&self, ws: &WorkspaceId) -> Result<Option<CurrentState>> {
        let (number, deleted, copy) = self.newest(ws, true).await?;
        if deleted {
            return Ok(None);
        }
        let key = self.version_key(ws, number);
        let obj = match copy {
            Some(copy) => copy,
            None => self
                .get(&key)
                .await?
                .ok_or_else(|| corrupt(&key, "the version vanished"))?,
        };
        let mut version =
            info_from_metadata(number, &obj.metadata).map_err(|d| corrupt(&key, &d))?;
        version.size = obj.data.len() as u64;
        if sha256_hex(&obj.data) != version.sha256 {
            return Err(corrupt(&key, "the content does not match its sha256"));
        }
        Ok(Some(CurrentState {
            token: VersionToken(number.to_string()),
            data: obj.data,
            version,
        }))
    }

    async fn put(
        &self,
        ws: &WorkspaceId,
        state: NewState,
        mode: PutMode,
        fence: Option<&Fence>,
    ) -> Result<VersionInfo> {
        let mut info = VersionInfo {
            number: 0,
            serial: state.serial,
            lineage: state.lineage,
            created_at: OffsetDateTime::now_utc(),
            size: state.data.len() as u64,
            sha256: sha256_hex(&state.data),
        };
        // The number is only known at commit; metadata carries it for the copy, so it is
        // filled in by a retry-free two-step: commit with the facts, then copy with the number.
        let mut meta = info_metadata(&info);
        meta.remove(META_NUMBER);
        let number = self.commit(ws, &mode, fence, state.data, meta).await?;
        info.number = number;
        if let Err(e) = self.mark_changed(ws, number).await {
            tracing::warn!(workspace = %ws, error = %e, "state version committed, but its change mark failed");
        }
        // The convenience copy, with the number a reader starts from. It may lag on a crash.
        let copied = self
            .copy(
                &self.version_key(ws, number),
                &self.key(ws, "terraform.tfstate"),
                Some(info_metadata(&info)),
            )
            .await;
        if let Err(e) = copied {
            tracing::warn!(workspace = %ws, error = %e, "state version committed, but its terraform.tfstate copy failed");
        }
        Ok(info)
    }

    async fn delete_current(
        &self,
        ws: &WorkspaceId,
        expected: &VersionToken,
        fence: Option<&Fence>,
    ) -> Result<()> {
        let meta = HashMap::from([(META_KIND.to_owned(), "deleted".to_owned())]);
        let number = self
            .commit(
                ws,
                &PutMode::Update(expected.clone()),
                fence,
                Bytes::new(),
                meta,
            )
            .await?;
        self.mark_changed(ws, number).await?;
        self.delete_object(&self.key(ws, "terraform.tfstate")).await
    }

    async fn versions(&self, ws: &WorkspaceId) -> Result<Vec<VersionInfo>> {
        let mut listed: Vec<(u64, u64)> = self
            .list_objects(&self.key(ws, "versions/"))
            .await?
            .iter()
            .filter_map(|o| Some((version_number(&o.key)?, o.size)))
            .collect();
        listed.sort_unstable();
        let mut out = Vec::with_capacity(listed.len());
        for (number, size) in listed {
            if let Some(mut info) = self.version_info(ws, number).await? {
                info.size = size;
                out.push(info);
            }
        }
        Ok(out)
    }

    async fn version(&self, ws: &WorkspaceId, number: u64) -> Result<Bytes> {
        let key = self.version_key(ws, number);
        match self.get(&key).await? {
            Some(obj) if !is_deleted(&obj.metadata) => Ok(obj.data),
            _ => Err(StoreError::NotFound {
                workspace: ws.clone(),
                what: format!("state version {number}"),
            }),
        }
    }

    async fn acquire_lease(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease> {
        match &self.config.lease {
            LeaseMode::LockObject => {
                let now = OffsetDateTime::now_utc();
                self.with_lock_object(ws, |record| match record.acquire(request, now) {
                    Ok(lease) => Ok((lease, true)),
                    Err(holder) => Err(StoreError::LeaseHeld {
                        workspace: ws.clone(),
                        holder,
                    }),
                })
                .await
            }
            LeaseMode::DynamoDb { .. } => self.acquire_item(ws, request).await,
        }
    }

    async fn renew_lease(&self, ws: &WorkspaceId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let lost = |reason: String| StoreError::LeaseLost {
            workspace: ws.clone(),
            owner: lease.owner.clone(),
            fence: lease.fence,
            reason,
        };
        match &self.config.lease {
            LeaseMode::LockObject => {
                let now = OffsetDateTime::now_utc();
                self.with_lock_object(ws, |record| {
                    record
                        .renew(lease, ttl, now)
                        .map(|l| (l, true))
                        .map_err(lost)
                })
                .await
            }
            LeaseMode::DynamoDb { .. } => {
                let now = OffsetDateTime::now_utc();
                let out = self
                    .lease_item(ws)
                    .update_expression("SET expires_at = :exp")
                    .condition_expression(
                        "#owner = :owner AND fence = :fence AND expires_at > :now",
                    )
                    .expression_attribute_names("#owner", "owner")
                    .expression_attribute_values(":owner", AttributeValue::S(lease.owner.clone()))
                    .expression_attribute_values(":fence", n(lease.fence))
                    .expression_attribute_values(":now", n(millis(now)))
                    .expression_attribute_values(":exp", n(millis(plus(now, ttl))))
                    .return_values(ReturnValue::AllNew)
                    .send()
                    .await;
                match out {
                    Ok(out) => out
                        .attributes()
                        .and_then(lease_from_item)
                        .ok_or_else(|| backend_error("renewed lease item is empty".into(), true)),
                    Err(e) if is_condition_failure(&e) => {
                        let record = self.lease_record(ws).await?;
                        let reason = record
                            .check(&lease.fence(), now)
                            .err()
                            .unwrap_or_else(|| "the lease changed while renewing".into());
                        Err(lost(reason))
                    }
                    Err(e) => Err(sdk_error("DynamoDB UpdateItem (renew)", e)),
                }
            }
        }
    }

    async fn release_lease(&self, ws: &WorkspaceId, lease: &Lease) -> Result<()> {
        match &self.config.lease {
            LeaseMode::LockObject => {
                self.with_lock_object(ws, |record| Ok(((), record.release(lease))))
                    .await
            }
            LeaseMode::DynamoDb { .. } => {
                let out = self
                    .lease_item(ws)
                    .update_expression(FREE)
                    .condition_expression("#owner = :owner AND fence = :fence")
                    .expression_attribute_names("#owner", "owner")
                    .expression_attribute_values(":owner", AttributeValue::S(lease.owner.clone()))
                    .expression_attribute_values(":fence", n(lease.fence))
                    .send()
                    .await;
                match out {
                    // Not ours any more (expired and taken, or broken): nothing to release.
                    Ok(_) => Ok(()),
                    Err(e) if is_condition_failure(&e) => Ok(()),
                    Err(e) => Err(sdk_error("DynamoDB UpdateItem (release)", e)),
                }
            }
        }
    }

    async fn break_lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        match &self.config.lease {
            LeaseMode::LockObject => {
                self.with_lock_object(ws, |record| {
                    let broken = record.break_lease();
                    let write = broken.is_some();
                    Ok((broken, write))
                })
                .await
            }
            LeaseMode::DynamoDb { .. } => {
                let out = self
                    .lease_item(ws)
                    .update_expression(FREE)
                    .condition_expression("attribute_exists(pk)")
                    .expression_attribute_names("#owner", "owner")
                    .return_values(ReturnValue::AllOld)
                    .send()
                    .await;
                match out {
                    Ok(out) => Ok(out.attributes().and_then(lease_from_item)),
                    Err(e) if is_condition_failure(&e) => Ok(None),
                    Err(e) => Err(sdk_error("DynamoDB UpdateItem (break)", e)),
                }
            }
        }
    }

    async fn lease(&self, ws: &WorkspaceId) -> Result<Option<Lease>> {
        Ok(self.lease_record(ws).await?.held)
    }

    async fn snapshot(&self, ws: &WorkspaceId, label: &str) -> Result<Option<BackupInfo>> {
        crate::check_artifact_name("backups", label)?;
        let (number, deleted) = self.head_version(ws).await?;
        if deleted {
            return Ok(None);
        }
        let info = self.version_info(ws, number).await?.ok_or_else(|| {
            corrupt(
                &self.version_key(ws, number),
                "the current version vanished",
            )
        })?;
        let index_key = self.key(ws, "backups/index.json");
        for _ in 0..20 {
            let (mut index, etag): (Vec<BackupInfo>, Option<String>) =
                match self.get(&index_key).await? {
                    Some(obj) => (
                        serde_json::from_slice(&obj.data)
                            .map_err(|e| corrupt(&index_key, &e.to_string()))?,
                        Some(obj.etag),
                    ),
                    None => (Vec::new(), None),
                };
            if index.last().is_some_and(|b| b.sha256 == info.sha256) {
                return Ok(None);
            }
            self.copy(
                &self.version_key(ws, number),
                &self.key(ws, &format!("backups/{label}.tfstate")),
                None,
            )
            .await?;
            let backup = BackupInfo {
                label: label.to_owned(),
                version: number,
                sha256: info.sha256.clone(),
            };
            index.retain(|b| b.label != label);
            index.push(backup.clone());
            let data = Bytes::from(serde_json::to_vec_pretty(&index).expect("index serializes"));
            let condition = match &etag {
                Some(etag) => Condition::Matches(etag),
                None => Condition::Absent,
            };
            if self
                .put_object(&index_key, data, HashMap::new(), condition)
                .await?
            {
                return Ok(Some(backup));
            }
        }
        Err(backend_error(
            format!("{index_key} kept changing under 20 attempts to update it"),
            true,
        ))
    }

    async fn backups(&self, ws: &WorkspaceId) -> Result<Vec<BackupInfo>> {
        let key = self.key(ws, "backups/index.json");
        match self.get(&key).await? {
            Some(obj) => {
                serde_json::from_slice(&obj.data).map_err(|e| corrupt(&key, &e.to_string()))
            }
            None => Ok(Vec::new()),
        }
    }

    async fn put_artifact(
        &self,
        ws: &WorkspaceId,
        job_id: &str,
        name: &str,
        data: Bytes,
    ) -> Result<()> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        self.put_object(&key, data, HashMap::new(), Condition::None)
            .await?;
        Ok(())
    }

    async fn artifact(&self, ws: &WorkspaceId, job_id: &str, name: &str) -> Result<Option<Bytes>> {
        crate::check_artifact_name(job_id, name)?;
        let key = self.key(ws, &format!("runs/{job_id}/{name}"));
        Ok(self.get(&key).await?.map(|o| o.data))
    }

    async fn artifacts(&self, ws: &WorkspaceId, job_id: &str) -> Result<Vec<String>> {
        crate::check_artifact_name(job_id, "x")?;
        let prefix = self.key(ws, &format!("runs/{job_id}/"));
        let mut names: Vec<String> = self
            .list(&prefix)
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    async fn changed(&self) -> Result<Vec<Changed>> {
        let prefix = self.changes_prefix();
        let mut out: Vec<Changed> = self
            .list_objects(&prefix)
            .await?
            .into_iter()
            .filter_map(|o| {
                let (tenant, workspace) = o.key.strip_prefix(&prefix)?.split_once('/')?;
                Some(Changed {
                    ws: WorkspaceId::new(tenant, workspace).ok()?,
                    mark: o.etag,
                })
            })
            .collect();
        out.sort_by_key(|a| a.ws.to_string());
        Ok(out)
    }

    async fn workspaces(&self) -> Result<Vec<WorkspaceId>> {
        let root = match self.config.prefix.trim_matches('/') {
            "" => String::new(),
            prefix => format!("{prefix}/"),
        };
        let mut out = Vec::new();
        for tenant in self.folders(&root).await? {
            // `_changes/` and the like: `_` cannot start a tenant name.
            if tenant.starts_with('_') {
                continue;
            }
            for workspace in self.folders(&format!("{root}{tenant}/")).await? {
                if let Ok(ws) = WorkspaceId::new(&tenant, &workspace) {
                    out.push(ws);
                }
            }
        }
        out.sort_by_key(ToString::to_string);
        Ok(out)
    }

    async fn clear_changed(&self, changed: &Changed) -> Result<()> {
        let key = self.change_key(&changed.ws);
        match self
            .s3
            .delete_object()
            .bucket(&self.config.bucket)
            .key(&key)
            .if_match(&changed.mark)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            // Written again since it was listed, or already gone: keep what is there.
            Err(e) if matches!(status(&e), Some(412 | 404)) => Ok(()),
            Err(e) => Err(sdk_error(&format!("DELETE {key}"), e)),
        }
    }

    async fn delete_backup(&self, ws: &WorkspaceId, label: &str) -> Result<()> {
        crate::check_artifact_name("backups", label)?;
        let index_key = self.key(ws, "backups/index.json");
        for _ in 0..20 {
            let Some(obj) = self.get(&index_key).await? else {
                break;
            };
            let mut index: Vec<BackupInfo> = serde_json::from_slice(&obj.data)
                .map_err(|e| corrupt(&index_key, &e.to_string()))?;
            let before = index.len();
            index.retain(|b| b.label != label);
            if index.len() == before {
                break;
            }
            let data = Bytes::from(serde_json::to_vec_pretty(&index).expect("index serializes"));
            if self
                .put_object(
                    &index_key,
                    data,
                    HashMap::new(),
                    Condition::Matches(&obj.etag),
                )
                .await?
            {
                break;
            }
        }
        self.delete_object(&self.key(ws, &format!("backups/{label}.tfstate")))
            .await
    }
}

impl S3Store {
    /// Takes the lease item when it is free or expired; the condition carries the rule.
    async fn acquire_item(&self, ws: &WorkspaceId, request: &LeaseRequest) -> Result<Lease> {
        let now = OffsetDateTime::now_utc();
        let expires = plus(now, request.ttl);
        let info = serde_json::to_string(&request.info).expect("JSON serializes");
        let out = self
            .lease_item(ws)
            .update_expression(
                "SET last_fence = if_not_exists(last_fence, :zero) + :one, \
                 fence = if_not_exists(last_fence, :zero) + :one, \
                 #owner = :owner, acquired_at = :now, expires_at = :exp, info = :info",
            )
            .condition_expression("attribute_not_exists(#owner) OR expires_at <= :now")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":owner", AttributeValue::S(request.owner.clone()))
            .expression_attribute_values(":now", n(millis(now)))
            .expression_attribute_values(":exp", n(millis(expires)))
            .expression_attribute_values(":info", AttributeValue::S(info))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match out {
            Ok(out) => {
                let old = out.attributes();
                let last_fence = old.and_then(|o| num(o, "last_fence")).unwrap_or(0);
                let took_over = old.and_then(lease_from_item).map(|expired| TakenOver {
                    owner: expired.owner,
                    fence: expired.fence,
                    expired_at: expired.expires_at,
                });
                Ok(Lease {
                    owner: request.owner.clone(),
                    fence: last_fence + 1,
                    acquired_at: from_millis(millis(now)),
                    expires_at: from_millis(millis(expires)),
                    info: request.info.clone(),
                    took_over,
                })
            }
            Err(e) if is_condition_failure(&e) => {
                let holder = condition_failure_item(&e)
                    .and_then(lease_from_item)
                    .ok_or_else(|| {
                        backend_error("the lease is held, but its item is empty".into(), true)
                    })?;
                Err(StoreError::LeaseHeld {
                    workspace: ws.clone(),
                    holder: Box::new(holder),
                })
            }
            Err(e) => Err(sdk_error("DynamoDB UpdateItem (acquire)", e)),
        }
    }
}

type UpdateError = SdkError<aws_sdk_dynamodb::operation::update_item::UpdateItemError>;

fn is_condition_failure(e: &UpdateError) -> bool {
    e.as_service_error()
        .is_some_and(|s| s.is_conditional_check_failed_exception())
}

fn condition_failure_item(e: &UpdateError) -> Option<&HashMap<String, AttributeValue>> {
    match e.as_service_error()? {
        aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(
            c,
        ) => c.item(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_keys_parse_back_to_numbers() {
        assert_eq!(
            version_number("p/t/w/versions/0000000042.tfstate"),
            Some(42)
        );
        assert_eq!(version_number("p/t/w/versions/notes.txt"), None);
    }

    #[test]
    fn version_facts_round_trip_through_metadata() {
        let info = VersionInfo {
            number: 3,
            serial: 7,
            lineage: "l-1".into(),
            created_at: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            size: 0,
            sha256: "ab".into(),
        };
        assert_eq!(info_from_metadata(3, &info_metadata(&info)).unwrap(), info);
        let mut meta = info_metadata(&info);
        meta.remove(META_SERIAL);
        assert!(info_from_metadata(3, &meta).unwrap_err().contains("serial"));
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
}
