//! Stores opened on someone else's data (a table of the store's name with another schema):
//! what the backends' hostile-input tests require of them.

use dedup_core::{ClaimOptions, DedupStore, Key, Result};

/// `opened` is what a store's constructor returned on a table (or key space) that holds
/// foreign data. Either the constructor refused it with a typed, non-retryable error, or
/// the store it returned fails `claim` and `get` with errors (never a panic, never a
/// claim that acquires over foreign data). The caller then checks the foreign data was
/// left alone.
pub async fn refused_or_failing<S: DedupStore>(opened: Result<S>) {
    let key = Key::new("hostile", "m1").expect("valid key");
    match opened {
        Err(e) => {
            println!("the constructor refused the foreign data: {e:?}");
            assert!(!e.is_retryable(), "foreign data is not transient: {e:?}");
        }
        Ok(store) => {
            let claim = store.claim(&key, &ClaimOptions::default()).await;
            assert!(
                claim.is_err(),
                "a claim on foreign data must fail: {claim:?}"
            );
            let get = store.get(&key).await;
            assert!(get.is_err(), "a get on foreign data must fail: {get:?}");
        }
    }
}
