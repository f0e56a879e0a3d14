//! A TCP proxy on loopback that can drop the network between its two sides without closing
//! anything: bytes stop flowing both ways, as in a partition (no FIN, no RST), until it heals.
//! What a broker's client sees only through its heartbeats.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; it stops accepting when dropped (open connections end with the test).
pub struct Blackhole {
    port: u16,
    cut: Arc<AtomicBool>,
    _accepting: tokio_util::task::AbortOnDropHandle<()>,
}

impl Blackhole {
    /// Forwards 127.0.0.1:PORT to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let (upstream, flag) = (upstream.to_owned(), cut.clone());
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, flag.clone()));
                tokio::spawn(pipe(sr, cw, flag.clone()));
            }
        });
        Self {
            port,
            cut,
            _accepting: tokio_util::task::AbortOnDropHandle::new(accepting),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Bytes stop flowing, both ways, on every connection (and new ones connect, then hear
    /// nothing).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Bytes flow again; what was read while cut was dropped, as a lost network drops it.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
