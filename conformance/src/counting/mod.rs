//! Test support: a loopback TCP proxy that counts what a store costs on the wire, for
//! guards that pin each operation's round trips and statements.
//!
//! [`CountingProxy`] sits between one store and its server and forwards every byte
//! unchanged. It counts:
//! - **round trips**: a client write burst that the server answers before the client
//!   writes again (however many messages the burst holds: a pipeline is one round trip);
//!   for Redis, whose server answers the first commands of a long pipeline while the
//!   client still writes the rest, the replies are counted too, and a command sent while
//!   every earlier one was answered starts a round trip; NATS likewise, with its requests
//!   (a publish with a reply subject) and their `MSG` answers;
//!   a burst of nothing but pool pings (MySQL `COM_PING`, PostgreSQL's lone `Sync`) is
//!   counted apart, in [`WireCounts::pings`], since the pool sends it after a connection
//!   sat idle, not the operation (NATS: each `PING` and `PONG`, the keepalive);
//! - **statements** and **prepares**, by cutting the client's bytes into the protocol's
//!   messages ([`Protocol`]): PostgreSQL `Q` (simple query) and `E` (execute) are
//!   statements, `P` (parse) a prepare; MySQL `COM_QUERY` and `COM_STMT_EXECUTE` are
//!   statements, `COM_STMT_PREPARE` a prepare; a Redis command (RESP) is a statement, and
//!   so is a NATS request;
//! - bytes each way and connections opened.
//!
//! The counts are exact only when nothing but the store under test talks through the
//! proxy and the store's statements are already prepared: [`CountingProxy::for_url`]
//! gives a URL that only that store uses; give the store a pool of one connection (so
//! every call finds the same connection and its statement cache), run each operation once
//! before measuring it, and measure one call at a time ([`CountingProxy::measure`]).
//! The proxy counts a message before forwarding it, and a reply before handing it on, so
//! when the call returns, its counts are in. TLS is turned off in the URL (`sslmode` /
//! `ssl-mode`): encrypted bytes cannot be parsed.
//!
//! To see what a count is made of, set `DEDUP_WIRE_TRACE=1` ([`TRACE`]): every chunk the
//! proxy forwards is printed to stderr with its messages' kinds.
//!
//! It is test code: one task per connection, no attempt at throughput.

mod framing;
mod guard;
pub mod operations;

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::ops::Sub;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use framing::Protocol;
use framing::{Framer, Kind, Replies};
pub use guard::CostGuard;
pub use operations::{LeaseCosts, acquired, check_lease_mode, check_purge_batch, key};

use crate::proxy::authority;

/// What passed through a [`CountingProxy`] (since it started, or between two readings:
/// subtract them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCounts {
    /// Connections accepted.
    pub connections: u64,
    /// Client bursts the server answered (pings apart).
    pub round_trips: u64,
    /// Client bursts of nothing but pool pings that the server answered.
    pub pings: u64,
    /// Statements the server ran (PostgreSQL `Q` and `E`; MySQL `COM_QUERY` and
    /// `COM_STMT_EXECUTE`).
    pub statements: u64,
    /// Statements prepared (PostgreSQL `P`; MySQL `COM_STMT_PREPARE`).
    pub prepares: u64,
    /// Client messages of every kind.
    pub client_messages: u64,
    /// Bytes from the client to the server.
    pub bytes_to_server: u64,
    /// Bytes from the server to the client.
    pub bytes_to_client: u64,
}

impl Sub for WireCounts {
    type Output = WireCounts;

    fn sub(self, before: WireCounts) -> WireCounts {
        WireCounts {
            connections: self.connections - before.connections,
            round_trips: self.round_trips - before.round_trips,
            pings: self.pings - before.pings,
            statements: self.statements - before.statements,
            prepares: self.prepares - before.prepares,
            client_messages: self.client_messages - before.client_messages,
            bytes_to_server: self.bytes_to_server - before.bytes_to_server,
            bytes_to_client: self.bytes_to_client - before.bytes_to_client,
        }
    }
}

impl WireCounts {
    /// The part a cost guard pins.
    pub fn cost(&self) -> Cost {
        Cost {
            round_trips: self.round_trips,
            statements: self.statements,
            prepares: self.prepares,
            pings: self.pings,
        }
    }
}

/// What one operation costs on the wire: the numbers a guard pins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Round trips.
    pub round_trips: u64,
    /// Statements run.
    pub statements: u64,
    /// Statements prepared.
    pub prepares: u64,
    /// Pings after the caller got its result: sqlx pings every connection it takes back
    /// into its pool, one round trip off the caller's path.
    pub pings: u64,
}

impl Cost {
    /// `round_trips` round trips running `statements` statements, nothing prepared, and
    /// `pings` pool pings.
    pub const fn new(round_trips: u64, statements: u64, pings: u64) -> Cost {
        Cost {
            round_trips,
            statements,
            prepares: 0,
            pings,
        }
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} round trips, {} statements, {} prepares, {} pings",
            self.round_trips, self.statements, self.prepares, self.pings
        )
    }
}

/// Panic unless `counted` is `expected`, with [`cost_mismatch`]'s message.
pub fn assert_cost(backend: &str, operation: &str, counted: Cost, expected: Cost) {
    if let Some(wrong) = cost_mismatch(backend, operation, counted, expected) {
        panic!("{wrong}");
    }
}

/// `None` when `counted` is `expected`; else a message naming the backend, the operation
/// and each number that differs, e.g. `postgres commit: 2 round trips, expected 1`.
pub fn cost_mismatch(
    backend: &str,
    operation: &str,
    counted: Cost,
    expected: Cost,
) -> Option<String> {
    let mut wrong = Vec::new();
    for (what, c, e) in [
        ("round trips", counted.round_trips, expected.round_trips),
        ("statements", counted.statements, expected.statements),
        ("prepares", counted.prepares, expected.prepares),
        ("pings", counted.pings, expected.pings),
    ] {
        if c != e {
            wrong.push(format!("{c} {what}, expected {e}"));
        }
    }
    (!wrong.is_empty()).then(|| {
        format!(
            "{backend} {operation}: {} (counted {counted}; expected {expected})",
            wrong.join("; ")
        )
    })
}

#[derive(Default)]
struct Shared {
    counts: Mutex<WireCounts>,
}

impl Shared {
    fn counts(&self) -> MutexGuard<'_, WireCounts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A loopback TCP proxy to one upstream server that counts round trips and statements
/// (see the module docs). Stops when dropped.
pub struct CountingProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl CountingProxy {
    /// Start a proxy to `upstream` (`host:port`) speaking `protocol`, on a free loopback
    /// port.
    pub async fn start(upstream: &str, protocol: Protocol) -> std::io::Result<CountingProxy> {
        let upstream = tokio::net::lookup_host(upstream)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{upstream}: no address")))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept = tokio::spawn(accept_loop(listener, upstream, protocol, shared.clone()));
        Ok(CountingProxy {
            addr,
            shared,
            accept,
        })
    }

    /// Start a proxy to the server of `url` (`scheme://[user[:password]@]host:port/...`)
    /// and return it with `url` rewritten to reach that server through the proxy, with TLS
    /// turned off (`sslmode=disable` for PostgreSQL, `ssl-mode=disabled` for MySQL).
    pub async fn for_url(
        url: &str,
        protocol: Protocol,
    ) -> std::io::Result<(CountingProxy, String)> {
        let (start, end) =
            authority(url).ok_or_else(|| std::io::Error::other(format!("{url}: no host:port")))?;
        let proxy = CountingProxy::start(&url[start..end], protocol).await?;
        let mut rewritten = format!("{}{}{}", &url[..start], proxy.addr(), &url[end..]);
        let plain = match protocol {
            Protocol::Postgres => Some("sslmode=disable"),
            Protocol::MySql => Some("ssl-mode=disabled"),
            Protocol::Resp | Protocol::Nats | Protocol::Opaque => None,
        };
        if let Some(plain) = plain {
            rewritten.push(if rewritten.contains('?') { '&' } else { '?' });
            rewritten.push_str(plain);
        }
        Ok((proxy, rewritten))
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Everything counted so far.
    pub fn counts(&self) -> WireCounts {
        *self.shared.counts()
    }

    /// Run `op` and return its output with what passed through the proxy meanwhile.
    pub async fn measure<T, Fut: Future<Output = T>>(&self, op: Fut) -> (T, WireCounts) {
        let before = self.counts();
        let out = op.await;
        (out, self.counts() - before)
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    protocol: Protocol,
    shared: Arc<Shared>,
) {
    while let Ok((client, _)) = listener.accept().await {
        shared.counts().connections += 1;
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(upstream).await {
                pump(client, server, protocol, &shared).await;
            }
        });
    }
}

/// The environment variable that makes every proxy print each chunk it forwards (its
/// size, the client messages' kinds and the first bytes as text) to stderr.
pub const TRACE: &str = "DEDUP_WIRE_TRACE";

/// The first bytes of `bytes`, as text, for [`TRACE`].
fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(80)])
        .chars()
        .map(|c| if c.is_control() { '.' } else { c })
        .collect()
}

/// The client burst waiting for the server's answer.
#[derive(Default)]
struct Burst {
    /// The client wrote since the server last answered.
    open: bool,
    /// It held a message that was not a ping.
    work: bool,
}

/// Forward both ways, counting, until either side closes.
async fn pump(mut client: TcpStream, mut server: TcpStream, protocol: Protocol, shared: &Shared) {
    let mut framer = Framer::new(protocol);
    let trace = std::env::var_os(TRACE).is_some();
    // RESP and NATS: replies are counted, and a command (NATS: a request) sent while none
    // is unanswered starts a round trip (a long pipeline's replies may start before its
    // last bytes are sent; a NATS connection carries the requests of every task at once).
    let mut replies =
        matches!(protocol, Protocol::Resp | Protocol::Nats).then(|| Replies::new(protocol));
    let mut outstanding = 0u64;
    let mut burst = Burst::default();
    // Large reads, and the client's bytes first when both sides have some: a request is
    // read whole before the replies to its first part, so it is never cut into two bursts
    // by the proxy itself.
    let (mut up, mut down) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        tokio::select! {
            biased;
            read = client.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                let kinds = framer.feed(&up[..n]);
                if trace {
                    eprintln!("wire -> {n} bytes {kinds:?} {:?}", printable(&up[..n]));
                }
                {
                    let mut c = shared.counts();
                    c.bytes_to_server += n as u64;
                    c.client_messages += kinds.len() as u64;
                    for kind in &kinds {
                        match kind {
                            Kind::Statement => c.statements += 1,
                            Kind::Prepare => c.prepares += 1,
                            Kind::Ping | Kind::Sync | Kind::Other => {}
                        }
                    }
                }
                if replies.is_some() {
                    let mut c = shared.counts();
                    for kind in &kinds {
                        // NATS: only requests are answered; a ping is counted apart.
                        if protocol == Protocol::Nats && *kind != Kind::Statement {
                            if *kind == Kind::Ping {
                                c.pings += 1;
                            }
                            continue;
                        }
                        if outstanding == 0 {
                            c.round_trips += 1;
                        }
                        outstanding += 1;
                    }
                } else {
                    burst.open = true;
                    burst.work = burst.work
                        || kinds.is_empty()
                        || kinds.iter().any(|k| !matches!(k, Kind::Ping | Kind::Sync));
                }
                if server.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                if trace {
                    eprintln!("wire <- {n} bytes {:?}", printable(&down[..n]));
                }
                {
                    let mut c = shared.counts();
                    c.bytes_to_client += n as u64;
                    if let Some(replies) = &mut replies {
                        outstanding = outstanding.saturating_sub(replies.feed(&down[..n]));
                    } else if burst.open {
                        if burst.work {
                            c.round_trips += 1;
                        } else {
                            c.pings += 1;
                        }
                    }
                }
                burst = Burst::default();
                if client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
