//! How the state server holds its connections: at most [`super::MAX_CONNECTIONS`] at once (more
//! wait to be accepted), and each closed when a request's head does not arrive within its
//! header read timeout ([`super::HEADER_READ_TIMEOUT`] by default: a connection that never
//! sends one, or idles between requests, gives its place back). HTTP/1.1 only: terraform's http
//! backend speaks nothing else.

use std::pin::pin;
use std::sync::Arc;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;

/// How long open requests may take to finish once the server stops; then they are dropped (a
/// store call that hangs, or a client trickling a body, cannot hold the job).
const FINISH_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `app` on `listener` until `stop`, then lets open requests finish (for a while).
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    header_read_timeout: std::time::Duration,
    stop: CancellationToken,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(super::MAX_CONNECTIONS));
    let mut open = tokio::task::JoinSet::new();
    loop {
        // Connections that ended are reaped as new ones come.
        while open.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = stop.cancelled() => break,
        };
        let io = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((io, _)) => io,
                Err(e) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    tracing::warn!(error = %e, "the state server could not accept a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // Requests are small and answered at once: no Nagle delay (terraform's client sets it
        // too).
        let _ = io.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let stop = stop.clone();
        open.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "a state server connection ended");
                    }
                }
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let finished = tokio::time::timeout(FINISH_WITHIN, async {
        while open.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            connections = open.len(),
            "state server connections did not finish in time; dropping them"
        );
        open.abort_all();
    }
}
