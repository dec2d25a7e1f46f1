//! The story's database, chosen by the store URL: PostgreSQL (`postgres://`: the run's own
//! schema) or MySQL / MariaDB (`mysql://`, `mariadb://`: the run's own table prefix in the
//! URL's database). Each holds the business tables, the inbox and the outbox.

use std::sync::Arc;

use dedup_core::outbox::{OutboxMessage, OutboxStore};
use dedup_core::{DedupStore, Handled, InboxConfig, InboxError, Key};
use dedup_mysql::sqlx as sqlx_my;
use dedup_mysql::{MySqlConfig, MySqlOutbox, MySqlStore, SqlSettings};
use dedup_postgres::sqlx as sqlx_pg;
use dedup_postgres::{PostgresConfig, PostgresOutbox, PostgresStore};

use super::{BoxError, Figures, Killer, Names, checkpoint};

/// The run's store and business tables on one server.
#[derive(Clone, Debug)]
pub enum Db {
    /// PostgreSQL: everything in the schema `names.schema`.
    Postgres(PostgresStore),
    /// MySQL / MariaDB: every table named `<names.schema>_...`.
    MySql(MySqlStore),
}

/// Whether `url` names a MySQL / MariaDB server.
fn is_mysql(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}

impl Db {
    /// The dedup store (inbox and outbox tables) of the run `names` on `url`.
    pub async fn open(url: &str, names: &Names) -> Result<Db, BoxError> {
        if is_mysql(url) {
            let config = MySqlConfig::from(SqlSettings {
                table: format!("{}_inbox", names.schema),
                max_connections: 8,
                ..Default::default()
            });
            return Ok(Db::MySql(MySqlStore::connect_with(url, config).await?));
        }
        let config = PostgresConfig {
            schema: names.schema.clone(),
            sql: SqlSettings {
                max_connections: 8,
                ..Default::default()
            },
            ..PostgresConfig::default()
        };
        Ok(Db::Postgres(
            PostgresStore::connect_with(url, config).await?,
        ))
    }

    /// The business table `name` of the run, ready to splice into SQL.
    pub fn table(&self, names: &Names, name: &str) -> String {
        match self {
            Db::Postgres(_) => format!("{}.{name}", names.schema),
            Db::MySql(_) => format!("`{}_{name}`", names.schema),
        }
    }

    /// The inbox.
    pub fn dedup(&self) -> Arc<dyn DedupStore> {
        match self {
            Db::Postgres(store) => Arc::new(store.clone()),
            Db::MySql(store) => Arc::new(store.clone()),
        }
    }

    /// The outbox, for relays and counts.
    pub fn outbox(&self) -> Arc<dyn OutboxStore> {
        match self {
            Db::Postgres(store) => Arc::new(store.outbox()),
            Db::MySql(store) => Arc::new(store.outbox()),
        }
    }

    /// Create the run's business tables (idempotent).
    pub async fn prepare(&self, names: &Names) -> Result<(), BoxError> {
        let (orders, invoices, mail) = (
            self.table(names, "orders"),
            self.table(names, "invoices"),
            self.table(names, "mail_provider"),
        );
        match self {
            Db::Postgres(store) => {
                for statement in [
                    format!("CREATE SCHEMA IF NOT EXISTS {}", names.schema),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {orders} (id TEXT PRIMARY KEY, item TEXT NOT NULL)"
                    ),
                    // No unique order_id: a doubled invoice must be countable.
                    format!(
                        "CREATE TABLE IF NOT EXISTS {invoices} (id BIGSERIAL PRIMARY KEY, \
                         order_id TEXT NOT NULL, fence BIGINT NOT NULL)"
                    ),
                    // The mail provider's own records: it accepts a send once per
                    // idempotency key, as payment and mail APIs that take one do, and
                    // counts the calls.
                    format!(
                        "CREATE TABLE IF NOT EXISTS {mail} (idempotency_key TEXT PRIMARY KEY, \
                         order_id TEXT NOT NULL, calls INT NOT NULL DEFAULT 1)"
                    ),
                ] {
                    sqlx_pg::query(sqlx_pg::AssertSqlSafe(statement))
                        .execute(store.pool())
                        .await?;
                }
            }
            Db::MySql(store) => {
                for statement in [
                    format!(
                        "CREATE TABLE IF NOT EXISTS {orders} (id VARCHAR(100) PRIMARY KEY, \
                         item TEXT NOT NULL)"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {invoices} (id BIGINT AUTO_INCREMENT \
                         PRIMARY KEY, order_id VARCHAR(100) NOT NULL, fence BIGINT NOT NULL)"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {mail} (idempotency_key VARCHAR(255) \
                         PRIMARY KEY, order_id VARCHAR(100) NOT NULL, calls INT NOT NULL DEFAULT 1)"
                    ),
                ] {
                    sqlx_my::query(sqlx_my::AssertSqlSafe(statement))
                        .execute(store.pool())
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Drop everything the run created.
    pub async fn drop_all(&self, names: &Names) -> Result<(), BoxError> {
        match self {
            Db::Postgres(store) => {
                sqlx_pg::query(sqlx_pg::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {} CASCADE",
                    names.schema
                )))
                .execute(store.pool())
                .await?;
            }
            Db::MySql(store) => {
                let config = store.config();
                let outbox = config.outbox_table_name();
                let tables = [
                    config.table.clone(),
                    outbox.clone(),
                    format!("{outbox}_keys"),
                    format!("{}_orders", names.schema),
                    format!("{}_invoices", names.schema),
                    format!("{}_mail_provider", names.schema),
                ];
                for table in &tables {
                    sqlx_my::query(sqlx_my::AssertSqlSafe(format!(
                        "DROP TABLE IF EXISTS `{table}`"
                    )))
                    .execute(store.pool())
                    .await?;
                }
                sqlx_my::query("DELETE FROM dedup_schema_versions WHERE table_name IN (?, ?)")
                    .bind(&config.table)
                    .bind(&outbox)
                    .execute(store.pool())
                    .await?;
            }
        }
        Ok(())
    }

    /// Write the order and `placed` in one transaction; the order row is written once even
    /// if a retry gets past the idempotency layer, and so is the message (its id is kept
    /// once).
    pub async fn place_order(
        &self,
        names: &Names,
        id: &str,
        item: &str,
        placed: OutboxMessage,
    ) -> Result<(), BoxError> {
        let orders = self.table(names, "orders");
        match self {
            Db::Postgres(store) => {
                let mut tx = store.pool().begin().await?;
                sqlx_pg::query(sqlx_pg::AssertSqlSafe(format!(
                    "INSERT INTO {orders} (id, item) VALUES ($1, $2) ON CONFLICT DO NOTHING"
                )))
                .bind(id)
                .bind(item)
                .execute(&mut *tx)
                .await?;
                store.outbox().enqueue(&mut tx, &[placed]).await?;
                tx.commit().await?;
            }
            Db::MySql(store) => {
                let mut tx = store.pool().begin().await?;
                sqlx_my::query(sqlx_my::AssertSqlSafe(format!(
                    "INSERT IGNORE INTO {orders} (id, item) VALUES (?, ?)"
                )))
                .bind(id)
                .bind(item)
                .execute(&mut *tx)
                .await?;
                store.outbox().enqueue(&mut tx, &[placed]).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// The mail provider's send: accepted once per idempotency key, every call counted.
    pub async fn send_mail(
        &self,
        names: &Names,
        idempotency_key: &str,
        order_id: &str,
    ) -> Result<(), BoxError> {
        let provider = self.table(names, "mail_provider");
        match self {
            Db::Postgres(store) => {
                sqlx_pg::query(sqlx_pg::AssertSqlSafe(format!(
                    "INSERT INTO {provider} (idempotency_key, order_id) VALUES ($1, $2) \
                     ON CONFLICT (idempotency_key) DO UPDATE SET calls = {provider}.calls + 1"
                )))
                .bind(idempotency_key)
                .bind(order_id)
                .execute(store.pool())
                .await?;
            }
            Db::MySql(store) => {
                sqlx_my::query(sqlx_my::AssertSqlSafe(format!(
                    "INSERT INTO {provider} (idempotency_key, order_id) VALUES (?, ?) \
                     ON DUPLICATE KEY UPDATE calls = calls + 1"
                )))
                .bind(idempotency_key)
                .bind(order_id)
                .execute(store.pool())
                .await?;
            }
        }
        Ok(())
    }

    /// Count what the run wrote into `figures`.
    pub async fn count(&self, names: &Names, figures: &mut Figures) -> Result<(), BoxError> {
        let (o, i, m) = (
            self.table(names, "orders"),
            self.table(names, "invoices"),
            self.table(names, "mail_provider"),
        );
        // Every figure as a signed 64-bit integer on both servers (MySQL's SUM is DECIMAL).
        let sql = format!(
            "WITH per_order AS ( \
               SELECT o.id, \
                 (SELECT count(*) FROM {i} i WHERE i.order_id = o.id) AS invoices, \
                 (SELECT count(*) FROM {m} m WHERE m.order_id = o.id) AS emails \
               FROM {o} o) \
             SELECT (SELECT count(*) FROM {o}), \
                    (SELECT count(*) FROM {i}), \
                    (SELECT count(*) FROM {m}), \
                    (SELECT CAST(coalesce(sum(calls), 0) AS {int}) FROM {m}), \
                    (SELECT count(*) FROM per_order WHERE invoices > 1 OR emails > 1), \
                    (SELECT count(*) FROM per_order WHERE invoices = 0 OR emails = 0)",
            int = match self {
                Db::Postgres(_) => "BIGINT",
                Db::MySql(_) => "SIGNED",
            }
        );
        let (order_rows, invoices, emails, calls, doubled, lost): (i64, i64, i64, i64, i64, i64) =
            match self {
                Db::Postgres(store) => {
                    sqlx_pg::query_as(sqlx_pg::AssertSqlSafe(sql))
                        .fetch_one(store.pool())
                        .await?
                }
                Db::MySql(store) => {
                    sqlx_my::query_as(sqlx_my::AssertSqlSafe(sql))
                        .fetch_one(store.pool())
                        .await?
                }
            };
        figures.order_rows = order_rows as u64;
        figures.invoices = invoices as u64;
        figures.emails = emails as u64;
        figures.mail_calls = calls as u64;
        figures.doubled = doubled as u64;
        figures.lost = lost as u64 + figures.orders.saturating_sub(order_rows as u64);
        Ok(())
    }

    /// The orders without an invoice or an e-mail.
    pub async fn lost_orders(&self, names: &Names) -> Vec<String> {
        let (o, i, m) = (
            self.table(names, "orders"),
            self.table(names, "invoices"),
            self.table(names, "mail_provider"),
        );
        let sql = format!(
            "SELECT o.id FROM {o} o WHERE NOT EXISTS (SELECT 1 FROM {i} i \
             WHERE i.order_id = o.id) OR NOT EXISTS (SELECT 1 FROM {m} m \
             WHERE m.order_id = o.id)"
        );
        match self {
            Db::Postgres(store) => sqlx_pg::query_scalar(sqlx_pg::AssertSqlSafe(sql))
                .fetch_all(store.pool())
                .await
                .unwrap_or_default(),
            Db::MySql(store) => sqlx_my::query_scalar(sqlx_my::AssertSqlSafe(sql))
                .fetch_all(store.pool())
                .await
                .unwrap_or_default(),
        }
    }

    /// Billing's transactional inbox and outbox on this store.
    pub fn billing(&self, config: InboxConfig) -> Billing {
        match self {
            Db::Postgres(store) => Billing::Postgres(
                dedup_postgres::TxInbox::new(store.clone()).with_config(config),
                store.outbox(),
            ),
            Db::MySql(store) => Billing::MySql(
                dedup_mysql::TxInbox::new(store.clone()).with_config(config),
                store.outbox(),
            ),
        }
    }
}

/// Billing's `TxInbox` and the outbox its handler writes to.
#[derive(Clone, Debug)]
pub enum Billing {
    /// On PostgreSQL.
    Postgres(dedup_postgres::TxInbox, PostgresOutbox),
    /// On MySQL / MariaDB.
    MySql(dedup_mysql::TxInbox, MySqlOutbox),
}

/// What one billing run writes.
#[derive(Clone, Debug)]
pub struct Invoice {
    /// The invoices table.
    pub table: String,
    /// The order billed.
    pub order_id: String,
    /// Where `InvoiceCreated` goes.
    pub destination: String,
}

impl Billing {
    /// Bill the order of `key` at most once: the invoice, its `InvoiceCreated` (id from
    /// `ConsumerOutbox`) and the inbox record commit together.
    pub async fn bill(
        &self,
        key: &Key,
        invoice: &Invoice,
        killer: &Option<Killer>,
    ) -> Result<Handled, InboxError> {
        match self {
            Billing::Postgres(inbox, outbox) => {
                inbox
                    .handle(key, None, |conn, lease| {
                        let (outbox, killer, invoice) =
                            (outbox.clone(), killer.clone(), invoice.clone());
                        Box::pin(async move {
                            checkpoint(&killer, "billing_claim_effect");
                            sqlx_pg::query(sqlx_pg::AssertSqlSafe(format!(
                                "INSERT INTO {} (order_id, fence) VALUES ($1, $2)",
                                invoice.table
                            )))
                            .bind(&invoice.order_id)
                            .bind(lease.fence as i64)
                            .execute(&mut *conn)
                            .await?;
                            let created = invoice.created(lease)?;
                            outbox.enqueue(conn, &[created]).await?;
                            checkpoint(&killer, "billing_effect_commit");
                            Ok::<_, BoxError>(Some(b"invoiced".to_vec()))
                        })
                    })
                    .await
            }
            Billing::MySql(inbox, outbox) => {
                inbox
                    .handle(key, None, |conn, lease| {
                        let (outbox, killer, invoice) =
                            (outbox.clone(), killer.clone(), invoice.clone());
                        Box::pin(async move {
                            checkpoint(&killer, "billing_claim_effect");
                            sqlx_my::query(sqlx_my::AssertSqlSafe(format!(
                                "INSERT INTO {} (order_id, fence) VALUES (?, ?)",
                                invoice.table
                            )))
                            .bind(&invoice.order_id)
                            .bind(lease.fence as i64)
                            .execute(&mut *conn)
                            .await?;
                            let created = invoice.created(lease)?;
                            outbox.enqueue(conn, &[created]).await?;
                            checkpoint(&killer, "billing_effect_commit");
                            Ok::<_, BoxError>(Some(b"invoiced".to_vec()))
                        })
                    })
                    .await
            }
        }
    }
}

impl Invoice {
    /// `InvoiceCreated` for this invoice, its id derived from the incoming key.
    fn created(&self, lease: &dedup_core::Lease) -> Result<OutboxMessage, BoxError> {
        let payload = serde_json::json!({"order_id": self.order_id})
            .to_string()
            .into_bytes();
        Ok(dedup_core::outbox::ConsumerOutbox::new(lease)
            .message(self.destination.clone(), payload)?
            .header("type", "InvoiceCreated")?)
    }
}
