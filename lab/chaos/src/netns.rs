//! A host of its own on this machine: a network namespace joined to the host's by a veth
//! pair (iproute2's `ip`), which can be cut (the host end's link down) and healed. Needs
//! root (CAP_NET_ADMIN); [`NetNs::create`] says why when it cannot.

use std::net::Ipv4Addr;
use std::process::Command;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A namespace and its veth pair, removed when dropped.
pub struct NetNs {
    name: String,
    host_if: String,
    /// The host end's address (servers listen there for the namespace's processes).
    pub host_addr: Ipv4Addr,
    /// The namespace end's address.
    pub ns_addr: Ipv4Addr,
}

/// Run `ip ARGS`; an error naming the command and what it printed.
fn ip(args: &[&str]) -> Result<(), BoxError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running `ip {}`: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

impl NetNs {
    /// A namespace named after this process (so parallel runs do not collide), with a
    /// /30 of 10.213.0.0/16 shared with the host through a veth pair, both ends up.
    pub fn create() -> Result<Self, BoxError> {
        let pid = std::process::id();
        // One /30 per pid modulo 16384: two runs at once collide only by bad luck.
        let block = (pid % 16384) * 4;
        let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + block;
        let ns = NetNs {
            name: format!("dedup-part-{pid}"),
            host_if: format!("dph{pid}"),
            host_addr: Ipv4Addr::from(base + 1),
            ns_addr: Ipv4Addr::from(base + 2),
        };
        let ns_if = format!("dpn{pid}");
        ip(&["netns", "add", &ns.name])?;
        // From here on `drop` removes what was made.
        let host_cidr = format!("{}/30", ns.host_addr);
        let ns_cidr = format!("{}/30", ns.ns_addr);
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ])?;
        ip(&["link", "set", &ns_if, "netns", &ns.name])?;
        ip(&["addr", "add", &host_cidr, "dev", &ns.host_if])?;
        ip(&["link", "set", &ns.host_if, "up"])?;
        ns.exec_ip(&["addr", "add", &ns_cidr, "dev", &ns_if])?;
        ns.exec_ip(&["link", "set", &ns_if, "up"])?;
        ns.exec_ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn exec_ip(&self, args: &[&str]) -> Result<(), BoxError> {
        ip(&[&["netns", "exec", &self.name, "ip"][..], args].concat())
    }

    /// `ip netns exec NAME`: the prefix running a command inside.
    pub fn exec_prefix(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.name]
    }

    /// Cut the namespace off: the host end's link goes down (addresses stay; packets
    /// are dropped, open TCP connections stall and resume on [`heal`](Self::heal)).
    pub fn cut(&self) -> Result<(), BoxError> {
        ip(&["link", "set", &self.host_if, "down"])
    }

    /// Join it to the host again.
    pub fn heal(&self) -> Result<(), BoxError> {
        ip(&["link", "set", &self.host_if, "up"])
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth end, and the pair with it.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}
