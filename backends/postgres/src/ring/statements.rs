//! The partitioned layout's statements: the plain layout's ([`Statements::new`]), with
//! every claim calling the claim function and every update moving the row to the current
//! window's partition.

use super::Partitions;
use super::schema::claim_function;
use crate::config::PostgresConfig;
use crate::statements::{LAZY_COMMIT, NOW_MS, Statements, purgeable_at, sql};

/// The statements of `config`'s table, in its layout.
pub(crate) fn for_config(config: &PostgresConfig) -> Statements {
    let table = config.qualified_table();
    let mut s = Statements::new(&table);
    if let Some(partitions) = &config.partitions {
        partitioned(&mut s, config, partitions);
    }
    s
}

/// `text` with its first `SET ` also setting `slot` to `slot` (an SQL expression).
fn set_slot(text: &str, slot: &str) -> String {
    assert!(text.contains(" SET "), "no SET clause in {text}");
    text.replacen(" SET ", &format!(" SET slot = {slot}, "), 1)
}

/// `text` with `from` replaced, which must be there.
fn must_replace(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in {text}");
    text.replace(from, to)
}

fn partitioned(s: &mut Statements, config: &PostgresConfig, p: &Partitions) {
    let function = claim_function(config);
    let (window, count) = (p.window_ms(), p.count);
    // The claim function over arrays; one-key statements pass one-element arrays.
    let call = |keys: &str, completed: bool, takeover: bool| {
        format!("{function}($1::bigint, {window}, {count}, {keys}, {completed}, {takeover})")
    };
    let one = "ARRAY[$2::text], ARRAY[$3::text], ARRAY[$4::text], ARRAY[$5::bigint], \
               ARRAY[$6::text]";
    let many = "$2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[]";
    let lazy = |text: String| format!("{text} WHERE {LAZY_COMMIT}");

    let claim = format!("SELECT * FROM {}", call(one, false, true));
    let claim_fresh = format!("SELECT expires_at FROM {}", call(one, false, false));
    let claim_many = format!("SELECT * FROM {}", call(many, false, true));
    s.claim_lazy = sql(lazy(claim.clone()));
    s.claim_fresh_lazy = sql(lazy(claim_fresh.clone()));
    s.claim_many_lazy = sql(lazy(claim_many.clone()));
    s.claim = sql(claim);
    s.claim_fresh = sql(claim_fresh);
    s.claim_many = sql(claim_many);
    s.claim_in_tx = sql(format!(
        "SELECT * FROM {}",
        call(
            "ARRAY[$2::text], ARRAY[$3::text], ARRAY[NULL::text], ARRAY[0::bigint], \
             ARRAY[$4::text]",
            true,
            true
        )
    ));

    // What a purge would retire now: the purgeable rows of the partitions whose latest
    // window ended at or before the cutoff (see `retire::retirable`), the current one never.
    s.count_purgeable = sql(format!(
        "WITH now AS (SELECT {NOW_MS} AS ms), \
         ring AS (SELECT ms / {window} AS w, ms - $2::bigint AS cutoff FROM now) \
         SELECT count(*) FILTER (WHERE processed_at IS NOT NULL) AS completed, \
                count(*) FILTER (WHERE processed_at IS NULL) AS expired \
         FROM {table} CROSS JOIN ring \
         WHERE slot <> ring.w % {count} \
           AND (ring.w - (ring.w - slot) % {count} + 1) * {window} <= ring.cutoff \
           AND {purgeable}",
        table = config.qualified_table(),
        purgeable = purgeable_at("ring.cutoff")
    ));

    // Every update moves the row to the current window's partition (a no-op, and still a
    // HOT update, within the window).
    let now_slot = p.slot_of(NOW_MS);
    s.commit = sql(set_slot(s.commit.as_str(), &now_slot));
    s.commit_held = sql(set_slot(s.commit_held.as_str(), &now_slot));
    // A holder's commit first tries the partition its row is expected in (see
    // `PostgresStore::commit_one`): one probe instead of one per partition, and no lock
    // on the others (a retiring partition's truncate does not hold it back).
    s.commit_held_in = (0..count)
        .map(|slot| {
            sql(must_replace(
                s.commit_held.as_str(),
                "AND r.processed_at IS NULL",
                &format!("AND r.slot = {slot} AND r.processed_at IS NULL"),
            ))
        })
        .collect();
    s.renew = sql(set_slot(s.renew.as_str(), &now_slot));
    s.release = sql(set_slot(s.release.as_str(), &now_slot));
    s.release_failed = sql(set_slot(s.release_failed.as_str(), &now_slot));
    s.revoke = sql(set_slot(s.revoke.as_str(), &p.slot_of("now.ms")));
    // A row's ctid is only unique within its partition: the batch commit matches the
    // partition too.
    let commit_many = set_slot(s.commit_many.as_str(), &p.slot_of("(SELECT ms FROM now)"));
    let commit_many = must_replace(
        &commit_many,
        "SELECT t.ctid AS row_id FROM",
        "SELECT t.ctid AS row_id, t.tableoid AS part FROM",
    );
    let commit_many = must_replace(
        &commit_many,
        "held AS (SELECT x.row_id, q.req_outcome",
        "held AS (SELECT x.row_id, x.part, q.req_outcome",
    );
    let commit_many = must_replace(
        &commit_many,
        "WHERE r.ctid = h.row_id AND",
        "WHERE r.ctid = h.row_id AND r.tableoid = h.part AND",
    );
    // The batch commit's first round, limited to one partition as `commit_held_in`.
    s.commit_many_in = (0..count)
        .map(|slot| {
            let text = must_replace(
                &commit_many,
                "AND t.processed_at IS NULL",
                &format!("AND t.slot = {slot} AND t.processed_at IS NULL"),
            );
            sql(must_replace(
                &text,
                "r.tableoid = h.part AND",
                &format!("r.tableoid = h.part AND r.slot = {slot} AND"),
            ))
        })
        .collect();
    s.commit_many = sql(commit_many);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_write_names_the_current_partition() {
        let config = PostgresConfig {
            partitions: Some(Partitions {
                window: Duration::from_secs(60),
                count: 5,
            }),
            ..PostgresConfig::default()
        };
        let s = for_config(&config);
        for (name, text) in [
            ("commit", &s.commit),
            ("commit_held", &s.commit_held),
            ("commit_many", &s.commit_many),
            ("renew", &s.renew),
            ("release", &s.release),
            ("release_failed", &s.release_failed),
            ("revoke", &s.revoke),
        ] {
            assert!(
                text.as_str().contains("SET slot = ((("),
                "{name}: {}",
                text.as_str()
            );
            assert!(text.as_str().contains("/ 60000) % 5)"), "{name}");
        }
        for text in [&s.claim, &s.claim_fresh, &s.claim_many, &s.claim_in_tx] {
            assert!(
                text.as_str()
                    .contains("\"dedup_inbox_claim\"($1::bigint, 60000, 5,")
            );
        }
        assert!(s.claim_lazy.as_str().ends_with(LAZY_COMMIT));
        assert!(s.commit_many.as_str().contains("r.tableoid = h.part"));
        assert_eq!(s.commit_held_in.len(), 5);
        assert!(s.commit_held_in[3].as_str().contains("AND r.slot = 3 AND"));
        assert!(s.commit_held_in[3].as_str().contains("SET slot = ((("));
        assert_eq!(s.commit_many_in.len(), 5);
        assert!(s.commit_many_in[2].as_str().contains("AND t.slot = 2 AND"));
        assert!(s.commit_many_in[2].as_str().contains("AND r.slot = 2 AND"));
        let plain = for_config(&PostgresConfig::default());
        assert!(!plain.commit.as_str().contains("slot"));
        assert!(plain.commit_held_in.is_empty() && plain.commit_many_in.is_empty());
    }
}
