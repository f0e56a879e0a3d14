//! What a job's broker stands on: a server on loopback, on a port of its own, that hands this
//! job's terraform short-lived credentials for the customer as terraform asks for them (the AWS
//! function's `credential_process`, the Azure function's managed identity endpoint). Only a
//! caller that shows the job's secret is answered, what it hands out is added to the job's
//! redactor, and it stops when dropped.

use std::net::SocketAddr;

use tokio_util::task::AbortOnDropHandle;

use crate::job::redact::LateSecrets;

/// A broker's keys: the secret a caller must show, and what it handed out (for the job's
/// redactor, which masks each as it is added).
#[derive(Clone, Debug, Default)]
pub struct Keys {
    /// Random, of this job only.
    pub secret: String,
    pub handed_out: LateSecrets,
}

impl Keys {
    /// A fresh secret, nothing handed out yet.
    pub fn new() -> Self {
        Self {
            secret: crate::run::state_server::random_secret(),
            handed_out: LateSecrets::default(),
        }
    }

    /// Whether `shown` is the secret (compared in constant time).
    pub fn admits(&self, shown: &str) -> bool {
        crate::run::state_server::constant_time_eq(shown.as_bytes(), self.secret.as_bytes())
    }
}

/// A server on `127.0.0.1`, serving until dropped.
#[derive(Debug)]
pub struct Loopback {
    /// `127.0.0.1:<its port>`.
    pub address: SocketAddr,
    _server: AbortOnDropHandle<()>,
}

impl Loopback {
    /// Serves `router` on a port of its own; `what` names the server in its log.
    ///
    /// # Errors
    /// The socket cannot be opened.
    pub async fn serve(what: &'static str, router: axum::Router) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let address = listener.local_addr()?;
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "{what} stopped");
            }
        });
        Ok(Self {
            address,
            _server: AbortOnDropHandle::new(server),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_loopback_server_answers_on_its_own_port_until_dropped() {
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "here" }));
        let served = Loopback::serve("test server", router).await.unwrap();
        assert!(served.address.ip().is_loopback());
        let address = served.address;
        let ask = || async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut stream = tokio::net::TcpStream::connect(address).await?;
            stream
                .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        assert!(ask().await.unwrap().ends_with("here"));
        drop(served);
        // The server's task ends when the runtime next polls it.
        let mut gone = false;
        for _ in 0..100 {
            if ask().await.is_err() {
                gone = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(gone, "nothing answers once it is dropped");
    }

    #[test]
    fn only_the_jobs_secret_is_admitted() {
        let keys = Keys::new();
        assert!(keys.admits(&keys.secret.clone()));
        assert!(!keys.admits(""));
        assert!(!keys.admits(&Keys::new().secret));
    }
}
