//! The billing checks the same on every sqlx backend: the charge the handler makes after
//! its invoice insert, and what the two runs (the key passed, and not) must report. Each
//! backend's test file (`mysql.rs`, `postgres.rs`) includes it (`mod sql_billing;`) beside
//! its own store setup and SQL.

use dedup_core::{BoxError, Lease};
use dedup_testkit::{Effects, Failure, Report, Violation};

/// What a run of the kit answers (`None`: no server configured).
pub type Ran = Option<Result<Report, Box<Failure>>>;

/// After the handler's invoice insert (`inserted`: it wrote the row), charge once: with
/// the lease's idempotency key when `with_key`, else without (the bug the kit must catch).
pub async fn charge(
    fx: &Effects,
    lease: &Lease,
    inserted: bool,
    with_key: bool,
) -> Result<Option<Vec<u8>>, BoxError> {
    if inserted {
        if with_key {
            fx.call_with_key("charge", &lease.idempotency_key()).await?;
        } else {
            fx.call("charge").await?;
        }
    }
    Ok(Some(b"invoiced".to_vec()))
}

/// The run with the key passed finds nothing.
pub fn passes(ran: Ran, url_var: &str, server: &str) {
    let Some(ran) = ran else {
        eprintln!("SKIPPED: {url_var} is not set");
        return;
    };
    let report = ran.unwrap_or_else(|f| panic!("{f}"));
    eprintln!("billing, transactional mode, {server}: {report:?}");
}

/// The run without the key is caught charging twice, on one message and one worker.
pub fn repeated_charge_is_caught(ran: Ran, url_var: &str) {
    let Some(ran) = ran else {
        eprintln!("SKIPPED: {url_var} is not set");
        return;
    };
    let f = ran.expect_err("the repeated charge must be caught");
    assert!(f.reproduced, "{f}");
    assert_eq!(
        f.violations,
        vec![Violation::EffectRepeated {
            message: "m0".into(),
            effect: "charge".into(),
            times: 2,
            excused: 0,
        }],
        "{f}"
    );
    assert_eq!((f.schedule.messages, f.schedule.workers), (1, 1), "{f}");
    assert_eq!(f.schedule.kills() + f.schedule.failures(), 1, "{f}");
}
