//! A TCP front that forwards every connection to one server and switches to another on
//! demand, closing the connections it carried, as HAProxy (with
//! `on-marked-down shutdown-sessions`) or a virtual IP moved to the new primary does. The
//! PostgreSQL driver (sqlx) takes one host per URL, so a client follows a promotion
//! through such a front; the failover runs use this one, and the partition scenario one
//! bound to a veth address. It can also hold every byte a client sends for a fixed delay
//! ([`SwitchingProxy::start_delayed`]): the slow link scenario's late requests, where the
//! kernel has no `netem` qdisc.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// The front; stops accepting, and closes every connection it carries, when dropped.
pub struct SwitchingProxy {
    addr: SocketAddr,
    target: watch::Sender<SocketAddr>,
    accept: JoinHandle<()>,
}

impl SwitchingProxy {
    /// Listen on `bind` (port 0: any free port) and forward to `target`. Needs a Tokio
    /// runtime.
    pub fn start(bind: SocketAddr, target: SocketAddr) -> io::Result<Self> {
        Self::start_delayed(bind, target, Duration::ZERO)
    }

    /// [`start`](Self::start), each byte from a client reaching the target `delay` after
    /// the front read it (in order; answers are not delayed).
    pub fn start_delayed(
        bind: SocketAddr,
        target: SocketAddr,
        delay: Duration,
    ) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind(bind)?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let (sender, receiver) = watch::channel(target);
        let accept = tokio::spawn(accept(listener, receiver, delay));
        Ok(SwitchingProxy {
            addr,
            target: sender,
            accept,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forward new connections to `target` from now on, and close the ones open.
    pub fn switch(&self, target: SocketAddr) {
        self.target.send_replace(target);
    }
}

impl Drop for SwitchingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept(listener: TcpListener, target: watch::Receiver<SocketAddr>, delay: Duration) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(forward(client, target.clone(), delay));
    }
}

/// Carry one connection until either side closes it or the target changes (or the front
/// is dropped). A target that refuses (a killed primary) closes the client's connection.
async fn forward(mut client: TcpStream, mut target: watch::Receiver<SocketAddr>, delay: Duration) {
    let to = *target.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(to).await else {
        return;
    };
    if delay.is_zero() {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
            _ = target.changed() => {}
        }
        return;
    }
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, server_write) = server.split();
    tokio::select! {
        _ = delayed_copy(&mut client_read, server_write, delay) => {}
        _ = tokio::io::copy(&mut server_read, &mut client_write) => {}
        _ = target.changed() => {}
    }
}

/// Copy `from` to `to`, each chunk written `delay` after it was read.
async fn delayed_copy(
    from: &mut (impl AsyncReadExt + Unpin),
    mut to: impl AsyncWriteExt + Unpin,
    delay: Duration,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if chunks
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
