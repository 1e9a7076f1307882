//! The plan of a causal decoder generating text: one pass for the prefill
//! of the padded prompt, then one pass per decode step (see
//! [`super::Pass`]). Per block (pre-norm):
//!
//! ```text
//! n    = norm₁(x)                          RMSNorm (Llama) or LayerNorm (GPT-2)
//! qkv  = trunc(rope(n·[Wq/√d_h | Wk | Wv]))   one product, RoPE on the product, one truncation
//! K, V = cache ++ k, v                     the KV cache: shares kept across passes
//! a    = attend(q, repeat(K), repeat(V))   grouped-query heads share K, V; causal in the prefill
//! x    = x + trunc(merge(a)·Wo)
//! n    = norm₂(x)
//! x    = x + trunc(trunc(SiLU(n·Wg) ⊙ n·Wu)·Wd)   Llama: one Beaver product
//! x    = x + trunc(GeLU(trunc(n·W1 + b1))·W2 + b2) GPT-2
//! ```
//!
//! The logits of the pass's last row, `final_norm(x)·Wₕ`, go back to the
//! client at scale 2·FRAC, untruncated.
//!
//! **Padding.** Prompts are left-padded to the bucket length P, so the
//! last prompt token always sits in slot P − 1 and decode step t in slot
//! P + t − 1: every position the servers use is public. Padded keys carry
//! the secret bias −C (as in BERT), which puts their exponents in nExp's
//! zero tail. RoPE scores depend on relative positions only, so shifting
//! the prompt right changes nothing but rounding; GPT-2's learned
//! positions are added by the client, which knows the real positions.

use std::sync::Arc;

use super::attention::{self, Heads};
use super::bound::{Bound, NormForm};
use super::linear::{Folded, Normed, Weights, encode_fine, heads, linear_product, linear_to_frac};
use super::mlp;
use super::norm::{Output, normalize, normalize_folded, normalize_stacked};
use super::scale::{truncate, ulp};
use super::{Builder, Category, Finish, Inputs, Kind, Plan, PlanError, RopeTables};
use crate::fixed::{FRAC, WEIGHT_FRAC, encode};
use crate::model::{Architecture, Decoder, DecoderConfig, DecoderLayer, Norm, RopeStyle};
use suffuse_core::gate::splines;

/// Fraction bits of RoPE's cos/sin tables.
pub const ROPE_FRAC: u32 = 16;

/// Fraction bits a rotated weight keeps beyond WEIGHT_FRAC where RoPE is
/// folded into the weights ([`RopeTables::keep`]): the layer is encoded
/// again at WEIGHT_FRAC + ROPE_KEEP ([`super::Fine`]) and each rotated
/// word rounded to that scale, so the folded weights are off by about
/// 2^-16 where the layer's own are off by 2^-13, and the truncation after
/// the product drops 16 bits instead of 28. Rotating the layer's own
/// words and rounding them to WEIGHT_FRAC (16 bits saved) doubled their
/// error, and Qwen2.5-Coder's teacher-forced top-1 on HumanEval/0 fell to
/// 165 of 167, under its 99 % bar.
pub const ROPE_KEEP: u32 = 4;

/// The shape of a generation: the prompt bucket and the decode passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Generation {
    /// Padded prompt length P.
    pub prompt: usize,
    /// Decode passes after the prefill (new tokens − 1).
    pub steps: usize,
}

/// The public prompt bucket for a prompt of `len` tokens: the next power
/// of two from 8 on (8, 16, 32, …), capped at `max`.
pub fn bucket(len: usize, max: usize) -> usize {
    len.max(8).next_power_of_two().min(max)
}

/// Builds (or reuses) the plan of a generation.
pub fn build(model: &Decoder, g: Generation) -> Result<Arc<Plan>, PlanError> {
    let digest = model.digest();
    super::memoized((digest, "generation", g.prompt, g.steps), || {
        build_uncached(model, digest, g, Head::LastRow)
    })
}

/// Builds (or reuses) the plan that scores a text of `bucket` tokens: the
/// prefill alone, with the logits of every row instead of the last one.
/// Row `i` holds what a generation would predict after the first `i + 1`
/// slots, so one pass gives a teacher-forced run over the whole text (the
/// accuracy tests run it in the reference; the servers could run it too).
pub fn build_scoring(model: &Decoder, bucket: usize) -> Result<Arc<Plan>, PlanError> {
    let digest = model.digest();
    let g = Generation {
        prompt: bucket,
        steps: 0,
    };
    super::memoized((digest, "scoring", bucket, 0), || {
        build_uncached(model, digest, g, Head::EveryRow)
    })
}

/// Which rows the LM head reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Head {
    /// The pass's last row: the next token's logits.
    LastRow,
    /// Every row.
    EveryRow,
}

fn build_uncached(
    model: &Decoder,
    digest: [u8; 32],
    g: Generation,
    rows: Head,
) -> Result<Plan, PlanError> {
    let cfg = &model.config;
    if g.prompt == 0 {
        return Err(PlanError::EmptyShape {
            batch: 1,
            seq: g.prompt,
        });
    }
    if g.prompt + g.steps > cfg.max_positions {
        return Err(PlanError::SequenceTooLong {
            seq: g.prompt + g.steps,
            max: cfg.max_positions,
        });
    }
    // Plan once to learn the score bounds, then with the padding bias
    // beyond them (as for BERT).
    let (first, scores) = plan_with(model, digest, g, rows, 0.0, Builder::default())?;
    let cutoff = splines::NEXP.pieces.last().map_or(16.0, |p| p.hi);
    let c = (2.0 * scores + cutoff + 1.0).log2().ceil().exp2();
    let memo = Builder::with_memo(first.linears, Default::default());
    Ok(plan_with(model, digest, g, rows, c, memo)?.0)
}

/// Per layer, the key and value cache tensors.
type Cache = Vec<(usize, usize)>;

fn plan_with(
    model: &Decoder,
    digest: [u8; 32],
    g: Generation,
    head_rows: Head,
    c: f64,
    mut b: Builder,
) -> Result<(Plan, f64), PlanError> {
    let cfg = &model.config;
    let d = cfg.hidden;
    let x_bound = embedding_bound(model);
    let mut cache: Cache = Vec::new();
    let mut scores = 0.0f64;
    let mut first = None;
    let mut output = 0;
    let head_w = model.head();
    for pass in 0..=g.steps {
        let site = PassSite {
            pass,
            g,
            head: (&head_w, head_rows),
            c,
            x_bound: &x_bound,
        };
        let (inputs, out, s) = plan_pass(&mut b, model, &site, &mut cache)?;
        first.get_or_insert(inputs);
        output = out;
        scores = scores.max(s);
    }
    let (x, bias) = first.unwrap_or_default();
    let plan = b.finish(
        &model.name,
        digest,
        1,
        g.prompt,
        d,
        Inputs {
            x,
            bias,
            mask: None,
        },
        output,
        encode(-c, FRAC),
        Finish::AsIs,
        false,
    )?;
    Ok((plan, scores))
}

/// What a pass of a generation is planned from: its index, the
/// generation's shape, the LM head and the rows it reads, the padding
/// constant and the embeddings' bound.
struct PassSite<'a> {
    pass: usize,
    g: Generation,
    head: (&'a crate::model::Linear, Head),
    c: f64,
    x_bound: &'a Bound,
}

/// One pass: its embeddings and key bias, every block over the cache, the
/// LM head. Returns the pass's inputs, its output and its worst score.
fn plan_pass(
    b: &mut Builder,
    model: &Decoder,
    site: &PassSite<'_>,
    cache: &mut Cache,
) -> Result<((usize, usize), usize, f64), PlanError> {
    let PassSite {
        pass,
        g,
        head: (head_w, head_rows),
        c,
        ..
    } = *site;
    let d = model.config.hidden;
    let (rows, ctx) = if pass == 0 {
        (g.prompt, g.prompt)
    } else {
        (1, g.prompt + pass)
    };
    b.at(Category::Linear, None);
    let x = b.tensor(
        format!("pass {pass} embeddings"),
        rows,
        d,
        FRAC,
        site.x_bound.clone(),
    )?;
    let bias = b.tensor(
        format!("pass {pass} key bias"),
        1,
        ctx,
        FRAC,
        Bound::uniform(ctx, c),
    )?;
    b.begin_pass(x, bias);
    let at = Position {
        first: ctx - rows,
        rows,
        ctx,
        last_only: false,
    };
    let mut h = x;
    let mut scores = 0.0f64;
    for (l, layer) in model.layers.iter().enumerate() {
        let last = l + 1 == model.layers.len() && head_rows == Head::LastRow;
        let at = at.last_only(last);
        let (out, s) = block(b, model, l, layer, h, bias, c, at, cache)?;
        h = out;
        scores = scores.max(s);
    }
    let out_rows = b.info(h).rows;
    let output = head(b, model, head_w, h, out_rows, head_rows)?;
    b.end_pass(output);
    Ok(((x, bias), output, scores))
}

/// Where a pass's rows sit: slots `first..first + rows` of a context of
/// `ctx` keys; with `last_only`, a block whose output only the LM head's
/// last row reads (a generation's last layer).
#[derive(Clone, Copy, Debug)]
struct Position {
    first: usize,
    rows: usize,
    ctx: usize,
    last_only: bool,
}

impl Position {
    /// This position for a block that computes its queries, attention and
    /// MLP for the last row only, where `last` and the pass has several
    /// rows: the keys and values of every row still join the cache, and
    /// the rest of the block's rows would go unread.
    fn last_only(self, last: bool) -> Position {
        Position {
            last_only: last && self.rows > 1,
            ..self
        }
    }

    /// Rows whose queries the block computes.
    fn queries(&self) -> usize {
        if self.last_only { 1 } else { self.rows }
    }

    /// Where those rows sit.
    fn query_position(self) -> Position {
        let rows = self.queries();
        Position {
            first: self.first + self.rows - rows,
            rows,
            last_only: false,
            ..self
        }
    }
}

/// The client's inputs: any token's embedding (plus any learned position),
/// encoded at FRAC.
fn embedding_bound(model: &Decoder) -> Bound {
    let d = model.config.hidden;
    let (mut abs, mut l2) = col_max(d, |f| model.embed.for_each_row(d, f));
    if let Some(scale) = model.config.block.embed_scale {
        let scale = f64::from(scale.abs());
        abs.iter_mut().for_each(|a| *a *= scale);
        l2 *= scale;
    }
    if let Some(p) = &model.positions {
        let (pa, pl) = col_max(d, |f| p.chunks_exact(d.max(1)).for_each(f));
        for (a, b) in abs.iter_mut().zip(pa) {
            *a += b;
        }
        l2 += pl;
    }
    // f32 sums and the encoding's rounding.
    let slack = |v: f64| v * (1.0 + 1e-6) + ulp(FRAC);
    let mut bound = Bound::from_abs(abs.into_iter().map(slack).collect(), d);
    bound.l2[0] = bound.l2[0].min(slack(l2) + (d as f64).sqrt() * ulp(FRAC));
    bound
}

/// Each of `d` columns' largest magnitude and the largest row norm, over
/// the rows `table` hands on.
fn col_max(d: usize, table: impl FnOnce(&mut dyn FnMut(&[f32]))) -> (Vec<f64>, f64) {
    let mut abs = vec![0.0f64; d];
    let mut l2 = 0.0f64;
    table(&mut |row: &[f32]| {
        let mut n = 0.0;
        for (a, v) in abs.iter_mut().zip(row) {
            let v = f64::from(v.abs());
            *a = a.max(v);
            n += v * v;
        }
        l2 = l2.max(n.sqrt());
    });
    (abs, l2)
}

/// Where a block's attention pre-norm puts its output. In a decode pass
/// of a model with grouped key/value heads, untruncated
/// ([`Output::Wide`]): the query/key/value truncation after the product
/// drops the norm's bits with its own, and the norm's own truncation (2
/// rounds per layer) goes. The projection is wider than the norm (960
/// against 576 in SmolLM2, 1,152 against 896 in Qwen2), so its truncation's
/// extra bits cost more key bytes than the norm's did: about 0.1 MB per
/// round saved in SmolLM2's decode token (docs/DECODERS.md). GPT-2's
/// projection is three times its width, so there the round would cost
/// more than twice as much, and prefills, whose rows are many, keep the
/// truncation too. A projection with biases (Qwen2) then leaves them out
/// of its words (at the norm's full scale they would pass the 44-bit words
/// that RoPE's fold takes, [`RopeTables::WORD_BITS`]) and adds them after
/// its truncation, turned for the pass's position ([`add_turned_bias`]):
/// so its pass must hold one position, one row.
fn attention_norm_output(
    b: &Builder,
    cfg: &DecoderConfig,
    layer: &DecoderLayer,
    at: Position,
) -> Output {
    let projection = cfg.heads * cfg.head_dim + 2 * cfg.kv_width();
    let parts = [&layer.query, &layer.key, &layer.value];
    let unbiased = parts.iter().all(|p| p.b.iter().all(|v| *v == 0.0));
    let placed = unbiased || (at.rows == 1 && cfg.architecture == Architecture::Llama);
    if b.decoding() && placed && projection <= 2 * cfg.hidden {
        Output::Wide
    } else {
        Output::Frac
    }
}

/// One pre-norm block; returns its output and its score bound.
#[allow(clippy::too_many_arguments)]
fn block(
    b: &mut Builder,
    model: &Decoder,
    l: usize,
    layer: &DecoderLayer,
    x: usize,
    bias: usize,
    c: f64,
    at: Position,
    cache: &mut Cache,
) -> Result<(usize, f64), PlanError> {
    let cfg = &model.config;
    let centre = cfg.architecture == Architecture::Gpt2;
    let name = format!("layer {l} attention");
    let output = attention_norm_output(b, cfg, layer, at);
    let norm = (&layer.attn_norm, name);
    let (n1, n1_form, n1_fold) = pre_norm(b, layer, x, norm, l, (centre, output))?;
    let (window, theta) = cfg.attention_of(l);
    let n1 = (n1, &n1_form, n1_fold.as_ref());
    let wide = output == Output::Wide && layer.post_norms.is_none();
    let (q, k, v) = projections(b, model, (l, theta), layer, (n1, wide), at)?;
    let (kc, vc) = cached(b, cache, (k, v), cfg.kv_heads, l)?;
    let kv = (q, kc, vc);
    let (om, score_abs) = self_attention(b, cfg, kv, (bias, c), (at, window), l)?;
    // The residual's rows, taken before the truncation that the norm's
    // square fuses with.
    let x = match at.last_only {
        true => last_row(b, x, format!("layer {l} input (last row)"))?,
        false => x,
    };
    let post = layer.post_norms.as_ref();
    let what = (format!("layer {l} attention output"), l);
    let a = block_output(
        b,
        om,
        (&layer.attn_out, cfg.hidden),
        post.map(|p| &p.0),
        what,
    )?;
    let x1 = residual(b, x, a, format!("layer {l} attention residual"), l)?;
    let name = format!("layer {l} MLP");
    let norm = (&layer.mlp_norm, name);
    let (n2, n2_form, n2_fold) = pre_norm(b, layer, x1, norm, l, (centre, Output::Frac))?;
    let h = mlp::decoder_mlp(b, model, l, layer, (n2, &n2_form, n2_fold.as_ref()))?;
    let what = (format!("layer {l} MLP output"), l);
    let f = block_output(b, h, (&layer.down, cfg.hidden), post.map(|p| &p.1), what)?;
    let x2 = residual(b, x1, f, format!("layer {l} MLP residual"), l)?;
    Ok((x2, score_abs))
}

/// The layer's cached keys and values with this pass's rows `(k, v)`
/// appended (the pass's own rows where the cache is empty), recorded as
/// the cache for the next pass.
fn cached(
    b: &mut Builder,
    cache: &mut Cache,
    (k, v): (usize, usize),
    kv_heads: usize,
    l: usize,
) -> Result<(usize, usize), PlanError> {
    let (kc, vc) = match cache.get(l) {
        Some(&(kp, vp)) => (
            append(b, kp, k, kv_heads, l, "keys")?,
            append(b, vp, v, kv_heads, l, "values")?,
        ),
        None => (k, v),
    };
    if l < cache.len() {
        cache[l] = (kc, vc);
    } else {
        cache.push((kc, vc));
    }
    Ok((kc, vc))
}

/// The queries `q` attending to the cached keys and values `(kc, vc)`
/// (grouped heads repeated), the heads' outputs merged back into rows;
/// returns them (at the attention's output scale) and the score bound.
fn self_attention(
    b: &mut Builder,
    cfg: &DecoderConfig,
    (q, kc, vc): (usize, usize, usize),
    (bias, c): (usize, f64),
    (at, window): (Position, Option<usize>),
    l: usize,
) -> Result<(usize, f64), PlanError> {
    let groups = cfg.heads / cfg.kv_heads;
    let kr = repeat(b, kc, cfg.kv_heads, groups)?;
    let vr = repeat(b, vc, cfg.kv_heads, groups)?;
    let score_max = b.info(q).bound.row_l2() * b.info(kr).bound.row_l2();
    let heads = Heads {
        q,
        k: kr,
        v: vr,
        blocks: cfg.heads,
        queries: at.queries(),
        keys: at.ctx,
        causal: at.queries() > 1,
        window,
        positions: cfg.max_positions,
    };
    let (o, score_abs) = attention::attend(b, heads, score_max, bias, c, l)?;
    b.at(Category::Linear, Some(l));
    let oi = b.info(o).clone();
    let width = cfg.heads * cfg.head_dim;
    let mut merged = Bound::from_abs(
        (0..width).map(|j| oi.bound.abs[j % cfg.head_dim]).collect(),
        cfg.head_dim,
    );
    for g in &mut merged.l2 {
        *g = g.min(oi.bound.row_l2());
    }
    let om = b.tensor(
        format!("layer {l} attention"),
        at.queries(),
        width,
        oi.scale,
        merged,
    )?;
    b.push(Kind::Unheads {
        x: o,
        heads: cfg.heads,
        out: om,
    });
    Ok((om, score_abs))
}

/// The last row of `x`.
fn last_row(b: &mut Builder, x: usize, name: String) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    b.rows(x, (xi.rows - 1, 1), xi.bound, name)
}

/// A block's pre-norm, its gains folded into the layer after it
/// ([`normalize_folded`]), except in a block with sandwich norms
/// (Gemma 3): there a norm rescales the block's output to unit RMS, so a
/// row whose products are nearly silent carries their absolute error up
/// with it (see [`block_output`]), and the folded weights' rounding is
/// such an error. With Gemma 3's norms folded, its logits' largest
/// difference from the float oracle's top 32 went from at most 0.13 to
/// 0.43 and its teacher-forced passage to 46 of 48.
fn pre_norm(
    b: &mut Builder,
    layer: &DecoderLayer,
    x: usize,
    (norm, name): (&Norm, String),
    l: usize,
    (centre, output): (bool, Output),
) -> Result<(usize, NormForm, Option<Folded>), PlanError> {
    if layer.post_norms.is_some() {
        let (out, form) = normalize(b, x, norm, name, l, centre)?;
        return Ok((out, form, None));
    }
    let (out, form, folded) = normalize_folded(b, x, norm, (name, l), centre, output)?;
    Ok((out, form, Some(folded)))
}

/// `out = x + a` at FRAC.
fn residual(
    b: &mut Builder,
    x: usize,
    a: usize,
    name: String,
    l: usize,
) -> Result<usize, PlanError> {
    b.at(Category::LayerNorm, Some(l));
    let xi = b.info(x).clone();
    let d = xi.cols;
    let bound = xi.bound.regroup(d).add(&b.info(a).bound.regroup(d));
    let out = b.tensor(name, xi.rows, d, FRAC, bound)?;
    b.push(Kind::Add { a: x, b: a, out });
    Ok(out)
}

/// Fraction bits of a block's output that a sandwich norm takes. At FRAC,
/// Gemma 3's MLP outputs lose their relative precision: the first row's
/// falls to an RMS of 8·10⁻⁵ by layer 14 (a third of an ulp at 2^-12), the
/// others' to 0.05–0.1, and the norm's gains (up to 1,657) multiply what
/// is left. At 2^-18 the norm still takes rows up to ‖y‖ ≈ 2.8·10³
/// ([`normalize`]'s checked capacity; 235 is the largest seen).
const POST_NORM_FRAC: u32 = 18;

/// A block's output `x·W` (`part`, `width` wide) at FRAC, through its
/// sandwich norm (Gemma) where it has one, which takes it at
/// [`POST_NORM_FRAC`]. There `x` too goes to the product at
/// [`POST_NORM_FRAC`] rather than FRAC: on a row whose MLP is nearly
/// silent (RMS 10⁻³ at HumanEval/109's position 407, layers 9–16), the
/// MLP output's error was 12.7 % with the GeGLU product rounded to FRAC,
/// 5.0 % at 2^-18, and 2.1 % with the fine GeLU as well; the norm carries
/// it to unit RMS.
fn block_output(
    b: &mut Builder,
    x: usize,
    (part, width): (&crate::model::Linear, usize),
    norm: Option<&crate::model::Norm>,
    (name, l): (String, usize),
) -> Result<usize, PlanError> {
    let Some(norm) = norm else {
        let (y, _) = linear_to_frac(b, x, None, name, Weights::new(&[part], 1.0), width, l)?;
        return Ok(y);
    };
    let xi = b.info(x).clone();
    let x = if xi.scale > POST_NORM_FRAC {
        b.at(Category::Truncation, Some(l));
        truncate(b, x, POST_NORM_FRAC, format!("{} (rescaled)", xi.name))?
    } else {
        x
    };
    let (y, _) = linear_product(
        b,
        x,
        None,
        name.clone(),
        Weights::new(&[part], 1.0),
        width,
        l,
    )?;
    b.at(Category::Truncation, Some(l));
    let y = truncate(b, y, POST_NORM_FRAC.min(b.info(y).scale), name.clone())?;
    let name = name.replace(" output", " out");
    Ok(normalize(b, y, norm, name, l, false)?.0)
}

/// The queries, new keys and new values of a block, split into heads
/// (`[heads·rows × d_h]`), RoPE applied (Llama family). `(l, theta)` is the
/// layer and its RoPE base. With QK-norm (Gemma 3), each query and key head
/// is normed, then rotated; otherwise RoPE rotates the product itself.
fn projections(
    b: &mut Builder,
    model: &Decoder,
    (l, theta): (usize, f32),
    layer: &DecoderLayer,
    ((n, form, fold), wide): (Normed<'_>, bool),
    at: Position,
) -> Result<(usize, usize, usize), PlanError> {
    let cfg = &model.config;
    let dh = cfg.head_dim;
    let qw = cfg.heads * dh;
    let kvw = cfg.kv_width();
    let name = format!("layer {l} query/key/value");
    let parts = [&layer.query, &layer.key, &layer.value];
    // 1/√d_h goes into the query weights, or (QK-norm) into the query
    // norm's gains, which come after the product.
    let inv_root = 1.0 / (dh as f64).sqrt();
    let query_scale = if layer.qk_norm.is_some() {
        1.0
    } else {
        inv_root
    };
    let weights = Weights::new(&parts, query_scale).folding(fold);
    // Biases after the truncation where the norm's output comes wide
    // (`attention_norm_output`): the product leaves them out, so the
    // prefill's encoding of the layer serves.
    let biases = weights.biases();
    let after = wide && biases.iter().any(|v| *v != 0.0);
    let encoded = if after { weights.unbiased() } else { weights };
    let (y, _) = linear_product(b, n, Some(form), name.clone(), encoded, dh, l)?;
    let place = Rotation {
        theta,
        at,
        heads: 1,
    };
    let turned = cfg.architecture == Architecture::Llama && layer.qk_norm.is_none();
    if turned {
        fold_rope(b, model, y, qw + kvw, place, encoded)?;
    }
    b.at(Category::Truncation, Some(l));
    let mut qkv = truncate(b, y, FRAC, name.clone())?;
    if after {
        let rotated = if turned { qw + kvw } else { 0 };
        qkv = add_turned_bias(b, model, qkv, (&biases, rotated), place, &name)?;
    }
    match &layer.qk_norm {
        None => open_heads(b, model, qkv, l, at),
        Some((qn, kn)) => {
            let mut qn = qn.clone();
            qn.gamma
                .iter_mut()
                .for_each(|g| *g = (f64::from(*g) * inv_root) as f32);
            open_normed_heads(b, model, qkv, [&qn, kn], (l, theta), at)
        }
    }
}

/// A block's new values: the heads of `qkv` after the queries and keys.
fn new_values(b: &mut Builder, model: &Decoder, qkv: usize, l: usize) -> Result<usize, PlanError> {
    let cfg = &model.config;
    let kv_start = cfg.heads * cfg.head_dim + cfg.kv_width();
    let name = format!("layer {l} new values");
    heads(b, qkv, kv_start, cfg.kv_heads, cfg.head_dim, name)
}

/// The queries, new keys and new values of `qkv` without QK-norm, opened
/// once: the scores product opens nothing, the weighted values open only
/// the probabilities, and the new keys and values join the cache with
/// their masks.
fn open_heads(
    b: &mut Builder,
    model: &Decoder,
    qkv: usize,
    l: usize,
    at: Position,
) -> Result<(usize, usize, usize), PlanError> {
    let cfg = &model.config;
    let (dh, qw) = (cfg.head_dim, cfg.heads * cfg.head_dim);
    let name = format!("layer {l} query/key/value");
    b.at(Category::AttentionMatmul, Some(l));
    let qkv = b.open(qkv, format!("{name} (opened)"))?;
    b.at(Category::Linear, Some(l));
    let queries = match at.last_only {
        true => last_row(b, qkv, format!("{name} (opened, last row)"))?,
        false => qkv,
    };
    let q = heads(b, queries, 0, cfg.heads, dh, format!("layer {l} queries"))?;
    let k = heads(b, qkv, qw, cfg.kv_heads, dh, format!("layer {l} new keys"))?;
    Ok((q, k, new_values(b, model, qkv, l)?))
}

/// Gemma 3's queries and keys normed ([`qk_norm`], `norms` the query
/// norm with 1/√d_h in its gains and the key norm) and rotated, opened in
/// one round with the new values.
fn open_normed_heads(
    b: &mut Builder,
    model: &Decoder,
    qkv: usize,
    norms: [&Norm; 2],
    (l, theta): (usize, f32),
    at: Position,
) -> Result<(usize, usize, usize), PlanError> {
    let (both, [q_part, k_part]) = qk_norm(b, qkv, norms, (l, theta), model, at)?;
    // Both openings share one round.
    b.at(Category::AttentionMatmul, Some(l));
    b.begin_lanes();
    let both = b.open(both, format!("layer {l} rotated queries and keys (opened)"))?;
    b.next_lane();
    let v = new_values(b, model, qkv, l)?;
    let v = b.open(v, format!("layer {l} new values (opened)"))?;
    b.end_lanes()?;
    b.at(Category::Linear, Some(l));
    let q = b.rows(both, q_part.0, q_part.1, format!("layer {l} queries"))?;
    let k = b.rows(both, k_part.0, k_part.1, format!("layer {l} new keys"))?;
    Ok((q, k, v))
}

/// Rows `(first, count)` of a tensor, with their bound.
type Part = ((usize, usize), Bound);

/// Gemma 3's query and key norms, then RoPE: the query heads and the new
/// key heads of `qkv` (adjacent columns) are stacked, so that both norms
/// and the truncation after RoPE each take the rounds of one; every block
/// keeps its own gains and its own bounds. Returns the stacked queries and
/// keys, and where each block's rows are.
fn qk_norm(
    b: &mut Builder,
    qkv: usize,
    [qn, kn]: [&Norm; 2],
    (l, theta): (usize, f32),
    model: &Decoder,
    at: Position,
) -> Result<(usize, [Part; 2]), PlanError> {
    let cfg = &model.config;
    let dh = cfg.head_dim;
    let rows = b.info(qkv).rows;
    let qk = query_and_key_heads(b, qkv, model, l, at)?;
    let counts = [cfg.heads * at.queries(), cfg.kv_heads * rows];
    let name = format!("layer {l} queries and keys");
    let (normed, bounds) = normalize_stacked(b, qk, &[(qn, counts[0]), (kn, counts[1])], &name, l)?;
    // Each block rotated on its own (RoPE is local) and with its own bound.
    let mut rotated = Vec::new();
    let mut first = 0;
    let blocks = [
        (cfg.heads, at.query_position(), "queries"),
        (cfg.kv_heads, at, "keys"),
    ];
    for ((count, bound), (heads, place, what)) in counts.iter().zip(bounds).zip(blocks) {
        let x = b.rows(
            normed,
            (first, *count),
            bound,
            format!("layer {l} normed {what}"),
        )?;
        let place = Rotation {
            theta,
            at: place,
            heads,
        };
        rotated.push(rope(b, model, x, dh, place, l)?);
        first += count;
    }
    let floor = |b: &Builder, x: usize| b.info(x).bound.floor_to(ulp(FRAC));
    let (q_bound, k_bound) = (floor(b, rotated[0]), floor(b, rotated[1]));
    let name = format!("layer {l} rotated queries and keys");
    let both = b.stack_rows(&rotated, name.clone())?;
    b.at(Category::Truncation, Some(l));
    let both = truncate(b, both, FRAC, name)?;
    let q_rows = (0, counts[0]);
    let k_rows = (counts[0], counts[1]);
    Ok((both, [(q_rows, q_bound), (k_rows, k_bound)]))
}

/// The query heads (of the last row only, where the block computes that
/// row alone) and the new key heads of `qkv`, stacked.
fn query_and_key_heads(
    b: &mut Builder,
    qkv: usize,
    model: &Decoder,
    l: usize,
    at: Position,
) -> Result<usize, PlanError> {
    let cfg = &model.config;
    let (dh, name) = (cfg.head_dim, format!("layer {l} queries and new keys"));
    if !at.last_only {
        // Adjacent columns: one layout operation for both.
        return heads(b, qkv, 0, cfg.heads + cfg.kv_heads, dh, name);
    }
    let last = last_row(b, qkv, format!("layer {l} query/key/value (last row)"))?;
    let q = heads(b, last, 0, cfg.heads, dh, format!("layer {l} queries"))?;
    let qw = cfg.heads * dh;
    let k = heads(b, qkv, qw, cfg.kv_heads, dh, format!("layer {l} new keys"))?;
    b.stack_rows(&[q, k], name)
}

/// Where RoPE turns a tensor's rows: the base, the pass's positions, and
/// how many heads are stacked (`[heads·rows × …]`, each head's rows at the
/// pass's positions).
#[derive(Clone, Copy, Debug)]
struct Rotation {
    theta: f32,
    at: Position,
    heads: usize,
}

/// The RoPE tables of `place` for the first `rotated` columns,
/// `[heads·rows × d_h/2]` at ROPE_FRAC.
fn rope_tables(model: &Decoder, place: Rotation, rotated: usize) -> RopeTables {
    let dh = model.config.head_dim;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for r in 0..place.at.rows {
        for i in 0..dh / 2 {
            let angle = rope_angle(place.theta, place.at.first + r, i, dh);
            cos.push(encode(libm::cos(angle), ROPE_FRAC));
            sin.push(encode(libm::sin(angle), ROPE_FRAC));
        }
    }
    RopeTables {
        rotated,
        head_dim: dh,
        adjacent: model.config.rope_style == RopeStyle::Adjacent,
        cos: cos.repeat(place.heads),
        sin: sin.repeat(place.heads),
        frac: ROPE_FRAC,
        keep: 0,
    }
}

/// RoPE's angle for frequency `i` of a head of `dh` at position `pos`:
/// `pos·θ^(−2i/dh)`.
fn rope_angle(theta: f32, pos: usize, i: usize, dh: usize) -> f64 {
    pos as f64 * f64::from(theta).powf(-2.0 * i as f64 / dh as f64)
}

/// The bound of `yb` with its first `rotated` columns turned by RoPE,
/// every value off by at most `extra` from the encoded rotation (or, in
/// the other columns, from `yb`'s values): a pair's norm is kept, up to
/// the tables' rounding.
fn rotated_bound(yb: &Bound, rotated: usize, model: &Decoder, extra: f64) -> Bound {
    let dh = model.config.head_dim;
    let half = dh / 2;
    let adjacent = model.config.rope_style == RopeStyle::Adjacent;
    // |c| + |s| rounding: the encoded rotation stretches a pair by at most
    // 1 + 2^(1 − ROPE_FRAC).
    let stretch = 1.0 + 2.0 * ulp(ROPE_FRAC);
    let mut abs = yb.abs.clone();
    for head in abs[..rotated].chunks_exact_mut(dh) {
        for i in 0..half {
            let (ia, ib) = if adjacent {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let m = head[ia].hypot(head[ib]) * stretch + extra;
            head[ia] = m;
            head[ib] = m;
        }
    }
    abs[rotated..].iter_mut().for_each(|a| *a += extra);
    let mut bound = Bound::from_abs(abs, dh);
    for (g, old) in bound.l2.iter_mut().enumerate() {
        *old = old.min(yb.group_l2(g) * stretch + (dh as f64).sqrt() * extra);
    }
    bound
}

/// `x + R·bias` at `x`'s scale (FRAC): `bias` (real, one per column)
/// with its first `rotated` columns turned by RoPE at `place`'s one
/// position, each pair as [`RopeTables::pairs`] takes it, and rounded
/// once to FRAC. A public offset per column (an [`Kind::Affine`] of gain
/// 1), so no round and no key: `R(xW + b) = R(xW) + R·b`.
fn add_turned_bias(
    b: &mut Builder,
    model: &Decoder,
    x: usize,
    (bias, rotated): (&[f64], usize),
    place: Rotation,
    name: &str,
) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    let tables = rope_tables(model, place, rotated);
    let mut turned = bias.to_vec();
    let dh = model.config.head_dim;
    for (ia, ib, i) in tables.pairs() {
        let (sin, cos) = libm::sincos(rope_angle(place.theta, place.at.first, i, dh));
        let (a, c) = (bias[ia], bias[ib]);
        turned[ia] = a * cos - c * sin;
        turned[ib] = a * sin + c * cos;
    }
    let offset: Vec<u64> = turned.iter().map(|v| encode(*v, xi.scale)).collect();
    let reals = offset
        .iter()
        .map(|o| crate::fixed::decode(*o, xi.scale).abs())
        .collect();
    let bound = xi.bound.add(&Bound::from_abs(reals, xi.bound.group));
    let out = b.tensor(
        format!("{name} (biased)"),
        xi.rows,
        xi.cols,
        xi.scale,
        bound,
    )?;
    b.push(Kind::Affine {
        x,
        gain: vec![1; xi.cols],
        offset,
        out,
    });
    Ok(out)
}

/// RoPE on the first `rotated` columns of `y`: the product, at `y`'s
/// scale plus ROPE_FRAC.
fn rope(
    b: &mut Builder,
    model: &Decoder,
    y: usize,
    rotated: usize,
    place: Rotation,
    l: usize,
) -> Result<usize, PlanError> {
    let tables = rope_tables(model, place, rotated);
    let yi = b.info(y).clone();
    let bound = rotated_bound(&yi.bound, rotated, model, 0.0);
    b.at(Category::Linear, Some(l));
    let out = b.tensor(
        format!("layer {l} rotated"),
        yi.rows,
        yi.cols,
        yi.scale + ROPE_FRAC,
        bound,
    )?;
    b.push(Kind::Rope { x: y, tables, out });
    Ok(out)
}

/// RoPE folded into the weights of the linear layer that just wrote `y`
/// ([`RopeTables`]): `y` gains ROPE_KEEP fraction bits instead of
/// ROPE_FRAC, so the truncation after it drops 12 bits fewer (16 instead
/// of 28 for SmolLM2's q/k/v). The product reads the layer's words at
/// WEIGHT_FRAC + ROPE_KEEP (encoded again from the model's weights), each
/// rotated word rounded to that scale; the bound allows for both against
/// the product `y`'s bound was computed for.
fn fold_rope(
    b: &mut Builder,
    model: &Decoder,
    y: usize,
    rotated: usize,
    place: Rotation,
    weights: Weights<'_>,
) -> Result<(), PlanError> {
    let tables = RopeTables {
        keep: ROPE_KEEP,
        ..rope_tables(model, place, rotated)
    };
    // The layer's input as it took it (after any rescaling).
    let x = match b.ops.last().map(|op| &op.kind) {
        Some(Kind::Linear { x, out, .. }) if *out == y => *x,
        _ => {
            return Err(PlanError::RopeFold {
                tensor: b.info(y).name.clone(),
            });
        }
    };
    let xi = b.info(x).clone();
    let yi = b.info(y).clone();
    // `y`'s bound is the coarse weights' product: the fine weights differ
    // from them by at most half a unit of each, and each rotated word is
    // rounded once more, so a column's weights (the values' columns too)
    // are off by a vector of entries below `off`: at most `off·Σ|x|`, or
    // `off·√k·‖x‖`; a bias word by less than a unit of the coarse scale.
    let off = 0.5 * ulp(WEIGHT_FRAC) + ulp(WEIGHT_FRAC + ROPE_KEEP);
    let l1: f64 = xi.bound.abs.iter().sum();
    let l2 = (xi.cols as f64).sqrt() * xi.bound.row_l2();
    let extra = off * l1.min(l2) + ulp(yi.scale);
    let bound = rotated_bound(&yi.bound, rotated, model, extra);
    let words = || encode_fine(weights, xi.scale, ROPE_KEEP);
    b.fold_rope(y, tables, bound, words)
}

/// The cache of a layer grown by this pass's rows.
fn append(
    b: &mut Builder,
    cache: usize,
    new: usize,
    kv_heads: usize,
    l: usize,
    what: &str,
) -> Result<usize, PlanError> {
    let (ci, ni) = (b.info(cache), b.info(new));
    let (rows, cols, scale) = (ci.rows + ni.rows, ci.cols, ci.scale);
    let bound = b.union_bound(cache, new);
    let out = b.tensor(format!("layer {l} cached {what}"), rows, cols, scale, bound)?;
    b.push(Kind::Append {
        cache,
        new,
        heads: kv_heads,
        out,
    });
    Ok(out)
}

/// Key/value heads repeated for the query heads that share them.
fn repeat(b: &mut Builder, x: usize, heads: usize, times: usize) -> Result<usize, PlanError> {
    if times == 1 {
        return Ok(x);
    }
    let xi = b.info(x).clone();
    let out = b.tensor(
        format!("{} (shared)", xi.name),
        xi.rows * times,
        xi.cols,
        xi.scale,
        xi.bound,
    )?;
    b.push(Kind::Repeat {
        x,
        heads,
        times,
        out,
    });
    Ok(out)
}

/// The logits of the last row (or of every row): `final_norm(x)·Wₕ` at
/// 2·FRAC.
fn head(
    b: &mut Builder,
    model: &Decoder,
    head: &crate::model::Linear,
    x: usize,
    rows: usize,
    which: Head,
) -> Result<usize, PlanError> {
    let cfg = &model.config;
    let xi = b.info(x).clone();
    b.at(Category::Linear, None);
    // A decode pass's one row is its last: no copy, so that the final
    // norm's square can ride in the residual's truncation.
    let last = match which {
        Head::EveryRow => x,
        Head::LastRow if rows == 1 => x,
        Head::LastRow => {
            let last = b.tensor(
                format!("{} (last row)", xi.name),
                1,
                xi.cols,
                xi.scale,
                xi.bound.clone(),
            )?;
            b.push(Kind::Rows {
                x,
                first: rows - 1,
                out: last,
            });
            last
        }
    };
    let centre = cfg.architecture == Architecture::Gpt2;
    let layer = cfg.layers;
    let (n, form) = normalize(b, last, &model.final_norm, "final".into(), layer, centre)?;
    let (logits, _) = linear_product(
        b,
        n,
        Some(&form),
        "LM head".into(),
        Weights::new(&[head], 1.0),
        cfg.vocab_size,
        layer,
    )?;
    debug_assert_eq!(b.info(logits).scale, FRAC + WEIGHT_FRAC);
    Ok(logits)
}
