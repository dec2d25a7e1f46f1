//! A TCP front that forwards every connection to one server and switches to another on
//! demand, closing the connections it carried, as HAProxy (with
//! `on-marked-down shutdown-sessions`) or a virtual IP moved to the new primary does. The
//! PostgreSQL driver (sqlx) takes one host per URL, so a client follows a promotion
//! through such a front; the failover runs use this one, and the partition scenario one
//! bound to a veth address.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
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
        let listener = std::net::TcpListener::bind(bind)?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let (sender, receiver) = watch::channel(target);
        let accept = tokio::spawn(accept(listener, receiver));
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

async fn accept(listener: TcpListener, target: watch::Receiver<SocketAddr>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(forward(client, target.clone()));
    }
}

/// Carry one connection until either side closes it or the target changes (or the front
/// is dropped). A target that refuses (a killed primary) closes the client's connection.
async fn forward(mut client: TcpStream, mut target: watch::Receiver<SocketAddr>) {
    let to = *target.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(to).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = target.changed() => {}
    }
}
