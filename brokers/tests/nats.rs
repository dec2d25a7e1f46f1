//! The NATS JetStream adapter tests (the adapter is not written yet).
