//! An SQS batch on Lambda: one job per record, run side by side; the response lists only the
//! records to see again (`batchItemFailures`), so finished and rejected ones are deleted. While
//! a job runs its message stays invisible; a busy workspace's message is queued again as a fresh
//! copy, delayed until the lease holding it runs out (see `shared::host::pipeline`).
//!
//! A job handed to an ECS task keeps its message: the Lambda makes it invisible for the task's
//! start window and leaves it on the queue; the task keeps it invisible while it runs and
//! deletes it once the job has a result or a fresh copy on the queue ([`settle`]). A task that
//! never starts, is killed or gives up leaves the message to come back, and (past the queue's
//! `maxReceiveCount`) to be dead-lettered: a handed-off job is never lost without a word.
//!
//! A FIFO jobs queue (its URL ends in `.fifo`; `MessageGroupId` = the job's workspace) keeps
//! each workspace's requests in order. A batch's groups then run side by side, each group's
//! records one after another in their order; once a record of a group is to be seen again (a
//! busy workspace, trouble that may pass), every later record of its group is returned
//! unhandled, so SQS delivers them again after it, in order.

use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use shared::host::pipeline::{self, Delivery, Fate};

pub async fn handle_batch(
    app: &App,
    event: SqsEvent,
    deadline: OffsetDateTime,
) -> SqsBatchResponse {
    if app.config.jobs_fifo() {
        return handle_fifo(app, event, deadline).await;
    }
    let mut running = tokio::task::JoinSet::new();
    let mut ids = std::collections::HashMap::new();
    for message in event.records {
        let app = app.clone();
        let id = message.message_id.clone().unwrap_or_default();
        let task = running.spawn(async move { handle_record(&app, message, deadline).await });
        ids.insert(task.id(), id);
    }
    let mut failures = Vec::new();
    while let Some(joined) = running.join_next_with_id().await {
        match joined {
            Ok((_, true)) => {}
            Ok((task, false)) => failures.extend(ids.remove(&task)),
            Err(e) => {
                // A record whose handling panicked is seen again (and dead-lettered if it
                // keeps failing).
                tracing::error!(error = %e, "a record's task failed");
                failures.extend(ids.remove(&e.id()));
            }
        }
    }
    response(failures)
}

/// The response listing the records to see again.
fn response(mut failures: Vec<String>) -> SqsBatchResponse {
    failures.sort();
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = failures
        .into_iter()
        .map(|id| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            failure
        })
        .collect();
    response
}

/// A FIFO batch: groups side by side, each group in order, and after the first record of a
/// group to be seen again, the rest of that group returned unhandled (made visible again at
/// once: SQS still delivers none of them before the one that waits).
async fn handle_fifo(app: &App, event: SqsEvent, deadline: OffsetDateTime) -> SqsBatchResponse {
    let mut groups: Vec<(String, Vec<SqsMessage>)> = Vec::new();
    for message in event.records {
        let group = message
            .attributes
            .get("MessageGroupId")
            .cloned()
            .unwrap_or_default();
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, records)) => records.push(message),
            None => groups.push((group, vec![message])),
        }
    }
    let mut running = tokio::task::JoinSet::new();
    let mut ids = std::collections::HashMap::new();
    for (group, records) in groups {
        let all: Vec<String> = records
            .iter()
            .map(|m| m.message_id.clone().unwrap_or_default())
            .collect();
        let app = app.clone();
        let task = running.spawn(async move {
            let mut failures = Vec::new();
            for message in records {
                let id = message.message_id.clone().unwrap_or_default();
                if !failures.is_empty() {
                    tracing::info!(message_id = %id, group, "returned unhandled: an earlier request of its workspace waits");
                    if let Some(receipt) = &message.receipt_handle {
                        set_visibility(&app, receipt, Duration::ZERO).await;
                    }
                    failures.push(id);
                } else if !handle_record(&app, message, deadline).await {
                    failures.push(id);
                }
            }
            failures
        });
        ids.insert(task.id(), all);
    }
    let mut failures = Vec::new();
    while let Some(joined) = running.join_next_with_id().await {
        match joined {
            Ok((_, failed)) => failures.extend(failed),
            Err(e) => {
                tracing::error!(error = %e, "a message group's task failed");
                failures.extend(ids.remove(&e.id()).unwrap_or_default());
            }
        }
    }
    response(failures)
}

/// True when the record is done with (delete it), false to see it again.
async fn handle_record(app: &App, message: SqsMessage, deadline: OffsetDateTime) -> bool {
    let id = message.message_id.clone().unwrap_or_default();
    let body = message.body.clone().unwrap_or_default();
    let left = (deadline - OffsetDateTime::now_utc())
        .try_into()
        .unwrap_or(Duration::ZERO)
        .saturating_sub(app.config.margin);
    let keeper = keep_invisible(app, message.receipt_handle.clone());
    // Only with the queue's URL can the task settle the message.
    let receipt = message
        .receipt_handle
        .as_deref()
        .filter(|_| app.config.jobs_queue_url.is_some());
    let fate = pipeline::handle(
        app,
        Delivery {
            message_id: &id,
            body: body.as_bytes(),
            time_left: Some(left),
            lease_wait: Duration::ZERO,
            cancel: CancellationToken::new(),
            receipt,
        },
    )
    .await;
    if let Some(keeper) = keeper {
        keeper.abort();
    }
    match fate {
        Fate::HandedOff(_) => {
            let Some(receipt) = receipt else {
                return true;
            };
            // The task settles it; until it starts, it stays out of sight for the start window.
            let window = app
                .config
                .handoff
                .as_ref()
                .map_or(crate::config::START_WINDOW, |h| h.start_window);
            set_visibility(app, receipt, window).await;
            false
        }
        Fate::Ran(_) | Fate::Rejected(_) | Fate::Requeued { .. } => true,
        Fate::Again { why, delay } => {
            tracing::warn!(message_id = %id, why, "job message returned for later");
            if let (Some(delay), Some(receipt)) = (delay, &message.receipt_handle) {
                set_visibility(app, receipt, delay).await;
            }
            false
        }
        Fate::Interrupted(_) => false,
    }
}

async fn set_visibility(app: &App, receipt: &str, timeout: Duration) {
    let Some(url) = &app.config.jobs_queue_url else {
        return;
    };
    if let Err(e) = app
        .sqs
        .change_message_visibility()
        .queue_url(url)
        .receipt_handle(receipt)
        .visibility_timeout(i32::try_from(timeout.as_secs()).unwrap_or(43_200))
        .send()
        .await
    {
        tracing::warn!(error = %state_backends::s3::brief(&e), "could not change the message's visibility");
    }
}

/// What a handed-off task does with the message it was given ([`shared::host::trigger::JobRef`]'s
/// `receipt`) once its job ends: deleted when the job has a final result or a fresh copy on the
/// queue, otherwise made visible again after `delay` (or at once) so it is delivered again.
pub async fn settle(app: &App, receipt: &str, fate: &Fate) {
    let Some(url) = &app.config.jobs_queue_url else {
        return;
    };
    match fate {
        Fate::Ran(_) | Fate::Rejected(_) | Fate::Requeued { .. } | Fate::HandedOff(_) => {
            if let Err(e) = app
                .sqs
                .delete_message()
                .queue_url(url)
                .receipt_handle(receipt)
                .send()
                .await
            {
                // Delivered again, it finds the job's result (or its fresh copy's lease).
                tracing::warn!(error = %state_backends::s3::brief(&e), "could not delete the job's message");
            }
        }
        Fate::Again { delay, .. } => {
            set_visibility(app, receipt, delay.unwrap_or(Duration::ZERO)).await;
        }
        Fate::Interrupted(_) => set_visibility(app, receipt, Duration::ZERO).await,
    }
}

/// Extends the message's invisibility while its job runs (four times `keep_invisible_every`,
/// renewed every `keep_invisible_every`).
pub fn keep_invisible(app: &App, receipt: Option<String>) -> Option<tokio::task::JoinHandle<()>> {
    let receipt = receipt?;
    app.config.jobs_queue_url.as_ref()?;
    let app = app.clone();
    let every = app.config.keep_invisible_every;
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            set_visibility(&app, &receipt, every * 4).await;
        }
    }))
}
