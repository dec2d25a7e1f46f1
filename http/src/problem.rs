//! The layer's own answers, as `application/problem+json` (RFC 9457) documents.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

/// The problems the layer answers with. The `type` URI is the configured prefix followed
/// by [`Problem::slug`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// `400`: a guarded request without the key header, while keys are required.
    KeyMissing,
    /// `400`: the key header is repeated, empty, too long or malformed.
    KeyInvalid,
    /// `413`: the request body is larger than the configured limit. Nothing was claimed.
    BodyTooLarge,
    /// `400`: the request body could not be read (the client's stream failed).
    BodyUnreadable,
    /// `409`: the first request with this key is still being processed. Sent with
    /// `Retry-After`.
    InFlight,
    /// `422`: the key was used before with another payload (method, path, query or body).
    KeyReused,
    /// The key's request was processed, but its response body was larger than the storage
    /// limit, so only its status and headers were kept. Sent with the original status.
    ResponseNotStored,
    /// `500`: the stored outcome is not a response this crate can read (another program
    /// wrote under the same key, or a newer encoding).
    StoredResponseUnreadable,
    /// `500`: the inner service's response body failed while it was read. The key was
    /// released.
    ResponseBodyFailed,
    /// `503`: the dedup store failed, or the lease was lost before a response existed.
    /// Sent with `Retry-After`.
    StoreUnavailable,
}

impl Problem {
    /// The last part of the problem's `type` URI.
    pub fn slug(self) -> &'static str {
        match self {
            Problem::KeyMissing => "idempotency-key-missing",
            Problem::KeyInvalid => "idempotency-key-invalid",
            Problem::BodyTooLarge => "request-body-too-large",
            Problem::BodyUnreadable => "request-body-unreadable",
            Problem::InFlight => "idempotency-key-in-flight",
            Problem::KeyReused => "idempotency-key-reused",
            Problem::ResponseNotStored => "response-not-stored",
            Problem::StoredResponseUnreadable => "stored-response-unreadable",
            Problem::ResponseBodyFailed => "response-body-failed",
            Problem::StoreUnavailable => "idempotency-store-unavailable",
        }
    }

    /// The status it is answered with (the original status for
    /// [`ResponseNotStored`](Problem::ResponseNotStored), given separately).
    pub fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing | Problem::KeyInvalid | Problem::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::InFlight => StatusCode::CONFLICT,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::ResponseNotStored => StatusCode::OK,
            Problem::StoredResponseUnreadable | Problem::ResponseBodyFailed => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency-Key is missing",
            Problem::KeyInvalid => "Idempotency-Key is invalid",
            Problem::BodyTooLarge => "Request body too large",
            Problem::BodyUnreadable => "Request body could not be read",
            Problem::InFlight => "A request with this Idempotency-Key is being processed",
            Problem::KeyReused => "Idempotency-Key reused with another payload",
            Problem::ResponseNotStored => "Processed; the response was too large to replay",
            Problem::StoredResponseUnreadable => "Stored response unreadable",
            Problem::ResponseBodyFailed => "Response body failed",
            Problem::StoreUnavailable => "Idempotency store unavailable",
        }
    }

    /// The problem document as a response with `status`.
    pub(crate) fn response(
        self,
        type_prefix: &str,
        status: StatusCode,
        detail: &str,
    ) -> Response<Bytes> {
        let body = serde_json::json!({
            "type": format!("{type_prefix}{}", self.slug()),
            "title": self.title(),
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = Response::new(Bytes::from(body.to_string()));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_document_has_its_type_title_status_and_detail() {
        let response =
            Problem::KeyReused.response("urn:x:", StatusCode::UNPROCESSABLE_ENTITY, "why");
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({
                "type": "urn:x:idempotency-key-reused",
                "title": "Idempotency-Key reused with another payload",
                "status": 422,
                "detail": "why",
            })
        );
    }
}
