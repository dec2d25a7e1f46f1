//! The outbox rows (`--only outbox`), on the servers the environment names:
//!
//! - `outbox_enqueue_vs_insert_alone` (PostgreSQL, SQLite, and MySQL / MariaDB in
//!   `outbox/mysql.rs`): one business row plus one `enqueue` in one transaction, against
//!   the business row alone;
//! - `relay_vs_raw_publish` (PostgreSQL + RabbitMQ): a [`Relay`](dedup_core::outbox::Relay) with a
//!   [`RabbitPublisher`](dedup_brokers::rabbitmq::RabbitPublisher) (batches of 100) publishing pre-enqueued rows until the outbox is
//!   empty, against the same messages published raw through the same lapin client on a
//!   confirm channel (publish all, then await every confirm);
//! - `commit_to_publish_p50` / `_p99` (PostgreSQL + RabbitMQ): a producer transaction
//!   commits one row, one starting every [`LATENCY_TICK`](latency::LATENCY_TICK) (1 000
//!   msgs/s), a relay publishes, a consumer on the queue stamps each
//!   message's arrival: latency from the producer's commit returning to the consumer's
//!   receipt, with `NOTIFY` wakeups (poll interval 10 s) against polling alone (every
//!   100 ms, no wakeups).

use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings};

use crate::bench::{Names, Params, Result, Row};

use latency::commit_to_publish;
use postgres::{Pg, exec, pg_enqueue, postgres_settings};
use relay::relay_throughput;
use sqlite::sqlite_enqueue;

mod latency;
#[cfg(feature = "mysql")]
mod mysql;
mod postgres;
mod probe;
mod relay;
mod sqlite;
mod support;

/// The servers the outbox rows need.
#[derive(Clone, Debug)]
pub(crate) struct Servers {
    /// `DEDUP_POSTGRES_URL`.
    pub(crate) postgres: Option<String>,
    /// `DEDUP_AMQP_URL`.
    pub(crate) amqp: Option<String>,
    /// `DEDUP_MYSQL_URL` (read with the `mysql` feature).
    pub(crate) mysql: Option<String>,
}

/// Every outbox row: SQLite always, PostgreSQL (and RabbitMQ) when named.
pub(crate) async fn run(params: &Params, servers: &Servers) -> Result<Vec<Row>> {
    let names = Names::new();
    let mut rows = Vec::new();
    eprintln!("outbox: sqlite enqueue...");
    rows.extend(sqlite_enqueue(params, &names).await?);
    #[cfg(feature = "mysql")]
    match &servers.mysql {
        Some(url) => {
            eprintln!("outbox: mysql enqueue...");
            rows.extend(mysql::mysql_enqueue(params, url, &names).await?);
        }
        None => eprintln!("outbox: DEDUP_MYSQL_URL not set: no MySQL rows"),
    }
    let Some(postgres) = &servers.postgres else {
        eprintln!("outbox: DEDUP_POSTGRES_URL not set: no PostgreSQL rows");
        return Ok(rows);
    };
    let schema = format!("dedup_bench_{}_outbox", names.run);
    let store = PostgresStore::connect_with(
        postgres,
        PostgresConfig {
            schema: schema.clone(),
            sql: SqlSettings {
                max_connections: params.max_concurrency() as u32 + 4,
                ..Default::default()
            },
            ..PostgresConfig::default()
        },
    )
    .await?;
    let business = format!("{schema}.business");
    exec(
        store.pool(),
        format!(
            "CREATE TABLE {business} (id bigserial PRIMARY KEY, message_id text NOT NULL, \
             amount integer NOT NULL)"
        ),
    )
    .await?;
    let settings = postgres_settings(store.pool()).await?;
    let pg = Pg {
        pool: store.pool().clone(),
        outbox: store.outbox(),
        insert: format!("INSERT INTO {business} (message_id, amount) VALUES ($1, $2)"),
        setup: format!("PostgreSQL as the server is set ({settings}), schema {schema}"),
    };
    let measured = async {
        eprintln!("outbox: postgres enqueue...");
        let mut rows = pg_enqueue(params, &pg).await?;
        // Its messages go nowhere: the relays must not see them.
        exec(&pg.pool, format!("TRUNCATE {}", pg.outbox.table())).await?;
        match &servers.amqp {
            Some(amqp) => {
                eprintln!("outbox: relay throughput...");
                rows.push(relay_throughput(params, &pg, postgres, amqp, &names).await?);
                eprintln!("outbox: commit-to-publish latency...");
                rows.extend(commit_to_publish(params, &pg, amqp, &names).await?);
            }
            None => eprintln!("outbox: DEDUP_AMQP_URL not set: no relay rows"),
        }
        Ok::<_, crate::bench::BoxError>(rows)
    }
    .await;
    let dropped = exec(
        store.pool(),
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
    )
    .await;
    rows.extend(measured?);
    dropped?;
    Ok(rows)
}
