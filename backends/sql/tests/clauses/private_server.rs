//! A private server from `scripts/services.sh` for the sqlx backends' crash-restart tests
//! (the shared test server must not be restarted under the other tests): each backend's
//! `tests/server_restart.rs` includes this file as a module (`#[path]`). Not a test target
//! of its own (cargo builds `tests/*.rs` only).

use std::path::PathBuf;
use std::process::Command;

/// A private server in a state dir of its own, stopped (and its folder removed) on drop.
pub struct Server {
    dir: PathBuf,
    service: &'static str,
    /// Its URL.
    pub url: String,
}

fn services(dir: &PathBuf, args: &[&str]) -> std::io::Result<std::process::Output> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    Command::new(script)
        .args(args)
        .env("DEDUP_SERVICES_DIR", dir)
        .output()
}

impl Server {
    /// Start `service` (`postgres`, `mariadb`) for this test process under `tag` (one per
    /// test: they run in parallel), its URL read from `url_var` in `services.sh env`.
    /// `None` (a failure under `DEDUP_TEST_STRICT=1`) when it cannot start.
    pub fn start(service: &'static str, url_var: &str, tag: &str) -> Option<Self> {
        let dir = std::env::temp_dir().join(format!(
            "dedup-{service}-restart-{tag}-{}",
            std::process::id()
        ));
        let started = services(&dir, &["start", service]);
        let ok = matches!(&started, Ok(out) if out.status.success());
        if !ok {
            let why = match started {
                Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
                Err(e) => e.to_string(),
            };
            let _ = services(&dir, &["stop"]);
            assert!(
                !dedup_conformance::strict(),
                "cannot start a private {service}: {why}"
            );
            eprintln!("SKIPPED: cannot start a private {service}: {why}");
            return None;
        }
        let env = services(&dir, &["env"]).expect("services.sh env");
        let env = String::from_utf8_lossy(&env.stdout).into_owned();
        let prefix = format!("export {url_var}=");
        let url = env
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_string())
            .unwrap_or_else(|| panic!("no {url_var} in {env}"));
        Some(Server { dir, service, url })
    }

    /// Stop the server as a crash would, keep it down `down_secs` seconds (`None`: the
    /// script's default), start it again.
    pub fn crash_restart(&self, down_secs: Option<u32>) {
        let down = down_secs.map(|s| s.to_string());
        let mut args = vec!["crash-restart", self.service];
        args.extend(down.as_deref());
        let out = services(&self.dir, &args).expect("crash-restart");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = services(&self.dir, &["stop"]);
    }
}
