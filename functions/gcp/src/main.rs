//! `terrace-gcp`: the Google Cloud function, a Cloud Run service. Pub/Sub pushes job messages to
//! `POST /pubsub`; Cloud Scheduler calls `POST /sweeps/backup` hourly. `terrace-gcp task` is the
//! Cloud Run Job execution a job too long for a request is handed to (`TERRACE_CLOUD_RUN_JOB`):
//! it runs the job staged in the customer's bucket that `TERRACE_JOB_REF` points to. Every request must carry
//! a Google-signed OIDC token for this service (see `oidc`). State lives in the customer's GCS
//! bucket, reached by impersonating their service account.
//!
//! On SIGTERM (Cloud Run stopping the instance) it stops taking requests, interrupts running
//! jobs (terraform gets SIGINT, leases are released, results say `interrupted`) and answers
//! their pushes with 503 so Pub/Sub delivers them again.

mod access;
mod app;
mod config;
mod google;
mod oidc;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use tokio_util::sync::CancellationToken;

use crate::app::App;

#[tokio::main]
async fn main() -> ExitCode {
    shared::process::init_json_logs();
    let serving = std::env::args().nth(1).as_deref() != Some("task");
    let config = match config::Config::from_env(serving) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("terrace-gcp: {e}");
            return ExitCode::from(78);
        }
    };
    let port = config.port;
    let shutdown = CancellationToken::new();
    let own = match google::Own::new(config.anonymous) {
        Ok(own) => own,
        Err(e) => {
            eprintln!("terrace-gcp: {e}");
            return ExitCode::from(78);
        }
    };
    let app = Arc::new(App {
        own,
        verifier: oidc::Verifier::new(config.oidc.clone()),
        config,
        shutdown: shutdown.clone(),
    });
    shared::process::cancel_on_sigterm(&shutdown, "no new requests; interrupting running jobs");
    if !serving {
        return task(&app).await;
    }
    let router = Router::new()
        .route(
            "/pubsub",
            post(
                |State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes| async move {
                    app.push(&headers, &body).await
                },
            ),
        )
        .route(
            "/sweeps/drift",
            post(
                |State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes| async move {
                    app.drift_sweep(&headers, &body).await
                },
            ),
        )
        .route(
            "/sweeps/backup",
            post(
                |State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes| async move {
                    app.backup_sweep(&headers, &body).await
                },
            ),
        )
        .with_state(app);
    let listener = match tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))).await
    {
        Ok(l) => l,
        Err(e) => {
            eprintln!("terrace-gcp: cannot listen on port {port}: {e}");
            return ExitCode::from(71);
        }
    };
    tracing::info!(port, "serving");
    let stopped = shutdown.clone();
    match axum::serve(listener, router)
        .with_graceful_shutdown(async move { stopped.cancelled().await })
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("terrace-gcp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `terrace-gcp task`: the Cloud Run Job execution a long job was handed to.
async fn task(app: &App) -> ExitCode {
    let Ok(reference) = std::env::var("TERRACE_JOB_REF") else {
        eprintln!(
            "terrace-gcp task: TERRACE_JOB_REF is not set (the service sets it when it hands a job off)"
        );
        return ExitCode::from(64);
    };
    shared::process::task_exit("terrace-gcp task", app.task(&reference).await)
}
