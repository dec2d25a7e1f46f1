//! `dedup console`: the operator's console (the `dedup-console` router) served alone, over
//! the store (and outbox) the URLs name, opened through the same front door as every
//! other command.

use std::net::SocketAddr;
use std::time::Duration;

use dedup_console::{Console, ConsoleConfig};

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, open, open_outbox};

/// What `dedup console` was given.
pub(crate) struct ConsoleArgs {
    pub(crate) outbox: Option<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) allow_writes: bool,
    pub(crate) token: Option<String>,
    pub(crate) stuck_after: String,
    /// `CONSUMER=URL`, each consumer's dead letters.
    pub(crate) dead_letters: Vec<String>,
}

/// `CONSUMER=URL` split, or a usage error naming the argument.
fn dead_letters(arg: &str) -> Result<(&str, &str), Failure> {
    match arg.split_once('=') {
        Some((consumer, url)) if !consumer.is_empty() && url.contains("://") => Ok((consumer, url)),
        _ => Err(Failure::usage(format!(
            "invalid --dead-letters {:?}: expected CONSUMER=URL (billing=redis://HOST?stream=orders)",
            dedup::url::redact(arg)
        ))),
    }
}

/// Serve the console until interrupted.
pub(crate) async fn run(store_args: &StoreArgs, args: ConsoleArgs) -> Result<(), Failure> {
    let stuck_after: Duration = dedup_core::parse_duration(&args.stuck_after)
        .map_err(|e| Failure::usage("invalid --stuck-after").cause(e))?;
    let dead: Vec<(&str, &str)> = args
        .dead_letters
        .iter()
        .map(|a| dead_letters(a))
        .collect::<Result<_, _>>()?;
    let beyond_loopback = !args.listen.ip().is_loopback();
    let needs_token = args.allow_writes || beyond_loopback;
    let (token, generated) = match args.token {
        Some(t) => (Some(t), false),
        None if needs_token => (Some(uuid::Uuid::new_v4().simple().to_string()), true),
        None => (None, false),
    };
    let mut config = ConsoleConfig::default();
    config.allow_writes = args.allow_writes;
    config.token = token.clone();
    config.views_need_token = beyond_loopback;
    config.stuck_after = stuck_after;
    // Writes open the store as writers (the schema is created or upgraded, as every store
    // does); a read-only console creates nothing.
    let access = if args.allow_writes {
        Access::Write
    } else {
        Access::Read
    };
    let opened = open(store_args, access).await?;
    let shown = store_args
        .url
        .as_deref()
        .map(dedup::url::redact)
        .unwrap_or_default();
    let mut console = Console::new(opened.store, &shown, config)
        .map_err(|e| Failure::usage("cannot set up the console").cause(e))?;
    if let Some(url) = args.outbox {
        let outbox_args = StoreArgs {
            url: Some(url),
            table: None,
            schema: None,
            prefix: None,
        };
        let (outbox, _) = open_outbox(&outbox_args, access).await?;
        console = console.with_outbox(outbox);
    }
    for (consumer, url) in dead {
        console = console.with_dead_letters(consumer, url);
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::new(format!("cannot listen on {}", args.listen)).cause(e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new("cannot read the listening address").cause(e))?;
    eprintln!(
        "dedup console for the {} store {}: http://{addr}/ ({})",
        opened.backend,
        crate::screen::line(&opened.location),
        if args.allow_writes {
            "writes allowed"
        } else {
            "read-only"
        }
    );
    if generated && let Some(t) = &token {
        eprintln!("token (sign in with it at http://{addr}/signin): {t}");
    }
    axum::serve(listener, console.router())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| Failure::new("the console's server failed").cause(e))
}
