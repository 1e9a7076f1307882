//! Linear layers: weights encoded at the input's scale, the product with
//! its proven output bound, and the truncation back to FRAC. Shared by the
//! encoder and the decoders; a decode pass reuses the encodings and bounds
//! of the pass before it.

use super::bound::{self, Bound, NormForm};
use super::scale::truncate;
use super::{Builder, Category, EncodedLinear, Fine, Kind, PlanError, ProductKey};
use crate::fixed::{self, FRAC, WEIGHT_FRAC, encode};
use crate::model;

/// A layer's weights as the model holds them, and what their encoding
/// folds in: attention's 1/√d_h into the first part (a fused QKV layer's
/// queries), and the gains and shifts of the norm whose output the layer
/// takes ([`Folded`]).
#[derive(Clone, Copy)]
pub(super) struct Weights<'a> {
    pub parts: &'a [&'a model::Linear],
    pub query_scale: f64,
    pub fold: Option<&'a Folded>,
    /// False where the caller adds the biases after the product's
    /// truncation ([`Weights::unbiased`]): the layer's biases encode as 0.
    pub biased: bool,
}

/// A pre-norm's per-channel gains `g` and shifts `β`, folded into the
/// layer that alone takes the norm's output `a = g⊙t + β`:
/// `a·W + b = t·(diag(g)·W) + (b + β·W)`, so the norm's output is `t`,
/// which carries no gains and so no gains' fraction bits
/// (`norm::normalize_folded`).
pub(super) struct Folded {
    pub gain: Vec<f64>,
    pub shift: Vec<f64>,
}

impl<'a> Weights<'a> {
    /// The parts with only 1/√d_h (`query_scale`) folded in.
    pub(super) fn new(parts: &'a [&'a model::Linear], query_scale: f64) -> Self {
        Weights {
            parts,
            query_scale,
            fold: None,
            biased: true,
        }
    }

    /// With a norm's gains and shifts folded in as well.
    pub(super) fn folding(self, fold: Option<&'a Folded>) -> Self {
        Weights { fold, ..self }
    }

    /// The same weights with their biases left out of the encoding: the
    /// caller adds [`Weights::biases`] after the product's truncation.
    pub(super) fn unbiased(self) -> Self {
        Weights {
            biased: false,
            ..self
        }
    }

    fn inputs(&self) -> usize {
        self.parts.first().map_or(0, |p| p.inputs)
    }

    fn outputs(&self) -> usize {
        self.parts.iter().map(|p| p.outputs).sum()
    }

    /// Attention's 1/√d_h multiplies part 0 (the queries of a fused QKV
    /// layer).
    fn part_scale(&self, part: usize) -> f64 {
        if part == 0 { self.query_scale } else { 1.0 }
    }

    /// The weights, `[inputs × outputs]`, parts side by side, encoded
    /// at `frac` (one real at a time: an LM head's reals would be a
    /// gigabyte).
    fn encoded(&self, frac: u32) -> Vec<u64> {
        let (inputs, outputs) = (self.inputs(), self.outputs());
        let mut w = vec![0u64; inputs * outputs];
        let mut col = 0;
        for (pi, p) in self.parts.iter().enumerate() {
            let s = self.part_scale(pi);
            let gain = |i: usize| self.fold.map_or(1.0, |f| f.gain[i]);
            p.w.for_each_weight(p.outputs, |i, j, v| {
                w[i * outputs + col + j] = encode(f64::from(v) * s * gain(i), frac);
            });
            col += p.outputs;
        }
        w
    }

    /// The real biases, parts side by side, the folded shifts' product
    /// added.
    pub(super) fn biases(&self) -> Vec<f64> {
        let mut bias = Vec::with_capacity(self.outputs());
        for (pi, p) in self.parts.iter().enumerate() {
            let s = self.part_scale(pi);
            // The weights are read (a stored matrix dequantized) only
            // where some shift is not 0.
            let shifts = self
                .fold
                .is_some_and(|f| f.shift.iter().any(|beta| *beta != 0.0));
            let pw = shifts.then(|| p.w.values());
            let weight = |i: usize, j: usize| pw.as_deref().map_or(0.0, |w| w[i * p.outputs + j]);
            let shifted = |j: usize| -> f64 {
                self.fold.map_or(0.0, |f| {
                    f.shift
                        .iter()
                        .enumerate()
                        .filter(|(_, beta)| **beta != 0.0)
                        .map(|(i, beta)| beta * f64::from(weight(i, j)))
                        .sum()
                })
            };
            bias.extend(
                p.b.iter()
                    .enumerate()
                    .map(|(j, v)| (f64::from(*v) + shifted(j)) * s),
            );
        }
        bias
    }
}

/// Encodes a linear layer for an input at `in_scale`.
pub(super) fn encode_linear(name: String, w: Weights<'_>, in_scale: u32) -> EncodedLinear {
    EncodedLinear {
        name,
        inputs: w.inputs(),
        outputs: w.outputs(),
        w: w.encoded(WEIGHT_FRAC),
        b: encode_bias(w, in_scale + WEIGHT_FRAC),
        bias_scale: in_scale + WEIGHT_FRAC,
        id: [0; 16],
        fine: None,
    }
}

/// The layer's words at `keep` more fraction bits than [`encode_linear`]'s
/// ([`Fine`]), for an input at `in_scale`.
pub(super) fn encode_fine(w: Weights<'_>, in_scale: u32, keep: u32) -> Fine {
    Fine {
        keep,
        w: w.encoded(WEIGHT_FRAC + keep),
        b: encode_bias(w, in_scale + WEIGHT_FRAC + keep),
    }
}

/// The biases at `bias_scale` (the input's scale plus the weights'): the
/// one part of an encoding that depends on the input's scale.
fn encode_bias(w: Weights<'_>, bias_scale: u32) -> Vec<u64> {
    if !w.biased {
        return vec![0; w.outputs()];
    }
    w.biases()
        .into_iter()
        .map(|v| encode(v, bias_scale))
        .collect()
}

/// A layer as its bounds read it: the weights' words, decoded where they
/// are read, and the biases (at `bias_scale`) as reals.
pub(super) fn for_bounds<'a>(
    words: &'a [u64],
    bias: &[u64],
    bias_scale: u32,
) -> (bound::Words<'a>, Vec<f64>) {
    let w = bound::Words {
        words,
        frac: WEIGHT_FRAC,
    };
    (
        w,
        bias.iter().map(|v| fixed::decode(*v, bias_scale)).collect(),
    )
}

/// `x·W + b` followed by the truncation back to FRAC; returns the output
/// and the linear layer's index. An input above FRAC (a spline output,
/// attention outputs) is multiplied as it is when the product still fits, so
/// one truncation rescales both; otherwise it is truncated first. `norm`
/// describes a LayerNorm-output input for a tighter bound.
pub(super) fn linear_to_frac(
    b: &mut Builder,
    x: usize,
    norm: Option<&NormForm>,
    name: String,
    w: Weights<'_>,
    group: usize,
    layer: usize,
) -> Result<(usize, usize), PlanError> {
    let (y, linear) = linear_product(b, x, norm, name.clone(), w, group, layer)?;
    b.at(Category::Truncation, Some(layer));
    Ok((truncate(b, y, FRAC, name)?, linear))
}

/// `x·W + b` at the product's scale, without the truncation: see
/// [`linear_to_frac`]. A layer already encoded in this plan at the same
/// scale (an earlier decode pass) is reused, not encoded again.
pub(super) fn linear_product(
    b: &mut Builder,
    x: usize,
    norm: Option<&NormForm>,
    name: String,
    weights: Weights<'_>,
    group: usize,
    layer: usize,
) -> Result<(usize, usize), PlanError> {
    let bound_of = |b: &Builder, xb: &Bound, enc: &Enc| product_bound(b, xb, enc, norm, group);
    let xi = b.info(x).clone();
    let unbiased = !weights.biased;
    if let Some(done) = reuse(b, (x, unbiased), &name, norm, group, layer)? {
        return Ok(done);
    }
    let fits = |out: &Bound, scale: u32| bound::width(out.max_abs(), scale + WEIGHT_FRAC) <= 62;
    let enc = encoded(b, &name, weights, xi.scale);
    let out = bound_of(b, &xi.bound, &enc);
    let (mut x, mut enc, mut out) = (x, enc, out);
    // Where the product does not fit the ring at the input's scale, the
    // input is truncated first: to the scale `rescale_to` picks, and, in
    // the rare case that the truncation's rounding then breaks the fit, on
    // to FRAC.
    let mut to = rescale_to(xi.scale, xi.cols, out.cols(), out.max_abs());
    while !fits(&out, b.info(x).scale) && b.info(x).scale > FRAC {
        if let Enc::New(unused) = enc {
            // The next decode pass tries this scale again.
            b.keep_memo(unused);
        }
        b.at(Category::Truncation, Some(layer));
        x = truncate(b, x, to, format!("{} (rescaled)", xi.name))?;
        let ti = b.info(x).clone();
        enc = encoded(b, &name, weights, ti.scale);
        out = bound_of(b, &ti.bound, &enc);
        to = FRAC;
    }
    b.at(Category::Linear, Some(layer));
    push_product(b, (x, enc, out), &name, (norm, group), unbiased)
}

/// The bound of `x·W + b` for an input bounded by `xb`: the plain
/// product's, or, for a norm's output, the tighter of it and the bound
/// through the norm's form.
fn product_bound(
    b: &Builder,
    xb: &Bound,
    enc: &Enc,
    norm: Option<&NormForm>,
    group: usize,
) -> Bound {
    let (words, bias, bias_scale, outputs) = enc.parts(b);
    let (w, bias) = for_bounds(words, bias, bias_scale);
    let plain = bound::linear(xb, &w, &bias, outputs, group);
    match norm {
        Some(nf) => plain.min(&bound::linear_from_norm(nf, &w, &bias, outputs, group)),
        None => plain,
    }
}

/// Pushes the product `x·W + b` of the layer `enc` (encoded now if it is
/// new), its output bounded by `out` and remembered for later passes;
/// returns the product and the layer's index.
fn push_product(
    b: &mut Builder,
    (x, enc, out): (usize, Enc, Bound),
    name: &str,
    (norm, group): (Option<&NormForm>, usize),
    unbiased: bool,
) -> Result<(usize, usize), PlanError> {
    let rows = b.info(x).rows;
    let scale = b.info(x).scale + WEIGHT_FRAC;
    let linear = match materialize(b, enc) {
        Enc::Built(i) => i,
        Enc::New(enc) => b.linear_layer(enc),
        Enc::Rebias { .. } => unreachable!("materialize encodes a rebias whole"),
    };
    let outputs = b.linear_ref(linear).outputs;
    let key = product_key(name, scale, &b.info(x).bound, norm, group);
    b.remember_product(key, out.clone());
    let y = b.tensor(format!("{name} product"), rows, outputs, scale, out)?;
    b.push(Kind::Linear {
        x,
        linear,
        rope: None,
        unbiased,
        out: y,
    });
    Ok((y, linear))
}

/// The scale a linear layer's input (at `scale`, `cols` wide) is
/// truncated to when the product, bounded by `max_abs`, does not fit the
/// ring at the input's scale. A truncation's key is a comparison over the
/// bits it drops (about 16 bytes a bit), and the caller truncates the
/// product to FRAC afterwards: the bits the input keeps above FRAC are
/// dropped again from the product. So where the input is wider than the product (a gated
/// MLP's 1,536 products into its 576 outputs), it keeps as many bits as
/// the ring allows (one bit of margin for the truncation's rounding), and
/// the wide tensor's truncation drops fewer bits: SmolLM2's 1,536 gated
/// products go from 2^-48 to 2^-28…2^-30 instead of 2^-12 (18–20 bits
/// dropped instead of 36), and its 576 outputs drop 28–30 bits instead of
/// 12. Otherwise FRAC, as before.
fn rescale_to(scale: u32, cols: usize, outputs: usize, max_abs: f64) -> u32 {
    if cols <= outputs {
        return FRAC;
    }
    (FRAC + 1..scale)
        .rev()
        .find(|s| bound::width(max_abs, s + WEIGHT_FRAC) <= 61)
        .unwrap_or(FRAC)
}

/// A decode pass repeats the layers of the pass before it on inputs with
/// the same bounds: the layer's encoding and its output bound (a pass
/// over every weight) are reused, not recomputed. `None` when either is
/// new.
fn reuse(
    b: &mut Builder,
    (x, unbiased): (usize, bool),
    name: &str,
    norm: Option<&NormForm>,
    group: usize,
    layer: usize,
) -> Result<Option<(usize, usize)>, PlanError> {
    let xi = b.info(x);
    let (rows, scale) = (xi.rows, xi.scale + WEIGHT_FRAC);
    let key = product_key(name, scale, &xi.bound, norm, group);
    let found = match unbiased {
        true => b.find_linear_named(name),
        false => b.find_linear(name, scale),
    };
    let (Some(linear), Some(out)) = (found, b.remembered_product(&key)) else {
        return Ok(None);
    };
    let outputs = b.linear_ref(linear).outputs;
    b.at(Category::Linear, Some(layer));
    let y = b.tensor(format!("{name} product"), rows, outputs, scale, out)?;
    b.push(Kind::Linear {
        x,
        linear,
        rope: None,
        unbiased,
        out: y,
    });
    Ok(Some((y, linear)))
}

/// What a linear layer's output bound depends on: the layer, the
/// product's scale, the grouping, and every real of the input's bound and
/// norm form (compared exactly, so a reused bound is the one that would be
/// computed).
fn product_key(
    name: &str,
    scale: u32,
    xb: &Bound,
    norm: Option<&NormForm>,
    group: usize,
) -> ProductKey {
    let reals = xb.abs.iter().chain(&xb.l2);
    let form = norm
        .into_iter()
        .flat_map(|f| f.gain.iter().chain(&f.shift).chain([&f.zeta, &f.delta]));
    ProductKey {
        name: name.to_string(),
        scale,
        groups: (group, xb.group, norm.is_some()),
        reals: reals.chain(form).map(|v| v.to_bits()).collect(),
    }
}

/// A linear layer for [`linear_product`]: already in the plan, or
/// encoded and not yet added (it may turn out to be at the wrong scale),
/// or another scale's encoding of it with this scale's bias: its weights
/// are the same at every scale, which is all a bound needs, and it is
/// encoded whole ([`materialize`]) only if it is used.
enum Enc {
    Built(usize),
    New(EncodedLinear),
    Rebias {
        from: Source,
        b: Vec<u64>,
        bias_scale: u32,
    },
}

/// Where a [`Enc::Rebias`] finds the weights: a layer of this plan, or an
/// earlier build's encoding not yet taken (its index is good until the
/// next `take_memo`).
#[derive(Clone, Copy)]
enum Source {
    Built(usize),
    Memo(usize),
}

impl Enc {
    /// The weights, the bias, its scale and the output count.
    fn parts<'e>(&'e self, b: &'e Builder) -> (&'e [u64], &'e [u64], u32, usize) {
        let whole = |l: &'e EncodedLinear| (&l.w[..], &l.b[..], l.bias_scale, l.outputs);
        match self {
            Enc::Built(i) => whole(b.linear_ref(*i)),
            Enc::New(l) => whole(l),
            Enc::Rebias {
                from,
                b: bias,
                bias_scale,
            } => {
                let l = match from {
                    Source::Built(i) => b.linear_ref(*i),
                    Source::Memo(j) => b.memo_ref(*j),
                };
                (&l.w[..], &bias[..], *bias_scale, l.outputs)
            }
        }
    }
}

/// A [`Enc::Rebias`] encoded whole: an earlier build's encoding taken and
/// given the new bias (its weights move), or a copy of this plan's layer
/// with it. Other encodings as they are.
fn materialize(b: &mut Builder, enc: Enc) -> Enc {
    let Enc::Rebias {
        from,
        b: bias,
        bias_scale,
    } = enc
    else {
        return enc;
    };
    let mut l = match from {
        Source::Memo(j) => b.take_memo_at(j),
        Source::Built(i) => b.linear_ref(i).clone(),
    };
    l.b = bias;
    l.bias_scale = bias_scale;
    // Its words at more fraction bits carry the old bias's scale.
    l.fine = None;
    Enc::New(l)
}

/// The layer `name` encoded for an input at `in_scale`: from this plan,
/// from an earlier pass's memo, or encoded now.
fn encoded(b: &mut Builder, name: &str, w: Weights<'_>, in_scale: u32) -> Enc {
    let scale = in_scale + WEIGHT_FRAC;
    if let Some(i) = b.find_linear(name, scale) {
        return Enc::Built(i);
    }
    // A layer without a bias is the same words at every scale: one copy
    // serves every input scale (a decode pass's projection takes its norm's
    // output untruncated, `decoder.rs` `attention_norm_output`; a copy per
    // scale held SmolLM2's query/key/value weights twice). So is a layer
    // whose product leaves its biases out (`Kind::Linear`'s `unbiased`).
    if let Some(i) = b.find_linear_named(name)
        && (!w.biased || b.linear_ref(i).b.iter().all(|v| *v == 0))
    {
        return Enc::Built(i);
    }
    if let Some(l) = b.take_memo(name, scale) {
        return Enc::New(l);
    }
    let from = b
        .find_linear_named(name)
        .map(Source::Built)
        .or_else(|| b.find_memo_named(name).map(Source::Memo));
    match from {
        Some(from) => Enc::Rebias {
            from,
            b: encode_bias(w, scale),
            bias_scale: scale,
        },
        None => Enc::New(encode_linear(name.to_string(), w, in_scale)),
    }
}

/// A pre-norm's output, its form for bounds, and the gains the layer
/// after it folds in (`norm::normalize_folded`).
pub(super) type Normed<'a> = (usize, &'a NormForm, Option<&'a Folded>);

/// Columns `from..from + count·dh` of `x` as `[count·rows × dh]`.
pub(super) fn heads(
    b: &mut Builder,
    x: usize,
    from: usize,
    count: usize,
    dh: usize,
    name: String,
) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    let cols = &xi.bound.abs[from..from + count * dh];
    let abs: Vec<f64> = (0..dh)
        .map(|c| (0..count).map(|h| cols[h * dh + c]).fold(0.0, f64::max))
        .collect();
    let l2 = if xi.bound.group == dh && from.is_multiple_of(dh) {
        (0..count)
            .map(|h| xi.bound.group_l2(from / dh + h))
            .fold(0.0, f64::max)
    } else {
        f64::INFINITY
    };
    let mut hb = Bound::from_abs(abs, dh);
    hb.l2[0] = hb.l2[0].min(l2);
    let out = b.tensor(name, count * xi.rows, dh, xi.scale, hb)?;
    b.push(Kind::Heads {
        x,
        from,
        heads: count,
        out,
    });
    Ok(out)
}
