//! A registered store is opened by URL through `dedup`, like a built-in one.

mod common;

use dedup::admin::ListFilter;
use dedup::store::ClaimOptions;
use dedup::url::RegisterError;
use dedup::{Claim, Key};

/// Two opens of `example:billing` are two handles on one store: a message claimed and
/// committed through one is a duplicate through the other, and the operator's view sees
/// its record.
#[tokio::test]
async fn a_registered_store_is_opened_by_url() {
    common::register();
    let first = dedup::open("example:billing").await.unwrap();
    let second = dedup::open("example:billing").await.unwrap();
    let key = Key::new("billing", "order-42").unwrap();
    let options = ClaimOptions::default();

    let claim = first.claim(&key, &options).await.unwrap();
    let lease = claim.into_lease().expect("acquired");
    first.commit(&lease, Some(b"charged")).await.unwrap();
    let again = second.claim(&key, &options).await.unwrap();
    assert!(
        matches!(&again, Claim::Completed { outcome: Some(o), .. } if o == b"charged"),
        "{again:?}"
    );

    let admin = dedup::open_admin("example:billing").await.unwrap();
    let records = admin.list(&ListFilter::consumer("billing")).await.unwrap();
    assert_eq!(records.len(), 1);

    let url = dedup::StoreUrl::parse("example:billing").unwrap();
    assert_eq!(url.backend(), "example");
    assert_eq!(url.location(), "the in-process store billing");
    assert!(dedup::url::backends().any(|d| d.name == "example"));
}

/// The store's URL grammar is checked through `dedup` like a built-in one's.
#[tokio::test]
async fn a_bad_url_of_the_registered_store_is_refused() {
    common::register();
    let Err(problem) = dedup::open("example:billing?tabel=x").await else {
        panic!("the typo is refused");
    };
    assert!(
        matches!(
            problem.url_problem(),
            Some(dedup::UrlError::UnknownParameter {
                backend: "example",
                ..
            })
        ),
        "{problem:?}"
    );
}

/// A scheme already answered, by this store or a built-in backend, is refused with the
/// backend that answers it, and nothing is registered.
#[test]
fn a_taken_scheme_is_refused() {
    common::register();
    match dedup::register(&dedup_example_store::DESCRIPTOR) {
        Err(RegisterError::SchemeTaken {
            scheme: "example",
            by: "example",
        }) => {}
        other => panic!("{other:?}"),
    }
    static SQLITE_AGAIN: dedup::url::BackendDescriptor = dedup::url::BackendDescriptor {
        name: "another",
        schemes: &["another", "sqlite"],
        ..dedup_example_store::DESCRIPTOR
    };
    match dedup::register(&SQLITE_AGAIN) {
        Err(e @ RegisterError::SchemeTaken { by: "sqlite", .. }) => {
            assert!(
                e.to_string().contains("the sqlite backend answers it"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    // `another` was not registered either.
    assert!(dedup::StoreUrl::parse("another:x").is_err());

    static UPPER: dedup::url::BackendDescriptor = dedup::url::BackendDescriptor {
        name: "upper",
        schemes: &["Upper"],
        ..dedup_example_store::DESCRIPTOR
    };
    assert!(matches!(
        dedup::register(&UPPER),
        Err(RegisterError::InvalidScheme {
            backend: "upper",
            scheme: "Upper"
        })
    ));
}
