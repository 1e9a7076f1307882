//! The shapes of the known answers in [`crate::kat`], which the host writes
//! (`cargo xtask vectors`) and checks (`tests/tests/mcu_kat.rs`).

use suffuse_core::error::SufError;
use suffuse_core::fss::{Kind, Output, Party};
use suffuse_core::gate::activation::{self, GeluForm};
use suffuse_core::gate::{Gate, relu};
use suffuse_core::ring::Width;

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
    /// P0's and P1's output shares at `points` (a pair's two words per
    /// point, point-major).
    pub outs: [&'static [u64]; 2],
    /// The reconstructed values at `points`, laid out as `outs`.
    pub values: &'static [u64],
}

/// One party's view of a two-party gate run on the host.
pub struct GateTranscript {
    /// A label.
    pub name: &'static str,
    /// How the firmware builds the gate at run time.
    pub build: GateBuild,
    /// The same gate built at compile time, into flash: the run-time one
    /// must equal it.
    pub flash: &'static Result<Gate, SufError>,
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
    /// The DCF key bodies as a key file holds them: without roots, back to
    /// back; the roots are re-derived from the seed (`Gate::fill_roots`
    /// into whole keys, or `Gate::derive_roots` beside the bodies).
    pub dcf: [&'static [u8]; suffuse_core::compile::MAX_KEYS],
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

impl GateTranscript {
    /// The party this transcript plays.
    pub fn party(&self) -> Party {
        if self.party == 0 {
            Party::P0
        } else {
            Party::P1
        }
    }
}

/// A gate constructor of the core and its arguments, called at run time
/// to build the gate in place. Only the `runtime-gates` build calls it: its
/// layout (memory/runtime.x) trades 8 KiB of stack for the gate slot.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "runtime-gates"), allow(dead_code))]
pub enum GateBuild {
    /// `relu::relu_init`.
    Relu {
        /// Ring width.
        ring: u32,
        /// Effective width.
        k: u32,
    },
    /// `activation::gelu_init`, erf form (its SUF from `Spline::suf`, in
    /// soft-float `f64` on this target).
    GeluErf {
        /// Ring width.
        ring: u32,
        /// Effective width.
        k: u32,
        /// Input fraction bits.
        frac: u32,
    },
}

#[cfg_attr(not(feature = "runtime-gates"), allow(dead_code))]
impl GateBuild {
    /// The core entry point that builds the gate.
    pub fn entry(self) -> &'static str {
        match self {
            GateBuild::Relu { .. } => "relu::relu_init",
            GateBuild::GeluErf { .. } => "activation::gelu_init",
        }
    }

    /// Builds the gate in `gate`, where it lies.
    pub fn init(self, gate: &mut Gate) -> Result<(), SufError> {
        match self {
            GateBuild::Relu { ring, k } => relu::relu_init(gate, Width::of(ring), planted(k)),
            GateBuild::GeluErf { ring, k, frac } => {
                activation::gelu_init(gate, GeluForm::Erf, Width::of(ring), planted(k), frac)
            }
        }
    }
}

/// The effective width `k`, one bit wider with the `plant-unequal-gate`
/// feature.
fn planted(k: u32) -> Width {
    Width::of(k + u32::from(cfg!(feature = "plant-unequal-gate")))
}
