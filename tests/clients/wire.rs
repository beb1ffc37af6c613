//! On the wire: a recording relay between a client and stockgate.

use crate::plans::is_stock_command;
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use stockgate::frame::RequestDecoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::codec::Decoder;

/// Relays connections to stockgate on loopback and records what each
/// client sent. With `black_hole`, the first connection to send a DEDUCT
/// or REVERT gets no bytes back from then on (the command still reaches
/// stockgate and is applied), as when a reply is lost on a dead network
/// path.
pub struct Tap {
    pub addr: SocketAddr,
    /// What each connection's client sent, connections in accept order.
    sent: Arc<Mutex<Vec<Recording>>>,
    accept: tokio::task::JoinHandle<()>,
}

/// The bytes one client sent, shared with its relay.
type Recording = Arc<Mutex<Vec<u8>>>;

impl Tap {
    pub async fn start(target: SocketAddr, black_hole: bool) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent: Arc<Mutex<Vec<Recording>>> = Arc::default();
        let log = sent.clone();
        let black_hole = Arc::new(AtomicBool::new(black_hole));
        let accept = tokio::spawn(async move {
            // Dropped with this task when the Tap is: that aborts every relay.
            let mut relays = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let record = Arc::new(Mutex::new(Vec::new()));
                log.lock().unwrap().push(record.clone());
                relays.spawn(relay(client, target, record, black_hole.clone()));
            }
        });
        Tap { addr, sent, accept }
    }

    /// The commands each connection sent, connections in accept order.
    pub fn commands(&self) -> Vec<Vec<Vec<String>>> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|bytes| requests(&bytes.lock().unwrap()))
            .collect()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies bytes both ways until either side closes, recording the client's.
async fn relay(
    client: tokio::net::TcpStream,
    target: SocketAddr,
    record: Recording,
    black_hole: Arc<AtomicBool>,
) {
    let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let swallow = Arc::new(AtomicBool::new(false));
    let to_server = {
        let swallow = swallow.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                {
                    let mut record = record.lock().unwrap();
                    record.extend_from_slice(&buf[..n]);
                    // Decide before forwarding, so the reply can't slip through.
                    if black_hole.load(Ordering::SeqCst)
                        && requests(&record).iter().any(|c| is_stock_command(c))
                        && black_hole.swap(false, Ordering::SeqCst)
                    {
                        swallow.store(true, Ordering::SeqCst);
                    }
                }
                if upstream_write.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = upstream_write.shutdown().await;
        }
    };
    let to_client = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = upstream_read.read(&mut buf).await {
            if swallow.load(Ordering::SeqCst) {
                continue;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(to_server, to_client);
}

/// The complete requests in `bytes`, framed by stockgate's own decoder.
pub fn requests(bytes: &[u8]) -> Vec<Vec<String>> {
    let mut buf = BytesMut::from(bytes);
    let mut decoder = RequestDecoder::new(1 << 20);
    let mut out = Vec::new();
    while let Some(request) = decoder.decode(&mut buf).expect("clients send valid RESP") {
        out.push(
            request
                .args
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
        );
    }
    out
}
