//! Registration, once per test binary (a second registration is refused).

use std::sync::Once;

/// Registers the `example:` scheme with `dedup`, the first time it is called.
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        dedup::register(&dedup_example_store::DESCRIPTOR).expect("the example scheme is free");
    });
}
