//! Socket reads that skip the `recv` whose only news is "nothing more",
//! the TCP keepalive of upstream connections, and a listener that keeps
//! its connections within a bound ([`Bounded`]).
//!
//! tokio keeps a socket readable until a read fails with `WouldBlock`, so
//! the usual loop (wait readable, read, wait readable, read) spends a
//! second `recv` per message just to learn the socket is empty. At depth 1
//! that is one extra syscall per DEDUCT: with 50 clients, `perf stat`
//! counted 2.0 `recvfrom` per request through stockgate.
//!
//! A read that returns less than the room it was given has emptied the
//! socket, so readiness is cleared right there, as nginx does with epoll
//! (`ngx_unix_recv`: a short read sets `ready = 0`). That is safe under
//! tokio's edge-triggered epoll: `try_io` clears only the readiness it saw
//! *before* the read, and bytes that arrive afterwards raise a new event;
//! a FIN is never cleared (tokio keeps closed readiness for good).

use bytes::BytesMut;
// The redis crate's: its `TcpSettings` take this crate's `TcpKeepalive`,
// and the node pipes' sockets use the same.
use redis::io::tcp::socket2;
use std::io;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Reads what the socket has now into `buf`'s spare room. `Ok(0)` is end
/// of stream; `WouldBlock` means there was nothing to read.
pub fn try_read(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let room = buf.capacity() - buf.len();
    let mut read = 0;
    let result = stream.try_io(Interest::READABLE, || {
        read = stream.try_read_buf(buf)?;
        if read > 0 && read < room {
            // Short read: the socket is empty; clear readiness now.
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(read)
        }
    });
    match result {
        Err(err) if err.kind() == io::ErrorKind::WouldBlock && read > 0 => Ok(read),
        other => other,
    }
}

/// Reads what the socket holds right now with a `recv` of its own, not
/// through tokio's readiness. A drain must take in every byte the client
/// sent before the signal, and some of them may have arrived after the last
/// short read cleared readiness, before the reactor saw their event: a
/// readiness-gated read would call the socket empty and drop them.
/// `WouldBlock` means the kernel holds nothing more.
pub fn read_now(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let spare = buf.spare_capacity_mut();
    loop {
        // SAFETY: recv writes at most `spare.len()` bytes into `spare`,
        // which is allocated and ours; MSG_DONTWAIT never blocks.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            // SAFETY: recv initialised the first n bytes of the spare room.
            unsafe { buf.set_len(buf.len() + n as usize) };
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Waits until the socket is readable, then [`try_read`]s. Cancel-safe:
/// nothing is read until the wait is over.
pub async fn read(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    loop {
        // The stream's own reader slot: one task reads each stream, and
        // `readable()`'s waiter list costs a lock every time round.
        std::future::poll_fn(|cx| stream.poll_read_ready(cx)).await?;
        match try_read(stream, buf) {
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// TCP keepalive on every upstream connection (the node pipes' and the
/// redis crate's): the first probe after [`KEEPALIVE_IDLE`] without
/// traffic, then one every [`KEEPALIVE_INTERVAL`], and the kernel resets
/// the connection after [`KEEPALIVE_PROBES`] unanswered: a flow the network
/// dropped silently (a conntrack or NAT entry timed out or flushed, a
/// firewall that discards) is found within 25 s of going quiet, so the
/// next request goes on a new connection instead of timing out on it. The
/// probes also keep such entries alive while the connection idles (the
/// usual idle limits are minutes). A flow that sticks while requests are
/// on it is found sooner, by their timeouts (`crate::pipeline`,
/// `crate::upstream`). The probes are answered by the peer's kernel; Redis
/// never sees them.
pub fn upstream_keepalive() -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES)
}

/// See [`upstream_keepalive`].
pub const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);
/// See [`upstream_keepalive`].
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// See [`upstream_keepalive`].
pub const KEEPALIVE_PROBES: u32 = 3;

/// Turns [`upstream_keepalive`] on for `stream`.
pub fn keep_alive(stream: &TcpStream) -> io::Result<()> {
    socket2::SockRef::from(stream).set_tcp_keepalive(&upstream_keepalive())
}

/// A connection that keeps its place among a [`Bounded`] listener's until
/// it is dropped.
pub struct Counted<T> {
    io: T,
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl<T> Counted<T> {
    /// `io`, holding `place` while it lives (a TLS stream made from a
    /// counted socket's, say).
    pub fn new(io: T, place: tokio::sync::OwnedSemaphorePermit) -> Counted<T> {
        Counted { io, _place: place }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The connection and its place, apart.
    pub fn into_parts(self) -> (T, tokio::sync::OwnedSemaphorePermit) {
        (self.io, self._place)
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A TCP listener with at most `places` of its connections open at once,
/// counted from their accept: past it, it accepts none until one closes,
/// and the next wait in the kernel's listen queue. (The HTTP face's: the
/// RESP port counts its own, and tells the one too many.)
pub struct Bounded {
    listener: tokio::net::TcpListener,
    places: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Bounded {
    pub fn new(listener: tokio::net::TcpListener, places: usize) -> Bounded {
        Bounded {
            listener,
            places: std::sync::Arc::new(tokio::sync::Semaphore::new(places)),
        }
    }

    /// The next connection, once a place is free.
    pub async fn accept(&self) -> io::Result<(Counted<TcpStream>, std::net::SocketAddr)> {
        let place = self
            .places
            .clone()
            .acquire_owned()
            .await
            .expect("the places are never closed");
        let (stream, peer) = self.listener.accept().await?;
        Ok((Counted::new(stream, place), peer))
    }

    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;
    use tokio::time::timeout;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// A liveness bound, not a timing assertion: a lost wakeup would hang.
    const STUCK: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn bytes_after_a_short_read_still_wake_the_reader() {
        let (mut client, server) = pair().await;
        let mut buf = BytesMut::with_capacity(1024);
        client.write_all(b"first").await.unwrap();
        assert_eq!(
            timeout(STUCK, read(&server, &mut buf))
                .await
                .unwrap()
                .unwrap(),
            5
        );
        // Readiness was cleared by the short read; nothing is there now.
        assert_eq!(
            try_read(&server, &mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            client.write_all(b"second").await.unwrap();
            client
        });
        assert_eq!(
            timeout(STUCK, read(&server, &mut buf))
                .await
                .unwrap()
                .unwrap(),
            6
        );
        assert_eq!(&buf[..], b"firstsecond");
        drop(later.await.unwrap());
        assert_eq!(
            timeout(STUCK, read(&server, &mut buf))
                .await
                .unwrap()
                .unwrap(),
            0
        );
    }

    #[tokio::test]
    async fn end_of_stream_behind_the_last_bytes_is_seen() {
        let (mut client, server) = pair().await;
        client.write_all(b"bye").await.unwrap();
        client.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut buf = BytesMut::with_capacity(1024);
        assert_eq!(
            timeout(STUCK, read(&server, &mut buf))
                .await
                .unwrap()
                .unwrap(),
            3
        );
        assert_eq!(
            timeout(STUCK, read(&server, &mut buf))
                .await
                .unwrap()
                .unwrap(),
            0
        );
    }

    #[tokio::test]
    async fn a_full_buffer_is_not_taken_for_an_empty_socket() {
        let (mut client, server) = pair().await;
        client.write_all(&[7u8; 100]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut buf = BytesMut::with_capacity(64);
        let room = buf.capacity();
        let first = timeout(STUCK, read(&server, &mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first, room, "a read that fills the room");
        buf.reserve(1024);
        let rest = timeout(STUCK, read(&server, &mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first + rest, 100);
    }
}
