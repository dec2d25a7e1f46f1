//! The stored outcome: a response in a small, versioned binary encoding.
//!
//! Version 1, all integers big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 3 | magic `DHR` |
//! | 1 | version, `1` |
//! | 1 | flags: bit 0 set = the body was too large to store and is absent |
//! | 2 | status code |
//! | 2 | header count `n` |
//! | `n` times | 2 name length, name (lowercase ASCII), 2 value length, value bytes |
//! | 4 | body length `m` (0 when bit 0 is set) |
//! | `m` | body, byte for byte |
//!
//! Nothing may follow the body. A decoder meeting another magic or a version it does not
//! know refuses the record ([`DecodeError`]) instead of guessing; a later version will keep
//! reading version 1.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 3] = b"DHR";
const VERSION: u8 = 1;
const BODY_OMITTED: u8 = 1;

/// A response as kept in the store and replayed to retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code.
    pub status: StatusCode,
    /// The headers chosen for storage (in the configured order; the values of one name in
    /// the order they were sent).
    pub headers: HeaderMap,
    /// The body, byte for byte; `None` when it was larger than the storage limit.
    pub body: Option<Bytes>,
}

/// Why a stored outcome could not be read back as a response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes do not start with this encoding's magic: not written by this crate.
    #[error("not a stored response (unknown magic)")]
    Magic,
    /// Written by a version of this encoding this build does not know.
    #[error("stored response version {0} is not supported (this build reads version 1)")]
    Version(u8),
    /// The bytes end early, run on past the body, or hold an invalid status or header.
    #[error("stored response is malformed: {0}")]
    Malformed(&'static str),
}

impl StoredResponse {
    /// The encoded bytes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let body = self.body.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(16 + body.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(if self.body.is_some() { 0 } else { BODY_OMITTED });
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        let headers: Vec<_> = self
            .headers
            .iter()
            .filter(|(n, v)| n.as_str().len() <= 0xffff && v.len() <= 0xffff)
            .take(0xffff)
            .collect();
        out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
        for (name, value) in headers {
            put_short(&mut out, name.as_str().as_bytes());
            put_short(&mut out, value.as_bytes());
        }
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    /// Read an encoded response back.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader(bytes);
        if r.take(3)? != MAGIC {
            return Err(DecodeError::Magic);
        }
        match r.take(1)?[0] {
            VERSION => {}
            v => return Err(DecodeError::Version(v)),
        }
        let flags = r.take(1)?[0];
        let status =
            StatusCode::from_u16(r.u16()?).map_err(|_| DecodeError::Malformed("status code"))?;
        let count = r.u16()?;
        let mut headers = HeaderMap::with_capacity(count.into());
        for _ in 0..count {
            let name = r.short()?;
            let value = r.short()?;
            headers.append(
                HeaderName::from_bytes(name).map_err(|_| DecodeError::Malformed("header name"))?,
                HeaderValue::from_bytes(value)
                    .map_err(|_| DecodeError::Malformed("header value"))?,
            );
        }
        let len = u32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes")) as usize;
        let body = Bytes::copy_from_slice(r.take(len)?);
        if !r.0.is_empty() {
            return Err(DecodeError::Malformed("bytes after the body"));
        }
        let body = match flags {
            0 => Some(body),
            BODY_OMITTED if body.is_empty() => None,
            _ => return Err(DecodeError::Malformed("flags")),
        };
        Ok(StoredResponse {
            status,
            headers,
            body,
        })
    }
}

fn put_short(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Malformed("ends early"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn short(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u16()?;
        self.take(len.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(body: Option<&'static [u8]>) -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("set-thing", HeaderValue::from_static("a"));
        headers.append("set-thing", HeaderValue::from_static("b"));
        StoredResponse {
            status: StatusCode::CREATED,
            headers,
            body: body.map(Bytes::from_static),
        }
    }

    #[test]
    fn responses_round_trip_byte_for_byte() {
        for body in [Some(&b"{\"id\":1}\0\xff"[..]), Some(&b""[..]), None] {
            let r = sample(body);
            assert_eq!(StoredResponse::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn version_1_layout_is_stable() {
        let r = StoredResponse {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Some(Bytes::from_static(b"hi")),
        };
        assert_eq!(r.encode(), b"DHR\x01\x00\x00\xc8\x00\x00\x00\x00\x00\x02hi");
    }

    #[test]
    fn foreign_or_damaged_bytes_are_refused() {
        let good = sample(Some(b"body")).encode();
        assert_eq!(StoredResponse::decode(b"XYZ\x01"), Err(DecodeError::Magic));
        let mut v2 = good.clone();
        v2[3] = 2;
        assert_eq!(StoredResponse::decode(&v2), Err(DecodeError::Version(2)));
        for cut in 0..good.len() {
            assert!(
                StoredResponse::decode(&good[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(StoredResponse::decode(&long).is_err());
    }

    #[test]
    fn a_body_flagged_absent_must_be_empty() {
        let mut flagged = sample(Some(b"body")).encode();
        flagged[4] = BODY_OMITTED;
        assert_eq!(
            StoredResponse::decode(&flagged),
            Err(DecodeError::Malformed("flags"))
        );
    }

    #[test]
    fn a_header_value_too_long_for_its_length_field_is_left_out() {
        let mut r = sample(Some(b"body"));
        let long = HeaderValue::from_bytes(&vec![b'v'; 0x10000]).unwrap();
        r.headers.insert("x-long", long);
        let decoded = StoredResponse::decode(&r.encode()).unwrap();
        r.headers.remove("x-long");
        assert_eq!(decoded, r);
    }
}
