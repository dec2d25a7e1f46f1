//! A private server of `scripts/services.sh`, for tests that kill connections or restart
//! the server (never the shared ones).

use std::path::{Path, PathBuf};
use std::process::Command;

/// How long one `services.sh` call may take (a start boots the server and waits for it)
/// before it is killed and the test fails naming the call, instead of hanging the run.
const SERVICES_LIMIT_SECS: &str = "300";

/// A private server, stopped on drop if this test started it.
pub struct Private {
    dir: PathBuf,
    service: String,
    owned: bool,
    /// Its URL (from `services.sh env`).
    pub url: String,
}

/// `scripts/services.sh ARGS` on the state dir `dir`: its stdout, or what went wrong.
fn run_services(dir: &Path, args: &[&str]) -> Result<String, String> {
    run_services_with(dir, args, &[])
}

/// [`run_services`] with `env` set for the script.
fn run_services_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh");
    let out = Command::new("timeout")
        .args(["-k", "10", SERVICES_LIMIT_SECS])
        .arg(script)
        .args(args)
        .env("DEDUP_SERVICES_DIR", dir)
        .envs(env.iter().copied())
        .output()
        .map_err(|e| format!("could not run services.sh {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "services.sh {args:?} failed ({}; 124: killed after {SERVICES_LIMIT_SECS} s): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn services(dir: &Path, args: &[&str]) -> String {
    run_services(dir, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `services.sh start` of `dir`, one at a time in this test binary. Each start picks
/// free ports a moment before its server binds them; two starts at once could pick the
/// same ones (a RabbitMQ once failed to bind its distribution port so).
fn start_one_at_a_time(dir: &Path, service: &str, env: &[(&str, &str)]) {
    static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    run_services_with(dir, &["start", service], env).unwrap_or_else(|e| panic!("{e}"));
}

/// The URL `services.sh env` of `dir` prints in `url_var`.
fn url_of(dir: &Path, url_var: &str) -> String {
    let env = services(dir, &["env"]);
    let prefix = format!("export {url_var}=");
    env.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {url_var} from services.sh env"))
        .trim_matches('\'')
        .to_owned()
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
        start_one_at_a_time(&dir, service, &[]);
        let url = url_of(&dir, url_var);
        Private {
            dir,
            service: service.to_owned(),
            owned,
            url,
        }
    }

    /// `service` of a fresh state dir of its own (whatever `DEDUP_RESTART_SERVICES_DIR`
    /// says), started with `env` set for `services.sh`, stopped on drop. Blocking.
    pub fn start_own(service: &str, url_var: &str, env: &[(&str, &str)]) -> Private {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("dedup-brokers-private-{}", &tag[..8]));
        start_one_at_a_time(&dir, service, env);
        let url = url_of(&dir, url_var);
        Private {
            dir,
            service: service.to_owned(),
            owned: true,
            url,
        }
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

impl Private {
    /// The last lines of the server's log files (`*.log`, `*.out` in its folder and the
    /// folders under it), for a failing test's report: what the server did around the
    /// failure, before `stop` removes the folder.
    fn log_tails(&self) -> String {
        const LINES: usize = 40;
        let mut files = Vec::new();
        let mut folders = vec![self.dir.join(&self.service)];
        while let Some(folder) = folders.pop() {
            let Ok(entries) = std::fs::read_dir(&folder) else {
                continue;
            };
            for path in entries.flatten().map(|e| e.path()) {
                let is_log = matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("log" | "out")
                );
                if path.is_dir() {
                    folders.push(path);
                } else if is_log {
                    files.push(path);
                }
            }
        }
        files.sort();
        let mut tails = String::new();
        for file in files {
            let text = std::fs::read(&file).unwrap_or_default();
            let text = String::from_utf8_lossy(&text);
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(LINES);
            tails.push_str(&format!(
                "--- {} (last {} of {} lines)\n{}\n",
                file.display(),
                lines.len() - from,
                lines.len(),
                lines[from..].join("\n")
            ));
        }
        tails
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "the private {} of the failed test ({}):\n{}",
                self.service,
                self.dir.display(),
                self.log_tails()
            );
        }
        // No panic here: a second one while the test unwinds would abort the whole binary.
        if self.owned
            && let Err(e) = run_services(&self.dir, &["stop"])
        {
            eprintln!("{e}");
        }
    }
}
