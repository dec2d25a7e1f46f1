//! Before its registration, the store's scheme is unknown; after, it is opened.

#[tokio::test]
async fn the_scheme_is_known_once_registered() {
    let Err(unknown) = dedup::open("example:billing").await else {
        panic!("opened before its registration");
    };
    assert!(
        matches!(
            unknown.url_problem(),
            Some(dedup::UrlError::UnknownScheme { .. })
        ),
        "{unknown:?}"
    );
    dedup::register(&dedup_example_store::DESCRIPTOR).unwrap();
    assert!(dedup::open("example:billing").await.is_ok());
    let Err(unknown) = dedup::open("nothing:").await else {
        panic!("no store answers nothing:");
    };
    assert!(
        unknown.to_string().contains("invalid store URL"),
        "{unknown}"
    );
    let known = format!("{:?}", unknown.url_problem());
    assert!(known.contains("example:NAME"), "{known}");
}
