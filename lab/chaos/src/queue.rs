//! An at-least-once queue in a PostgreSQL table: a received message becomes visible again
//! after the visibility timeout unless it is acknowledged, and goes to any worker then.

use std::time::Duration;

use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The queue table `name` in the database of `pool`.
#[derive(Clone, Debug)]
pub struct Queue {
    pool: PgPool,
    table: String,
    visibility: Duration,
}

/// Counts over the queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages in the queue.
    pub messages: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Deliveries made (receives), redeliveries included.
    pub deliveries: u64,
}

impl QueueStats {
    /// Whether every message was acknowledged.
    pub fn acked_all(&self) -> bool {
        self.acked == self.messages
    }
}

impl Queue {
    /// The queue `table` (an identifier the caller controls) on `pool`; a received message
    /// is hidden for `visibility`.
    pub fn new(pool: PgPool, table: &str, visibility: Duration) -> Self {
        Queue {
            pool,
            table: table.to_owned(),
            visibility,
        }
    }

    fn sql(&self, template: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(template.replace("{q}", &format!("\"{}\"", self.table)))
    }

    /// Create the table and enqueue messages `0..messages`.
    pub async fn create(&self, messages: u64) -> Result<(), BoxError> {
        sqlx::query(self.sql(
            "CREATE TABLE {q} (id bigint PRIMARY KEY, visible_at timestamptz NOT NULL \
             DEFAULT now(), deliveries int NOT NULL DEFAULT 0, acked boolean NOT NULL \
             DEFAULT false)",
        ))
        .execute(&self.pool)
        .await?;
        sqlx::query(self.sql("INSERT INTO {q} (id) SELECT generate_series(0, $1 - 1)"))
            .bind(messages as i64)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Receive one visible message (hiding it for the visibility timeout), if any.
    pub async fn receive(&self) -> Result<Option<u64>, sqlx::Error> {
        let id: Option<i64> = sqlx::query_scalar(self.sql(
            "UPDATE {q} SET visible_at = now() + make_interval(secs => $1), \
             deliveries = deliveries + 1 WHERE id = (SELECT id FROM {q} WHERE NOT acked \
             AND visible_at <= now() ORDER BY visible_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING id",
        ))
        .bind(self.visibility.as_secs_f64())
        .fetch_optional(&self.pool)
        .await?;
        Ok(id.map(|id| id as u64))
    }

    /// Acknowledge message `id`: it is never delivered again.
    pub async fn ack(&self, id: u64) -> Result<(), sqlx::Error> {
        sqlx::query(self.sql("UPDATE {q} SET acked = true WHERE id = $1"))
            .bind(id as i64)
            .execute(&self.pool)
            .await
            .map(|_| ())
    }

    /// Counts over the queue.
    pub async fn stats(&self) -> Result<QueueStats, sqlx::Error> {
        let (messages, acked, deliveries): (i64, i64, i64) = sqlx::query_as(self.sql(
            "SELECT count(*), count(*) FILTER (WHERE acked), coalesce(sum(deliveries), 0) \
             FROM {q}",
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(QueueStats {
            messages: messages as u64,
            acked: acked as u64,
            deliveries: deliveries as u64,
        })
    }
}
