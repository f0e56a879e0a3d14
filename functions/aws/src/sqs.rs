//! An SQS batch on Lambda: one job per record, run side by side; the response lists only the
//! records to see again (`batchItemFailures`), so finished, rejected and handed-off ones are
//! deleted. While a job runs its message stays invisible; a busy workspace's message comes back
//! when the lease holding it runs out.

use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use shared::trigger::Handled;

pub async fn handle_batch(
    app: &App,
    event: SqsEvent,
    deadline: OffsetDateTime,
) -> SqsBatchResponse {
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

/// True when the record is done with (delete it), false to see it again.
async fn handle_record(app: &App, message: SqsMessage, deadline: OffsetDateTime) -> bool {
    let id = message.message_id.clone().unwrap_or_default();
    let body = message.body.clone().unwrap_or_default();
    let Ok((envelope, job)) = app.parse(&id, &body).await else {
        return true;
    };
    let left = (deadline - OffsetDateTime::now_utc())
        .try_into()
        .unwrap_or(Duration::ZERO)
        .saturating_sub(app.config.margin);
    let keeper = keep_invisible(app, message.receipt_handle.clone());
    let handled = app
        .run(&envelope, job, Some(left), CancellationToken::new())
        .await;
    if let Some(keeper) = keeper {
        keeper.abort();
    }
    match handled {
        Handled::Done(_) => true,
        Handled::TooLong { job_id, ws } => {
            match app.hand_off(&envelope.target, &body, &job_id, &ws).await {
                Ok(record) => {
                    tracing::info!(job_id, record = %record, "job handed off to ECS");
                    app.report(&record).await;
                }
                Err(why) => {
                    let record = serde_json::json!({
                        "status": "rejected", "message_id": id, "job_id": job_id,
                        "errors": [{ "field": "timeout", "problem": why, "fix": "shorten the job's timeout, or configure the ECS handoff" }],
                    });
                    tracing::error!(record = %record, "job cannot run here");
                    app.report(&record).await;
                }
            }
            true
        }
        Handled::Again { why, delay } => {
            // Busy: a fresh copy, delayed until the holder's lease ends, and this one is done.
            // Waiting is not a failed delivery: returned, it would count towards the queue's
            // maxReceiveCount and dead-letter a job that only waited behind a long apply.
            if let Some(delay) = delay
                && requeue(app, &body, delay).await
            {
                tracing::info!(message_id = %id, why, delay_s = delay.as_secs(), "job message queued again for later");
                return true;
            }
            tracing::warn!(message_id = %id, why, "job message returned for later");
            if let (Some(delay), Some(receipt)) = (delay, &message.receipt_handle) {
                set_visibility(app, receipt, delay).await;
            }
            false
        }
    }
}

/// Sends `body` to the jobs queue again, delayed by `delay` (SQS allows 15 minutes at most);
/// false when it cannot (no queue configured, a FIFO queue, an error).
async fn requeue(app: &App, body: &str, delay: Duration) -> bool {
    let Some(url) = &app.config.jobs_queue_url else {
        return false;
    };
    let seconds = i32::try_from(delay.as_secs().min(900)).unwrap_or(900);
    match app
        .sqs
        .send_message()
        .queue_url(url)
        .message_body(body)
        .delay_seconds(seconds)
        .send()
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %state_backends::s3::brief(&e), "could not queue the message again; returning it instead");
            false
        }
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

/// Extends the message's invisibility while its job runs.
fn keep_invisible(app: &App, receipt: Option<String>) -> Option<tokio::task::JoinHandle<()>> {
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
