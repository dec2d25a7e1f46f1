//! TLS against the TLS-only servers `scripts/services.sh` starts (certificates from a
//! throwaway CA): `sslmode=verify-full` and `rediss://` connect and keep the contract; a
//! client trusting another CA refuses the server and says why; a plain connection to a
//! TLS-only server is refused.

mod common;

use common::{UrlFactory, chain, server, smoke};
use dedup::OpenError;
use dedup::url::TlsFiles;

/// The TLS servers' URLs and the two CA files, or `None` (skipped; a failure under
/// `DEDUP_TEST_STRICT=1`).
struct Tls {
    url: String,
    ca: String,
    other_ca: String,
}

fn tls(var: &str, test: &str) -> Option<Tls> {
    Some(Tls {
        url: server(var, test)?,
        ca: server("DEDUP_TLS_CA", test)?,
        other_ca: server("DEDUP_TLS_OTHER_CA", test)?,
    })
}

async fn failure(url: &str) -> OpenError {
    match dedup::open(url).await {
        Ok(_) => panic!("{} opened", dedup::url::redact(url)),
        Err(e) => e,
    }
}

/// The error says the server's certificate was refused.
fn assert_certificate_refused(e: &OpenError) {
    let text = chain(e);
    let hint = e.store_error().and_then(|s| s.hint()).unwrap_or_default();
    assert!(hint.contains("TLS"), "the hint names TLS: {text}");
    assert!(
        text.contains("UnknownIssuer"),
        "the cause names the untrusted issuer: {text}"
    );
}

#[tokio::test]
async fn postgres_verify_full_connects_and_passes_the_smoke_clauses() {
    let Some(t) = tls("DEDUP_POSTGRES_TLS_URL", "postgres_verify_full") else {
        return;
    };
    smoke(&UrlFactory {
        base: format!("{}?sslmode=verify-full&sslrootcert={}", t.url, t.ca),
        param: "table",
    })
    .await;
}

#[tokio::test]
async fn postgres_config_ca_means_verify_full() {
    let Some(t) = tls("DEDUP_POSTGRES_TLS_URL", "postgres_config_ca") else {
        return;
    };
    use dedup::postgres::{PostgresConfig, PostgresStore, SqlSettings};
    let config = |ca: &str| PostgresConfig {
        sql: SqlSettings {
            table: format!("t_tls_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            tls: TlsFiles {
                ca: Some(ca.into()),
                ..TlsFiles::default()
            },
            ..Default::default()
        },
        ..PostgresConfig::default()
    };
    PostgresStore::connect_with(&t.url, config(&t.ca))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let e = PostgresStore::connect_with(&t.url, config(&t.other_ca))
        .await
        .expect_err("a CA in the config verifies the server");
    assert!(chain(&e).contains("UnknownIssuer"), "{}", chain(&e));
}

#[tokio::test]
async fn postgres_server_certificate_from_another_ca_is_refused() {
    let Some(t) = tls("DEDUP_POSTGRES_TLS_URL", "postgres_other_ca") else {
        return;
    };
    let e = failure(&format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        t.url, t.other_ca
    ))
    .await;
    assert_certificate_refused(&e);
}

#[tokio::test]
async fn postgres_plain_connection_to_the_tls_only_server_is_refused() {
    let Some(t) = tls("DEDUP_POSTGRES_TLS_URL", "postgres_plain_refused") else {
        return;
    };
    let e = failure(&format!("{}?sslmode=disable", t.url)).await;
    let text = chain(&e);
    assert!(
        text.contains("no encryption"),
        "the server's refusal is kept: {text}"
    );
    let hint = e.store_error().and_then(|s| s.hint()).unwrap_or_default();
    assert!(hint.contains("accepts only TLS"), "{text}");
}

#[tokio::test]
async fn rediss_connects_and_passes_the_smoke_clauses() {
    let Some(t) = tls("DEDUP_REDIS_TLS_URL", "rediss") else {
        return;
    };
    assert!(t.url.starts_with("rediss://"), "{}", t.url);
    smoke(&UrlFactory {
        base: format!("{}?tls_ca={}", t.url, t.ca),
        param: "prefix",
    })
    .await;
}

#[tokio::test]
async fn redis_config_ca_is_used() {
    let Some(t) = tls("DEDUP_REDIS_TLS_URL", "redis_config_ca") else {
        return;
    };
    use dedup::redis::{RedisConfig, RedisStore};
    let config = |ca: &str| RedisConfig {
        prefix: "tls-config:".into(),
        tls: TlsFiles {
            ca: Some(ca.into()),
            ..TlsFiles::default()
        },
        ..RedisConfig::default()
    };
    RedisStore::connect_with(&t.url, config(&t.ca))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let e = RedisStore::connect_with(&t.url, config(&t.other_ca))
        .await
        .expect_err("the configured CA is the only root");
    assert!(chain(&e).contains("UnknownIssuer"), "{}", chain(&e));
}

#[tokio::test]
async fn redis_server_certificate_from_another_ca_is_refused() {
    let Some(t) = tls("DEDUP_REDIS_TLS_URL", "redis_other_ca") else {
        return;
    };
    let e = failure(&format!("{}?tls_ca={}", t.url, t.other_ca)).await;
    assert_certificate_refused(&e);
}

#[tokio::test]
async fn redis_plain_connection_to_the_tls_server_is_refused() {
    let Some(t) = tls("DEDUP_REDIS_TLS_URL", "redis_plain_refused") else {
        return;
    };
    let plain = t.url.replacen("rediss://", "redis://", 1);
    let e = failure(&plain).await;
    let text = chain(&e);
    let hint = e.store_error().and_then(|s| s.hint()).unwrap_or_default();
    assert!(hint.contains("use rediss://"), "{text}");
}

/// The TLS Redis takes an optional client certificate but refuses one from another CA: a
/// handshake that fails only with `other-client.crt` proves the configured one is sent.
#[tokio::test]
async fn redis_client_certificate_is_sent() {
    let Some(t) = tls("DEDUP_REDIS_TLS_URL", "redis_client_certificate") else {
        return;
    };
    let dir = std::path::Path::new(&t.ca)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let with = |client: &str| {
        format!(
            "{}?tls_ca={}&tls_cert={dir}/{client}.crt&tls_key={dir}/{client}.key&prefix=tls-client:",
            t.url, t.ca
        )
    };
    dedup::open(&with("client"))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let e = failure(&with("other-client")).await;
    let hint = e.store_error().and_then(|s| s.hint()).unwrap_or_default();
    assert!(hint.contains("tls_cert"), "{}", chain(&e));
    assert!(
        chain(&e).contains("UnknownCA"),
        "the server's alert is kept: {}",
        chain(&e)
    );
}
