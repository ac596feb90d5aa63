//! Accepting connections with bounds: at most so many at once (past that,
//! a new connection is closed as soon as it is accepted), and a client
//! that sends nothing within a deadline of its connecting is dropped (a
//! gRPC client that never sends HTTP/2's preface holds no slot for long).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection holding one of its listener's slots until dropped.
pub struct Capped {
    stream: TcpStream,
    /// Until the first bytes arrive: when the client must have sent them.
    first_bytes: Option<Pin<Box<Sleep>>>,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for Capped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.first_bytes = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => match this.first_bytes.as_mut().map(|s| s.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing in time",
                ))),
                _ => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Capped {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for Capped {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// Accepts on `listener` at most `max` connections at once; the ones past
/// that are closed at once (and logged at debug level).
pub async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    first_bytes: Duration,
) -> Capped {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // out of file descriptors and the like: wait, then go on
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("too many connections: one closed");
            continue;
        };
        let _ = stream.set_nodelay(true);
        return Capped {
            stream,
            first_bytes: Some(Box::pin(tokio::time::sleep(first_bytes))),
            _slot: slot,
        };
    }
}

/// The connections of `listener` as a stream (for tonic's
/// `serve_with_incoming`), at most `max` at once.
pub fn incoming(
    listener: TcpListener,
    max: usize,
    first_bytes: Duration,
) -> impl Stream<Item = io::Result<Capped>> {
    let slots = Arc::new(Semaphore::new(max));
    futures_util::stream::unfold((listener, slots), move |(l, s)| async move {
        let c = accept(&l, &s, first_bytes).await;
        Some((Ok(c), (l, s)))
    })
}
