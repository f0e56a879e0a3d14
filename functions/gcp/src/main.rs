//! `terrace-gcp`: the Google Cloud function's process (see the `gcp` library for what it
//! does): a Cloud Run service, or `terrace-gcp task`, a Cloud Run Job execution.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use gcp::app::App;
use gcp::{config, oidc, transport};

fn main() -> ExitCode {
    shared::host::process::function_main(serve)
}

async fn serve() -> ExitCode {
    shared::host::process::init_json_logs();
    shared::host::process::harden();
    let serving = std::env::args().nth(1).as_deref() != Some("task");
    let mut config = match config::Config::from_env(serving) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("terrace-gcp: {e}");
            return ExitCode::from(78);
        }
    };
    // Terraform's version is read while the first message is fetched.
    config.runtime.warm_client();
    let (anonymous, endpoint) = (config.anonymous, config.gcs_endpoint.clone());
    let call_timeout = config.runtime.call_timeout;
    let tenant_sets = config.tenants.policy_sets().clone();
    let opened = config
        .runtime
        .open_buckets(&tenant_sets, |location| {
            gcp::app::templates_bucket(location, anonymous, endpoint.clone(), call_timeout)
        })
        .await;
    if let Err(e) = opened {
        tracing::error!("terrace-gcp: {e}");
        return ExitCode::from(78);
    }
    let port = config.port;
    let shutdown = CancellationToken::new();
    let own = match transport::Own::new(config.anonymous) {
        Ok(own) => own,
        Err(e) => {
            tracing::error!("terrace-gcp: {e}");
            return ExitCode::from(78);
        }
    };
    let app = Arc::new(App {
        own,
        verifier: oidc::Verifier::new(config.oidc.clone()),
        config,
        shutdown: shutdown.clone(),
    });
    shared::host::process::cancel_on_sigterm(
        &shutdown,
        "no new requests; interrupting running jobs",
    );
    if !serving {
        return gcp::task(&app).await;
    }
    let router = gcp::router(app);
    let listener = match tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))).await
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("terrace-gcp: cannot listen on port {port}: {e}");
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
            tracing::error!("terrace-gcp: {e}");
            ExitCode::FAILURE
        }
    }
}
