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
