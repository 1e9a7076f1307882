//! The shapes of the known answers in [`crate::kat`], which the host writes
//! (`cargo xtask vectors`) and checks (`tests/tests/mcu_kat.rs`).

use suffuse_core::error::SufError;
use suffuse_core::fss::{Kind, Output};
use suffuse_core::gate::Gate;

/// One DCF/DPF key pair of `tests/vectors/v1/fss.json` with its outputs.
pub struct FssVector {
    /// The vector's label.
    pub name: &'static str,
    /// DCF or DPF.
    pub kind: Kind,
    /// Input width k.
    pub k: u32,
    /// Output group.
    pub output: Output,
    /// P0's and P1's keys.
    pub keys: [&'static [u8]; 2],
    /// Public evaluation points.
    pub points: &'static [u64],
    /// P0's and P1's output shares at `points`.
    pub outs: [&'static [u64]; 2],
    /// The reconstructed values at `points`.
    pub values: &'static [u64],
}

/// One party's view of a two-party gate run on the host.
pub struct GateTranscript {
    /// A label.
    pub name: &'static str,
    /// The gate, built at compile time (a gate descriptor is about 22 KB
    /// and building one at run time takes far more stack than 16 KiB).
    pub gate: &'static Result<Gate, SufError>,
    /// 0 or 1.
    pub party: u8,
    /// The party's 16-byte PRF seed.
    pub seed: [u8; 16],
    /// The first element index of the key material.
    pub first: u64,
    /// The cleartext inputs (for the reference check only).
    pub xs: &'static [u64],
    /// This party's input shares.
    pub input: &'static [u64],
    /// The DCF key bodies as a key file holds them: roots zeroed, to be
    /// re-derived from the seed with `Gate::fill_roots`.
    pub dcf: [&'static [u8]; 3],
    /// P1's explicit words (empty for P0).
    pub explicit: &'static [u64],
    /// What this party sent in each round.
    pub sent: &'static [&'static [u8]],
    /// What the peer sent in each round.
    pub received: &'static [&'static [u8]],
    /// This party's ring output shares (element-major).
    pub arith: &'static [u64],
    /// This party's bit output shares.
    pub bits: &'static [u64],
    /// The peer's ring output shares, to reconstruct against the reference.
    pub peer_arith: &'static [u64],
    /// The peer's bit output shares.
    pub peer_bits: &'static [u64],
}
