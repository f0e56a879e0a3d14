//! What every cloud function's process sets up first: its log, and SIGTERM.

use tokio_util::sync::CancellationToken;

/// JSON log lines on stderr, filtered by `TERRACE_LOG` (default `info`): what the clouds'
/// log services parse.
pub fn init_json_logs() {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TERRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Cancels `token` when the process gets SIGTERM (how every platform stops a container before
/// it kills it), logging `what` happens then.
pub fn cancel_on_sigterm(token: &CancellationToken, what: &'static str) {
    let token = token.clone();
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
            tracing::warn!("SIGTERM: {what}");
            token.cancel();
        }
    });
}
