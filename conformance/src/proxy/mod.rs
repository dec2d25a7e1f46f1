//! Test support: a loopback TCP proxy that cuts connections at random moments.
//!
//! [`Proxy`] listens on `127.0.0.1` and forwards every accepted connection to one upstream
//! server (a PostgreSQL or a Redis). While cutting is on, each chunk of bytes that passes
//! may end its connection, both sides closed at once:
//! - before a request reaches the server (the call failed and had no effect);
//! - after a request was forwarded, before its reply comes back (the call took effect,
//!   or not, and the client cannot know: the case a retry must make safe);
//! - in the middle of a reply (part of it delivered).
//!
//! [`Proxy::set_cutting`] turns the faults off so that retries converge and the final state
//! can be checked; [`Proxy::cuts`] counts what was done. The scenario every server-backed
//! store runs through it is [`retried_operations_converge`].
//!
//! It is test code: one task per connection, no attempt at throughput. A Redis Cluster
//! redirects clients to the nodes' own ports, so only the first contact of a cluster
//! client would pass through one proxy; the tests use it with standalone servers.

mod converge;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use proptest::prelude::RngExt;
use proptest::test_runner::{RngAlgorithm, TestRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use converge::{ConvergeReport, Converging, retried_operations_converge};

/// How often the proxy cuts, per chunk of bytes passing through (0.0 to 1.0 each).
#[derive(Clone, Copy, Debug)]
pub struct CutRates {
    /// Drop a request chunk and close, before it reaches the server.
    pub before_request: f64,
    /// Forward a request chunk, then close instead of returning the server's next reply.
    pub before_reply: f64,
    /// Forward half of a reply chunk, then close.
    pub mid_reply: f64,
}

impl Default for CutRates {
    /// 3 % before a request, 8 % between request and reply, 2 % mid-reply.
    fn default() -> Self {
        CutRates {
            before_request: 0.03,
            before_reply: 0.08,
            mid_reply: 0.02,
        }
    }
}

/// Cuts made so far, by moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cuts {
    /// Connections accepted.
    pub connections: u64,
    /// Cut before a request reached the server.
    pub before_request: u64,
    /// Cut after a request was forwarded, its reply dropped.
    pub before_reply: u64,
    /// Cut in the middle of a reply.
    pub mid_reply: u64,
}

impl Cuts {
    /// Cuts of any kind.
    pub fn total(&self) -> u64 {
        self.before_request + self.before_reply + self.mid_reply
    }
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    before_request: AtomicU64,
    before_reply: AtomicU64,
    mid_reply: AtomicU64,
}

struct Shared {
    upstream: SocketAddr,
    rates: CutRates,
    seed: u64,
    cutting: AtomicBool,
    counters: Counters,
}

/// A loopback TCP proxy to one upstream server that cuts connections at random moments
/// (see the module docs). Stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Proxy {
    /// Start a proxy to `upstream` (`host:port`) on a free loopback port that will cut with
    /// `rates` once [`set_cutting`](Self::set_cutting) turns it on (so clients can connect
    /// and migrate first); random choices follow `seed`.
    pub async fn start(upstream: &str, rates: CutRates, seed: u64) -> std::io::Result<Proxy> {
        let upstream = tokio::net::lookup_host(upstream)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{upstream}: no address")))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            rates,
            seed,
            cutting: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy {
            addr,
            shared,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Start a proxy to the server of `url` (`scheme://[user[:password]@]host:port/...`)
    /// and return it with `url` rewritten to reach that server through the proxy.
    pub async fn for_url(
        url: &str,
        rates: CutRates,
        seed: u64,
    ) -> std::io::Result<(Proxy, String)> {
        let (start, end) =
            authority(url).ok_or_else(|| std::io::Error::other(format!("{url}: no host:port")))?;
        let proxy = Proxy::start(&url[start..end], rates, seed).await?;
        let rewritten = format!("{}{}{}", &url[..start], proxy.addr(), &url[end..]);
        Ok((proxy, rewritten))
    }

    /// Turn cutting on or off (connections already open stay as they are).
    pub fn set_cutting(&self, on: bool) {
        self.shared.cutting.store(on, Ordering::SeqCst);
    }

    /// What the proxy did so far.
    pub fn cuts(&self) -> Cuts {
        let c = &self.shared.counters;
        Cuts {
            connections: c.connections.load(Ordering::Relaxed),
            before_request: c.before_request.load(Ordering::Relaxed),
            before_reply: c.before_reply.load(Ordering::Relaxed),
            mid_reply: c.mid_reply.load(Ordering::Relaxed),
        }
    }
}

/// Where `host:port` lies in `url`.
pub(crate) fn authority(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let host = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
    url[host..end].contains(':').then_some((host, end))
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        let n = shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(shared.upstream).await {
                pump(client, server, &shared, n).await;
            }
        });
    }
}

fn rng(seed: u64, connection: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&connection.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// Forward both ways until either side closes or a cut; returning drops (closes) both.
async fn pump(mut client: TcpStream, mut server: TcpStream, shared: &Shared, connection: u64) {
    let mut rng = rng(shared.seed, connection);
    let mut roll = |p: f64| shared.cutting.load(Ordering::SeqCst) && rng.random_bool(p);
    let count = |c: &AtomicU64| {
        c.fetch_add(1, Ordering::Relaxed);
    };
    let c = &shared.counters;
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    // A request was forwarded and its reply is to be dropped.
    let mut armed = false;
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                if roll(shared.rates.before_request) {
                    return count(&c.before_request);
                }
                if server.write_all(&up[..n]).await.is_err() {
                    return;
                }
                armed = armed || roll(shared.rates.before_reply);
            }
            read = server.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                if armed {
                    return count(&c.before_reply);
                }
                if roll(shared.rates.mid_reply) {
                    let _ = client.write_all(&down[..n / 2]).await;
                    return count(&c.mid_reply);
                }
                if client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_authority_is_found_after_user_info() {
        for (url, expected) in [
            ("postgres://u:p@127.0.0.1:5432/db?x=1", "127.0.0.1:5432"),
            ("redis://127.0.0.1:6379", "127.0.0.1:6379"),
            ("redis://127.0.0.1:6379/0", "127.0.0.1:6379"),
        ] {
            let (s, e) = super::authority(url).expect("an authority");
            assert_eq!(&url[s..e], expected);
        }
        assert_eq!(super::authority("redis://localhost"), None);
    }
}
