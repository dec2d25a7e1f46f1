//! One run of the story: servers, the API, the roles (tasks, or with chaos worker
//! processes that are SIGKILLed and started again), the client, the count.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dedup_brokers::{Shutdown, ShutdownTrigger, shutdown};
use serde::Serialize;

use super::broker::{Broker, BrokerKind};
use super::roles::{self, Ctx};
use super::{BoxError, Db, Figures, Killer, Names, api};
use dedup_lab::servers::{Kafka, MariaDb, Postgres, RabbitMq, Service};

/// The roles and how many of each run.
pub const ROLES: [(Role, u32); 3] = [(Role::Relay, 2), (Role::Billing, 2), (Role::Mail, 1)];

/// One of the story's workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Publishes the outbox.
    Relay,
    /// Consumes `OrderPlaced`, writes invoices.
    Billing,
    /// Consumes `InvoiceCreated`, sends e-mails.
    Mail,
}

impl Role {
    /// Run this role until `shutdown` or an error.
    pub async fn run(
        self,
        ctx: &Ctx,
        killer: Option<Killer>,
        shutdown: Shutdown,
    ) -> Result<(), BoxError> {
        match self {
            Role::Relay => roles::relay(ctx, killer, shutdown).await.map(|_| ()),
            Role::Billing => roles::billing(ctx, killer, shutdown).await.map(|_| ()),
            Role::Mail => roles::mail(ctx, killer, shutdown).await.map(|_| ()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Role::Relay => "relay",
            Role::Billing => "billing",
            Role::Mail => "mail",
        }
    }
}

/// The store server a chaos run starts (privately) and crash-restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosStore {
    /// PostgreSQL.
    #[default]
    Postgres,
    /// MariaDB (the MySQL backend).
    Mariadb,
}

impl ChaosStore {
    /// The name its restart is counted under in [`Figures::restarts`].
    fn name(self) -> &'static str {
        match self {
            ChaosStore::Postgres => "postgres",
            ChaosStore::Mariadb => "mariadb",
        }
    }

    /// Start it with its state under `root`.
    fn start(self, root: &Path) -> Result<Service, BoxError> {
        match self {
            ChaosStore::Postgres => Postgres::start(&root.join("postgres")),
            ChaosStore::Mariadb => MariaDb::start(&root.join("mariadb")),
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Orders the client places.
    pub orders: u64,
    /// The store (PostgreSQL or MySQL / MariaDB) to use (without chaos; chaos starts a
    /// private store server: [`chaos_store`](Self::chaos_store)).
    pub store: Option<String>,
    /// With chaos: which store server to start and crash-restart.
    pub chaos_store: ChaosStore,
    /// The broker.
    pub broker: BrokerKind,
    /// Its address (without chaos; chaos starts a private one).
    pub broker_url: Option<String>,
    /// Chaos: the probability of a kill at a step after its first (which always kills);
    /// `None`: no chaos.
    pub kill_rate: Option<f64>,
    /// Give up waiting for every order's e-mail after this long.
    pub timeout: Duration,
}

/// Run the story once (see [the module](super)).
pub async fn run(config: &RunConfig) -> Result<Figures, BoxError> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let chaos = config.kill_rate.is_some();
    let mut private: Option<(Service, Service)> = None;
    let (store_url, broker_url) = match (&config.store, &config.broker_url, chaos) {
        (Some(store), Some(broker), false) => (store.clone(), broker.clone()),
        (_, _, true) => {
            let (root, kind, store_kind) =
                (dir.path().to_path_buf(), config.broker, config.chaos_store);
            let servers = tokio::task::spawn_blocking(move || -> Result<_, String> {
                let db = store_kind.start(&root).map_err(|e| e.to_string())?;
                let broker = match kind {
                    BrokerKind::Rabbitmq => RabbitMq::start(&root.join("rabbitmq")),
                    BrokerKind::Kafka => Kafka::start(&root.join("kafka")),
                };
                Ok((db, broker.map_err(|e| e.to_string())?))
            })
            .await??;
            let urls = (servers.0.url.clone(), servers.1.url.clone());
            private = Some(servers);
            urls
        }
        _ => {
            let broker = match config.broker {
                BrokerKind::Rabbitmq => "--amqp",
                BrokerKind::Kafka => "--kafka",
            };
            return Err(format!("give --store and {broker} (or run with --chaos)").into());
        }
    };
    let names = Names::fresh();
    let store = names.store(&store_url).await?;
    if chaos {
        match &store {
            Db::Postgres(pg) => Postgres::commit_durably(pg.pool()).await?,
            Db::MySql(my) => MariaDb::commit_durably(my.pool()).await?,
        }
    }
    store.prepare(&names).await?;
    let ctx = Ctx {
        store: store_url,
        broker: Broker {
            kind: config.broker,
            url: broker_url,
        },
        names: names.clone(),
    };
    ctx.broker.prepare(&names).await?;
    let destination = ctx.broker.destination(&names.orders_queue);
    let addr = api::serve(store.clone(), names.clone(), destination).await?;
    let killer = config.kill_rate.map(|rate| Killer {
        dir: dir.path().to_path_buf(),
        rate,
    });
    let mut workers = Workers::start(&ctx, killer.as_ref())?;

    let orders = config.orders;
    let client = tokio::spawn(place_all(addr, orders));
    let mut figures = Figures {
        orders,
        ..Figures::default()
    };
    let mut client = Some(client);
    let deadline = started + config.timeout;
    let mut complete_since: Option<Instant> = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        figures.worker_exits += workers.supervise(&ctx, killer.as_ref())?;
        if let Some(c) = client.take_if(|c| c.is_finished()) {
            figures.requests = c.await??;
        }
        if store.count(&names, &mut figures).await.is_err() {
            continue; // the database restarting
        }
        if let Some((db, mq)) = &private {
            let db_name = config.chaos_store.name();
            if figures.invoices * 3 >= orders && !figures.restarts.contains_key(db_name) {
                crash_restart(db).await?;
                figures.restarts.insert(db_name, 1);
            } else if figures.emails * 3 >= orders * 2
                && !figures.restarts.contains_key(ctx.broker.kind.name())
            {
                crash_restart(mq).await?;
                figures.restarts.insert(ctx.broker.kind.name(), 1);
            }
        }
        // Done when every order has its e-mail and a second has passed without a change
        // (so late copies would be counted).
        if client.is_none() && figures.complete() {
            match complete_since {
                None => complete_since = Some(Instant::now()),
                Some(t) if t.elapsed() > Duration::from_secs(1) => break,
                Some(_) => {}
            }
        }
    }
    workers.stop().await;
    store.count(&names, &mut figures).await?;
    figures.unsent = {
        let stats = store.outbox().stats().await?;
        stats.pending + stats.held + stats.dead
    };
    figures.kills = read_kills(dir.path());
    if figures.lost > 0 {
        explain_lost(&store, &ctx.broker, &names).await;
    }
    figures.seconds = started.elapsed().as_secs_f64();
    if !chaos {
        // The shared servers keep nothing of the run.
        store.drop_all(&names).await?;
        ctx.broker.cleanup(&names).await?;
    }
    drop(private);
    Ok(figures)
}

/// Place `orders` orders, each until the API answers 2xx (a 5xx or a dropped connection,
/// e.g. while PostgreSQL restarts, is retried with the same key); every fourth order is
/// sent once more afterwards, as a client that missed the answer would. Returns the
/// requests sent.
async fn place_all(addr: std::net::SocketAddr, orders: u64) -> Result<u64, BoxError> {
    let mut requests = 0;
    for i in 0..orders {
        let (key, id) = (format!("key-{i}"), format!("order-{i}"));
        let copies = if i % 4 == 0 { 2 } else { 1 };
        for _ in 0..copies {
            let give_up = Instant::now() + Duration::from_secs(60);
            loop {
                requests += 1;
                match api::post_order(addr, &key, &id, "tea").await {
                    Ok(status) if (200..300).contains(&status) => break,
                    _ if Instant::now() > give_up => {
                        return Err(format!("order {id} was refused for 60 s").into());
                    }
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }
    Ok(requests)
}

async fn crash_restart(server: &Service) -> Result<(), BoxError> {
    tokio::task::block_in_place(|| server.crash_restart())
}

/// Print, for each order without an invoice or e-mail, where its messages are: the outbox
/// rows, the inbox records, what the broker holds (to standard error).
async fn explain_lost(store: &Db, broker: &Broker, names: &Names) {
    let lost = store.lost_orders(names).await;
    let rows = store
        .outbox()
        .list(&dedup_core::outbox::OutboxQuery {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap_or_default();
    let inbox = store.dedup();
    for id in lost {
        let placed = format!("order-placed-{id}");
        let row = rows.iter().find(|e| e.row.message_id == placed);
        let record = match dedup_core::Key::new(names.orders_queue.as_str(), placed.as_str()) {
            Ok(key) => inbox.get(&key).await.ok().flatten(),
            Err(_) => None,
        };
        eprintln!(
            "LOST {id}: OrderPlaced outbox row {:?} (attempts {:?}, error {:?}); billing record {:?}",
            row.map(|e| e.state),
            row.map(|e| e.row.attempts),
            row.and_then(|e| e.last_error.clone()),
            record
        );
    }
    broker.explain(names).await;
}

fn read_kills(dir: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut kills = std::collections::BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("kills.log")) {
        for point in text.lines() {
            *kills.entry(point.to_owned()).or_default() += 1;
        }
    }
    kills
}

/// The running roles: tasks in this process, or (with chaos) worker processes.
enum Workers {
    Tasks {
        trigger: ShutdownTrigger,
        tasks: Vec<tokio::task::JoinHandle<Result<(), BoxError>>>,
    },
    Processes(Vec<(Role, Child)>),
}

impl Workers {
    fn start(ctx: &Ctx, killer: Option<&Killer>) -> Result<Self, BoxError> {
        let roles = ROLES
            .iter()
            .flat_map(|(role, n)| std::iter::repeat_n(*role, *n as usize));
        match killer {
            None => {
                let (trigger, stop) = shutdown();
                let tasks = roles
                    .map(|role| {
                        let (ctx, stop) = (ctx.clone(), stop.clone());
                        tokio::spawn(async move { role.run(&ctx, None, stop).await })
                    })
                    .collect();
                Ok(Workers::Tasks { trigger, tasks })
            }
            Some(killer) => Ok(Workers::Processes(
                roles
                    .map(|role| Ok((role, spawn(role, ctx, killer)?)))
                    .collect::<Result<_, BoxError>>()?,
            )),
        }
    }

    /// Start again every worker process that ended; returns how many ended by themselves
    /// (not by a kill).
    fn supervise(&mut self, ctx: &Ctx, killer: Option<&Killer>) -> Result<u64, BoxError> {
        let (Workers::Processes(children), Some(killer)) = (self, killer) else {
            return Ok(0);
        };
        let mut exits = 0;
        for (role, child) in children.iter_mut() {
            if let Some(status) = child.try_wait()? {
                use std::os::unix::process::ExitStatusExt;
                if status.signal().is_none() {
                    exits += 1;
                }
                *child = spawn(*role, ctx, killer)?;
            }
        }
        Ok(exits)
    }

    async fn stop(self) {
        match self {
            Workers::Tasks { trigger, tasks } => {
                trigger.shut_down();
                for task in tasks {
                    let _ = task.await;
                }
            }
            Workers::Processes(children) => {
                for (_, mut child) in children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }
}

fn spawn(role: Role, ctx: &Ctx, killer: &Killer) -> Result<Child, BoxError> {
    Ok(Command::new(std::env::current_exe()?)
        .args(["worker", "--role", role.name()])
        .args(["--store", &ctx.store])
        .args([
            "--broker",
            ctx.broker.kind.name(),
            "--broker-url",
            &ctx.broker.url,
        ])
        .args(["--run-id", ctx.names.run_id()])
        .arg("--run-dir")
        .arg(&killer.dir)
        .args(["--kill-rate", &killer.rate.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?)
}
