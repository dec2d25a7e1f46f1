//! Helpers the CLI's tests share: HTTP to a running `dedup console`.
#![allow(dead_code)] // each test file uses a part

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One HTTP/1.1 request, written as is; the status code and the whole answer (headers
/// and body). Waits 20 s at most for the answer.
pub fn http(addr: &str, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    (text[9..12].parse().expect("a status"), text)
}

/// One HTTP/1.1 GET of `path`; as [`http`].
pub fn get(addr: &str, path: &str) -> (u16, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
}
