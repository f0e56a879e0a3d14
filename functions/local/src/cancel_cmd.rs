//! `terrace cancel`: asks for a job to be cancelled. A queued job then never runs; a running
//! one is stopped within a few seconds (its runner looks for the request every 2 s); a
//! finished one is left as it is, and the command says so.

use crate::output::Cancelled;
use shared::run::records;
use shared::run::runner::previous_result;
use state_backends::{StateStore, WorkspaceId, display_time};

use crate::exit;
use crate::ops::{Found, JSON_SCHEMA, Output, bad_job_id, locate, print_json};

pub(crate) async fn cancel(
    store: &dyn StateStore,
    job_id: &str,
    ws: Option<&WorkspaceId>,
    out: Output,
) -> anyhow::Result<u8> {
    if let Some(why) = bad_job_id(job_id) {
        eprintln!("error: {why}");
        return Ok(exit::USAGE);
    }
    // A job that has not started has nothing in the store yet: its workspace is named.
    let ws = match (locate(store, job_id, ws).await?, ws) {
        (Found::One(ws), _) => ws,
        (Found::None, Some(ws)) => ws.clone(),
        (Found::None, None) => {
            eprintln!(
                "no job {job_id} in any workspace: a job that has not started has nothing in the store yet, so name its workspace with -w TENANT/WORKSPACE"
            );
            return Ok(exit::NOT_FOUND);
        }
        (Found::Several(all), _) => {
            let names: Vec<String> = all.iter().map(ToString::to_string).collect();
            eprintln!(
                "job {job_id} is in {}: name one with -w TENANT/WORKSPACE",
                names.join(", ")
            );
            return Ok(exit::USAGE);
        }
    };
    if let Some(result) = previous_result(store, &ws, job_id, None).await? {
        if out.json {
            print_json(&Cancelled {
                schema: JSON_SCHEMA,
                job_id: job_id.to_owned(),
                workspace: ws.to_string(),
                cancelled: false,
                status: Some(result.status),
                requested_at: None,
            });
        } else {
            outln!(
                "{ws}: job {job_id} already finished ({}); nothing changed",
                result.status.as_str()
            );
        }
        return Ok(exit::OK);
    }
    let request = records::request_cancel(store, &ws, job_id, "terrace cancel").await?;
    if out.json {
        print_json(&Cancelled {
            schema: JSON_SCHEMA,
            job_id: job_id.to_owned(),
            workspace: ws.to_string(),
            cancelled: true,
            status: None,
            requested_at: Some(display_time(request.requested_at)),
        });
    } else {
        outln!(
            "{ws}: cancel of job {job_id} requested: if it is queued it will not run; if it is running it stops within a few seconds (see `terrace result {job_id} -w {ws}`)"
        );
    }
    Ok(exit::OK)
}

/// `terrace cancel JOB -w TENANT/WORKSPACE --to QUEUE [--sign KEY]`.
pub(crate) struct SendCancel<'a> {
    pub job: &'a str,
    pub ws: Option<&'a WorkspaceId>,
    pub to: &'a str,
    pub sign: Option<&'a std::path::Path>,
}

/// Sends a cancel to a deployed runner's jobs queue, signed when asked: the runner answers on
/// its results channel (`cancel-requested`, or `already-finished`).
pub(crate) async fn send_cancel(a: SendCancel<'_>) -> anyhow::Result<u8> {
    use crate::submit_cmd::{Queue, send, signing_key};
    if let Some(why) = bad_job_id(a.job) {
        eprintln!("error: {why}");
        return Ok(exit::USAGE);
    }
    let Some(ws) = a.ws else {
        eprintln!("error: --to needs the job's workspace: add -w TENANT/WORKSPACE");
        return Ok(exit::USAGE);
    };
    let queue = match Queue::parse(a.to) {
        Ok(queue) => queue,
        Err(why) => {
            eprintln!("error: --to: {why}");
            return Ok(exit::USAGE);
        }
    };
    let key = match a.sign.map(signing_key).transpose() {
        Ok(key) => key,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(exit::USAGE);
        }
    };
    // The cancel as the runner reads it (`docs/schema/cancel-message.schema.json`).
    let ask = shared::host::message::CancelAsk {
        job: a.job.to_owned(),
        tenant: ws.tenant().to_owned(),
        workspace: ws.workspace().to_owned(),
        signature: None,
    };
    let Ok(serde_json::Value::Object(mut ask)) = serde_json::to_value(ask) else {
        unreachable!("a struct of text is a JSON object")
    };
    if let Some(key) = &key
        && let Err(why) = key.sign(
            shared::job::signature::Kind::Cancel,
            &mut ask,
            time::OffsetDateTime::now_utc(),
        )
    {
        eprintln!("error: --sign: {why}");
        return Ok(exit::USAGE);
    }
    let message = serde_json::json!({ "cancel": ask });
    let id = format!("cancel-{}", a.job);
    if let Err(why) = send(&queue, ws, &id, &message).await {
        eprintln!(
            "error: the cancel of job {} was not sent to {}: {why}",
            a.job,
            queue.describe()
        );
        return Ok(exit::FAILED);
    }
    let answer = match queue {
        Queue::Folder(_) => "`terrace serve` answers in the folder's done/ (or failed/)",
        _ => "the runner answers on its results channel",
    };
    eprintln!(
        "cancel of job {} ({ws}) sent to {}: {answer}; `terrace result {} -w {ws}` shows how the job ended",
        a.job,
        queue.describe(),
        a.job
    );
    Ok(exit::OK)
}
