//! Leases kept in DynamoDB (`lease_table`): one item per workspace, changed only by
//! conditional updates, so two runners never both hold it.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use time::OffsetDateTime;

use crate::lease::{LeaseRecord, plus};
use crate::objects::{LeaseKeeper, Taken};
use crate::{Lease, LeaseRequest, Result, StoreError, TakenOver, WorkspaceId};

use super::{SdkError, backend_error, sdk_error};

/// The attributes of the lease held; freeing an item removes them and keeps its fence counter.
const HELD: &str = "#owner, fence, acquired_at, expires_at, info";

pub(super) fn n(value: u64) -> AttributeValue {
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

pub(super) fn string(item: &HashMap<String, AttributeValue>, key: &str) -> Option<String> {
    item.get(key)?.as_s().ok().cloned()
}

/// The lease a DynamoDB item records as held, if any, with whose expired lease it took over
/// (written by the same update).
fn lease_from_item(item: &HashMap<String, AttributeValue>) -> Option<Lease> {
    Some(Lease {
        owner: string(item, "owner")?,
        fence: num(item, "fence")?,
        acquired_at: from_millis(num(item, "acquired_at")?),
        expires_at: from_millis(num(item, "expires_at")?),
        info: string(item, "info")
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(serde_json::Value::Null),
        took_over: taken_over(item),
    })
}

/// The expired lease an item's last acquisition took over, as it recorded it.
fn taken_over(item: &HashMap<String, AttributeValue>) -> Option<TakenOver> {
    let fence = num(item, "prev_fence").filter(|f| *f > 0)?;
    Some(TakenOver {
        owner: string(item, "prev_owner").filter(|o| !o.is_empty())?,
        fence,
        expired_at: from_millis(num(item, "prev_expires")?),
    })
}

pub(super) fn record_from_item(item: Option<&HashMap<String, AttributeValue>>) -> LeaseRecord {
    match item {
        None => LeaseRecord::default(),
        Some(item) => LeaseRecord {
            last_fence: num(item, "last_fence").unwrap_or(0),
            held: lease_from_item(item),
            settled: num(item, "settled"),
        },
    }
}

/// The lease as a DynamoDB item per workspace.
#[derive(Clone, Debug)]
pub struct DynamoLeases {
    pub(super) client: aws_sdk_dynamodb::Client,
    pub(super) table: String,
}

impl DynamoLeases {
    /// An update of the workspace's lease item.
    pub(super) fn item(
        &self,
        key: &str,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(key.to_owned()))
    }
}

#[async_trait]
impl LeaseKeeper for DynamoLeases {
    async fn record(&self, key: &str) -> Result<LeaseRecord> {
        let item = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("DynamoDB GetItem", e))?;
        Ok(record_from_item(item.item()))
    }

    /// Takes the lease item when it is free or expired; the condition carries the rule.
    async fn acquire(&self, ws: &WorkspaceId, key: &str, request: &LeaseRequest) -> Result<Taken> {
        let now = OffsetDateTime::now_utc();
        let expires = plus(now, request.ttl);
        let info = serde_json::to_string(&request.info).expect("JSON serializes");
        let out = self
            .item(key)
            // The lease it replaces (if any, expired) goes into the item as well, so a retry of
            // this very request, whose first answer was lost, still knows it.
            .update_expression(
                "SET last_fence = if_not_exists(last_fence, :zero) + :one, \
                 fence = if_not_exists(last_fence, :zero) + :one, \
                 #owner = :owner, acquired_at = :now, expires_at = :exp, info = :info, \
                 prev_owner = if_not_exists(#owner, :nobody), \
                 prev_fence = if_not_exists(fence, :zero), \
                 prev_expires = if_not_exists(expires_at, :zero) \
                 REMOVE settled",
            )
            .condition_expression("attribute_not_exists(#owner) OR expires_at <= :now")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":owner", AttributeValue::S(request.owner.clone()))
            .expression_attribute_values(":now", n(millis(now)))
            .expression_attribute_values(":exp", n(millis(expires)))
            .expression_attribute_values(":info", AttributeValue::S(info))
            .expression_attribute_values(":nobody", AttributeValue::S(String::new()))
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
                let lease = Lease {
                    owner: request.owner.clone(),
                    fence: last_fence + 1,
                    acquired_at: from_millis(millis(now)),
                    expires_at: from_millis(millis(expires)),
                    info: request.info.clone(),
                    took_over,
                };
                let settled = old.and_then(|o| num(o, "settled"));
                Ok(Taken { lease, settled })
            }
            Err(e) if is_condition_failure(&e) => {
                let holder = condition_failure_item(&e)
                    .and_then(lease_from_item)
                    .ok_or_else(|| {
                        backend_error("the lease is held, but its item is empty".into(), true)
                    })?;
                // The SDK sent this request again after its answer was lost, and the first
                // try had taken the lease: the holder is this request (its owner, its info,
                // its time to the millisecond), and the item says whose expired lease it took.
                if holder.owner == request.owner
                    && holder.info == request.info
                    && holder.acquired_at == from_millis(millis(now))
                {
                    // What the item said before that first try is gone with its answer.
                    return Ok(Taken {
                        lease: holder,
                        settled: None,
                    });
                }
                Err(StoreError::LeaseHeld {
                    workspace: ws.clone(),
                    holder: Box::new(holder),
                })
            }
            Err(e) => Err(sdk_error("DynamoDB UpdateItem (acquire)", e)),
        }
    }

    async fn renew(
        &self,
        ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease> {
        let lost = |reason: String| StoreError::LeaseLost {
            workspace: ws.clone(),
            owner: lease.owner.clone(),
            fence: lease.fence,
            reason,
        };
        let now = OffsetDateTime::now_utc();
        let out = self
            .item(key)
            .update_expression("SET expires_at = :exp")
            .condition_expression("#owner = :owner AND fence = :fence AND expires_at > :now")
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
                let record = self.record(key).await?;
                let reason = record
                    .check(&lease.fence(), now)
                    .err()
                    .unwrap_or_else(|| "the lease changed while renewing".into());
                Err(lost(reason))
            }
            Err(e) => Err(sdk_error("DynamoDB UpdateItem (renew)", e)),
        }
    }

    async fn release(
        &self,
        _ws: &WorkspaceId,
        key: &str,
        lease: &Lease,
        settled: Option<u64>,
    ) -> Result<()> {
        let mut update = self.item(key);
        update = match settled {
            Some(number) => update
                .update_expression(format!("SET settled = :settled REMOVE {HELD}"))
                .expression_attribute_values(":settled", n(number)),
            None => update.update_expression(format!("REMOVE {HELD}, settled")),
        };
        let out = update
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

    async fn break_lease(
        &self,
        _ws: &WorkspaceId,
        key: &str,
        only: Option<u64>,
    ) -> Result<Option<Lease>> {
        let mut update = self
            .item(key)
            .update_expression(format!("REMOVE {HELD}, settled"))
            .expression_attribute_names("#owner", "owner")
            .return_values(ReturnValue::AllOld);
        update = match only {
            None => update.condition_expression("attribute_exists(pk)"),
            Some(fence) => update
                .condition_expression("attribute_exists(pk) AND fence = :fence")
                .expression_attribute_values(":fence", n(fence)),
        };
        let out = update.send().await;
        match out {
            Ok(out) => Ok(out.attributes().and_then(lease_from_item)),
            Err(e) if is_condition_failure(&e) => Ok(None),
            Err(e) => Err(sdk_error("DynamoDB UpdateItem (break)", e)),
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
