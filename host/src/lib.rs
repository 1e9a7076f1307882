//! # suffuse-host
//!
//! Everything around the sans-IO core that touches the world: Hugging Face
//! checkpoints, the plan, the dealer's key files, the party runtime, the
//! client, TCP networking, reports and the `suffuse` CLI.

#![forbid(unsafe_code)]

pub mod float;
pub mod model;
pub mod net;
