//! The client side of the wire, cut into messages: PostgreSQL frontend messages and MySQL
//! client packets, each sorted into what it costs the server.

/// The wire protocol a [`CountingProxy`](super::CountingProxy) parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// PostgreSQL's frontend/backend protocol 3.0: after the untyped startup packets
    /// (`SSLRequest`, `GSSENCRequest`, the startup message), a type byte and a big-endian
    /// `i32` length that counts itself.
    Postgres,
    /// MySQL's client/server protocol: a 3-byte little-endian payload length and a sequence
    /// id; a packet with sequence id 0 starts a command, its first byte the command's code.
    MySql,
    /// Redis's RESP: a command is an array of bulk strings (`*N` then `$len` each),
    /// counted as a statement (`EVALSHA`, `MULTI` and `EXEC` included).
    Resp,
    /// NATS's text protocol: a `PUB` or `HPUB` with a reply subject (a request, such as a
    /// JetStream publish or API call) is a statement, answered by one `MSG` or `HMSG`;
    /// `PING` and `PONG` are pings; a publish without a reply subject, `SUB`, `UNSUB` and
    /// `CONNECT` are neither.
    Nats,
    /// No parsing: round trips only (every client burst is a request).
    Opaque,
}

impl Protocol {
    /// The protocol a store URL's server speaks, by its scheme, when its traffic can be
    /// counted (one TCP server, no TLS); `None` for any other URL.
    pub fn of_url(url: &str) -> Option<Protocol> {
        match url.split("://").next()? {
            "postgres" | "postgresql" => Some(Protocol::Postgres),
            "mysql" | "mariadb" => Some(Protocol::MySql),
            "redis" => Some(Protocol::Resp),
            "nats" => Some(Protocol::Nats),
            _ => None,
        }
    }
}

/// What one client message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A statement the server runs: PostgreSQL `Q` (simple query) or `E` (execute);
    /// MySQL `COM_QUERY` (0x03) or `COM_STMT_EXECUTE` (0x17).
    Statement,
    /// A statement prepared: PostgreSQL `P` (parse); MySQL `COM_STMT_PREPARE` (0x16).
    Prepare,
    /// A liveness check the pool makes, not the operation: MySQL `COM_PING` (0x0e); NATS
    /// `PING` and `PONG`.
    Ping,
    /// A PostgreSQL `S` (sync): the end of an extended-protocol request. Alone in a
    /// burst it is sqlx's ping.
    Sync,
    /// Anything else (startup, authentication, bind, describe, close, quit...).
    Other,
}

/// Cuts a byte stream from the client into messages; bytes of a message not yet whole
/// wait for the next chunk.
pub(super) struct Framer {
    protocol: Protocol,
    buffer: Vec<u8>,
    /// PostgreSQL: still in the untyped startup packets.
    startup: bool,
}

/// Counts the whole replies in the server's byte stream: RESP values (Redis answers each
/// command with one value), NATS `MSG` and `HMSG` (the answer to a request; the server's
/// `INFO`, `PING`, `PONG`, `+OK` and `-ERR` lines are not counted). Bytes of a reply not yet
/// whole wait for the next chunk.
pub(super) struct Replies {
    protocol: Protocol,
    buffer: Vec<u8>,
}

impl Replies {
    /// The replies of `protocol`'s server: [`Protocol::Resp`] or [`Protocol::Nats`].
    pub(super) fn new(protocol: Protocol) -> Self {
        Replies {
            protocol,
            buffer: Vec::new(),
        }
    }

    /// Take `bytes` and return how many replies they completed.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> u64 {
        self.buffer.extend_from_slice(bytes);
        let (mut at, mut count) = (0, 0);
        loop {
            let found = match self.protocol {
                Protocol::Nats => nats_server_message(&self.buffer, at),
                _ => resp_value(&self.buffer, at).map(|end| (end, true)),
            };
            let Some((end, reply)) = found else { break };
            at = end;
            count += u64::from(reply);
        }
        self.buffer.drain(..at);
        count
    }
}

/// Where the NATS server message starting at `at` ends, if it is whole, and whether it
/// answers a request (`MSG`, `HMSG`).
fn nats_server_message(b: &[u8], at: usize) -> Option<(usize, bool)> {
    let (line, end) = resp_line(b, at)?;
    let mut words = line
        .split(|c| *c == b' ' || *c == b'\t')
        .filter(|w| !w.is_empty());
    let op = words.next().unwrap_or_default().to_ascii_uppercase();
    if op != b"MSG" && op != b"HMSG" {
        return Some((end, false));
    }
    // The last argument is the payload's size (headers and body for HMSG).
    let size = usize::try_from(resp_number(words.next_back()?)?).ok()?;
    let whole = end + size + 2;
    (b.len() >= whole).then_some((whole, true))
}

/// The length and kind of the NATS client message at the start of `b`, if whole.
fn nats_client_message(b: &[u8]) -> Option<(usize, Kind)> {
    let (line, end) = resp_line(b, 0)?;
    let words: Vec<&[u8]> = line
        .split(|c| *c == b' ' || *c == b'\t')
        .filter(|w| !w.is_empty())
        .collect();
    let op = words
        .first()
        .copied()
        .unwrap_or_default()
        .to_ascii_uppercase();
    // PUB subject [reply] size; HPUB subject [reply] header-size total-size.
    let with_reply = match op.as_slice() {
        b"PUB" => words.len() == 4,
        b"HPUB" => words.len() == 5,
        b"PING" | b"PONG" => return Some((end, Kind::Ping)),
        _ => return Some((end, Kind::Other)),
    };
    let size = usize::try_from(resp_number(words.last()?)?).ok()?;
    let whole = end + size + 2;
    let kind = if with_reply {
        Kind::Statement
    } else {
        Kind::Other
    };
    (b.len() >= whole).then_some((whole, kind))
}

/// Where the RESP2 / RESP3 value starting at `at` ends, if it is whole.
fn resp_value(b: &[u8], at: usize) -> Option<usize> {
    let kind = *b.get(at)?;
    let (line, end) = resp_line(b, at + 1)?;
    let elements = match kind {
        b'$' | b'!' | b'=' => {
            return match usize::try_from(resp_number(line)?) {
                Ok(len) => (b.len() >= end + len + 2).then_some(end + len + 2),
                Err(_) => Some(end),
            };
        }
        b'*' | b'~' | b'>' => resp_number(line)?,
        b'%' | b'|' => resp_number(line)? * 2,
        _ => return Some(end),
    };
    let mut at = end;
    for _ in 0..elements {
        at = resp_value(b, at)?;
    }
    Some(at)
}

/// PostgreSQL's `SSLRequest` and `GSSENCRequest` codes: the startup goes on after them.
const PG_ENCRYPTION_REQUESTS: [i32; 2] = [80_877_103, 80_877_104];

impl Framer {
    pub(super) fn new(protocol: Protocol) -> Self {
        Framer {
            protocol,
            buffer: Vec::new(),
            startup: true,
        }
    }

    /// Take `bytes` and return the kinds of the messages they completed.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Vec<Kind> {
        if self.protocol == Protocol::Opaque {
            return vec![Kind::Other];
        }
        self.buffer.extend_from_slice(bytes);
        let mut kinds = Vec::new();
        let mut at = 0;
        while let Some((len, kind)) = next(self.protocol, &mut self.startup, &self.buffer[at..]) {
            kinds.push(kind);
            at += len;
        }
        self.buffer.drain(..at);
        kinds
    }
}

/// The length and kind of the message at the start of `b`, if it is whole; `startup`: a
/// PostgreSQL stream still in its untyped startup packets.
fn next(protocol: Protocol, startup: &mut bool, b: &[u8]) -> Option<(usize, Kind)> {
    match protocol {
        Protocol::Postgres if *startup => {
            let len = usize::try_from(i32::from_be_bytes(b.get(..4)?.try_into().ok()?))
                .ok()?
                .max(8);
            let code = i32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
            if b.len() < len {
                return None;
            }
            *startup = PG_ENCRYPTION_REQUESTS.contains(&code);
            Some((len, Kind::Other))
        }
        Protocol::Postgres => {
            let tag = *b.first()?;
            let len = usize::try_from(i32::from_be_bytes(b.get(1..5)?.try_into().ok()?))
                .ok()?
                .max(4);
            if b.len() < 1 + len {
                return None;
            }
            let kind = match tag {
                b'Q' | b'E' => Kind::Statement,
                b'P' => Kind::Prepare,
                b'S' => Kind::Sync,
                _ => Kind::Other,
            };
            Some((1 + len, kind))
        }
        Protocol::MySql => {
            let header = b.get(..4)?;
            let len =
                usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
            if b.len() < 4 + len {
                return None;
            }
            let kind = match (header[3], b.get(4)) {
                (0, Some(0x03 | 0x17)) => Kind::Statement,
                (0, Some(0x16)) => Kind::Prepare,
                (0, Some(0x0e)) => Kind::Ping,
                _ => Kind::Other,
            };
            Some((4 + len, kind))
        }
        Protocol::Resp => resp_command(b).map(|len| (len, Kind::Statement)),
        Protocol::Nats => nats_client_message(b),
        Protocol::Opaque => None,
    }
}

/// The length of the RESP command (an array of bulk strings) at the start of `b`, if whole;
/// a line that is not an array (an inline command) is one command.
fn resp_command(b: &[u8]) -> Option<usize> {
    let (header, mut at) = resp_line(b, 0)?;
    let Some(count) = header.strip_prefix(b"*") else {
        return Some(at);
    };
    for _ in 0..resp_number(count)? {
        let (bulk, next) = resp_line(b, at)?;
        let len = usize::try_from(resp_number(bulk.strip_prefix(b"$")?)?).ok()?;
        at = next + len + 2;
        if b.len() < at {
            return None;
        }
    }
    Some(at)
}

/// The line of `b` from `from` to its `\r\n`, and where the next one starts.
fn resp_line(b: &[u8], from: usize) -> Option<(&[u8], usize)> {
    let rest = b.get(from..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], from + end + 2))
}

fn resp_number(digits: &[u8]) -> Option<i64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{Framer, Kind, Protocol};

    #[test]
    fn the_protocol_of_a_url_is_its_schemes() {
        assert_eq!(
            Protocol::of_url("postgresql://h/db"),
            Some(Protocol::Postgres)
        );
        assert_eq!(Protocol::of_url("mariadb://h/db"), Some(Protocol::MySql));
        assert_eq!(Protocol::of_url("redis://h"), Some(Protocol::Resp));
        assert_eq!(Protocol::of_url("nats://h:4222"), Some(Protocol::Nats));
        assert_eq!(Protocol::of_url("rediss://h"), None, "TLS is not counted");
        assert_eq!(Protocol::of_url("sqlite:/tmp/x.db"), None);
    }

    fn pg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(i32::try_from(body.len()).unwrap() + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn postgres_messages_are_cut_after_the_startup_and_across_chunks() {
        let mut f = Framer::new(Protocol::Postgres);
        let mut ssl = 8i32.to_be_bytes().to_vec();
        ssl.extend_from_slice(&80_877_103i32.to_be_bytes());
        assert_eq!(f.feed(&ssl), [Kind::Other]);
        let mut startup = 12i32.to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608i32.to_be_bytes());
        startup.extend_from_slice(b"ab\0\0");
        assert_eq!(f.feed(&startup), [Kind::Other]);
        let mut burst = pg(b'P', b"\0SELECT 1\0\0\0");
        burst.extend(pg(b'B', b"\0\0\0\0\0\0\0\0"));
        burst.extend(pg(b'E', b"\0\0\0\0\0"));
        burst.extend(pg(b'S', b""));
        burst.extend(pg(b'Q', b"BEGIN\0"));
        let (a, b) = burst.split_at(7);
        assert_eq!(f.feed(a), []);
        assert_eq!(
            f.feed(b),
            [
                Kind::Prepare,
                Kind::Other,
                Kind::Statement,
                Kind::Sync,
                Kind::Statement
            ]
        );
    }

    #[test]
    fn resp_commands_are_cut_across_chunks() {
        let mut f = Framer::new(Protocol::Resp);
        let burst = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\nv\r\nx\r\n*1\r\n$4\r\nEXEC\r\n";
        let (a, b) = burst.split_at(20);
        assert_eq!(f.feed(a), []);
        assert_eq!(f.feed(b), [Kind::Statement, Kind::Statement]);
    }

    #[test]
    fn resp_replies_are_counted_when_whole() {
        let mut r = super::Replies::new(Protocol::Resp);
        assert_eq!(
            r.feed(b"+OK\r\n:1\r\n$-1\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n*1\r\n:"),
            4
        );
        assert_eq!(r.feed(b"7\r\n"), 1);
        assert_eq!(r.feed(b"%1\r\n+k\r\n*0\r\n-ERR x\r\n"), 2);
    }

    #[test]
    fn nats_requests_and_their_answers_are_cut_across_chunks() {
        let mut f = Framer::new(Protocol::Nats);
        let burst = b"CONNECT {\"verbose\":false}\r\nPING\r\nSUB _INBOX.a.* 1\r\n\
            HPUB $KV.b.k _INBOX.a.1 18 21\r\nNATS/1.0\r\nA: 0\r\n\r\nabc\r\n\
            PUB x 2\r\nhi\r\nPUB $JS.API.INFO _INBOX.a.2 0\r\n\r\n";
        let (a, b) = burst.split_at(70);
        let mut kinds = f.feed(a);
        kinds.extend(f.feed(b));
        assert_eq!(
            kinds,
            [
                Kind::Other,
                Kind::Ping,
                Kind::Other,
                Kind::Statement,
                Kind::Other,
                Kind::Statement
            ]
        );
        let mut r = super::Replies::new(Protocol::Nats);
        assert_eq!(r.feed(b"INFO {}\r\nPONG\r\nMSG _INBOX.a.1 1 5\r\nhe"), 0);
        assert_eq!(
            r.feed(b"llo\r\nPING\r\nHMSG _INBOX.a.2 1 12 12\r\nNATS/1.0\r\n\r\n\r\n"),
            2
        );
    }

    #[test]
    fn mysql_commands_are_read_only_at_sequence_zero() {
        let mut f = Framer::new(Protocol::MySql);
        let packet = |seq: u8, body: &[u8]| {
            let mut p = u32::try_from(body.len()).unwrap().to_le_bytes()[..3].to_vec();
            p.push(seq);
            p.extend_from_slice(body);
            p
        };
        // A handshake response whose first byte happens to be 0x03 is not a query.
        assert_eq!(f.feed(&packet(1, &[0x03, 0, 0])), [Kind::Other]);
        let mut burst = packet(0, b"\x16SELECT ?");
        burst.extend(packet(0, &[0x17, 1, 0, 0, 0]));
        burst.extend(packet(0, b"\x03COMMIT"));
        burst.extend(packet(0, &[0x0e]));
        let (a, b) = burst.split_at(3);
        assert_eq!(f.feed(a), []);
        assert_eq!(
            f.feed(b),
            [Kind::Prepare, Kind::Statement, Kind::Statement, Kind::Ping]
        );
    }
}
