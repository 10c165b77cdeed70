//! Networking of a multi-process job: the versioned, length-limited framing and the challenge-response
//! handshake ([`wire`]), the messages between coordinator and workers ([`proto`]), and per-worker
//! aggregation of acknowledgements ([`acks`]).
//!
//! It does not decide anything about checkpoints: the cluster runtime feeds what arrives here into the
//! same pure coordinator the embedded runtime uses.

pub(crate) mod acks;
pub(crate) mod data;
pub(crate) mod proto;
pub(crate) mod wire;
