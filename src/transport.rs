//! What a client connection reads from and writes to: a plain TCP socket,
//! or a TLS session over one ([`crate::tls`]).
//!
//! Either way a client is one socket, served by one connection loop
//! ([`crate::connection`]): nothing another local process could connect
//! to stands between a client and its session, and a connection costs one
//! descriptor, the one `--max-clients` counts.
//!
//! The loop reads through [`Reader`], whose reads allocate buffer room only
//! once bytes are there (most of a sidecar's connections sit idle in a
//! pool), and writes through tokio's `AsyncWrite`.

use bytes::BytesMut;
use std::io;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::net::tcp;

/// Read buffer growth step.
pub const READ_CHUNK: usize = 4 * 1024;

/// A client's byte stream, as the connection loop uses it.
pub trait Transport: Send {
    /// Where requests come from.
    type Reader<'a>: Reader + Send
    where
        Self: 'a;
    /// Where replies go.
    type Writer<'a>: AsyncWrite + Unpin + Send
    where
        Self: 'a;
    /// Whether a write may leave bytes inside the transport until a flush
    /// (TLS: records rustls could not send yet). A plain socket holds none,
    /// and its loop spends no turn on a flush.
    const BUFFERS_WRITES: bool;

    /// The reading and the writing side, used side by side.
    fn split(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>);
}

/// The reading side of a [`Transport`].
pub trait Reader {
    /// Waits until bytes (or the end of the stream) are there, then appends
    /// what is there to `buf`, growing it first if its spare room is short.
    /// `Ok(0)` is the end of the stream. Reads nothing unless it is ready.
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>>;

    /// Appends what has arrived by now, without waiting: a drain takes in
    /// what the client sent before it. `WouldBlock`: nothing more.
    fn fill_now(&mut self, buf: &mut BytesMut) -> io::Result<usize>;
}

/// Grows `buf` by [`READ_CHUNK`] when its spare room is short.
pub fn make_room(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

impl Transport for TcpStream {
    type Reader<'a> = tcp::ReadHalf<'a>;
    type Writer<'a> = tcp::WriteHalf<'a>;
    const BUFFERS_WRITES: bool = false;

    fn split(&mut self) -> (tcp::ReadHalf<'_>, tcp::WriteHalf<'_>) {
        TcpStream::split(self)
    }
}

impl Reader for tcp::ReadHalf<'_> {
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let stream = self.as_ref();
        loop {
            // The stream's own reader slot, not a waiter list.
            ready!(stream.poll_read_ready(cx))?;
            make_room(buf);
            match crate::net::try_read(stream, buf) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                read => return Poll::Ready(read),
            }
        }
    }

    fn fill_now(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        make_room(buf);
        crate::net::read_now(self.as_ref(), buf)
    }
}

/// After the last reply has been written and the write side shut down:
/// reads and drops whatever the client still sends (bytes after QUIT or
/// a protocol error, requests past a drain), until it closes or `within`
/// passes. Closing a socket whose receive buffer holds unread bytes makes
/// Linux send a reset instead of a FIN, and discard the replies still
/// queued for the client: this keeps the close a FIN.
pub async fn discard_input<R: Reader>(reader: &mut R, within: Duration) {
    let mut sink = BytesMut::new();
    let _ = tokio::time::timeout(within, async {
        loop {
            sink.clear();
            match std::future::poll_fn(|cx| reader.poll_fill(cx, &mut sink)).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}
