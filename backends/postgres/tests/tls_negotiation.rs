//! What connecting makes of the errors sqlx reports while negotiating TLS (the `SSLRequest`
//! that opens a TLS connection), each produced for real by the driver: the plain test server
//! refusing TLS, and local listeners standing for a server that drops the connection before
//! answering (a restart, a proxy cutting it) and for a port that is not PostgreSQL.
//!
//! `error.rs` recognises the dropped connection by the text of sqlx's protocol error
//! (`unexpected response from SSLRequest: 0x00`, the byte it never read): these tests pin
//! that the text is still what sqlx produces and that it is classified as intended.
//! Needs the `tls` feature: without it sqlx never sends an `SSLRequest`.
#![cfg(feature = "tls")]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use dedup_core::Error;
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings, sqlx};

/// The `sqlx::Error` a failed connect kept as its source.
fn driver_error(error: &Error) -> &sqlx::Error {
    std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .unwrap_or_else(|| panic!("no sqlx error as source: {error:?}"))
}

/// Connect to `url`, which must fail within a few seconds.
async fn connect_error(url: &str) -> Error {
    let config = PostgresConfig {
        sql: SqlSettings {
            connect_timeout: Duration::from_secs(5),
            ..Default::default()
        },
        ..PostgresConfig::default()
    };
    PostgresStore::connect_with(url, config)
        .await
        .expect_err("the connection must fail")
}

/// A local listener that takes one connection, reads the client's 8-byte `SSLRequest`,
/// writes `answer` and closes the connection; its URL asks for TLS.
fn one_shot_listener(answer: &'static [u8]) -> (String, std::thread::JoinHandle<[u8; 8]>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let server = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().expect("accept");
        let mut request = [0u8; 8];
        socket
            .read_exact(&mut request)
            .expect("read the SSLRequest");
        socket.write_all(answer).expect("answer");
        // Dropping the socket after reading everything sent: an orderly close (FIN).
        request
    });
    let url = format!("postgres://dedup@127.0.0.1:{port}/dedup?sslmode=require");
    (url, server)
}

/// The SSLRequest message: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

#[tokio::test]
async fn a_connection_closed_before_the_tls_answer_is_retryable() {
    let (url, server) = one_shot_listener(b"");
    let error = connect_error(&url).await;
    assert_eq!(server.join().expect("listener"), SSL_REQUEST);
    match driver_error(&error) {
        // sqlx appends where it raised the error: `... 0x00 (sqlx_postgres::connection::tls:95)`.
        sqlx::Error::Protocol(message) => assert!(
            message.starts_with("unexpected response from SSLRequest: 0x00 "),
            "sqlx's text changed ({message}): update error::cut_during_tls_negotiation"
        ),
        other => panic!("expected sqlx's protocol error, got {other:?}"),
    }
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(error.operation(), Some("connecting"), "{error:?}");
    let hint = error.hint().expect("a hint");
    assert!(hint.contains("before answering the TLS request"), "{hint}");
}

#[tokio::test]
async fn a_port_answering_the_tls_request_unlike_postgresql_is_permanent() {
    // What an HTTP server would start its answer with.
    let (url, server) = one_shot_listener(b"H");
    let error = connect_error(&url).await;
    assert_eq!(server.join().expect("listener"), SSL_REQUEST);
    match driver_error(&error) {
        sqlx::Error::Protocol(message) => {
            assert!(
                message.starts_with("unexpected response from SSLRequest: 0x48 "),
                "{message}"
            )
        }
        other => panic!("expected sqlx's protocol error, got {other:?}"),
    }
    assert!(!error.is_retryable(), "{error:?}");
    let hint = error.hint().expect("a hint");
    assert!(hint.contains("is it a PostgreSQL port?"), "{hint}");
}

#[tokio::test]
async fn requiring_tls_from_the_plain_server_is_a_permanent_tls_error() {
    let url = url_or_skip!();
    let separator = if url.contains('?') { '&' } else { '?' };
    let error = connect_error(&format!("{url}{separator}sslmode=require")).await;
    match driver_error(&error) {
        sqlx::Error::Tls(tls) => {
            assert!(tls.to_string().contains("does not support TLS"), "{tls}")
        }
        other => panic!("expected sqlx's TLS error, got {other:?}"),
    }
    assert!(!error.is_retryable(), "{error:?}");
    let hint = error.hint().expect("a hint");
    assert!(hint.contains("does not accept TLS connections"), "{hint}");
}
