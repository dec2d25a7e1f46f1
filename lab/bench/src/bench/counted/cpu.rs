//! CPU time: the bench's own (getrusage), and a server's, read from `/proc/PID/stat` of
//! the server's processes when the server runs on this machine.

use std::time::Duration;

/// Clock ticks per second of `/proc/*/stat` times (`USER_HZ`, 100 on Linux).
const TICKS: f64 = 100.0;

/// CPU time (user + system) of this process so far, every thread, exited ones included.
pub(crate) fn client() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec().max(0) as u64)
                    + Duration::from_micros(t.tv_usec().max(0) as u64)
            };
            tv(usage.user_time()) + tv(usage.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// The `/proc/PID/stat` figures after the command: (ppid, utime + stime, cutime + cstime)
/// in ticks.
fn proc_stat(pid: u32) -> Option<(u32, f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    Some((f.get(1)?.parse().ok()?, n(11)? + n(12)?, n(13)? + n(14)?))
}

/// The parent of process `pid`.
pub(crate) fn parent(pid: u32) -> Option<u32> {
    proc_stat(pid).map(|(ppid, _, _)| ppid)
}

/// A server's processes: one process (every thread counted: MariaDB, Redis), or a
/// process and its children (PostgreSQL's postmaster and its backends).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Server {
    /// The process alone (its threads are in its times).
    Process(u32),
    /// The process, its live children and its exited children.
    Tree(u32),
}

impl Server {
    /// CPU time the server's processes used so far; `None` when they cannot be read (the
    /// server runs elsewhere).
    pub(crate) fn cpu(&self) -> Option<Duration> {
        let ticks = match *self {
            Server::Process(pid) => proc_stat(pid)?.1,
            Server::Tree(root) => {
                let (_, own, exited) = proc_stat(root)?;
                let mut total = own + exited;
                for entry in std::fs::read_dir("/proc").ok()?.flatten() {
                    let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                        continue;
                    };
                    if let Some((ppid, cpu, _)) = proc_stat(pid)
                        && ppid == root
                    {
                        total += cpu;
                    }
                }
                total
            }
        };
        Some(Duration::from_secs_f64(ticks / TICKS))
    }

    /// The pid named, for the setup line.
    pub(crate) fn pid(&self) -> u32 {
        match *self {
            Server::Process(pid) | Server::Tree(pid) => pid,
        }
    }
}

/// The server listening on the loopback or any address at the port of `url`
/// (`scheme://[user[:password]@]host:port[/...]`): the process that holds the listening
/// socket (`/proc/net/tcp{,6}` and the processes' open sockets). `None` when the URL has
/// no port, nothing here listens on it, or the process cannot be read (another user's).
pub(crate) fn listener_of(url: &str) -> Option<u32> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.rsplit_once('@').map_or(rest, |(_, a)| a);
    let authority = authority.split(['/', '?']).next()?;
    let port: u16 = authority.rsplit_once(':')?.1.parse().ok()?;
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path())
                && let Some(inode) = link
                    .to_str()
                    .and_then(|l| l.strip_prefix("socket:["))
                    .and_then(|l| l.strip_suffix(']'))
                && inodes.iter().any(|i| i == inode)
            {
                return Some(pid);
            }
        }
    }
    None
}

/// The inodes of the sockets listening on TCP `port` (state `0A`).
fn listening_inodes(port: u16) -> Vec<String> {
    let port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    (f.len() > 9 && f[1].ends_with(&port) && f[3] == "0A").then(|| f[9].to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// CPU readings around timed sections: this process's and, where found, each server's.
#[derive(Clone, Debug)]
pub(crate) struct Meter {
    servers: Vec<(&'static str, Option<Server>)>,
}

/// One reading of a [`Meter`]: this process's CPU and each server's.
#[derive(Clone, Debug)]
pub(crate) struct Mark {
    client: Duration,
    servers: Vec<Option<Duration>>,
}

/// CPU spent between readings, summed over sections: this process's and each server's
/// (`None` when a server's cannot be read), and the messages the sections handled.
#[derive(Clone, Debug, Default)]
pub(crate) struct Spent {
    pub(crate) client: Duration,
    pub(crate) servers: Vec<(&'static str, Option<Duration>)>,
    pub(crate) messages: usize,
}

impl Meter {
    /// A meter of this process and of `servers` (a name, for the figures, and a server).
    pub(crate) fn new(servers: Vec<(&'static str, Option<Server>)>) -> Self {
        Meter { servers }
    }

    /// The CPU so far.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            client: client(),
            servers: self
                .servers
                .iter()
                .map(|(_, s)| s.and_then(|s| s.cpu()))
                .collect(),
        }
    }

    /// Add what was spent since `mark`, handling `messages`, to `spent`.
    pub(crate) fn add_since(&self, mark: &Mark, messages: usize, spent: &mut Spent) {
        let now = self.mark();
        spent.client += now.client.saturating_sub(mark.client);
        spent.messages += messages;
        if spent.servers.is_empty() {
            spent.servers = self
                .servers
                .iter()
                .map(|(name, _)| (*name, Some(Duration::ZERO)))
                .collect();
        }
        for ((_, total), (after, before)) in spent
            .servers
            .iter_mut()
            .zip(now.servers.iter().zip(&mark.servers))
        {
            *total = total
                .zip(*after)
                .zip(*before)
                .map(|((t, a), b)| t + a.saturating_sub(b));
        }
    }
}

impl Spent {
    /// Microseconds per message: `client` and each server's by name (`null` when a
    /// server's is unknown); and their sum, when every part is known.
    pub(crate) fn per_message_us(
        &self,
    ) -> (serde_json::Map<String, serde_json::Value>, Option<f64>) {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / self.messages.max(1) as f64;
        let mut figures = serde_json::Map::new();
        figures.insert("client".into(), per(self.client).into());
        let mut total = Some(per(self.client));
        for (name, spent) in &self.servers {
            let us = spent.map(per);
            figures.insert((*name).into(), us.into());
            total = total.zip(us).map(|(t, us)| t + us);
        }
        (figures, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_of_a_url_is_the_process_holding_its_port() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let me = std::process::id();
        assert_eq!(
            listener_of(&format!("postgres://u@127.0.0.1:{port}/db")),
            Some(me)
        );
        assert_eq!(
            listener_of(&format!("amqp://g:p@127.0.0.1:{port}/%2f")),
            Some(me)
        );
        assert_eq!(listener_of(&format!("redis://127.0.0.1:{port}")), Some(me));
        drop(socket);
        assert_eq!(listener_of(&format!("redis://127.0.0.1:{port}")), None);
        assert_eq!(listener_of("sqlite://file.db"), None);
    }
}
