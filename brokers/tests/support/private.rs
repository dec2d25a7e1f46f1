//! A private server of `scripts/services.sh`, for tests that kill connections or restart
//! the server (never the shared ones).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A private server, stopped on drop if this test started it.
pub struct Private {
    dir: PathBuf,
    owned: bool,
    /// Its URL (from `services.sh env`).
    pub url: String,
}

fn services(dir: &Path, args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh");
    let out = Command::new(script)
        .args(args)
        .env("DEDUP_SERVICES_DIR", dir)
        .output()
        .expect("run scripts/services.sh");
    assert!(
        out.status.success(),
        "services.sh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

impl Private {
    /// `service` of the state dir named by `DEDUP_RESTART_SERVICES_DIR` (started there if
    /// missing), or, without it, of a fresh state dir this value stops on drop. `url_var` is
    /// the variable `services.sh env` prints its URL in. Blocking: call it off the runtime.
    pub fn start(service: &str, url_var: &str) -> Private {
        let (dir, owned) = match std::env::var("DEDUP_RESTART_SERVICES_DIR") {
            Ok(dir) => (PathBuf::from(dir), false),
            Err(_) => {
                let tag = uuid::Uuid::new_v4().simple().to_string();
                let name = format!("dedup-brokers-private-{}", &tag[..8]);
                (std::env::temp_dir().join(name), true)
            }
        };
        services(&dir, &["start", service]);
        let env = services(&dir, &["env"]);
        let prefix = format!("export {url_var}=");
        let url = env
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {url_var} from services.sh env"))
            .trim_matches('\'')
            .to_owned();
        Private { dir, owned, url }
    }

    /// `services.sh crash-restart <service>`: killed (-9) and started again, data kept.
    /// Blocking.
    pub fn crash_restart(&self, service: &str) {
        services(&self.dir, &["crash-restart", service]);
    }
}

/// Tests of one binary that restart a server take turns when they share one (through
/// `DEDUP_RESTART_SERVICES_DIR`): one test's restart must not hit another's run. Without
/// it each test has a server of its own and they run side by side.
pub async fn turn() -> Option<tokio::sync::MutexGuard<'static, ()>> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    match std::env::var_os("DEDUP_RESTART_SERVICES_DIR") {
        Some(_) => Some(TURN.lock().await),
        None => None,
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        if self.owned {
            services(&self.dir, &["stop"]);
        }
    }
}
