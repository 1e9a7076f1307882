//! The plan: a model and a batch shape turned into a deterministic list of
//! operations over fixed-point tensors, with every gate's effective width
//! proven by range analysis over the public weights ([`bound`]).
//!
//! One plan drives four interpreters that must agree step for step: the
//! cleartext fixed-point reference ([`crate::reference`]), the dealer
//! ([`crate::dealer`]), and the two parties ([`crate::party`]). Operations
//! are either *local* (linear algebra with public weights, reshapes, sums:
//! no keys, no messages) or *steps* (interactive protocols with key
//! material and rounds). Steps are numbered in order; key-file sections and
//! network frames carry that number.
//!
//! The plan's hash covers the format version, the model's digest, the
//! shape, every tensor and every operation with its parameters, so a dealer
//! and a party that disagree on anything are stopped before any work.

pub mod attention;
pub mod bert;
pub mod bound;
pub mod decoder;
mod linear;
mod mlp;
mod norm;
mod scale;
pub mod step;

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use suffuse_core::gate::Gate;
use suffuse_core::gate::activation::{self, GeluForm, NexpForm, SiluForm};
use suffuse_core::gate::centre_square::CentreSquare;
use suffuse_core::gate::chain::{Chain, Lin, Source, Step};
use suffuse_core::gate::inverse::{Inverse, InverseScales, inverse, inverse_table};
use suffuse_core::gate::max::{MaxTree, ONE_ROUND_TAIL};
use suffuse_core::gate::ring_trunc::RingTrunc;
use suffuse_core::gate::trunc::{Range, Shift, trunc};
use suffuse_core::gate::trunc_open::TruncOpen;
use suffuse_core::ring::Width;

use crate::fixed::{self, RING};
use bound::Bound;

/// Version of the plan format; part of the hash. 2: reciprocal and rsqrt
/// chains and a norm's per-row scalars truncate in one round
/// (`RingTrunc`), and a max tree's last levels run a one-round ReLU
/// (`RingRelu`), which changes their key sections, so key files dealt for
/// version 1 no longer match. 3: the chains' range reduction and mantissa
/// spline run in one round each (`RingSuf`), 7 → 5 rounds per chain, and
/// operations carry their lane where independent steps share rounds
/// ([`Lane`]). 4: decoders open q/k/v once and keep the cache's masks
/// across passes ([`Kind::Open`]). 5: the servers exchange roles step by
/// step so that their key files are the same size (`crate::proto::role`):
/// the same sections go to the other server's file. 6: a Llama-family
/// decoder folds RoPE into its query/key weights ([`RopeTables`]), so its
/// q/k/v truncation drops 16 bits instead of 28. 7: the spline chains'
/// mantissa spline and exponent factor's product run as one scaled SUF
/// (`RingSuf::scaled`), 5 → 4 rounds per chain, so their key sections
/// change; and a LayerNorm's centring and sum of squares are one step
/// ([`Kind::CentreSquare`]). 8: GeLU takes its products from dealer
/// monomials (`activation::gelu_monomials`), 3 → 2 rounds, so its key
/// sections change. 9: a max tree's one-round ReLU holds one pair-output
/// key (`Output::Pair`) where it held two ring-output keys, so those
/// levels' key sections change.
pub const PLAN_VERSION: u32 = 9;

/// The most sentences a plan takes in one run. Far above what one key set
/// is dealt for in practice; it keeps every shape product small enough to
/// check once ([`PlanError::ShapeTooLarge`]).
pub const MAX_BATCH: usize = 1 << 16;

/// The most elements any tensor of a plan may have.
pub const MAX_ELEMENTS: u64 = 1 << 32;

/// What a piece of work is, for the report (the columns of seeds/001
/// Tables 1, 5 and 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Local products with public weights.
    Linear,
    /// Secret × secret products in attention (QKᵀ, PV).
    AttentionMatmul,
    /// Row max, exponent, reciprocal and normalization.
    Softmax,
    /// The FFN activation.
    Gelu,
    /// LayerNorm, residual additions included.
    LayerNorm,
    /// Rescaling after products.
    Truncation,
    /// Pooling of the final hidden states.
    Pooling,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 7] = [
        Category::Linear,
        Category::AttentionMatmul,
        Category::Softmax,
        Category::Gelu,
        Category::LayerNorm,
        Category::Truncation,
        Category::Pooling,
    ];

    /// The report's name.
    pub fn name(self) -> &'static str {
        match self {
            Category::Linear => "linear",
            Category::AttentionMatmul => "attention_matmul",
            Category::Softmax => "softmax",
            Category::Gelu => "gelu",
            Category::LayerNorm => "layernorm",
            Category::Truncation => "truncation",
            Category::Pooling => "pooling",
        }
    }
}

/// A tensor slot: shape, scale and proven bound.
#[derive(Clone, Debug, Serialize)]
pub struct TensorInfo {
    /// What it is ("layer 2 attention scores").
    pub name: String,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Fraction bits.
    pub scale: u32,
    /// The proven bound, in real units.
    #[serde(skip)]
    pub bound: Bound,
    /// Largest magnitude any element may take, as an integer: the bound
    /// with the margin. The reference checks every value against it.
    pub limit: u64,
    /// An opened tensor ([`Kind::Open`]): the store holds `2·len` words,
    /// the public masked values `E` and then this party's share of the
    /// mask `A`, with `value = E + A` (the reference: the values, then
    /// zeros).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paired: bool,
}

impl TensorInfo {
    /// Elements.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Words a store holds for the tensor: twice its elements if paired.
    pub fn words(&self) -> usize {
        self.len() << usize::from(self.paired)
    }

    /// Whether the tensor is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A scalar gate applied to every element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "gate", rename_all = "snake_case")]
pub enum GateSpec {
    /// Arithmetic right shift by `shift` (gap truncation: the input is
    /// proven below 2^(k−1) in magnitude).
    Trunc {
        /// Effective input width.
        k: u32,
        /// Bits dropped.
        shift: u32,
    },
    /// GeLU at input scale [`fixed::FRAC`]; output at 2·FRAC + 12, or
    /// FRAC + 12 in the degree-1 form.
    Gelu {
        /// Effective input width.
        k: u32,
        /// The tanh form (GPT-2) instead of erf (BERT).
        tanh: bool,
        /// The tanh form to 2^-11 ([`GeluForm::TanhFine`]), where a norm
        /// rescales the MLP's output (Gemma 3). Absent from the plan's
        /// serialized form when false, so other plans hash as before.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        fine: bool,
        /// The tanh form's degree-1 pieces ([`GeluForm::TanhLinear`]), in
        /// decode passes. Absent when false, as `fine`.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        linear: bool,
        /// Φ's products by Beaver triples (3 rounds,
        /// `activation::gelu`) instead of dealer monomials (2 rounds,
        /// `activation::gelu_monomials`): in decode passes, where the
        /// monomials' extra words cost more key bytes per round saved
        /// than the plan takes there (docs/PLAN.md). Absent when false.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        beaver: bool,
    },
    /// SiLU `x·σ(x)` at input scale FRAC; output at 2·FRAC + 12, or
    /// FRAC + 12 in the degree-1 form.
    Silu {
        /// Effective input width.
        k: u32,
        /// The degree-1 pieces ([`SiluForm::Linear`]), in decode passes.
        /// Absent when false, so other plans hash as before.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        linear: bool,
    },
    /// e^(−z) for z ≥ 0 at input scale FRAC; output at 2·FRAC + 12, or
    /// FRAC + 12 in the degree-1 form.
    Nexp {
        /// Effective input width.
        k: u32,
        /// The degree-1 pieces ([`NexpForm::Linear`]), in decode passes.
        /// Absent when false, so other plans hash as before.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        linear: bool,
    },
}

impl GateSpec {
    /// The core gate.
    pub fn build(&self) -> Result<Gate, suffuse_core::SufError> {
        let w = |k: u32| Width::new(k).map_err(|_| suffuse_core::SufError::FixedPoint);
        let g = match *self {
            GateSpec::Trunc { k, shift } => {
                trunc(RING, w(k)?, shift, Shift::Arithmetic, Range::Gap)?
            }
            GateSpec::Gelu {
                k,
                tanh,
                fine,
                linear,
                beaver,
            } => {
                let form = gelu_form(tanh, fine, linear);
                match beaver {
                    true => activation::gelu(form, RING, w(k)?, fixed::FRAC)?,
                    false => activation::gelu_monomials(form, RING, w(k)?, fixed::FRAC)?,
                }
            }
            GateSpec::Nexp { k, linear } => {
                activation::nexp(nexp_form(linear), RING, w(k)?, fixed::FRAC)?
            }
            GateSpec::Silu { k, linear } => {
                activation::silu(silu_form(linear), RING, w(k)?, fixed::FRAC)?
            }
        };
        Ok(g)
    }

    /// The same gate at input width `k`.
    pub(crate) fn with_k(self, k: u32) -> GateSpec {
        match self {
            GateSpec::Trunc { shift, .. } => GateSpec::Trunc { k, shift },
            GateSpec::Gelu {
                tanh,
                fine,
                linear,
                beaver,
                ..
            } => GateSpec::Gelu {
                k,
                tanh,
                fine,
                linear,
                beaver,
            },
            GateSpec::Silu { linear, .. } => GateSpec::Silu { k, linear },
            GateSpec::Nexp { linear, .. } => GateSpec::Nexp { k, linear },
        }
    }

    /// The input width.
    pub fn k(&self) -> u32 {
        match *self {
            GateSpec::Trunc { k, .. }
            | GateSpec::Gelu { k, .. }
            | GateSpec::Nexp { k, .. }
            | GateSpec::Silu { k, .. } => k,
        }
    }
}

/// The GeLU a [`GateSpec::Gelu`] names: the erf form, or the tanh form
/// coarse, fine or of degree 1 (fine wins: it is never linear).
pub fn gelu_form(tanh: bool, fine: bool, linear: bool) -> GeluForm {
    match (tanh, fine, linear) {
        (false, _, _) => GeluForm::Erf,
        (true, true, _) => GeluForm::TanhFine,
        (true, false, false) => GeluForm::Tanh,
        (true, false, true) => GeluForm::TanhLinear,
    }
}

/// The SiLU a [`GateSpec::Silu`] names.
pub fn silu_form(linear: bool) -> SiluForm {
    if linear {
        SiluForm::Linear
    } else {
        SiluForm::Quadratic
    }
}

/// The nExp a [`GateSpec::Nexp`] names.
pub fn nexp_form(linear: bool) -> NexpForm {
    if linear {
        NexpForm::Linear
    } else {
        NexpForm::Quadratic
    }
}

/// What a chain step computes on every element: one value per row, so
/// that rounds, not key bytes, decide its form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "chain", rename_all = "snake_case")]
pub enum ChainSpec {
    /// Reciprocal or rsqrt.
    Inverse(InverseSpec),
    /// Arithmetic right shift by `shift` in one round ([`RingTrunc`]): the
    /// input is proven below 2^(k−1) in magnitude.
    Trunc {
        /// Effective input width.
        k: u32,
        /// Bits dropped.
        shift: u32,
    },
}

impl ChainSpec {
    /// The core chain.
    pub fn build(&self) -> Result<Chain, suffuse_core::SufError> {
        match *self {
            ChainSpec::Inverse(spec) => spec.build(),
            ChainSpec::Trunc { k, shift } => {
                let k = Width::new(k).map_err(|_| suffuse_core::SufError::FixedPoint)?;
                let chain = Chain::new(RING)
                    .then(Step::Trunc {
                        gate: RingTrunc::new(RING, k, shift, Shift::Arithmetic)?,
                        input: Lin::of(Source::Input),
                    })
                    .output(Source::Output { step: 0, index: 0 });
                chain.validate()?;
                Ok(chain)
            }
        }
    }

    /// The name and input width, for the report.
    fn name_and_width(&self) -> (&'static str, u32) {
        match *self {
            ChainSpec::Inverse(s) if s.rsqrt => ("rsqrt", s.k_in),
            ChainSpec::Inverse(s) => ("recip", s.k_in),
            ChainSpec::Trunc { k, .. } => ("trunc, one round", k),
        }
    }
}

/// Scales of a reciprocal or rsqrt (mirrors core's [`InverseScales`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct InverseSpec {
    /// `1/√v` instead of `1/v`.
    pub rsqrt: bool,
    /// Fraction bits of the input.
    pub frac_in: u32,
    /// The input is below 2^k_in.
    pub k_in: u32,
    /// Inputs below 2^lo_bits saturate.
    pub lo_bits: u32,
    /// Fraction bits of the output.
    pub frac_out: u32,
    /// The table form (3 rounds; core's `inverse_table`) instead of the
    /// spline form (4 rounds): in decode passes only. Each element's
    /// lookup expands a DPF over 2^15–2^16 points, which a decode pass
    /// (one row per norm, one per head per softmax) pays easily and a
    /// prefill (BERT-base: 18,432 softmax rows) does not, by seconds
    /// (docs/PLAN.md). Chosen by the pass's kind, never by its row count,
    /// so that a row's value does not depend on the batch around it.
    /// Absent from the plan's serialized form when false, so plans without
    /// it hash as before.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub table: bool,
}

impl InverseSpec {
    /// The core chain.
    pub fn build(&self) -> Result<Chain, suffuse_core::SufError> {
        let kind = if self.rsqrt {
            Inverse::Rsqrt
        } else {
            Inverse::Recip
        };
        let scales = InverseScales {
            frac_in: self.frac_in,
            k_in: self.k_in,
            lo_bits: self.lo_bits,
            frac_out: self.frac_out,
        };
        match self.table {
            true => inverse_table(kind, RING, scales),
            false => inverse(kind, RING, scales),
        }
    }
}

/// The keys each query of an attention block sees under a sliding window:
/// a block has `queries` rows, the last `queries` of its `keys` positions,
/// so query `i` sits at `p = keys − queries + i` and sees keys
/// `max(0, p + 1 − window) ..= p`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Band {
    /// Query rows per block.
    pub queries: usize,
    /// Keys each query sees, itself included.
    pub window: usize,
}

impl Band {
    /// The keys `lo..=p` that query `i` of a block with `keys` keys sees.
    pub fn range(&self, i: usize, keys: usize) -> std::ops::RangeInclusive<usize> {
        let p = keys - self.queries + i;
        (p + 1).saturating_sub(self.window)..=p
    }

    /// Entries a block packs.
    pub fn packed(&self, keys: usize) -> usize {
        (0..self.queries).map(|i| self.range(i, keys).count()).sum()
    }

    /// The causal square of `l` rows: every earlier key.
    pub fn causal(l: usize) -> Band {
        Band {
            queries: l,
            window: usize::MAX,
        }
    }
}

/// RoPE's tables and where they apply: the first `rotated` columns (whole
/// heads of `head_dim`), each pair `(a, b)` of a head turned by row `r`'s
/// angles. [`Kind::Rope`] turns a product's values (`(a·c − b·s, a·s +
/// b·c)` at `frac` more fraction bits); [`Kind::Linear`] folds them into
/// the weights: row `r` takes the weights and the bias `(c·W_a − s·W_b,
/// s·W_a + c·W_b)` from the layer's words at `keep` more fraction bits
/// ([`EncodedLinear::fine`]), each rotated word rounded (half up) back to
/// their scale, and the other columns' words as they are (without fine
/// words: the layer's own, rotated words rounded to `keep` more fraction
/// bits, the other columns' times `2^keep`). The product is then at the
/// input's scale plus the weights' plus `keep`, where RoPE on the product
/// adds `frac`: the truncation after it drops `frac − keep` bits fewer.
#[derive(Clone, Debug, Serialize)]
pub struct RopeTables {
    /// Columns rotated (queries and keys).
    pub rotated: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Pairs `(2i, 2i+1)` (GGUF) instead of `(i, i + d_h/2)` (HF).
    pub adjacent: bool,
    /// `cos` per row and frequency, `[rows × d_h/2]`, at `frac`.
    pub cos: Vec<u64>,
    /// `sin` likewise.
    pub sin: Vec<u64>,
    /// Fraction bits of the tables.
    pub frac: u32,
    /// Folded into weights: the fraction bits the rotated words keep
    /// beyond the weights' own (below `frac`).
    #[serde(skip_serializing_if = "is_zero")]
    pub keep: u32,
}

fn is_standard_tail(v: &usize) -> bool {
    *v == ONE_ROUND_TAIL
}

fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl RopeTables {
    /// The largest weight or bias word (in magnitude) a fold takes: the
    /// rotation's sums then stay below 2^(WORD_BITS + frac + 1),
    /// inside i64.
    pub const WORD_BITS: u32 = 44;

    /// The columns paired in one head, with their frequency index.
    pub fn pairs(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let half = self.head_dim / 2;
        (0..self.rotated / self.head_dim.max(1)).flat_map(move |h| {
            (0..half).map(move |i| {
                let (a, b) = if self.adjacent {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + half)
                };
                (h * self.head_dim + a, h * self.head_dim + b, i)
            })
        })
    }
}

/// One operation.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Kind {
    /// `out = x·W + b` with linear layer `linear` of the plan (local);
    /// with `rope`, row `r` takes `W` and `b` rotated by row `r`'s angles
    /// ([`RopeTables`]); with `unbiased`, `x·W` alone.
    Linear {
        /// Input `[rows × inputs]`.
        x: usize,
        /// Index into [`Plan::linears`].
        linear: usize,
        /// RoPE folded into the weights, row by row.
        #[serde(skip_serializing_if = "Option::is_none")]
        rope: Option<Box<RopeTables>>,
        /// The layer's biases left out: the planner adds them after the
        /// product's truncation (a decode pass of a biased projection,
        /// `plan::decoder` `add_turned_bias`), so any encoding of the
        /// layer serves, whatever scale its biases are at.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        unbiased: bool,
        /// Output `[rows × outputs]`.
        out: usize,
    },
    /// `out = a + b` (local).
    Add {
        /// First summand.
        a: usize,
        /// Second summand.
        b: usize,
        /// Sum.
        out: usize,
    },
    /// `out[r, c] = x[r, c]·gain[c] + offset[c]` with public per-column
    /// constants (local).
    Affine {
        /// Input.
        x: usize,
        /// Per-column gains (ring elements).
        gain: Vec<u64>,
        /// Per-column offsets (ring elements).
        offset: Vec<u64>,
        /// Output.
        out: usize,
    },
    /// Columns `part·d..(part+1)·d` of a `[B·L × 3d]` tensor rearranged to
    /// `[B·H·L × d/H]`, one block of L rows per (sentence, head) (local).
    SplitHeads {
        /// Input.
        x: usize,
        /// Which third (query, key, value).
        part: usize,
        /// Heads.
        heads: usize,
        /// Output.
        out: usize,
    },
    /// The inverse of [`Kind::SplitHeads`] for one `[B·H·L × d/H]` tensor
    /// (local).
    MergeHeads {
        /// Input.
        x: usize,
        /// Heads.
        heads: usize,
        /// Output `[B·L × d]`.
        out: usize,
    },
    /// `out[r, c] = x[r, c] + bias[r / rows_per, c]` (local).
    AddBias {
        /// Input.
        x: usize,
        /// Bias rows.
        bias: usize,
        /// Rows of x per bias row.
        rows_per: usize,
        /// Output.
        out: usize,
    },
    /// `out[r, c] = v[r] − x[r, c]` (local).
    RowMinus {
        /// One value per row.
        v: usize,
        /// Input.
        x: usize,
        /// Output.
        out: usize,
    },
    /// `out[r, c] = x[r, c] − v[r]` (local).
    MinusRow {
        /// Input.
        x: usize,
        /// One value per row.
        v: usize,
        /// Output.
        out: usize,
    },
    /// `out[r] = Σ_c x[r, c]` (local).
    RowSum {
        /// Input.
        x: usize,
        /// Output `[rows × 1]`.
        out: usize,
    },
    /// Rows `0, stride, 2·stride, …` (local).
    TakeRows {
        /// Input.
        x: usize,
        /// Row step.
        stride: usize,
        /// Output.
        out: usize,
    },
    /// A scalar gate on every element ([`step::Gate`]).
    Gate(step::Gate),
    /// A reciprocal, rsqrt or one-round truncation on every element
    /// ([`step::Chain`]).
    Chain(step::Chain),
    /// Row maxima by a comparison tree ([`step::Max`]).
    Max(step::Max),
    /// Secret × secret matrix products ([`step::MatMul`]).
    MatMul(step::MatMul),
    /// Each row times its own secret factor ([`step::MulRows`]).
    MulRows(step::MulRows),
    /// A tensor opened once under a fresh mask ([`step::Open`]).
    Open(step::Open),
    /// A truncation, its residual sum and the sum's square
    /// ([`step::TruncSquare`]).
    TruncSquare(step::TruncSquare),
    /// A LayerNorm's centring and sum of squares
    /// ([`step::CentreSquare`]).
    CentreSquare(step::CentreSquare),
    /// Elementwise squares ([`step::Square`]).
    Square(step::Square),
    /// Elementwise products ([`step::Mul`]).
    Mul(step::Mul),
    /// The lower triangles (`j ≤ i`) of the square `[L × L]` blocks of
    /// `x`, packed row by row into `[blocks·L(L+1)/2 × 1]` (local); with a
    /// `band`, the entries each query of a block sees under a sliding window.
    Triangle {
        /// Input `[blocks·L × L]` (with a band: `[blocks·Q × K]`).
        x: usize,
        /// A sliding window's band; `None` is the causal square.
        #[serde(skip_serializing_if = "Option::is_none")]
        band: Option<Band>,
        /// Output.
        out: usize,
    },
    /// The inverse of [`Kind::Triangle`]: entries `j > i` (outside the
    /// band) become the row's diagonal value (`diagonal`) or 0 (local).
    Spread {
        /// Packed input.
        x: usize,
        /// Fill with the diagonal instead of 0.
        diagonal: bool,
        /// As the [`Kind::Triangle`] that packed it.
        #[serde(skip_serializing_if = "Option::is_none")]
        band: Option<Band>,
        /// Output `[blocks·L × L]`.
        out: usize,
    },
    /// RoPE on the first `rotated` columns of `x` (whole heads of
    /// `head_dim`), row `r` by the angles of row `r` of the tables; the
    /// other columns are multiplied by `2^frac` so that every column leaves
    /// at the input scale plus `frac` (local: the rotation is public).
    Rope {
        /// Input.
        x: usize,
        /// The tables and the columns they turn.
        #[serde(flatten)]
        tables: RopeTables,
        /// Output.
        out: usize,
    },
    /// Columns `from..from + heads·d_h` of `[rows × ·]` rearranged to
    /// `[heads·rows × d_h]`, one block per head (local).
    Heads {
        /// Input.
        x: usize,
        /// First column.
        from: usize,
        /// Heads.
        heads: usize,
        /// Output.
        out: usize,
    },
    /// The inverse of [`Kind::Heads`]: `[heads·rows × d_h]` to
    /// `[rows × heads·d_h]` (local).
    Unheads {
        /// Input.
        x: usize,
        /// Heads.
        heads: usize,
        /// Output.
        out: usize,
    },
    /// Per head, the rows of `cache` then those of `new` (local): the KV
    /// cache growing by one decode step.
    Append {
        /// `[heads·n × d_h]`.
        cache: usize,
        /// `[heads·m × d_h]`.
        new: usize,
        /// Heads.
        heads: usize,
        /// `[heads·(n + m) × d_h]`.
        out: usize,
    },
    /// Each head block repeated `times` times in place (local): the shared
    /// key/value heads of grouped-query attention.
    Repeat {
        /// `[heads·n × d_h]`.
        x: usize,
        /// Heads of `x`.
        heads: usize,
        /// Copies of each.
        times: usize,
        /// `[heads·times·n × d_h]`.
        out: usize,
    },
    /// Rows `first..first + out.rows` (local).
    Rows {
        /// Input.
        x: usize,
        /// First row.
        first: usize,
        /// Output.
        out: usize,
    },
}

impl Kind {
    /// Whether this is an interactive step (key material, rounds).
    pub fn is_step(&self) -> bool {
        self.step().is_some()
    }

    /// What kind of step this is in the report's rounds per kind of step:
    /// the key label, without a truncation's shift (its rounds do not
    /// depend on it). `None` for local operations.
    pub fn round_label(&self) -> Option<String> {
        self.step().map(|s| s.round_label())
    }

    /// What a step's key section is for, in the report's key bytes per
    /// gate: the gate and, for a truncation, the bits it drops (its key is
    /// a comparison over them). `None` for local operations.
    pub fn key_label(&self) -> Option<String> {
        self.step().map(|s| s.key_label())
    }

    /// Whether this is a layout operation that takes opened (paired)
    /// tensors to opened tensors, moving values and masks alike.
    pub fn carries_pairs(&self) -> bool {
        matches!(
            self,
            Kind::Heads { .. } | Kind::Append { .. } | Kind::Repeat { .. } | Kind::Rows { .. }
        )
    }

    /// Tensors read.
    pub fn inputs(&self) -> Vec<usize> {
        if let Some(s) = self.step() {
            return s.inputs();
        }
        match *self {
            Kind::Linear { x, .. }
            | Kind::Affine { x, .. }
            | Kind::SplitHeads { x, .. }
            | Kind::MergeHeads { x, .. }
            | Kind::RowSum { x, .. }
            | Kind::TakeRows { x, .. }
            | Kind::Triangle { x, .. }
            | Kind::Spread { x, .. }
            | Kind::Rope { x, .. }
            | Kind::Heads { x, .. }
            | Kind::Unheads { x, .. }
            | Kind::Repeat { x, .. }
            | Kind::Rows { x, .. } => vec![x],
            Kind::Add { a, b, .. } => vec![a, b],
            Kind::Append { cache, new, .. } => vec![cache, new],
            Kind::AddBias { x, bias, .. } => vec![x, bias],
            Kind::RowMinus { v, x, .. } | Kind::MinusRow { x, v, .. } => vec![x, v],
            // The steps, answered above.
            _ => Vec::new(),
        }
    }

    /// The tensor written.
    pub fn output(&self) -> usize {
        if let Some(s) = self.step() {
            return s.output();
        }
        match *self {
            Kind::Linear { out, .. }
            | Kind::Add { out, .. }
            | Kind::Affine { out, .. }
            | Kind::SplitHeads { out, .. }
            | Kind::MergeHeads { out, .. }
            | Kind::AddBias { out, .. }
            | Kind::RowMinus { out, .. }
            | Kind::MinusRow { out, .. }
            | Kind::RowSum { out, .. }
            | Kind::TakeRows { out, .. }
            | Kind::Triangle { out, .. }
            | Kind::Spread { out, .. }
            | Kind::Rope { out, .. }
            | Kind::Heads { out, .. }
            | Kind::Unheads { out, .. }
            | Kind::Append { out, .. }
            | Kind::Repeat { out, .. }
            | Kind::Rows { out, .. } => out,
            // The steps, answered above.
            _ => 0,
        }
    }

    /// Tensors written: [`Kind::output`], and a [`Kind::TruncSquare`]'s
    /// square or a [`Kind::CentreSquare`]'s row sums after it.
    pub fn outputs(&self) -> Vec<usize> {
        match self.step() {
            Some(s) => s.outputs(),
            None => vec![self.output()],
        }
    }
}

/// An operation with its place in the model.
#[derive(Clone, Debug, Serialize)]
pub struct Op {
    /// For the report.
    pub category: Category,
    /// Encoder layer, when inside one.
    pub layer: Option<usize>,
    /// Where it runs beside other operations, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<Lane>,
    /// What it does.
    #[serde(flatten)]
    pub kind: Kind,
}

/// An operation's place in a group of lanes: consecutive operations of one
/// group run as independent lanes whose steps share rounds (each round
/// one frame with every running lane's message, in lane order); within a
/// lane they run in plan order. No lane reads what another lane of its
/// group writes ([`Builder::end_lanes`] checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Lane {
    /// The group, counted over the plan.
    pub group: u32,
    /// The lane within it.
    pub lane: u8,
}

/// The core objects a step runs, built once per distinct spec and shared
/// by every step with that spec: decode passes repeat the same gates, and
/// one `Chain` is 176 KB (held by value, SmolLM2's 32-pass plan took
/// 0.5 GB per pass).
#[derive(Debug)]
pub enum Built {
    /// A scalar gate.
    Gate(Arc<Gate>),
    /// A chain (reciprocal, rsqrt).
    Chain(Arc<Chain>),
    /// A comparison tree.
    Max(Arc<MaxTree>),
    /// A truncation that opens its output (squared form).
    TruncOpen(TruncOpen),
    /// A LayerNorm's centring and sum of squares.
    CentreSquare(CentreSquare),
    /// A Beaver protocol: nothing to build.
    Beaver,
}

/// `map`'s object for `key`, built by `build` on first use.
fn shared<K: std::hash::Hash + Eq, V>(
    map: &mut HashMap<K, Arc<V>>,
    key: K,
    build: impl FnOnce() -> Result<V, PlanError>,
) -> Result<Arc<V>, PlanError> {
    if let Some(v) = map.get(&key) {
        return Ok(v.clone());
    }
    let v = Arc::new(build()?);
    map.insert(key, v.clone());
    Ok(v)
}

/// The core objects built so far in [`Builder::finish`], by spec: each
/// step builds its own on first use ([`step::Interactive::build`]).
#[derive(Default)]
pub struct BuiltCache {
    gates: HashMap<GateSpec, Arc<Gate>>,
    chains: HashMap<ChainSpec, Arc<Chain>>,
    trees: HashMap<(u32, usize, usize, usize), Arc<MaxTree>>,
}

impl BuiltCache {
    /// The object step `kind` runs, built on first use.
    fn get(&mut self, kind: &Kind, tensors: &[TensorInfo]) -> Result<Built, PlanError> {
        match kind.step() {
            Some(s) => s.build(self, tensors),
            None => Ok(Built::Beaver),
        }
    }
}

/// A linear layer in fixed point.
#[derive(Clone, Debug, Serialize)]
pub struct EncodedLinear {
    /// Which layer ("layer 0 query/key/value").
    pub name: String,
    /// Inputs.
    pub inputs: usize,
    /// Outputs.
    pub outputs: usize,
    /// `[inputs × outputs]` at [`fixed::WEIGHT_FRAC`].
    #[serde(skip)]
    pub w: Vec<u64>,
    /// Bias at the product's scale.
    #[serde(skip)]
    pub b: Vec<u64>,
    /// The bias scale.
    pub bias_scale: u32,
    /// Names `w` for backends that keep it resident
    /// ([`suffuse_core::batch::Resident`]): derived at [`Builder::finish`]
    /// from the model's digest, the layer's name, its shape and its scale,
    /// which together determine the encoded weights.
    #[serde(skip)]
    pub id: [u8; 16],
    /// Where RoPE is folded into this layer ([`RopeTables::keep`]): its
    /// weights and bias encoded again at `keep` more fraction bits, which
    /// the folded product reads instead of `w` and `b`.
    #[serde(skip)]
    pub fine: Option<Box<Fine>>,
}

/// A layer's words at `keep` more fraction bits ([`EncodedLinear::fine`]).
#[derive(Clone, Debug)]
pub struct Fine {
    /// The extra fraction bits.
    pub keep: u32,
    /// `[inputs × outputs]` at `WEIGHT_FRAC + keep`.
    pub w: Vec<u64>,
    /// The bias at `bias_scale + keep`.
    pub b: Vec<u64>,
}

impl EncodedLinear {
    /// The id of this layer's weights in a model with `model_digest`.
    fn derive_id(&self, model_digest: &[u8; 32]) -> [u8; 16] {
        let mut h = Sha256::new();
        h.update(b"suffuse resident weights v1\0");
        h.update(model_digest);
        h.update((self.name.len() as u64).to_le_bytes());
        h.update(self.name.as_bytes());
        for v in [
            self.inputs as u64,
            self.outputs as u64,
            u64::from(self.bias_scale),
        ] {
            h.update(v.to_le_bytes());
        }
        let digest: [u8; 32] = h.finalize().into();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        id
    }
}

/// How the client's pooled output is finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// The output is a sum over real tokens: divide by their count.
    MeanOverTokens,
    /// The output is the first token's state.
    AsIs,
}

/// Where the client's inputs go.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Inputs {
    /// Embeddings `[B·L × d]` at FRAC.
    pub x: usize,
    /// Attention bias `[B × L]` at FRAC: 0 for tokens, `pad_bias` for
    /// padding.
    pub bias: usize,
    /// Pooling mask `[B × L]` at scale 0 (mean pooling only).
    pub mask: Option<usize>,
}

/// One round trip with the client: its inputs arrive before operation
/// `first_op`, the operations up to the next pass run, and `output` goes
/// back. An encoder has one pass; a decoder's generation has the prefill
/// and then one pass per decode step, whose KV cache tensors are read
/// across passes (the parties keep their shares of them in between).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Pass {
    /// The first operation of the pass.
    pub first_op: usize,
    /// The client's embeddings for this pass.
    pub x: usize,
    /// The client's additive key bias for this pass.
    pub bias: usize,
    /// The tensor returned to the client.
    pub output: usize,
}

/// A complete plan.
#[derive(Debug)]
pub struct Plan {
    /// The model's name.
    pub model: String,
    /// The model's digest.
    pub model_digest: [u8; 32],
    /// Sentences per run.
    pub batch: usize,
    /// Tokens per sentence (padded).
    pub seq: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Every tensor.
    pub tensors: Vec<TensorInfo>,
    /// Every operation, in order.
    pub ops: Vec<Op>,
    /// Per operation: its step number, if it is a step.
    pub step_of: Vec<Option<u32>>,
    /// Per operation: the built core object of a step.
    pub built: Vec<Option<Built>>,
    /// Linear layers.
    pub linears: Vec<EncodedLinear>,
    /// The client's inputs.
    pub inputs: Inputs,
    /// The output tensor `[B × d]` (of the last pass).
    pub output: usize,
    /// The client round trips, in order (one for an encoder).
    pub passes: Vec<Pass>,
    /// The attention bias of a padding position (a ring element).
    pub pad_bias: u64,
    /// How the client finishes the output.
    pub finish: Finish,
    /// Whether the client L2-normalizes the embedding.
    pub normalize: bool,
    /// Per tensor: the last operation that reads it (tensors are freed
    /// after it), or `usize::MAX` for the output.
    pub last_use: Vec<usize>,
    /// The plan's hash.
    pub hash: [u8; 32],
    /// Per operation: whether the two servers exchange roles in its step
    /// (`crate::proto::role`), derived from the plan on first use.
    pub swapped: std::sync::OnceLock<Vec<bool>>,
}

impl Plan {
    /// The shape the plan was built for.
    pub fn shape(&self) -> Shape {
        Shape {
            batch: self.batch,
            seq: self.seq,
            decode_steps: self.passes.len().saturating_sub(1),
        }
    }

    /// Number of steps.
    pub fn steps(&self) -> usize {
        self.step_of.iter().flatten().count()
    }

    /// The operations of pass `p`: from its first to the next pass's.
    pub fn pass_ops(&self, p: usize) -> std::ops::Range<usize> {
        let start = self.passes.get(p).map_or(self.ops.len(), |q| q.first_op);
        let end = self
            .passes
            .get(p + 1)
            .map_or(self.ops.len(), |q| q.first_op);
        start..end
    }

    /// The operations of the group of lanes that starts at operation `i`,
    /// if one does.
    pub fn group_at(&self, i: usize) -> Option<std::ops::Range<usize>> {
        let group = self.ops[i].lane?.group;
        let same = |j: usize| self.ops[j].lane.is_some_and(|l| l.group == group);
        if i > 0 && same(i - 1) {
            return None;
        }
        let end = (i..self.ops.len())
            .find(|&j| !same(j))
            .unwrap_or(self.ops.len());
        Some(i..end)
    }

    /// The hash as hex.
    pub fn hash_hex(&self) -> String {
        hex(&self.hash)
    }

    /// The smallest and largest effective width of each gate kind, for the
    /// report: `(name, k)` per step.
    pub fn widths(&self) -> Vec<(String, u32)> {
        self.ops
            .iter()
            .filter_map(|op| match &op.kind {
                Kind::Gate(step::Gate { x, gate, .. }) => Some((
                    format!("{} ({})", self.tensors[*x].name, gate_name(gate)),
                    gate.k(),
                )),
                Kind::Chain(step::Chain { x, spec, .. }) => {
                    let (name, k) = spec.name_and_width();
                    Some((format!("{} ({name})", self.tensors[*x].name), k))
                }
                Kind::Max(step::Max { x, k, .. }) => {
                    Some((format!("{} (max)", self.tensors[*x].name), *k))
                }
                _ => None,
            })
            .collect()
    }
}

fn gate_name(g: &GateSpec) -> &'static str {
    match g {
        GateSpec::Trunc { .. } => "trunc",
        GateSpec::Gelu { .. } => "gelu",
        GateSpec::Silu { .. } => "silu",
        GateSpec::Nexp { .. } => "nexp",
    }
}

/// The shape a plan is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Shape {
    /// Sentences per run (encoders; 1 for a decoder).
    pub batch: usize,
    /// Tokens per sentence, or a decoder's prompt bucket.
    pub seq: usize,
    /// A decoder's decode passes after the prefill (0 for an encoder).
    pub decode_steps: usize,
}

/// Builds (or reuses) the plan of `model` at `shape`, with the planner of
/// the model's architecture.
pub fn build<'a>(
    model: impl Into<crate::model::ModelRef<'a>>,
    shape: Shape,
) -> Result<std::sync::Arc<Plan>, PlanError> {
    match model.into() {
        crate::model::ModelRef::Encoder(m) => bert::build(m, shape.batch, shape.seq),
        crate::model::ModelRef::Decoder(m) => decoder::build(
            m,
            decoder::Generation {
                prompt: shape.seq,
                steps: shape.decode_steps,
            },
        ),
    }
}

/// Plans built in this process, shared while anyone holds them: the
/// dealer, both servers and the client of an in-process run plan the same
/// model and shape, and a plan holds the encoded weights. Keyed by the
/// model's digest, the kind of plan and two shape numbers.
type PlanKey = ([u8; 32], &'static str, usize, usize);
type PlanCache = std::sync::Mutex<Vec<(PlanKey, std::sync::Weak<Plan>)>>;
static PLANS: PlanCache = std::sync::Mutex::new(Vec::new());

/// What runs before and after every plan this process builds.
type BuildHooks = (fn(), fn());
static AROUND_BUILDS: std::sync::OnceLock<BuildHooks> = std::sync::OnceLock::new();

/// Has `before` run as each plan build starts and `after` as it ends (only
/// the first call counts). Builds run one at a time. The `suffuse` binary
/// uses it to let its allocator give the build's transient memory back to
/// the kernel, which it otherwise keeps for the online phase's sake: a
/// Qwen2.5-Coder-0.5B plan peaks at 10.2 GB and keeps 7.0.
pub fn around_builds(before: fn(), after: fn()) {
    let _ = AROUND_BUILDS.set((before, after));
}

/// The plan for `key`, built by `build` unless one is alive.
pub(crate) fn memoized(
    key: PlanKey,
    build: impl FnOnce() -> Result<Plan, PlanError>,
) -> Result<std::sync::Arc<Plan>, PlanError> {
    let mut cache = PLANS.lock().unwrap_or_else(|e| e.into_inner());
    cache.retain(|(_, w)| w.strong_count() > 0);
    if let Some(p) = cache
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(p);
    }
    let hooks = AROUND_BUILDS.get();
    hooks.inspect(|(before, _)| before());
    let built = build();
    hooks.inspect(|(_, after)| after());
    let plan = std::sync::Arc::new(built?);
    cache.push((key, std::sync::Arc::downgrade(&plan)));
    Ok(plan)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// Zero sentences or zero tokens.
    #[error(
        "a plan needs at least one sentence of at least one token (got batch {batch}, sequence {seq})"
    )]
    EmptyShape {
        /// Sentences.
        batch: usize,
        /// Tokens.
        seq: usize,
    },
    /// A shape whose tensors would not fit in memory (or in `usize`).
    #[error(
        "a batch of {batch} sentences × {seq} tokens is too large (at most {MAX_BATCH} sentences, \
         and at most 2^32 elements in any tensor)"
    )]
    ShapeTooLarge {
        /// Sentences.
        batch: usize,
        /// Tokens.
        seq: usize,
    },
    /// More tokens than the model has positions.
    #[error("sequence length {seq} exceeds the model's {max} positions")]
    SequenceTooLong {
        /// Requested.
        seq: usize,
        /// Allowed.
        max: usize,
    },
    /// The heads do not divide the hidden size.
    #[error("hidden size {hidden} is not a multiple of the {heads} attention heads")]
    Heads {
        /// Hidden size.
        hidden: usize,
        /// Heads.
        heads: usize,
    },
    /// A proven bound does not fit the 64-bit ring.
    #[error(
        "{tensor}: its proven bound ({bound:.3e} at 2^-{scale}) needs {bits} bits, more than the \
         ring allows; the model's weights are too large for this fixed-point format"
    )]
    RangeExceedsRing {
        /// The tensor.
        tensor: String,
        /// The bound in real units.
        bound: f64,
        /// Its scale.
        scale: u32,
        /// Bits needed.
        bits: u32,
    },
    /// A width no gate supports.
    #[error("no gate supports an effective width of {k} bits")]
    Width {
        /// The width.
        k: u32,
    },
    /// A lane of a group reads what another lane of it writes.
    #[error(
        "lanes that share rounds must be independent, but one reads {tensor}, which another writes"
    )]
    Lanes {
        /// The tensor.
        tensor: String,
    },
    /// An opened tensor where only layout operations and products may
    /// read it, or a plain one where a pair belongs.
    #[error("{tensor}: an opened (paired) tensor is read by an operation that cannot take it")]
    Paired {
        /// The operation's output.
        tensor: String,
    },
    /// An operation reads a truncation that a fused step
    /// ([`Kind::TruncSquare`]) took in, so that nothing writes it.
    #[error("{tensor}: read after a fused step took in the truncation that wrote it")]
    Fused {
        /// The truncation's output.
        tensor: String,
    },
    /// RoPE asked to fold into something other than the linear layer
    /// just written, or into weights too wide for the fold's arithmetic.
    #[error("RoPE cannot fold into the weights behind {tensor}")]
    RopeFold {
        /// The product.
        tensor: String,
    },
    /// A gate could not be built.
    #[error("building the gate for {tensor} ({spec}): {error}")]
    Gate {
        /// The gate's input.
        tensor: String,
        /// The gate's parameters.
        spec: String,
        /// The core's reason.
        error: suffuse_core::SufError,
    },
}

/// Where opened (paired) tensors may go: [`Kind::Open`] makes them from
/// plain ones, layout operations keep them paired (all inputs and the
/// output alike), and only [`Kind::MatMul`] consumes them. Each is written
/// once, so a mask never covers a second value.
fn check_pairs(tensors: &[TensorInfo], ops: &[Op]) -> Result<(), PlanError> {
    let mut written = vec![false; tensors.len()];
    for op in ops {
        let o = op.kind.output();
        let out = tensors[o].paired;
        if out && std::mem::replace(&mut written[o], true) {
            return Err(PlanError::Paired {
                tensor: tensors[o].name.clone(),
            });
        }
        let ok = |want: bool| op.kind.inputs().iter().all(|&t| tensors[t].paired == want);
        let fine = match op.kind {
            Kind::Open(_) => out && ok(false),
            _ if op.kind.carries_pairs() => ok(out),
            Kind::MatMul(_) => !out,
            _ => !out && ok(false),
        };
        if !fine {
            return Err(PlanError::Paired {
                tensor: tensors[op.kind.output()].name.clone(),
            });
        }
    }
    Ok(())
}

/// No operation reads a truncation's output that a fused step took in
/// ([`Builder::square`]).
fn check_fused(tensors: &[TensorInfo], ops: &[Op], fused: &[usize]) -> Result<(), PlanError> {
    let mut taken = vec![false; tensors.len()];
    for &t in fused {
        taken[t] = true;
    }
    for op in ops {
        if let Some(&t) = op.kind.inputs().iter().find(|t| taken[**t]) {
            return Err(PlanError::Fused {
                tensor: tensors[t].name.clone(),
            });
        }
    }
    Ok(())
}

/// Serializable view of a plan for hashing and inspection.
#[derive(Serialize)]
struct Canonical<'a> {
    version: u32,
    model: &'a str,
    model_digest: String,
    batch: usize,
    seq: usize,
    tensors: &'a [TensorInfo],
    ops: &'a [Op],
    linears: &'a [EncodedLinear],
    inputs: Inputs,
    output: usize,
    passes: &'a [Pass],
    pad_bias: u64,
    finish: Finish,
    normalize: bool,
}

impl Plan {
    /// SHA-256 of the plan's canonical JSON: the version, the model and
    /// its digest, the shape, every tensor, operation and linear layer,
    /// the inputs, the passes and how the output is finished.
    fn canonical_hash(&self) -> [u8; 32] {
        let canonical = Canonical {
            version: PLAN_VERSION,
            model: &self.model,
            model_digest: hex(&self.model_digest),
            batch: self.batch,
            seq: self.seq,
            tensors: &self.tensors,
            ops: &self.ops,
            linears: &self.linears,
            inputs: self.inputs,
            output: self.output,
            passes: &self.passes,
            pad_bias: self.pad_bias,
            finish: self.finish,
            normalize: self.normalize,
        };
        // Serializing plain data to a Vec cannot fail; an empty hash input
        // would still be caught by the header check against the dealer's.
        let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
        Sha256::digest(&bytes).into()
    }
}

/// What a linear layer's output bound was computed from (see
/// `linear::product_key`).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ProductKey {
    /// The layer.
    pub name: String,
    /// The product's scale.
    pub scale: u32,
    /// Output grouping, input grouping, whether a norm form was used.
    pub groups: (usize, usize, bool),
    /// The bits of every real of the input bound and norm form.
    pub reals: Vec<u64>,
}

/// Accumulates tensors and operations; [`bert::build`] drives it.
#[derive(Debug, Default)]
pub struct Builder {
    tensors: Vec<TensorInfo>,
    ops: Vec<Op>,
    linears: Vec<EncodedLinear>,
    category: Option<Category>,
    layer: Option<usize>,
    /// Encoded layers and bounds from an earlier pass over the same model,
    /// by name (and bias scale): encoding and spectral bounds are the slow
    /// part of planning.
    memo_linears: Vec<EncodedLinear>,
    memo_bounds: std::collections::HashMap<String, f64>,
    products: std::collections::HashMap<ProductKey, Bound>,
    passes: Vec<Pass>,
    /// The open group of lanes: its first operation and the current lane.
    lanes: Option<(usize, u8)>,
    /// Groups of lanes so far.
    groups: u32,
    /// Truncations' outputs that fused steps took in: nothing writes them.
    fused: Vec<usize>,
}

/// The limit of a tensor with `bound` at `scale`: the bound with the
/// margin, as an integer, or the error if it does not fit the ring.
fn limit_of(name: &str, bound: &Bound, scale: u32) -> Result<u64, PlanError> {
    let max = bound.max_abs();
    let bits = bound::width(max, scale);
    // 62 bits leaves room for the one-bit slack of gap truncation and
    // for sums of two bounded tensors.
    if bits > 62 || !max.is_finite() {
        return Err(PlanError::RangeExceedsRing {
            tensor: name.to_string(),
            bound: max,
            scale,
            bits,
        });
    }
    // Below 2^62 by the width check.
    Ok(((max * bound::MARGIN * fixed::pow2(scale)).ceil() + 2.0) as u64)
}

/// The bound memoized under `key` in `bounds`, computed and kept if new.
fn memo(
    bounds: &mut std::collections::HashMap<String, f64>,
    key: &str,
    compute: impl FnOnce() -> f64,
) -> f64 {
    if let Some(v) = bounds.get(key) {
        return *v;
    }
    let v = compute();
    bounds.insert(key.to_string(), v);
    v
}

impl Builder {
    /// A builder that reuses an earlier pass's encoded layers and bounds.
    pub fn with_memo(
        linears: Vec<EncodedLinear>,
        bounds: std::collections::HashMap<String, f64>,
    ) -> Builder {
        Builder {
            memo_linears: linears,
            memo_bounds: bounds,
            ..Builder::default()
        }
    }

    /// An earlier pass's encoding of layer `name` at `bias_scale`.
    pub fn take_memo(&mut self, name: &str, bias_scale: u32) -> Option<EncodedLinear> {
        let i = self
            .memo_linears
            .iter()
            .position(|l| l.name == name && l.bias_scale == bias_scale)?;
        Some(self.memo_linears.swap_remove(i))
    }

    /// An earlier pass's encoding of layer `name` at any scale.
    pub fn find_memo_named(&self, name: &str) -> Option<usize> {
        self.memo_linears.iter().position(|l| l.name == name)
    }

    /// The earlier pass's encoding at `j` (from [`Builder::find_memo_named`]).
    pub fn memo_ref(&self, j: usize) -> &EncodedLinear {
        &self.memo_linears[j]
    }

    /// Takes the earlier pass's encoding at `j`.
    pub fn take_memo_at(&mut self, j: usize) -> EncodedLinear {
        self.memo_linears.swap_remove(j)
    }

    /// Keeps an encoded layer for a later pass's [`Builder::take_memo`].
    pub fn keep_memo(&mut self, l: EncodedLinear) {
        self.memo_linears.push(l);
    }

    /// A bound computed once per build, by key.
    pub fn memo_bound(&mut self, key: &str, compute: impl FnOnce() -> f64) -> f64 {
        memo(&mut self.memo_bounds, key, compute)
    }

    /// [`Builder::memo_bound`] of a bound computed from linear `i`'s
    /// encoding, lent to `compute` (not copied: a layer's fused q/k/v
    /// weights are 14 MB at BERT-base's shape).
    pub fn memo_linear_bound(
        &mut self,
        key: &str,
        i: usize,
        compute: impl FnOnce(&EncodedLinear) -> f64,
    ) -> f64 {
        let linear = &self.linears[i];
        memo(&mut self.memo_bounds, key, || compute(linear))
    }

    /// The memoized bounds (to carry into the next pass).
    pub fn bounds(&self) -> std::collections::HashMap<String, f64> {
        self.memo_bounds.clone()
    }
    /// Sets the category and layer of the operations that follow.
    pub fn at(&mut self, category: Category, layer: Option<usize>) {
        self.category = Some(category);
        self.layer = layer;
    }

    /// Adds a tensor, checking that its bound fits the ring.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        rows: usize,
        cols: usize,
        scale: u32,
        bound: Bound,
    ) -> Result<usize, PlanError> {
        let name = name.into();
        let limit = limit_of(&name, &bound, scale)?;
        self.tensors.push(TensorInfo {
            name,
            rows,
            cols,
            scale,
            bound,
            limit,
            paired: false,
        });
        Ok(self.tensors.len() - 1)
    }

    /// Folds RoPE into the linear layer that wrote `y`, the last
    /// operation ([`RopeTables`]): `y`'s scale rises by `keep` and its
    /// bound becomes `bound`, the rotated product's; the layer's words at
    /// `keep` more fraction bits come from `fine` unless an earlier pass
    /// made them. The layer's outputs must pair up and its words fit the
    /// fold's arithmetic.
    pub fn fold_rope(
        &mut self,
        y: usize,
        fold: RopeTables,
        bound: Bound,
        fine: impl FnOnce() -> Fine,
    ) -> Result<(), PlanError> {
        let fits = self.rope_fits(y, &fold, fine)?;
        let t = &self.tensors[y];
        let scale = t.scale + fold.keep;
        let limit = limit_of(&t.name, &bound, scale)?;
        match self.ops.last_mut() {
            Some(Op {
                kind: Kind::Linear { rope, .. },
                ..
            }) if fits => *rope = Some(Box::new(fold)),
            _ => {
                return Err(PlanError::RopeFold {
                    tensor: t.name.clone(),
                });
            }
        }
        let t = &mut self.tensors[y];
        (t.scale, t.limit, t.bound) = (scale, limit, bound);
        Ok(())
    }

    /// Whether `fold` fits the last operation, the linear layer that
    /// wrote `y`: its outputs pair up and its words at `keep` more
    /// fraction bits (made by `fine` and kept, unless an earlier pass made
    /// them) fit the fold's arithmetic.
    fn rope_fits(
        &mut self,
        y: usize,
        fold: &RopeTables,
        fine: impl FnOnce() -> Fine,
    ) -> Result<bool, PlanError> {
        let wide = |w: &u64| (*w as i64).unsigned_abs() >> RopeTables::WORD_BITS != 0;
        let block = if fold.adjacent { 2 } else { fold.head_dim };
        Ok(match self.ops.last().map(|op| &op.kind) {
            Some(Kind::Linear {
                linear,
                rope: None,
                unbiased,
                out,
                ..
            }) if *out == y => {
                let l = &self.linears[*linear];
                // A product without biases shares a layer another scale
                // encoded: its words at `keep` must be there already, with
                // that layer's biases (which it leaves out).
                let made = match &l.fine {
                    Some(f) if f.keep == fold.keep => None,
                    _ if *unbiased => {
                        return Err(PlanError::RopeFold {
                            tensor: self.tensors[y].name.clone(),
                        });
                    }
                    _ => Some(fine()),
                };
                let f = made.as_ref().or(l.fine.as_deref());
                let paired = block > 0 && l.outputs.is_multiple_of(block);
                let ok = f.is_some_and(|f| {
                    let sized = f.w.len() == l.w.len() && f.b.len() == l.b.len();
                    sized && !f.w.iter().chain(&f.b).any(wide)
                });
                let ok = ok && paired && fold.keep < fold.frac;
                if let (true, Some(f)) = (ok, made) {
                    self.linears[*linear].fine = Some(Box::new(f));
                }
                ok
            }
            _ => false,
        })
    }

    /// Starts a client round trip: the operations that follow read its
    /// inputs `x` and `bias`.
    pub fn begin_pass(&mut self, x: usize, bias: usize) {
        self.passes.push(Pass {
            first_op: self.ops.len(),
            x,
            bias,
            output: usize::MAX,
        });
    }

    /// Whether the current pass is a decode step (one new row per
    /// sequence): every pass after a plan's first, as
    /// [`Shape::decode_steps`] counts them. Its inverse chains take the
    /// table form ([`InverseSpec::table`]).
    pub fn decoding(&self) -> bool {
        self.passes.len() > 1
    }

    /// Ends the current round trip: `output` goes back to the client.
    pub fn end_pass(&mut self, output: usize) {
        if let Some(p) = self.passes.last_mut() {
            p.output = output;
        }
    }

    /// A tensor's metadata.
    pub fn info(&self, t: usize) -> &TensorInfo {
        &self.tensors[t]
    }

    /// Adds a linear layer; returns its index.
    pub fn linear_layer(&mut self, l: EncodedLinear) -> usize {
        self.linears.push(l);
        self.linears.len() - 1
    }

    /// Records the output bound of a linear layer's product, by
    /// `linear::product_key`.
    pub fn remember_product(&mut self, key: ProductKey, bound: Bound) {
        self.products.insert(key, bound);
    }

    /// An output bound recorded by [`Builder::remember_product`].
    pub fn remembered_product(&self, key: &ProductKey) -> Option<Bound> {
        self.products.get(key).cloned()
    }

    /// The index of the layer `name` already encoded at `bias_scale`.
    pub fn find_linear(&self, name: &str, bias_scale: u32) -> Option<usize> {
        self.linears
            .iter()
            .position(|l| l.name == name && l.bias_scale == bias_scale)
    }

    /// A layer of this plan named `name`, at any scale.
    pub fn find_linear_named(&self, name: &str) -> Option<usize> {
        self.linears.iter().position(|l| l.name == name)
    }

    /// A linear layer.
    pub fn linear_ref(&self, i: usize) -> &EncodedLinear {
        &self.linears[i]
    }

    /// Appends an operation (a [`Kind`] or a [`step`]) under the current
    /// category (and lane).
    pub fn push(&mut self, kind: impl Into<Kind>) {
        let kind = kind.into();
        // Layout operations carry an opened tensor's pair along.
        if kind.carries_pairs() && kind.inputs().iter().any(|&t| self.tensors[t].paired) {
            self.tensors[kind.output()].paired = true;
        }
        self.ops.push(Op {
            category: self.category.unwrap_or(Category::Linear),
            layer: self.layer,
            lane: self.lanes.map(|(_, lane)| Lane {
                group: self.groups,
                lane,
            }),
            kind,
        });
    }

    /// `out = x²` elementwise. Where `x` is the output of the two-round
    /// truncation pushed just before, or the residual sum `add + t` just
    /// pushed with `t` the truncation pushed before it (which nothing else
    /// has read), they become one [`Kind::TruncSquare`] (in the
    /// truncation's place, category and layer): the square rides in the
    /// truncation's second round, one round less. Otherwise a Beaver
    /// [`Kind::Square`] (one round).
    pub fn square(&mut self, x: usize, out: usize) {
        let Some((kind, taken)) = self.fusable_square(x, out) else {
            if !self.square_through_heads(x, out) {
                self.push(step::Square { x, out });
            }
            return;
        };
        if let Some(t) = taken {
            self.ops.truncate(self.ops.len() - 1);
            self.fused.push(t);
        }
        if let Some(op) = self.ops.last_mut() {
            op.kind = kind;
        }
    }

    /// The [`Kind::TruncSquare`] that [`Builder::square`] would make of the
    /// last operation (a truncation writing `x`) or the last two (a
    /// truncation and the residual sum writing `x`), and the truncated
    /// tensor it takes in where a sum is fused, if they qualify.
    fn fusable_square(&self, x: usize, out: usize) -> Option<(Kind, Option<usize>)> {
        let last = self.ops.last()?;
        if let Some((y, k, shift, t)) = self.fusable_trunc(last, self.ops.len() - 1) {
            let kind = Kind::TruncSquare(step::TruncSquare {
                x: y,
                add: None,
                k,
                shift,
                out: t,
                square: out,
            });
            return (t == x).then_some((kind, None));
        }
        let [.., before, _] = self.ops.as_slice() else {
            return None;
        };
        let Kind::Add { a, b, out: r } = last.kind else {
            return None;
        };
        let (y, k, shift, t) = self.fusable_trunc(before, self.ops.len() - 2)?;
        let add = match (a == t, b == t) {
            (true, false) => b,
            (false, true) => a,
            _ => return None,
        };
        let alone = last.lane.is_none() && !self.tensors[add].paired && !self.tensors[r].paired;
        let kind = Kind::TruncSquare(step::TruncSquare {
            x: y,
            add: Some(add),
            k,
            shift,
            out: r,
            square: out,
        });
        (r == x && alone).then_some((kind, Some(t)))
    }

    /// Where `x` is some heads of the truncation pushed just before it (a
    /// decoder's query and key heads, the value heads left out), the
    /// truncation becomes a [`Kind::TruncSquare`] that squares all its
    /// output, and `out` the same heads of those squares: one round less
    /// for a few unread squares. False, with nothing changed, otherwise
    /// (or if the squares' bound does not fit the ring).
    fn square_through_heads(&mut self, x: usize, out: usize) -> bool {
        let n = self.ops.len();
        let [.., trunc, layout] = self.ops.as_slice() else {
            return false;
        };
        let Kind::Heads {
            x: t,
            from,
            heads,
            out: h,
        } = layout.kind
        else {
            return false;
        };
        let Some((y, k, shift, written)) = self.fusable_trunc(trunc, n - 2) else {
            return false;
        };
        if written != t || h != x || layout.lane.is_some() {
            return false;
        }
        let ti = self.info(t).clone();
        let abs = ti.bound.abs.iter().map(|a| a * a).collect();
        let bound = Bound::from_abs(abs, ti.cols);
        let name = format!("{} squares", ti.name);
        let Ok(all) = self.tensor(name, ti.rows, ti.cols, 2 * ti.scale, bound) else {
            return false;
        };
        self.ops[n - 2].kind = Kind::TruncSquare(step::TruncSquare {
            x: y,
            add: None,
            k,
            shift,
            out: t,
            square: all,
        });
        self.push(Kind::Heads {
            x: all,
            from,
            heads,
            out,
        });
        true
    }

    /// `(x, k, shift, out)` of `op`, pushed at `at`, if it is a gap
    /// truncation that may fuse: outside lane groups, inside the current
    /// pass, an input proven within the gap truncation's range
    /// (`shift < k < 64`), plain tensors.
    fn fusable_trunc(&self, op: &Op, at: usize) -> Option<(usize, u32, u32, usize)> {
        let Kind::Gate(step::Gate {
            x: y,
            gate: GateSpec::Trunc { k, shift },
            out: t,
        }) = op.kind
        else {
            return None;
        };
        let passes = self.passes.last().is_none_or(|p| p.first_op <= at);
        let alone = self.lanes.is_none() && op.lane.is_none();
        let plain = !self.tensors[y].paired && !self.tensors[t].paired;
        let gap = 0 < shift && shift < k && k < RING.bits();
        (passes && alone && plain && gap).then_some((y, k, shift, t))
    }

    /// `x` opened once under a fresh mask ([`Kind::Open`]): the paired
    /// tensor that later products read without opening it again.
    pub fn open(&mut self, x: usize, name: String) -> Result<usize, PlanError> {
        let xi = self.info(x).clone();
        let out = self.tensor(name, xi.rows, xi.cols, xi.scale, xi.bound)?;
        self.tensors[out].paired = true;
        self.push(step::Open { x, out });
        Ok(out)
    }

    /// Starts a group of lanes: the operations pushed until
    /// [`Builder::next_lane`] form lane 0, and so on until
    /// [`Builder::end_lanes`].
    pub fn begin_lanes(&mut self) {
        self.lanes = Some((self.ops.len(), 0));
    }

    /// Starts the group's next lane.
    pub fn next_lane(&mut self) {
        if let Some((_, lane)) = &mut self.lanes {
            *lane += 1;
        }
    }

    /// Ends the group: checks that no lane reads a tensor another lane of
    /// the group writes. A group with fewer than two lanes holding a step
    /// would share no round, so its operations run as usual.
    pub fn end_lanes(&mut self) -> Result<(), PlanError> {
        let Some((start, _)) = self.lanes.take() else {
            return Ok(());
        };
        let ops = &mut self.ops[start..];
        let lane_of = |op: &Op| op.lane.map_or(0, |l| l.lane);
        let mut writer = std::collections::HashMap::new();
        for op in ops.iter() {
            for t in op.kind.inputs() {
                if writer.get(&t).is_some_and(|w| *w != lane_of(op)) {
                    return Err(PlanError::Lanes {
                        tensor: self.tensors[t].name.clone(),
                    });
                }
            }
            for t in op.kind.outputs() {
                writer.insert(t, lane_of(op));
            }
        }
        let mut with_steps: Vec<u8> = ops
            .iter()
            .filter(|op| op.kind.is_step())
            .map(lane_of)
            .collect();
        with_steps.dedup();
        with_steps.sort_unstable();
        with_steps.dedup();
        if with_steps.len() < 2 {
            for op in ops.iter_mut() {
                op.lane = None;
            }
        } else {
            self.groups += 1;
        }
        Ok(())
    }

    /// Rows `first..first + count` of `x`, with the caller's `bound` (a
    /// block of a stacked tensor whose own bound is tighter than the
    /// stack's).
    pub fn rows(
        &mut self,
        x: usize,
        (first, count): (usize, usize),
        bound: Bound,
        name: String,
    ) -> Result<usize, PlanError> {
        let xi = self.info(x).clone();
        debug_assert!(first + count <= xi.rows);
        let out = self.tensor(name, count, xi.cols, xi.scale, bound)?;
        self.push(Kind::Rows { x, first, out });
        Ok(out)
    }

    /// A bound of rows drawn from `a` or from `c` (equal width): the
    /// larger of the two per column and per row.
    pub fn union_bound(&self, a: usize, c: usize) -> Bound {
        let (ai, ci) = (self.info(a), self.info(c));
        let abs = ai.bound.abs.iter().zip(&ci.bound.abs);
        let mut bound = Bound::from_abs(abs.map(|(x, y)| x.max(*y)).collect(), ai.cols);
        bound.l2[0] = bound.l2[0].min(ai.bound.row_l2().max(ci.bound.row_l2()));
        bound
    }

    /// The rows of `blocks` (equal width and scale) one after another.
    pub fn stack_rows(&mut self, blocks: &[usize], name: String) -> Result<usize, PlanError> {
        let Some((&first, rest)) = blocks.split_first() else {
            return Err(PlanError::EmptyShape { batch: 0, seq: 0 });
        };
        let mut acc = first;
        for &block in rest {
            let (ai, bi) = (self.info(acc), self.info(block));
            debug_assert_eq!((ai.cols, ai.scale), (bi.cols, bi.scale));
            let (rows, cols, scale) = (ai.rows + bi.rows, ai.cols, ai.scale);
            let bound = self.union_bound(acc, block);
            let out = self.tensor(name.clone(), rows, cols, scale, bound)?;
            self.push(Kind::Append {
                cache: acc,
                new: block,
                heads: 1,
                out,
            });
            acc = out;
        }
        Ok(acc)
    }

    /// Finishes the plan: builds the steps' core objects, liveness and the
    /// hash. Memoized bounds are returned beside it.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        self,
        model: &str,
        model_digest: [u8; 32],
        batch: usize,
        seq: usize,
        hidden: usize,
        inputs: Inputs,
        output: usize,
        pad_bias: u64,
        finish: Finish,
        normalize: bool,
    ) -> Result<Plan, PlanError> {
        let mut linears = self.linears;
        for l in &mut linears {
            l.id = l.derive_id(&model_digest);
        }
        check_pairs(&self.tensors, &self.ops)?;
        check_fused(&self.tensors, &self.ops, &self.fused)?;
        let (step_of, built) = built_steps(&self.ops, &self.tensors)?;
        let passes = if self.passes.is_empty() {
            vec![Pass {
                first_op: 0,
                x: inputs.x,
                bias: inputs.bias,
                output,
            }]
        } else {
            self.passes
        };
        let last_use = last_uses(&self.ops, self.tensors.len(), &passes);
        let mut plan = Plan {
            model: model.to_string(),
            model_digest,
            batch,
            seq,
            hidden,
            tensors: self.tensors,
            ops: self.ops,
            step_of,
            built,
            linears,
            inputs,
            output,
            passes,
            pad_bias,
            finish,
            normalize,
            last_use,
            hash: [0; 32],
            swapped: std::sync::OnceLock::new(),
        };
        plan.hash = plan.canonical_hash();
        Ok(plan)
    }
}

/// [`Plan::step_of`] and [`Plan::built`].
type StepsBuilt = (Vec<Option<u32>>, Vec<Option<Built>>);

/// Each operation's step index (steps numbered in plan order) and its
/// built protocol, `None` for local operations; equal step kinds share one
/// build.
fn built_steps(ops: &[Op], tensors: &[TensorInfo]) -> Result<StepsBuilt, PlanError> {
    let mut step_of = Vec::with_capacity(ops.len());
    let mut built = Vec::with_capacity(ops.len());
    let mut cache = BuiltCache::default();
    let mut s = 0u32;
    for op in ops {
        if op.kind.is_step() {
            step_of.push(Some(s));
            s += 1;
            built.push(Some(cache.get(&op.kind, tensors)?));
        } else {
            step_of.push(None);
            built.push(None);
        }
    }
    Ok((step_of, built))
}

/// The last operation that reads each tensor; a pass's output is never
/// released.
fn last_uses(ops: &[Op], tensors: usize, passes: &[Pass]) -> Vec<usize> {
    let mut last_use = vec![0usize; tensors];
    for (i, op) in ops.iter().enumerate() {
        for t in op.kind.inputs() {
            last_use[t] = i;
        }
    }
    for p in passes {
        last_use[p.output] = usize::MAX;
    }
    last_use
}

/// One-pass plans for the blocks' unit tests: begun on an input tensor
/// and a zero bias, then finished and run on the cleartext reference.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Builder, Finish, Inputs, Plan, bound::Bound};
    use crate::fixed::FRAC;
    use crate::reference::{self, PassInputs};

    /// A builder with the pass begun on `x` (`rows × cols` at FRAC, below
    /// `bound`) and a zero bias; returns it, `x` and the bias.
    pub(crate) fn begin(rows: usize, cols: usize, bound: Bound) -> (Builder, usize, usize) {
        let mut b = Builder::default();
        let x = b.tensor("x", rows, cols, FRAC, bound).unwrap();
        let bias = b
            .tensor("bias", 1, 1, FRAC, Bound::uniform(1, 0.0))
            .unwrap();
        b.begin_pass(x, bias);
        (b, x, bias)
    }

    /// Ends the pass at `out`, finishes the plan and runs the reference on
    /// the words `xs` of `x`; returns the plan and the pass's output.
    pub(crate) fn run(
        mut b: Builder,
        (x, bias, out): (usize, usize, usize),
        name: &str,
        xs: Vec<u64>,
    ) -> (Plan, Vec<u64>) {
        b.end_pass(out);
        let (rows, cols) = (b.info(x).rows, b.info(x).cols);
        let inputs = Inputs {
            x,
            bias,
            mask: None,
        };
        let plan = b
            .finish(
                name,
                [0; 32],
                1,
                rows,
                cols,
                inputs,
                out,
                0,
                Finish::AsIs,
                false,
            )
            .unwrap();
        let mut given = Some(PassInputs {
            x: xs,
            bias: vec![0],
        });
        let mut next = |_: usize, _: &[Vec<u64>]| given.take();
        let mut outs = reference::run_passes(&plan, &mut next, crate::backend::auto()).unwrap();
        let out = outs.swap_remove(0);
        (plan, out)
    }

    /// Seeded reals uniform in `[-r, r)`.
    pub(crate) fn uniform(n: usize, r: f64, seed: u64) -> Vec<f64> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
                r * (2.0 * unit - 1.0)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A builder with tensors `x, y, z` (2×2 at FRAC).
    fn three() -> (Builder, [usize; 3]) {
        let mut b = Builder::default();
        let mut t = [0; 3];
        for (i, name) in ["x", "y", "z"].into_iter().enumerate() {
            t[i] = b
                .tensor(name, 2, 2, fixed::FRAC, Bound::uniform(2, 1.0))
                .unwrap();
        }
        (b, t)
    }

    /// [`three`], a tensor t and the truncation of y into it: `(b, [x, y,
    /// z, t])`.
    fn three_and_a_truncation() -> (Builder, [usize; 4]) {
        let (mut b, [x, y, z]) = three();
        let t = b
            .tensor("t", 2, 2, fixed::FRAC, Bound::uniform(2, 1.0))
            .unwrap();
        b.push(step::Gate {
            x: y,
            gate: GateSpec::Trunc { k: 30, shift: 12 },
            out: t,
        });
        (b, [x, y, z, t])
    }

    /// A tensor of `cols` columns at twice the fraction bits, for squares.
    fn squares(b: &mut Builder, cols: usize) -> usize {
        let bound = Bound::uniform(cols, 4.0);
        b.tensor("sq", 2, cols, 2 * fixed::FRAC, bound).unwrap()
    }

    /// RoPE folds only into the linear layer just written, once, and only
    /// into words its arithmetic holds; a refused fold changes nothing.
    #[test]
    fn rope_folds_only_into_the_last_linear_layer() {
        let fold = || RopeTables {
            rotated: 2,
            head_dim: 2,
            adjacent: true,
            cos: vec![1 << 16; 2],
            sin: vec![0; 2],
            frac: 16,
            keep: 4,
        };
        let (mut b, [x, y, z]) = three();
        let linear = b.linear_layer(EncodedLinear {
            name: "l".into(),
            inputs: 2,
            outputs: 2,
            w: vec![1, 2, 3, 4],
            b: vec![0, 0],
            bias_scale: 2 * fixed::FRAC,
            id: [0; 16],
            fine: None,
        });
        let mut words = vec![16, 32, 48, 1 << RopeTables::WORD_BITS];
        let fine = || Fine {
            keep: 4,
            w: vec![16, 32, 48, 64],
            b: vec![0, 0],
        };
        b.push(Kind::Linear {
            x,
            linear,
            rope: None,
            unbiased: false,
            out: y,
        });
        let wide = b.fold_rope(y, fold(), Bound::uniform(2, 2.0), || Fine {
            keep: 4,
            w: std::mem::take(&mut words),
            b: vec![0, 0],
        });
        assert!(matches!(wide, Err(PlanError::RopeFold { .. })), "{wide:?}");
        assert!(b.linears[linear].fine.is_none());
        let before = b.tensors[y].limit;
        b.push(step::Square { x, out: z });
        let not_last = b.fold_rope(y, fold(), Bound::uniform(2, 2.0), fine);
        assert!(matches!(not_last, Err(PlanError::RopeFold { .. })));
        assert_eq!(b.tensors[y].limit, before);
        b.ops.pop();
        let too_many = RopeTables { keep: 16, ..fold() };
        let kept = b.fold_rope(y, too_many, Bound::uniform(2, 2.0), fine);
        assert!(matches!(kept, Err(PlanError::RopeFold { .. })));
        b.fold_rope(y, fold(), Bound::uniform(2, 2.0), fine)
            .unwrap();
        assert!(b.tensors[y].limit > before);
        assert_eq!(b.linears[linear].fine.as_ref().map(|f| f.keep), Some(4));
        assert_eq!(b.tensors[y].scale, fixed::FRAC + 4);
        let again = b.fold_rope(y, fold(), Bound::uniform(2, 2.0), fine);
        assert!(matches!(again, Err(PlanError::RopeFold { .. })));
    }

    #[test]
    fn lanes_must_be_independent_and_hold_steps() {
        let (mut b, [x, y, z]) = three();
        b.begin_lanes();
        b.push(step::Square { x, out: y });
        b.next_lane();
        b.push(step::Square { x, out: z });
        b.end_lanes().unwrap();
        let lanes: Vec<_> = b
            .ops
            .iter()
            .map(|o| o.lane.map(|l| (l.group, l.lane)))
            .collect();
        assert_eq!(lanes, [Some((0, 0)), Some((0, 1))]);
        // The next group is counted on.
        b.begin_lanes();
        b.push(step::Square { x, out: y });
        b.next_lane();
        b.push(step::Square { x, out: z });
        b.end_lanes().unwrap();
        assert_eq!(b.ops[3].lane, Some(Lane { group: 1, lane: 1 }));

        let (mut b, [x, y, z]) = three();
        b.begin_lanes();
        b.push(step::Square { x, out: y });
        b.next_lane();
        b.push(step::Square { x: y, out: z });
        let err = b.end_lanes().unwrap_err();
        assert!(
            matches!(err, PlanError::Lanes { ref tensor } if tensor == "y"),
            "{err}"
        );

        // One lane with a step shares nothing: the group dissolves.
        let (mut b, [x, y, z]) = three();
        b.begin_lanes();
        b.push(step::Square { x, out: y });
        b.next_lane();
        b.push(Kind::Add { a: x, b: x, out: z });
        b.end_lanes().unwrap();
        assert!(b.ops.iter().all(|o| o.lane.is_none()));
    }

    /// Every attention block's reciprocal runs beside its weighted values.
    #[test]
    fn attention_plans_one_group_of_two_lanes_per_layer() {
        let model = crate::model::Model::demo();
        let plan = bert::build(&model, 1, 11).unwrap();
        let mut groups = 0;
        for i in 0..plan.ops.len() {
            if let Some(g) = plan.group_at(i) {
                groups += 1;
                let lanes: std::collections::BTreeSet<u8> = g
                    .clone()
                    .filter_map(|j| plan.ops[j].lane)
                    .map(|l| l.lane)
                    .collect();
                assert_eq!(lanes.len(), 2);
                assert!(
                    g.clone()
                        .any(|j| matches!(plan.ops[j].kind, Kind::Chain(_)))
                );
                assert!(
                    g.clone()
                        .any(|j| matches!(plan.ops[j].kind, Kind::MatMul(_)))
                );
            }
        }
        assert_eq!(groups, model.layers.len());
    }

    /// An encoder's softmax reciprocal takes the bits of its position
    /// limit, and its post-norms' ρ POST_NORM_RHO_FRAC: the tensors after
    /// them carry those bits, so their truncations drop them.
    #[test]
    fn an_encoders_reciprocals_take_the_bits_they_need() {
        let model = crate::model::Model::demo();
        let plan = bert::build(&model, 1, 11).unwrap();
        let scale_of = |name: &str| {
            plan.tensors
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("{name}"))
                .scale
        };
        let recip = crate::fixed::recip_frac(model.config.max_positions);
        assert_eq!(recip, 18);
        assert_eq!(scale_of("layer 0 1/sum"), recip);
        assert_eq!(
            scale_of("layer 0 attention heads"),
            crate::fixed::FRAC + recip
        );
        assert_eq!(scale_of("layer 0 attention 1/√Σy²"), 20);
        assert_eq!(scale_of("layer 0 output 1/√Σy²"), 20);
        assert_eq!(
            scale_of("layer 0 attention normalized"),
            crate::fixed::FRAC + 20
        );
    }

    /// Opened tensors reach products through layout operations only, and
    /// are written once.
    #[test]
    fn opened_tensors_go_only_where_pairs_are_read() {
        let matmul = |a, b, out| {
            Kind::MatMul(step::MatMul {
                a,
                b,
                transpose_b: true,
                batches: 1,
                m: 2,
                k: 2,
                n: 2,
                out,
            })
        };
        let (mut b, [x, y, z]) = three();
        let p = b.open(x, "x opened".into()).unwrap();
        assert!(b.info(p).paired && b.info(p).words() == 8);
        b.push(Kind::Rows {
            x: p,
            first: 0,
            out: y,
        });
        assert!(b.info(y).paired, "a layout operation carries the pair");
        b.push(matmul(p, y, z));
        check_pairs(&b.tensors, &b.ops).unwrap();

        let refused = |kind: Kind| {
            let (mut b, [x, y, _]) = three();
            let p = b.open(x, "x opened".into()).unwrap();
            b.push(Kind::Rows {
                x: p,
                first: 0,
                out: y,
            });
            b.push(kind);
            check_pairs(&b.tensors, &b.ops).unwrap_err()
        };
        let err = refused(Kind::Add { a: p, b: p, out: z });
        assert!(
            matches!(err, PlanError::Paired { ref tensor } if tensor == "z"),
            "{err}"
        );
        // Opened twice, or a pair written twice: its mask would cover two
        // values.
        for kind in [
            Kind::Open(step::Open { x: p, out: z }),
            Kind::Rows {
                x: p,
                first: 0,
                out: y,
            },
        ] {
            assert!(matches!(refused(kind), PlanError::Paired { .. }));
        }
        // A product's output is plain.
        let (mut b, [x, y, _]) = three();
        let p = b.open(x, "x opened".into()).unwrap();
        let q = b.open(y, "y opened".into()).unwrap();
        b.push(matmul(p, q, q));
        assert!(check_pairs(&b.tensors, &b.ops).is_err());
    }

    /// A built-in tiny decoder and its plan for an 8-slot prompt and
    /// `decode_steps` decode passes.
    fn tiny_decoder(name: &str, decode_steps: usize) -> (crate::model::Decoder, Arc<Plan>) {
        let model = crate::model::Decoder::builtin(name).unwrap();
        let shape = Shape {
            batch: 1,
            seq: 8,
            decode_steps,
        };
        let plan = build(&model, shape).unwrap();
        (model, plan)
    }

    /// A decode pass opens its new rows and reads the cache as opened: the
    /// scores product opens nothing, the weighted values open only the
    /// probabilities, and what a pass opens ahead does not grow with the
    /// context.
    #[test]
    fn decode_passes_keep_the_caches_masks() {
        for name in ["tiny-llama", "tiny-gpt2", "tiny-gemma"] {
            let (model, plan) = tiny_decoder(name, 3);
            let t = &plan.tensors;
            let mut opened_ahead = Vec::new();
            for i in (0..plan.passes.len()).skip(1) {
                let (mut local_products, mut products, mut opens) = (0, 0, Vec::new());
                for op in &plan.ops[plan.pass_ops(i)] {
                    match op.kind {
                        Kind::MatMul(step::MatMul { a, b, .. }) => {
                            products += 1;
                            assert!(t[b].paired, "{name}: {} opened again", t[b].name);
                            local_products += usize::from(t[a].paired);
                        }
                        Kind::Open(step::Open { x, .. }) => opens.push(t[x].len()),
                        _ => {}
                    }
                }
                let layers = model.layers.len();
                assert_eq!((products, local_products), (2 * layers, layers), "{name}");
                opened_ahead.push(opens);
            }
            assert!(opened_ahead.windows(2).all(|w| w[0] == w[1]), "{name}");
            assert!(!opened_ahead[0].is_empty());
        }
    }

    /// A decode pass truncates its scores in one round and runs one more
    /// max level in one round than a prefill does; the prefill keeps the
    /// two-round truncation and the standard tail.
    #[test]
    fn decode_passes_take_their_scores_and_max_in_fewer_rounds() {
        for name in ["tiny-llama", "tiny-gpt2", "tiny-gemma"] {
            let (model, plan) = tiny_decoder(name, 2);
            for i in 0..plan.passes.len() {
                let (mut scores, mut tails) = (Vec::new(), Vec::new());
                for op in &plan.ops[plan.pass_ops(i)] {
                    match &op.kind {
                        Kind::Max(step::Max { tail, .. }) => tails.push(*tail),
                        Kind::Gate(step::Gate {
                            out,
                            gate: GateSpec::Trunc { .. },
                            ..
                        })
                        | Kind::Chain(step::Chain {
                            out,
                            spec: ChainSpec::Trunc { .. },
                            ..
                        }) if plan.tensors[*out].name.ends_with(" scores") => {
                            scores.push(matches!(op.kind, Kind::Chain(_)));
                        }
                        _ => {}
                    }
                }
                let layers = model.layers.len();
                assert_eq!(
                    (scores.len(), tails.len()),
                    (layers, layers),
                    "{name} pass {i}"
                );
                let decoding = i > 0;
                assert!(scores.iter().all(|one| *one == decoding), "{name} pass {i}");
                let want = ONE_ROUND_TAIL + 2 * usize::from(decoding);
                assert!(
                    tails.iter().all(|t| *t == want),
                    "{name} pass {i}: {tails:?}"
                );
            }
        }
    }

    /// A decode pass of a model with grouped key/value heads and no
    /// projection biases leaves its attention norms' outputs untruncated,
    /// for the projection's truncation to take; prefills, GPT-2 (whose
    /// projection is three times its width) and Gemma 3 (sandwich norms,
    /// not folded) truncate them.
    #[test]
    fn decode_passes_leave_the_attention_norm_to_the_projection() {
        let cases = [
            ("tiny-llama", true),
            ("tiny-gpt2", false),
            ("tiny-gemma", false),
        ];
        for (name, wide) in cases {
            let (model, plan) = tiny_decoder(name, 2);
            for i in 0..plan.passes.len() {
                let untruncated = plan.ops[plan.pass_ops(i)]
                    .iter()
                    .flat_map(|op| op.kind.outputs())
                    .filter(|t| {
                        plan.tensors[*t]
                            .name
                            .ends_with("attention LayerNorm (untruncated)")
                    })
                    .count();
                let want = if i > 0 && wide { model.layers.len() } else { 0 };
                assert_eq!(untruncated, want, "{name} pass {i}");
            }
        }
    }

    /// A layer without biases is encoded once, whatever scales its inputs
    /// come at: a decode pass's projection takes its norm's output
    /// untruncated, at another scale than the prefill's.
    #[test]
    fn layers_without_biases_are_encoded_once() {
        let (_, plan) = tiny_decoder("tiny-llama", 2);
        let mut seen = std::collections::BTreeMap::new();
        for l in &plan.linears {
            assert!(l.b.iter().all(|v| *v == 0), "{}", l.name);
            *seen.entry(l.name.as_str()).or_insert(0) += 1;
        }
        assert!(seen.contains_key("layer 0 query/key/value"));
        assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    }

    /// Every RMSNorm after a residual takes its squares from the residual's
    /// truncation (a decoder's two norms per layer and the final one, but
    /// the first layer's first, which reads the embeddings), and nothing
    /// reads the truncations it took in; GPT-2's LayerNorms centre their
    /// rows first and keep the Beaver square. A prefill's last layer runs
    /// its last row only, so its final norm fuses too.
    ///
    /// Gemma 3's sandwich norms square the block's output itself, the
    /// truncation after its output product, and its query and key norms
    /// the query and key heads of the truncated projection: those three
    /// per layer fuse without an addend, but a prefill's last layer, whose
    /// queries come from its last row alone, squares them in a round of
    /// their own.
    #[test]
    fn residual_norms_square_in_the_truncations_round() {
        let cases = [
            ("tiny-llama", 2, 0),
            ("tiny-gemma", 2, 3),
            ("tiny-gpt2", 0, 0),
        ];
        for (name, residual_per_layer, alone_per_layer) in cases {
            let (model, plan) = tiny_decoder(name, 1);
            let layers = model.layers.len();
            for i in 0..plan.passes.len() {
                let ops = &plan.ops[plan.pass_ops(i)];
                let fused = |with_add: bool| {
                    let of = |op: &&Op| matches!(&op.kind, Kind::TruncSquare(s) if s.add.is_some() == with_add);
                    ops.iter().filter(of).count()
                };
                let last_only = usize::from(i == 0 && alone_per_layer > 0);
                let want = (
                    residual_per_layer * layers,
                    alone_per_layer * layers - last_only,
                );
                assert_eq!((fused(true), fused(false)), want, "{name} pass {i}");
            }
            // The prefill's last MLP runs its last row only.
            let mlp = format!("layer {} MLP output product", layers - 1);
            let first = plan.tensors.iter().find(|t| t.name == mlp).unwrap();
            assert_eq!(first.rows, 1, "{name}");
            let read: std::collections::HashSet<usize> =
                plan.ops.iter().flat_map(|op| op.kind.inputs()).collect();
            for op in &plan.ops {
                if let Kind::TruncSquare(step::TruncSquare {
                    x,
                    add,
                    out,
                    square,
                    ..
                }) = op.kind
                {
                    assert!(read.contains(&out) && read.contains(&square), "{name}");
                    let add = add.unwrap_or(out);
                    assert_eq!(plan.tensors[x].cols, plan.tensors[add].cols);
                }
            }
        }
    }

    /// A square fuses with the truncation and residual just before it
    /// only: not where another operation comes between, and a plan that
    /// reads a truncation a fused step took in is refused.
    #[test]
    fn only_a_truncation_and_its_residual_just_before_fuse() {
        // x, y, the truncation t of y, r = x + t, its square; `between`
        // pushes an unrelated operation before the square.
        let setup = |between: bool| {
            let (mut b, [x, y, z, t]) = three_and_a_truncation();
            let r = b
                .tensor("r", 2, 2, fixed::FRAC, Bound::uniform(2, 2.0))
                .unwrap();
            let sq = squares(&mut b, 2);
            b.push(Kind::Add { a: x, b: t, out: r });
            if between {
                b.push(Kind::Add { a: x, b: x, out: z });
            }
            b.square(r, sq);
            (b, [x, y, t, r, sq])
        };
        let (mut b, [x, y, t, r, sq]) = setup(false);
        assert_eq!(b.ops.len(), 1);
        assert!(matches!(
            b.ops[0].kind,
            Kind::TruncSquare(step::TruncSquare { x: xx, add, out, square, k: 30, shift: 12 })
                if (xx, add, out, square) == (y, Some(x), r, sq)
        ));
        let (apart, _) = setup(true);
        assert_eq!(apart.ops.len(), 4);
        assert!(matches!(apart.ops[3].kind, Kind::Square(_)));
        // A later reader of the truncation taken in.
        let late = b
            .tensor("late", 2, 2, fixed::FRAC, Bound::uniform(2, 2.0))
            .unwrap();
        b.push(Kind::Add {
            a: t,
            b: x,
            out: late,
        });
        assert!(matches!(
            check_fused(&b.tensors, &b.ops, &b.fused),
            Err(PlanError::Fused { .. })
        ));
    }

    /// A square of a truncation's own output, pushed just after it, fuses
    /// with no addend and leaves the truncation's output written (by the
    /// fused step) for later readers; a square of another tensor, or one
    /// with an operation between, does not.
    #[test]
    fn a_square_of_a_truncation_just_before_fuses_without_an_addend() {
        let setup = |between: bool, of_t: bool| {
            let (mut b, [x, y, z, t]) = three_and_a_truncation();
            let sq = squares(&mut b, 2);
            if between {
                b.push(Kind::Add { a: x, b: x, out: z });
            }
            b.square(if of_t { t } else { x }, sq);
            (b, [y, t, sq])
        };
        let (b, [y, t, sq]) = setup(false, true);
        assert_eq!(b.ops.len(), 1);
        assert!(matches!(
            b.ops[0].kind,
            Kind::TruncSquare(step::TruncSquare { x: xx, add: None, out, square, k: 30, shift: 12 })
                if (xx, out, square) == (y, t, sq)
        ));
        assert!(b.fused.is_empty());
        assert!(check_fused(&b.tensors, &b.ops, &b.fused).is_ok());
        let (apart, _) = setup(true, true);
        assert_eq!(apart.ops.len(), 3);
        assert!(matches!(apart.ops[2].kind, Kind::Square(_)));
        let (other, _) = setup(false, false);
        assert_eq!(other.ops.len(), 2);
        assert!(matches!(other.ops[1].kind, Kind::Square(_)));
    }

    /// A square of some heads of a truncation pushed just before squares
    /// the whole truncation in its round and takes the same heads of the
    /// squares; heads of anything else keep the Beaver square.
    #[test]
    fn a_square_of_a_truncations_heads_squares_it_all() {
        let setup = |of_t: bool| {
            let (mut b, [x, y, _, t]) = three_and_a_truncation();
            let h = b
                .tensor("h", 2, 1, fixed::FRAC, Bound::uniform(1, 1.0))
                .unwrap();
            let sq = squares(&mut b, 1);
            let from = if of_t { t } else { x };
            b.push(Kind::Heads {
                x: from,
                from: 0,
                heads: 1,
                out: h,
            });
            b.square(h, sq);
            (b, [y, t, h, sq])
        };
        let (b, [y, t, h, sq]) = setup(true);
        assert_eq!(b.ops.len(), 3);
        let Kind::TruncSquare(step::TruncSquare {
            x,
            add: None,
            out,
            square: all,
            ..
        }) = b.ops[0].kind
        else {
            panic!("{:?}", b.ops[0].kind);
        };
        assert_eq!((x, out), (y, t));
        assert_eq!((b.tensors[all].rows, b.tensors[all].cols), (2, 2));
        assert_eq!(b.tensors[all].scale, 2 * fixed::FRAC);
        assert!(matches!(b.ops[1].kind, Kind::Heads { x, out, .. } if (x, out) == (t, h)));
        assert!(matches!(
            b.ops[2].kind,
            Kind::Heads { x, from: 0, heads: 1, out } if (x, out) == (all, sq)
        ));
        let (other, _) = setup(false);
        assert_eq!(other.ops.len(), 3);
        assert!(matches!(other.ops[0].kind, Kind::Gate(_)));
        assert!(matches!(other.ops[2].kind, Kind::Square(_)));
    }

    static BEFORE: AtomicUsize = AtomicUsize::new(0);
    static AFTER: AtomicUsize = AtomicUsize::new(0);

    /// The binary's allocator hooks run around a fresh build, failed or
    /// not, and not for a plan that is alive. Builds run one at a time, so
    /// within one exactly one `before` is unmatched.
    #[test]
    fn build_hooks_run_around_a_fresh_build_only() {
        let count = |c: &AtomicUsize| c.load(Ordering::SeqCst);
        around_builds(
            || {
                BEFORE.fetch_add(1, Ordering::SeqCst);
            },
            || {
                AFTER.fetch_add(1, Ordering::SeqCst);
            },
        );
        let (before, after) = (count(&BEFORE), count(&AFTER));
        let failed = memoized(([7; 32], "encoder", 1, 1), || {
            assert_eq!(count(&BEFORE), count(&AFTER) + 1, "inside a build");
            Err(PlanError::EmptyShape { batch: 0, seq: 0 })
        });
        assert!(failed.is_err());
        assert!(count(&BEFORE) > before && count(&AFTER) > after);

        let model = crate::model::Model::demo();
        let plan = bert::build(&model, 1, 11).unwrap();
        let key = (model.digest(), "encoder", 1, 11);
        let again = memoized(key, || unreachable!("the plan is alive")).unwrap();
        assert!(std::sync::Arc::ptr_eq(&plan, &again));
    }
}
