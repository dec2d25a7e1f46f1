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
    /// A liveness check the pool makes, not the operation: MySQL `COM_PING` (0x0e).
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

/// Counts the whole RESP replies in the server's byte stream (Redis answers each command
/// with one value; bytes of a value not yet whole wait for the next chunk).
pub(super) struct Replies {
    buffer: Vec<u8>,
}

impl Replies {
    pub(super) fn new() -> Self {
        Replies { buffer: Vec::new() }
    }

    /// Take `bytes` and return how many replies they completed.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> u64 {
        self.buffer.extend_from_slice(bytes);
        let (mut at, mut count) = (0, 0);
        while let Some(end) = resp_value(&self.buffer, at) {
            at = end;
            count += 1;
        }
        self.buffer.drain(..at);
        count
    }
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
        let mut r = super::Replies::new();
        assert_eq!(
            r.feed(b"+OK\r\n:1\r\n$-1\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n*1\r\n:"),
            4
        );
        assert_eq!(r.feed(b"7\r\n"), 1);
        assert_eq!(r.feed(b"%1\r\n+k\r\n*0\r\n-ERR x\r\n"), 2);
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
