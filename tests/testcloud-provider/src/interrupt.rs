//! SIGINT, as the provider sees it: terraform's process group gets SIGINT when the runner
//! interrupts terraform. Like a real provider, this one then lets its in-flight operations end
//! (instead of dying), and operations that can be cancelled, such as a `slow` create, give up.

use std::sync::OnceLock;

use tokio::sync::watch;

fn flag() -> &'static watch::Sender<bool> {
    static FLAG: OnceLock<watch::Sender<bool>> = OnceLock::new();
    FLAG.get_or_init(|| watch::channel(false).0)
}

/// Starts listening for SIGINT (from then on SIGINT no longer ends the process).
///
/// # Errors
/// When the signal handler cannot be installed.
pub fn listen() -> std::io::Result<()> {
    let mut signals = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::spawn(async move {
        while signals.recv().await.is_some() {
            flag().send_replace(true);
        }
    });
    Ok(())
}

/// Resolves once the provider has been interrupted.
pub async fn interrupted() {
    let mut rx = flag().subscribe();
    // The sender lives in a static, so the channel never closes.
    let _ = rx.wait_for(|interrupted| *interrupted).await;
}
