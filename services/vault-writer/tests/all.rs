//! The vault services against a real NATS JetStream and a real folder.

mod reader;
mod writer;
