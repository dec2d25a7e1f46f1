//! The partitioned layout's DDL: the table partitioned by `slot`, its partitions, the
//! claim function, and the check that a table's layout matches the configuration.

use dedup_core::{Error, Result};
use sqlx::PgConnection;

use super::Partitions;
use crate::config::PostgresConfig;
use crate::ddl::{index_name, render_table};
use crate::error::backend;
use crate::statements::{NOW_MS, first_claim};

/// The partitioned layout's migrations, in order, as [`crate::schema`]'s are for the
/// plain layout. Placeholders: those of [`render_table`], plus `{partitions}` (one
/// `CREATE TABLE ... PARTITION OF` per slot), `{claim_fn}` (the claim function's
/// qualified name), `{layout}` (the table comment recording the ring), `{now_ms}`,
/// `{first_claim}` (the first claim as the plain layout reads it: an insert leaves the
/// column NULL, a takeover fills it in) and `{returning}` (what the claim function
/// returns of a row it wrote).
///
/// The columns are the plain layout's at version 5, plus `slot`. The claim function
/// serves every claim statement: it locks each key (a transaction-scoped advisory lock),
/// looks the key up in every partition, then inserts into the current window's partition
/// or takes the record over where it is (moving it to the current partition).
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: the table, its partitions, the claim function and the purge runs' table.
    r#"CREATE TABLE {table} (
    slot             smallint NOT NULL, -- the partition: the window of the last write
    consumer         text    NOT NULL,
    message_id       text    NOT NULL,
    token            uuid,
    fence            bigint  NOT NULL,
    attempt          integer NOT NULL,
    expires_at       bigint,
    processed_at     bigint,
    outcome          bytea,
    fingerprint      text,
    claimed_at       bigint  NOT NULL,
    first_claimed_at bigint,
    last_failure     bytea,
    PRIMARY KEY (consumer, message_id, slot),
    CHECK (processed_at IS NOT NULL OR (token IS NOT NULL AND expires_at IS NOT NULL))
) PARTITION BY LIST (slot);
{partitions}COMMENT ON TABLE {table} IS '{layout}';
CREATE FUNCTION {claim_fn}(
    now_in bigint, window_ms bigint, slots integer, consumers text[], ids text[],
    tokens text[], leases bigint[], fingerprints text[], completed boolean, takeover boolean)
RETURNS TABLE (wrote boolean, now_ms bigint, consumer text, message_id text, token text,
    fence bigint, attempt integer, expires_at bigint, processed_at bigint, outcome bytea,
    fingerprint text, first_claimed_at bigint, last_failure bytea)
LANGUAGE plpgsql AS $claim$
DECLARE
    t bigint := coalesce(now_in, {now_ms});
    s smallint := ((t / window_ms) % slots)::smallint;
    n integer := coalesce(array_length(ids, 1), 0);
    inserted integer;
    found_slot smallint;
    r record;
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'a partitioned dedup table claims under READ COMMITTED or SERIALIZABLE, not REPEATABLE READ'
            USING ERRCODE = '0A000';
    END IF;
    -- The keys without a record in any partition are inserted after every key's lock, by
    -- one statement whose snapshot is taken after the locks: it sees every claim that held
    -- one before. One key, the common case, has statements of its own: PostgreSQL keeps
    -- their plans from call to call, index look-ups whatever the table's size, where it
    -- plans the statements over arrays anew at each call, over every partition.
    IF n = 1 THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(ids[1], hashtext(consumers[1])));
        RETURN QUERY INSERT INTO {table} AS x (slot, consumer, message_id, token, fence,
            attempt, claimed_at, expires_at, processed_at, fingerprint)
        SELECT s, consumers[1], ids[1], tokens[1]::uuid, 1, 1, t,
            CASE WHEN completed THEN NULL ELSE t + leases[1] END,
            CASE WHEN completed THEN t END, fingerprints[1]
         WHERE NOT EXISTS (SELECT 1 FROM {table} e
                            WHERE e.consumer = consumers[1] AND e.message_id = ids[1])
        RETURNING {returning};
    ELSE
        -- In the order given (callers sort the keys: batches never deadlock).
        PERFORM pg_advisory_xact_lock(hashtextextended(q.id, hashtext(q.c)))
          FROM unnest(consumers, ids) WITH ORDINALITY AS q(c, id, i) ORDER BY q.i;
        RETURN QUERY INSERT INTO {table} AS x (slot, consumer, message_id, token, fence,
            attempt, claimed_at, expires_at, processed_at, fingerprint)
        SELECT s, q.c, q.id, tokens[q.i]::uuid, 1, 1, t,
            CASE WHEN completed THEN NULL ELSE t + leases[q.i] END,
            CASE WHEN completed THEN t END, fingerprints[q.i]
          FROM unnest(consumers, ids) WITH ORDINALITY AS q(c, id, i)
         WHERE NOT EXISTS (SELECT 1 FROM {table} e WHERE e.consumer = q.c AND e.message_id = q.id)
         ORDER BY q.i
        RETURNING {returning};
    END IF;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    IF inserted = n OR NOT takeover THEN
        RETURN;
    END IF;
    -- The keys with a record: taken over one at a time, where the contract says so.
    FOR i IN 1 .. n LOOP
        LOOP
            SELECT x.slot, x.token, x.processed_at, x.expires_at, x.fingerprint INTO r
              FROM {table} x WHERE x.consumer = consumers[i] AND x.message_id = ids[i] LIMIT 1;
            IF NOT FOUND THEN
                -- Gone since the insert's snapshot (a purge, a forget): insert it now.
                RETURN QUERY INSERT INTO {table} AS x (slot, consumer, message_id, token, fence,
                    attempt, claimed_at, expires_at, processed_at, fingerprint)
                VALUES (s, consumers[i], ids[i], tokens[i]::uuid, 1, 1, t,
                    CASE WHEN completed THEN NULL ELSE t + leases[i] END,
                    CASE WHEN completed THEN t END, fingerprints[i])
                RETURNING {returning};
                EXIT;
            END IF;
            IF r.token IS NOT DISTINCT FROM tokens[i]::uuid AND tokens[i] IS NOT NULL THEN
                EXIT; -- the insert above wrote it
            END IF;
            IF r.processed_at IS NOT NULL OR r.expires_at > t
               OR (fingerprints[i] IS NOT NULL AND r.fingerprint IS NOT NULL
                   AND r.fingerprint <> fingerprints[i]) THEN
                EXIT; -- not written: the store reads the record
            END IF;
            found_slot := r.slot;
            BEGIN
                RETURN QUERY UPDATE {table} AS x SET slot = s, token = tokens[i]::uuid,
                    fence = x.fence + 1, attempt = x.attempt + 1, claimed_at = t,
                    first_claimed_at = {first_claim},
                    expires_at = CASE WHEN completed THEN NULL ELSE t + leases[i] END,
                    processed_at = CASE WHEN completed THEN t END,
                    outcome = CASE WHEN completed THEN NULL ELSE x.outcome END,
                    fingerprint = coalesce(fingerprints[i], x.fingerprint)
                  WHERE x.consumer = consumers[i] AND x.message_id = ids[i] AND x.slot = found_slot
                    AND x.processed_at IS NULL AND x.expires_at <= t
                  RETURNING {returning};
                EXIT WHEN FOUND;
            EXCEPTION WHEN serialization_failure THEN
                -- Moved to another partition by a concurrent write (READ COMMITTED
                -- reports it so): look again. Under SERIALIZABLE it is a real conflict.
                IF current_setting('transaction_isolation') <> 'read committed' THEN
                    RAISE;
                END IF;
            END;
            -- The record changed or moved since the look-up (a commit, a purge): look again.
        END LOOP;
    END LOOP;
END
$claim$;
CREATE TABLE IF NOT EXISTS "{schema}".dedup_purge_runs (
    table_name    text    PRIMARY KEY,  -- a records table in this schema
    finished_at   bigint  NOT NULL,     -- ms since the Unix epoch, by the store's clock
    removed       bigint  NOT NULL,
    took_ms       bigint  NOT NULL,
    stopped_early boolean NOT NULL
);
DELETE FROM "{schema}".dedup_purge_runs WHERE table_name = '{table_name}';
"#,
];

/// The bare name of partition `slot` of `table`.
pub(crate) fn partition_name(table: &str, slot: u16) -> String {
    index_name(table, &format!("p{slot}"))
}

/// The quoted, qualified name of partition `slot`.
pub(crate) fn qualified_partition(config: &PostgresConfig, slot: u16) -> String {
    format!(
        "\"{}\".\"{}\"",
        config.schema,
        partition_name(&config.table, slot)
    )
}

/// The quoted, qualified name of the table's claim function.
pub(crate) fn claim_function(config: &PostgresConfig) -> String {
    format!(
        "\"{}\".\"{}\"",
        config.schema,
        index_name(&config.table, "claim")
    )
}

/// The table comment that records a ring: read back by [`check_layout`], so processes
/// configured with another window or count refuse the table instead of filing rows in the
/// wrong partitions.
fn layout_comment(partitions: &Partitions) -> String {
    format!(
        "dedup partitions: window {} ms, count {}",
        partitions.window_ms(),
        partitions.count
    )
}

/// What the claim function returns of a row it wrote, in its `RETURNS TABLE` order.
const RETURNING: &str = "true, t, x.consumer, x.message_id, x.token::text, x.fence, \
    x.attempt, x.expires_at, x.processed_at, x.outcome, x.fingerprint, {first_claim}, \
    x.last_failure";

/// `migration` for `config`'s table and `partitions`, every placeholder filled in.
pub(crate) fn render(migration: &str, config: &PostgresConfig, partitions: &Partitions) -> String {
    let table = config.qualified_table();
    let ddl: String = (0..partitions.count)
        .map(|slot| {
            format!(
                "CREATE TABLE {} PARTITION OF {table} FOR VALUES IN ({slot});\n",
                qualified_partition(config, slot)
            )
        })
        .collect();
    let migration = migration
        .replace("{partitions}", &ddl)
        .replace("{claim_fn}", &claim_function(config))
        .replace("{returning}", RETURNING)
        .replace("{first_claim}", &first_claim("x."))
        .replace("{layout}", &layout_comment(partitions))
        .replace("{now_ms}", &NOW_MS.replace("$1::bigint", "NULL::bigint"));
    render_table(&migration, &config.schema, &config.table)
}

/// Refuse a table whose layout is not the configured one: a plain table under a
/// partitioned configuration, a partitioned one under a plain configuration, or a ring
/// of another window or count. A missing table passes (migrating creates it).
pub(crate) async fn check_layout(conn: &mut PgConnection, config: &PostgresConfig) -> Result<()> {
    let found: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT c.relkind::text, obj_description(c.oid, 'pg_class') FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(&config.schema)
    .bind(&config.table)
    .fetch_optional(&mut *conn)
    .await
    .map_err(backend)?;
    let Some((kind, comment)) = found else {
        return Ok(());
    };
    let table = config.qualified_table();
    match (&config.partitions, kind.as_str()) {
        (None, "p") => Err(Error::invalid(
            "partitions",
            format!(
                "{table} is partitioned ({}); configure the same `partitions` to open it",
                comment.unwrap_or_default()
            ),
        )),
        (Some(_), "r") => Err(Error::invalid(
            "partitions",
            format!(
                "{table} exists with the plain layout; the partitioned layout needs a new table \
                 (configure another table name, or no `partitions`)"
            ),
        )),
        (Some(p), "p") if comment.as_deref() != Some(layout_comment(p).as_str()) => {
            Err(Error::invalid(
                "partitions",
                format!(
                    "{table} was created as \"{}\", the configuration says \"{}\"; a ring's \
                     window and count cannot change",
                    comment.unwrap_or_default(),
                    layout_comment(p)
                ),
            ))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_migration_renders_every_placeholder() {
        let partitions = Partitions {
            window: Duration::from_secs(3600),
            count: 4,
        };
        let config = PostgresConfig {
            partitions: Some(partitions),
            ..PostgresConfig::default()
        };
        let sql = render(MIGRATIONS[0], &config, &partitions);
        for placeholder in [
            "{table}",
            "{partitions}",
            "{claim_fn}",
            "{layout}",
            "{now_ms}",
            "{first_claim}",
            "{returning}",
            "{schema}",
        ] {
            assert!(!sql.contains(placeholder), "{placeholder} left in:\n{sql}");
        }
        assert_eq!(sql.matches("PARTITION OF").count(), 4, "{sql}");
        assert!(
            sql.contains("\"public\".\"dedup_inbox_p3\" PARTITION OF"),
            "{sql}"
        );
        assert!(
            sql.contains("'dedup partitions: window 3600000 ms, count 4'"),
            "{sql}"
        );
    }
}
