//! [`capabilities`]: what every sqlx backend's store offers, the same on each server.

use dedup_core::Capabilities;

/// The capabilities of a sqlx backend's store: persistent, shared by processes, native
/// batches, claims in the caller's transaction, the first claim's time and failure causes
/// recorded; `server_clock` when no clock was injected (leases run on the server's clock).
pub fn capabilities(server_clock: bool) -> Capabilities {
    Capabilities {
        persistent: true,
        multi_process: true,
        native_batch: true,
        transactional: true,
        server_clock,
        first_claim_time: true,
        failure_causes: true,
        ..Capabilities::default()
    }
}
