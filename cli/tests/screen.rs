//! Nothing secret or hostile on the operator's screen. A scripted run of the built `dedup`
//! binary on a real MariaDB store reached as a user with a password of its own: every
//! subcommand's `--help`, every command (text and `--json`), the error paths (a wrong
//! password, a server that is down, a rejected URL) and every page of `dedup console`. The
//! store holds records whose message ids, consumer names, workers and causes (and an
//! outbox row whose last error) are full of terminal control sequences.
//! No output may hold the password, nor a raw control character (a newline only where
//! it separates lines), and `dedup list` keeps one record per line.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dedup_conformance::server_url;
use dedup_core::outbox::{AfterFailure, OutboxMessage, OutboxStore};
use dedup_core::{Admin, ClaimOptions, DedupStore, Failure, Key, Verdict};
use dedup_mysql::{MySqlConfig, MySqlStore, SqlSettings};
use support::get;

/// What a hostile producer writes: clear the screen, set the window's title, go back to the
/// start of the line, start a new one.
const HOSTILE: &str = "payload \x1b[2J\x1b]0;title\x07\r\nsecond line";

/// A message id and a consumer name with escape sequences (and a newline) in them.
const EVIL_ID: &str = "evil-\x1b[2J-\r\n-id";
const EVIL_CONSUMER: &str = "bill\x1b[31ming";

/// The console's token, in `DEDUP_CONSOLE_TOKEN` for every run: a secret too.
const TOKEN: &str = "screen-token-0123456789";

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The first thing wrong with `output` (what the run `label` printed, `text` when newlines
/// separate its lines): a secret in it, or a raw control character.
fn problem(label: &str, output: &[u8], secrets: &[&str]) -> Option<String> {
    let text = String::from_utf8_lossy(output);
    if let Some(s) = secrets.iter().find(|s| text.contains(**s)) {
        return Some(format!("{label}: shows the secret {s:?}: {text}"));
    }
    let raw = text.chars().find(|c| c.is_control() && *c != '\n');
    raw.map(|c| format!("{label}: a raw {c:?} in {text:?}"))
}

/// Every output seen, and what was wrong with them.
#[derive(Default)]
struct Screen {
    seen: usize,
    problems: Vec<String>,
}

impl Screen {
    fn check(&mut self, label: &str, output: &[u8], secrets: &[&str]) {
        self.seen += 1;
        self.problems.extend(problem(label, output, secrets));
    }

    fn check_run(&mut self, label: &str, output: &Output, secrets: &[&str]) {
        self.check(&format!("{label} (stdout)"), &output.stdout, secrets);
        self.check(&format!("{label} (stderr)"), &output.stderr, secrets);
    }
}

/// `dedup ARGS` with the store URL in `DEDUP_STORE_URL`.
fn dedup(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(args)
        .env("DEDUP_STORE_URL", url)
        .env("DEDUP_CONSOLE_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .output()
        .expect("run dedup")
}

/// `text` percent-encoded for a query string.
fn qs(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// The body of an HTTP answer (the headers end with CR LF CR LF, which are no one's
/// screen).
fn body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// MariaDB's user `name` with `password`, allowed everything on the test database, made
/// by the test server's own user (`admin`).
async fn create_user(admin: &MySqlStore, name: &str, password: &str, db: &str) {
    for sql in [
        format!("CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'"),
        format!("GRANT ALL ON `{db}`.* TO '{name}'@'%'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(admin.pool())
            .await
            .expect("create the test's user");
    }
}

/// The records the outputs show: failures whose causes, workers, ids and consumer names
/// hold escape sequences, a live lease, a processed one, and a dead outbox row.
async fn seed(store: &MySqlStore) {
    let now = store.now().await.expect("now");
    let failure =
        |lines: Vec<String>| Failure::new("handler", lines, 1, now, Some("worker-\x1b[5m-7"));
    let claim = |consumer: &'static str, id: &'static str, secs: u64| async move {
        store
            .claim(
                &Key::new(consumer, id).expect("key"),
                &ClaimOptions::lease(Duration::from_secs(secs)),
            )
            .await
            .expect("claim")
            .into_lease()
            .expect("acquired")
    };
    let hostile = failure(vec![
        HOSTILE.to_owned(),
        "root: \x1b]0;pwned\x07".to_owned(),
    ]);
    for id in [EVIL_ID, "fail-1"] {
        let lease = claim("billing", id, 30).await;
        store
            .commit(&lease, Some(&Verdict::failed(&hostile)))
            .await
            .expect("commit a failure");
    }
    let lease = claim("billing", "dead-1", 30).await;
    store
        .commit(&lease, Some(&Verdict::dead_letter(3, Some(&hostile))))
        .await
        .expect("commit a dead letter");
    let lease = claim("billing", "ok-1", 30).await;
    store
        .commit(&lease, Some(b"done\x1b[2J"))
        .await
        .expect("commit");
    let lease = claim(EVIL_CONSUMER, "ok-1", 30).await;
    store.commit(&lease, None).await.expect("commit");
    claim("billing", "stuck-1", 3600).await;

    let mut tx = store.pool().begin().await.expect("begin");
    // Destinations, ids and headers refuse control characters; a broker's error is
    // whatever it said.
    let message = OutboxMessage::new("invoices", "inv-1", b"x".to_vec()).unwrap();
    store
        .outbox()
        .enqueue(&mut tx, &[message])
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit the outbox row");
    let outbox = store.outbox();
    let held = outbox
        .take(10, Duration::from_secs(30))
        .await
        .expect("take");
    let id = held.rows[0].id;
    assert!(
        outbox
            .mark_failed(&held.token, id, HOSTILE, AfterFailure::Dead)
            .await
            .expect("mark dead")
    );
}

/// Every subcommand's name, for `--help`.
const SUBCOMMANDS: &[&[&str]] = &[
    &[],
    &["migrate"],
    &["stats"],
    &["consumers"],
    &["inspect"],
    &["list"],
    &["purge"],
    &["release"],
    &["forget"],
    &["console"],
    &["counts"],
    &["counts", "enable"],
    &["counts", "disable"],
    &["counts", "status"],
    &["outbox"],
    &["outbox", "stats"],
    &["outbox", "list"],
    &["outbox", "retry"],
    &["outbox", "purge"],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_shows_the_password_or_a_raw_control_character() {
    let Some(admin_url) = server_url("DEDUP_MYSQL_URL") else {
        eprintln!("SKIPPED: DEDUP_MYSQL_URL is not set");
        return;
    };
    let admin_url = url::Url::parse(&admin_url).expect("DEDUP_MYSQL_URL");
    let db = admin_url.path().trim_start_matches('/').to_owned();
    let table = unique("screen");
    let user = unique("screen");
    let password = format!(
        "s3cr3t-pw-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let wrong = format!(
        "wr0ng-pw-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let admin = MySqlStore::connect_with(
        admin_url.as_str(),
        MySqlConfig::from(SqlSettings {
            table: table.clone(),
            max_connections: 2,
            ..Default::default()
        }),
    )
    .await
    .expect("connect as the server's user");
    create_user(&admin, &user, &password, &db).await;
    let host = format!(
        "{}:{}",
        admin_url.host_str().unwrap(),
        admin_url.port().unwrap()
    );
    let url = format!("mysql://{user}:{password}@{host}/{db}?table={table}");
    let secrets = [password.as_str(), wrong.as_str(), TOKEN];
    let mut screen = Screen::default();

    // Help, with the URL in the environment (clap shows environment values unless told).
    for sub in SUBCOMMANDS {
        let mut args = sub.to_vec();
        args.push("--help");
        let out = dedup(&url, &args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        screen.check_run(&format!("dedup {}", args.join(" ")), &out, &secrets);
    }

    // The commands, on records full of escape sequences.
    let migrate = dedup(&url, &["migrate"]);
    assert_eq!(migrate.status.code(), Some(0), "{migrate:?}");
    screen.check_run("dedup migrate", &migrate, &secrets);
    let store = MySqlStore::connect_with(
        &url,
        MySqlConfig::from(SqlSettings {
            table: table.clone(),
            max_connections: 2,
            ..Default::default()
        }),
    )
    .await
    .expect("connect as the test's user");
    seed(&store).await;
    let debug = format!("{store:?} {:?}", dedup::StoreUrl::parse(&url).unwrap());
    screen.check("Debug of the store and its URL", debug.as_bytes(), &secrets);
    // PostgreSQL here trusts every local user: the password is given, and not needed.
    if let Some(pg) = server_url("DEDUP_POSTGRES_URL") {
        let mut pg = url::Url::parse(&pg).expect("DEDUP_POSTGRES_URL");
        pg.set_password(Some(&password)).unwrap();
        let pg = dedup_postgres::PostgresStore::connect_with(
            pg.as_str(),
            dedup_postgres::PostgresConfig {
                sql: dedup_postgres::SqlSettings {
                    table: table.clone(),
                    max_connections: 1,
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("connect to PostgreSQL with a password");
        let debug = format!("{pg:?}");
        screen.check("Debug of a PostgreSQL store", debug.as_bytes(), &secrets);
    }
    let dead_row = store
        .outbox()
        .list(&Default::default())
        .await
        .expect("the outbox's rows")[0]
        .row
        .id
        .to_string();
    let runs: &[&[&str]] = &[
        &["stats"],
        &["consumers"],
        &["list", "billing"],
        &["list", "billing", "--state", "failed"],
        &["list", EVIL_CONSUMER],
        &["inspect", "billing", EVIL_ID],
        &["inspect", "billing", "dead-1"],
        &["inspect", "billing", "stuck-1"],
        &["inspect", "billing", "ok-1"],
        &["inspect", "billing", "no-such-\x1b[2J-key"],
        &["purge", "--older-than", "1d", "--dry-run"],
        &["purge", "--older-than", "1d"],
        &["purge", "--older-than", "\x1b[2J"],
        &["counts", "status"],
        &["outbox", "stats"],
        &["outbox", "list"],
        &["outbox", "retry", &dead_row],
        &["outbox", "purge", "--retention", "7d"],
        &["release", "billing", "stuck-1"],
        &["release", "billing", "stuck-1", "--force"],
        &["forget", "billing", "fail-1"],
        &["forget", "billing", EVIL_ID],
        &["forget", "billing", "fail-1"],
    ];
    for json in [false, true] {
        for run in runs {
            let mut args = run.to_vec();
            if json {
                args.push("--json");
            }
            let out = dedup(&url, &args);
            let label = format!("dedup {args:?} (exit {:?})", out.status.code());
            screen.check_run(&label, &out, &secrets);
            if json && out.status.success() {
                serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .unwrap_or_else(|e| panic!("{label}: not JSON ({e})"));
            }
        }
        // Written again: the next pass forgets them once more, the listing shows them.
        seed_again(&store).await;
    }
    // One record, one line.
    let list = dedup(&url, &["list", "billing"]);
    let lines = String::from_utf8_lossy(&list.stdout).lines().count();
    let records = store
        .list(&dedup_core::ListFilter::consumer("billing"))
        .await
        .expect("list")
        .len();
    assert_eq!(records, 5, "fail-1, dead-1, ok-1, stuck-1 and the evil id");
    if lines != records {
        screen.problems.push(format!(
            "dedup list: {lines} lines for {records} records: {}",
            String::from_utf8_lossy(&list.stdout)
        ));
    }
    let inspect = dedup(&url, &["inspect", "billing", "dead-1"]);
    let shown = String::from_utf8_lossy(&inspect.stdout);
    let indented = format!("\n{:17}second line", "");
    if !(shown.contains("payload \\x1b[2J\\x1b]0;title\\x07\\r") && shown.contains(&indented)) {
        screen.problems.push(format!(
            "dedup inspect shows no multi-line cause as indented lines, escaped: {shown}"
        ));
    }

    // The error paths: a wrong password, a server that is down, URLs that are refused.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_port = down.local_addr().unwrap().port();
    drop(down);
    let failing = [
        format!("mysql://{user}:{wrong}@{host}/{db}?table={table}"),
        format!("mysql://{user}:{password}@127.0.0.1:{down_port}/{db}?connect_timeout=2s"),
        format!("mysql://{user}:{password}@{host}/{db}?tabel=x"),
        format!("mysql://{user}:{password}@{host}:notaport/{db}"),
        format!("mysqlx://{user}:{password}@{host}/{db}"),
        format!("mysql://{user}:{password}/x@{host}/{db}"),
        format!("postgres://{user}:{password}@127.0.0.1:{down_port}/db?connect_timeout=2s"),
        format!("redis://:{password}@127.0.0.1:{down_port}/"),
    ];
    for bad in &failing {
        let runs: [&[&str]; 6] = [
            &["migrate"],
            &["stats"],
            &["list", "billing"],
            &["forget", "billing", "fail-1"],
            &["outbox", "stats"],
            &["console", "--listen", "127.0.0.1:0"],
        ];
        for args in runs {
            let out = dedup(bad, args);
            assert_ne!(out.status.code(), Some(0), "{args:?} on a failing URL");
            screen.check_run(&format!("dedup {args:?} on a failing URL"), &out, &secrets);
            let out = Command::new(env!("CARGO_BIN_EXE_dedup"))
                .args(args)
                .args(["--store", bad])
                .env_remove("DEDUP_STORE_URL")
                .output()
                .expect("run dedup");
            screen.check_run(&format!("dedup {args:?} --store URL"), &out, &secrets);
        }
        let parsed = format!("{:?}", dedup::StoreUrl::parse(bad));
        screen.check("Debug of a parsed URL", parsed.as_bytes(), &secrets);
        if let Err(e) = dedup::open_admin(bad).await {
            let said = format!("{e} {e:?} {}", dedup_core::error_chain(&e));
            screen.check(
                "an open error, Display and Debug",
                said.as_bytes(),
                &secrets,
            );
        }
    }

    // The console: every page, and its own lines on standard error.
    console_pages(&url, &mut screen, &secrets, &dead_row);

    assert!(screen.seen > 200, "{} outputs checked", screen.seen);
    assert!(
        screen.problems.is_empty(),
        "{} of {} outputs:\n{}",
        screen.problems.len(),
        screen.seen,
        screen.problems.join("\n")
    );
    let drop_user = format!("DROP USER '{user}'@'%'");
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop_user))
        .execute(admin.pool())
        .await
        .expect("drop the test's user");
}

/// The failed record and the live lease again, for the second pass of the commands.
async fn seed_again(store: &MySqlStore) {
    let now = store.now().await.expect("now");
    let cause = Failure::new("handler", vec![HOSTILE.to_owned()], 1, now, None);
    for id in ["fail-1", EVIL_ID] {
        let key = Key::new("billing", id).unwrap();
        if let Ok(claim) = store
            .claim(&key, &ClaimOptions::lease(Duration::from_secs(30)))
            .await
            && let Some(lease) = claim.into_lease()
        {
            store
                .commit(&lease, Some(&Verdict::failed(&cause)))
                .await
                .expect("commit");
        }
    }
}

/// `dedup console` over the store (and its outbox) with writes allowed: every page and
/// its JSON, and what the process printed.
fn console_pages(url: &str, screen: &mut Screen, secrets: &[&str], dead_row: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(["console", "--listen", "127.0.0.1:0", "--allow-writes"])
        .args(["--outbox", url])
        .env("DEDUP_STORE_URL", url)
        .env("DEDUP_CONSOLE_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedup console");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr
        .read_line(&mut first)
        .expect("the console's first line");
    screen.check("dedup console's first line", first.as_bytes(), secrets);
    let at = first.find("http://").expect("the address") + 7;
    let addr = first[at..at + first[at..].find('/').unwrap()].to_owned();
    let (_, failures) = get(&addr, "/api/failures");
    let failures: serde_json::Value = serde_json::from_str(body(&failures)).expect("JSON");
    let group = failures["groups"][0]["id"]
        .as_str()
        .expect("a group")
        .to_owned();
    let key = |page: &str, id: &str| format!("{page}?consumer=billing&id={}", qs(id));
    let pages = [
        "/".to_owned(),
        "/failures".to_owned(),
        format!("/failures/group?id={group}"),
        key("/key", EVIL_ID),
        key("/key", "dead-1"),
        format!("/key?consumer={}&id=ok-1", qs(EVIL_CONSUMER)),
        "/stuck?older_than=0s".to_owned(),
        "/outbox".to_owned(),
        "/signin".to_owned(),
        format!("{}&fence=1", key("/confirm/forget", "dead-1")),
        format!("/confirm/forget-group?id={group}"),
        format!("/confirm/outbox-retry?id={dead_row}"),
        "/confirm/purge".to_owned(),
        key("/key", "no-such-\x1b[2J-key"),
        "/api/overview".to_owned(),
        "/api/failures".to_owned(),
        key("/api/key", EVIL_ID),
        key("/api/key", "dead-1"),
        "/api/stuck?older_than=0s".to_owned(),
        "/api/outbox/dead".to_owned(),
        "/api/session".to_owned(),
    ];
    for page in &pages {
        let (status, answer) = get(&addr, page);
        assert!(
            status == 200 || page.contains("no-such"),
            "{page}: {answer}"
        );
        screen.check(
            &format!("console {page}"),
            body(&answer).as_bytes(),
            secrets,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut rest = String::new();
    let _ = stderr.read_to_string(&mut rest);
    screen.check("dedup console's standard error", rest.as_bytes(), secrets);
}
