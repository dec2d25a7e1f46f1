//! The scenario programs, run as users run them, with their printed numbers checked.

use dedup_lab::programs as support;

use support::{json_lines, run_example};

fn row<'a>(rows: &'a [serde_json::Value], field: &str, value: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r[field] == value)
        .unwrap_or_else(|| panic!("no row with {field} = {value}"))
}

#[test]
fn billing_naive_charges_twice_dedup_once_and_the_natural_key_catches_a_new_message_id() {
    let out = run_example("billing", &[]);
    let rows = json_lines(&out);
    let pair = |variant: &str| {
        let r = row(&rows, "variant", variant);
        (
            r["charges"].as_u64().unwrap(),
            r["invoices"].as_i64().unwrap(),
        )
    };
    assert_eq!(pair("naive check-then-act"), (2, 2), "{out}");
    assert_eq!(pair("dedup, lease mode (Inbox)"), (1, 1), "{out}");
    assert_eq!(
        pair("dedup, claim in the invoice transaction"),
        (1, 1),
        "{out}"
    );
    assert_eq!(
        pair("two message ids, message-id dedup only"),
        (2, 2),
        "{out}"
    );
    assert_eq!(
        pair("two message ids, + natural key (order id)"),
        (1, 1),
        "{out}"
    );
}

#[test]
fn parcel_each_consumer_does_its_work_once_and_the_carrier_is_called_once() {
    let out = run_example("parcel", &[]);
    let rows = json_lines(&out);
    let notification = row(&rows, "consumer", "notification");
    assert_eq!(notification["side_effects"], 1, "{out}");
    assert_eq!(notification["processed"], 1, "{out}");
    assert_eq!(notification["duplicates"], 1, "{out}");
    let carrier = row(&rows, "consumer", "carrier-booking");
    assert_eq!(carrier["deliveries"], 3, "{out}");
    assert_eq!(
        carrier["side_effects"], 1,
        "the carrier call happens once:\n{out}"
    );
    assert_eq!(carrier["duplicates"], 2, "{out}");
}

#[test]
fn cleanup_purges_exactly_the_records_past_retention_in_batches() {
    let out = run_example("cleanup", &[]);
    let r = &json_lines(&out)[0];
    assert_eq!(r["purged_completed"], 250, "{out}");
    assert_eq!(r["purged_expired"], 5, "{out}");
    assert_eq!(r["old_left"], 0, "{out}");
    assert_eq!(r["recent_kept"], 100, "{out}");
    assert_eq!(r["live_kept"], true, "{out}");
    // Paced: small batches first (at most 64, then growing to at most 100), so at least 3.
    assert_eq!(r["paced"], true, "{out}");
    assert!(r["batches"].as_u64().unwrap() >= 3, "{out}");
}

#[test]
fn cleanup_unpaced_runs_full_batches() {
    let out = run_example("cleanup", &["--unpaced"]);
    let r = &json_lines(&out)[0];
    assert_eq!(r["purged_completed"], 250, "{out}");
    assert_eq!(r["purged_expired"], 5, "{out}");
    assert_eq!(r["paced"], false, "{out}");
    // 255 records in batches of 100: 100, 100, 55.
    assert_eq!(r["batches"], 3, "{out}");
}

#[test]
fn cleanup_gives_the_same_numbers_on_postgres() {
    let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
        eprintln!("SKIPPED: DEDUP_POSTGRES_URL not set");
        return;
    };
    let out = run_example("cleanup", &["--store", &url]);
    let r = &json_lines(&out)[0];
    assert_eq!(
        (r["purged_completed"].as_u64(), r["purged_expired"].as_u64()),
        (Some(250), Some(5)),
        "{out}"
    );
    assert_eq!(
        (r["old_left"].as_u64(), r["recent_kept"].as_u64()),
        (Some(0), Some(100)),
        "{out}"
    );
}
