//! The HTTP scenarios on every backend: a real axum server on a loopback port over SQLite,
//! PostgreSQL, Redis and Redis Cluster, driven by a real HTTP client. Server-backed runs
//! need `DEDUP_POSTGRES_URL` / `DEDUP_REDIS_URL` / `DEDUP_REDIS_CLUSTER_URLS` (skipped
//! without them, failing under `DEDUP_TEST_STRICT=1`).

mod common;

use common::Backend;

macro_rules! scenarios {
    ($backend:ident => $($scenario:ident),* $(,)?) => {
        #[allow(non_snake_case)]
        mod $backend {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let Some(store) = Backend::$backend.store(stringify!($scenario)).await else {
                        return;
                    };
                    common::scenarios::$scenario(store.store.clone()).await;
                }
            )*
        }
    };
}

macro_rules! every_backend {
    ($($backend:ident),*) => {$(
        scenarios!($backend =>
            one_post_with_a_key_creates_one_order,
            concurrent_retries_create_one_order,
            another_body_with_the_same_key_is_422,
            missing_key_is_400,
            server_error_releases_the_key,
            client_error_is_stored_and_replayed,
            keys_of_two_principals_do_not_collide,
            oversized_body_is_413_and_stores_nothing,
            long_handler_keeps_its_lease,
            client_hangup_releases_the_key,
        );
    )*};
}

every_backend!(Sqlite, Postgres, Redis, RedisCluster);
