//! # suffuse-core
//!
//! The allocation-free, constant-time heart of suffuse, two-server secure
//! transformer inference with function secret sharing.
//!
//! * [`ring`]: Z_2^n words for a runtime width, views, fixed-point constants.
//! * [`prg`]: fixed-key AES as a correlation-robust hash, and a seeded PRG.
//! * [`fss`], [`dcf`], [`dpf`]: half-tree DCF/DPF keys, generated into and
//!   evaluated from caller buffers.
//! * [`batch`]: [`batch::BatchEval`], the accelerator boundary, and
//!   [`batch::Serial`], its reference implementation.
//! * [`wire`]: the versioned binary key format, parsed as zero-copy views.
//! * [`error`]: small `Copy` error enums.
//!
//! The crate is `no_std` without `alloc`: every output goes to a caller
//! buffer whose size is a `const fn` of the public shape. Secrets (seeds,
//! control bits, correction words, masks) never steer a branch or a memory
//! index; `SIDE-CHANNELS.md` states exactly what is claimed.

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(clippy::as_conversions)]
// Parallel fixed-capacity tables are indexed by one shared index throughout;
// iterator rewrites would hide the algebra they implement.
#![allow(clippy::needless_range_loop)]
// Tests index and cast freely; the audited-cast rule is for shipped code.
#![cfg_attr(test, allow(clippy::as_conversions))]

pub mod batch;
pub mod compile;
pub mod dcf;
pub mod dpf;
pub mod error;
pub mod fss;
pub mod gate;
pub mod mpc;
pub mod phi;
#[cfg(feature = "ct-planted")]
#[allow(clippy::as_conversions)]
mod planted;
pub mod prg;
#[allow(clippy::as_conversions)]
pub mod ring;
pub mod suf;
pub mod wire;

pub use error::{Error, SufError, WireError};

/// Whether this build carries the deliberate leaks of the test-only
/// `ct-planted` feature (`cargo xtask ct`'s planted run). A production
/// binary must refuse to run when it is set.
pub const PLANTED_LEAKS: bool = cfg!(feature = "ct-planted");

#[cfg(test)]
extern crate std;
