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
