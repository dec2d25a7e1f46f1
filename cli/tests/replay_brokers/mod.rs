//! The replay scenario's brokers beyond Redis Streams and Kafka, one module each.

pub mod nats;
pub mod pubsub;
pub mod rabbitmq;
