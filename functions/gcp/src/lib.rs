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

pub mod access;
pub mod app;
pub mod config;
pub mod oidc;
pub mod transport;

use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use shared::sweeps::report::SweepKind;

use crate::app::App;

/// The service's routes: `POST /pubsub`, `POST /sweeps/drift`, `POST /sweeps/backup`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
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
                    app.sweep(SweepKind::Drift, &headers, &body).await
                },
            ),
        )
        .route(
            "/sweeps/backup",
            post(
                |State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes| async move {
                    app.sweep(SweepKind::Backup, &headers, &body).await
                },
            ),
        )
        .with_state(app)
}

/// `terrace-gcp task`: the Cloud Run Job execution a long job was handed to.
pub async fn task(app: &App) -> ExitCode {
    let Ok(reference) = std::env::var("TERRACE_JOB_REF") else {
        tracing::error!(
            "terrace-gcp task: TERRACE_JOB_REF is not set (the service sets it when it hands a job off)"
        );
        return ExitCode::from(64);
    };
    shared::host::pipeline::task_exit("terrace-gcp task", app.task(&reference).await)
}
