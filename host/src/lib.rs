//! # suffuse-host
//!
//! Everything around the sans-IO core that touches the world: Hugging Face
//! checkpoints, the plan, the dealer's key files, the party runtime, the
//! client, TCP networking, reports and the `suffuse` CLI.
//!
//! | module | what it does |
//! | --- | --- |
//! | [`model`], [`float`] | checkpoints, tokenizer, the f32 model |
//! | [`fixed`], [`plan`] | fixed-point conventions; the plan with proven widths |
//! | [`exec`], [`reference`](mod@reference) | local operations; the cleartext fixed-point reference |
//! | [`proto`] | every interactive step: key layout, dealer side, party side |
//! | [`keyfile`], [`dealer`], [`ledger`], [`private`] | key files, the dealer that streams them, the spent-key ledger; who may use secret files and folders |
//! | [`party`], [`server`], [`client`], [`net`] | the online phase over TCP |
//! | [`pool`], [`service`] | key pools; the long-running server that serves many queries from one |
//! | [`generate`] | private text generation: prompts, sampling, the KV-cache passes |
//! | [`session`], [`report`] | a whole run in one process; the report |
//! | [`gateway`] | the OpenAI-compatible HTTP API on the client's side |
//! | [`metrics`] | a long-running server's Prometheus metrics |
//! | [`backend`] | `--backend`: the one place a concrete accelerator is named |

#![deny(unsafe_code)]

pub mod backend;
pub mod client;
pub mod dealer;
pub mod exec;
pub mod fixed;
pub mod float;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod generate;
pub mod keyfile;
pub mod lanes;
pub mod ledger;
pub mod logline;
pub mod metrics;
pub mod model;
pub mod net;
pub mod party;
pub mod plan;
pub mod pool;
pub mod private;
pub mod proto;
pub mod reference;
pub mod report;
pub mod server;
pub mod service;
pub mod session;
pub mod wipe;
