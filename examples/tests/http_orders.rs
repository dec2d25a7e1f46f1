//! The `http_orders` server, run as a user runs it and spoken to over plain HTTP/1.1: a
//! retry with the same `Idempotency-Key` gets the first response back, byte for byte.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// The running server; killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_http_orders"))
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn http_orders");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the address line");
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server { child, addr }
    }

    /// One request on its own connection; the raw response (head and body).
    fn exchange(&self, method: &str, headers: &[&str], body: &str) -> (String, String) {
        let mut stream = TcpStream::connect(&self.addr).expect("connect");
        let mut request = format!(
            "{method} /orders HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        for h in headers {
            request.push_str(&format!("{h}\r\n"));
        }
        request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        stream.write_all(request.as_bytes()).expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("receive");
        let (head, body) = response.split_once("\r\n\r\n").expect("head and body");
        (head.to_ascii_lowercase(), body.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_retry_with_the_same_key_replays_the_first_response() {
    let server = Server::start();
    let key = [
        "Idempotency-Key: 5b3b8f0e-order-1",
        "Content-Type: application/json",
    ];
    let (head, first) = server.exchange("POST", &key, r#"{"item":"tea"}"#);
    assert!(head.starts_with("http/1.1 201"), "{head}");
    assert!(!head.contains("idempotency-replayed"), "{head}");
    assert!(head.contains("location: /orders/1"), "{head}");
    let (head, again) = server.exchange("POST", &key, r#"{"item":"tea"}"#);
    assert!(head.starts_with("http/1.1 201"), "{head}");
    assert!(head.contains("idempotency-replayed: true"), "{head}");
    assert_eq!(again, first, "the replay is the first body byte for byte");
    let (head, other) = server.exchange("POST", &key, r#"{"item":"coffee"}"#);
    assert!(head.starts_with("http/1.1 422"), "{head}\n{other}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    let (head, _) = server.exchange("POST", &[], r#"{"item":"tea"}"#);
    assert!(head.starts_with("http/1.1 400"), "{head}");
    let (_, list) = server.exchange("GET", &[], "");
    let orders: serde_json::Value = serde_json::from_str(&list).expect("JSON list");
    assert_eq!(
        orders.as_array().map(Vec::len),
        Some(1),
        "one order: {list}"
    );
}
