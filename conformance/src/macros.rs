//! `suite!` and `transactional_suite!`: one `#[tokio::test]` per clause.

/// Expands to one `#[tokio::test]` per lease-mode clause (and the model-based test), each
/// calling the clause with the factory expression. The calling crate needs `tokio` (with the
/// `macros` and `rt-multi-thread` features) as a dev-dependency.
///
/// ```ignore
/// dedup_conformance::suite!(MyFactory::new());
/// ```
#[macro_export]
macro_rules! suite {
    ($factory:expr) => {
        $crate::__clauses!($factory;
            // claim
            first_claim_acquires,
            live_lease_gives_in_flight,
            expired_lease_is_taken_over,
        );
    };
}

/// Expands to one `#[tokio::test]` per transactional clause, for factories implementing
/// [`TransactionalFactory`](crate::TransactionalFactory).
#[macro_export]
macro_rules! transactional_suite {
    ($factory:expr) => {
        $crate::__clauses!($factory;
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __clauses {
    ($factory:expr; $($clause:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $clause() {
                let factory = $factory;
                if $crate::should_run(&factory, stringify!($clause)) {
                    $crate::clauses::$clause(&factory).await;
                }
            }
        )*
    };
}
