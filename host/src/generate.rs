//! Private text generation, the client's side: the prompt is left-padded
//! to its public bucket and embedded by the client (a public-weight lookup
//! on its own input), the servers return shares of each pass's logits,
//! and the client reconstructs them, picks the next token, embeds it and
//! shares it for the next decode pass. The servers see shares only: never
//! the prompt, the logits or the tokens. They learn the prompt bucket and
//! how many decode passes ran.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::client::{self, ClientError, Connected};
use crate::fixed::{FRAC, decode, encode};
use crate::model::{Decoder, ModelError};
use crate::net::{FrameKind as Frame, Security, Timeouts, put_words};
use crate::party::PartyReport;
use crate::plan::Plan;
use crate::reference::{self, ClearInputs, PassInputs, ReferenceError};
use crate::report::Figures;

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 (the default) picks the most likely token (greedy); above 0 the
    /// logits are divided by it before the softmax.
    pub temperature: f64,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability
    /// reaches `top_p` (1: all).
    pub top_p: f64,
    /// Seed of the sampler's random stream.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// Picks tokens: greedy, or sampled with a seeded stream.
#[derive(Debug)]
pub struct Sampler {
    how: Sampling,
    state: u64,
}

impl Sampler {
    /// A sampler.
    pub fn new(how: Sampling) -> Sampler {
        Sampler {
            how,
            state: how.seed ^ 0x5eed_5eed_5eed_5eed,
        }
    }

    /// The next token from fixed-point logits (`scale` fraction bits).
    /// Greedy compares the ring values as signed integers, so it is exact:
    /// the lowest id wins a tie.
    pub fn pick(&mut self, logits: &[u64], scale: u32) -> u32 {
        let greedy = logits
            .iter()
            .enumerate()
            .max_by(|a, b| (*a.1 as i64).cmp(&(*b.1 as i64)).then(b.0.cmp(&a.0)))
            .map_or(0, |(i, _)| i as u32);
        if self.how.temperature <= 0.0 {
            return greedy;
        }
        let mut ranked: Vec<(usize, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, v)| (i, decode(*v, scale) / self.how.temperature))
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.how.top_k > 0 {
            ranked.truncate(self.how.top_k);
        }
        let top = ranked.first().map_or(0.0, |r| r.1);
        let mut probs: Vec<f64> = ranked.iter().map(|r| (r.1 - top).exp()).collect();
        let total: f64 = probs.iter().sum();
        let mut mass = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter_mut().enumerate() {
            *p /= total;
            mass += *p;
            if mass >= self.how.top_p {
                keep = keep.min(i + 1);
            }
        }
        let kept: f64 = probs[..keep].iter().sum();
        let mut u = self.uniform() * kept;
        for (r, p) in ranked.iter().zip(&probs[..keep]) {
            if u < *p {
                return r.0 as u32;
            }
            u -= p;
        }
        ranked
            .get(keep.saturating_sub(1))
            .map_or(greedy, |r| r.0 as u32)
    }

    /// SplitMix64, uniform in [0, 1): the sampler's randomness is the
    /// client's own and needs no cryptographic strength.
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What the client needs to know about a generation: from the servers'
/// hello (bound to the plan hash) or from a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The prompt bucket P.
    pub prompt: usize,
    /// Decode passes after the prefill.
    pub steps: usize,
    /// The key bias of a padded position.
    pub pad_bias: u64,
    /// Fraction bits of the logits.
    pub logit_scale: u32,
}

impl Layout {
    /// The layout of a decoder plan.
    pub fn of(plan: &Plan) -> Layout {
        Layout {
            prompt: plan.seq,
            steps: plan.passes.len().saturating_sub(1),
            pad_bias: plan.pad_bias,
            logit_scale: plan.tensors[plan.output].scale,
        }
    }
}

/// Why a prompt cannot be generated from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// The prompt does not fit the bucket the keys were dealt for.
    #[error("the prompt has {tokens} tokens; the keys are for prompts of at most {bucket}")]
    PromptTooLong {
        /// Its tokens.
        tokens: usize,
        /// The bucket.
        bucket: usize,
    },
    /// The model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The fixed-point reference.
    #[error("fixed-point reference: {0}")]
    Reference(ReferenceError),
    /// The servers or the connection.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The servers' keys are not for a generation.
    #[error("the servers' keys are for {0}, not for generation with this decoder")]
    NotGeneration(String),
}

/// The client's inputs of the prefill: the prompt left-padded to the
/// bucket (padding slots hold the first token's embedding, so every row
/// stays in range, and carry the padding bias).
pub fn prefill_inputs(
    model: &Decoder,
    layout: &Layout,
    prompt: &[u32],
) -> Result<PassInputs, GenerateError> {
    let (p, len) = (layout.prompt, prompt.len());
    if len > p || len == 0 {
        return Err(GenerateError::PromptTooLong {
            tokens: len,
            bucket: p,
        });
    }
    let pad = p - len;
    let mut x = Vec::with_capacity(p * model.config.hidden);
    for slot in 0..p {
        let (token, position) = match slot.checked_sub(pad) {
            Some(i) => (prompt[i], i),
            None => (prompt[0], 0),
        };
        x.extend(encoded(&model.embed_token(token, position)?));
    }
    let bias = (0..p)
        .map(|slot| if slot < pad { layout.pad_bias } else { 0 })
        .collect();
    Ok(PassInputs { x, bias })
}

/// The client's inputs of decode pass `pass` (1, 2, …): the previous
/// pass's token at real position `prompt_len + pass − 1`, and the key bias
/// of the prompt's padding followed by zeros.
pub fn step_inputs(
    model: &Decoder,
    layout: &Layout,
    prompt_len: usize,
    pass: usize,
    token: u32,
) -> Result<PassInputs, GenerateError> {
    let x = encoded(&model.embed_token(token, prompt_len + pass - 1)?);
    let pad = layout.prompt - prompt_len;
    let bias = (0..layout.prompt + pass)
        .map(|slot| if slot < pad { layout.pad_bias } else { 0 })
        .collect();
    Ok(PassInputs { x, bias })
}

fn encoded(row: &[f32]) -> Vec<u64> {
    row.iter().map(|v| encode(f64::from(*v), FRAC)).collect()
}

/// A generation: the tokens picked and every pass's logits.
#[derive(Clone, Debug, Default)]
pub struct Generated {
    /// New tokens, in order (ending with eos when it was produced).
    pub tokens: Vec<u32>,
    /// Each pass's logits (fixed point).
    pub logits: Vec<Vec<u64>>,
}

/// Drives a generation: `run(inputs)` runs one pass and returns its
/// logits; stops at eos, when the plan's passes are used up, or when
/// `on_token` returns false (the caller has what it wants, or is gone).
pub fn drive(
    model: &Decoder,
    layout: &Layout,
    prompt: &[u32],
    sampling: Sampling,
    run: &mut dyn FnMut(usize, PassInputs) -> Result<Vec<u64>, GenerateError>,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<Generated, GenerateError> {
    let mut sampler = Sampler::new(sampling);
    let mut out = Generated::default();
    let mut inputs = prefill_inputs(model, layout, prompt)?;
    for pass in 0..=layout.steps {
        let logits = run(pass, inputs)?;
        let token = sampler.pick(&logits, layout.logit_scale);
        out.logits.push(logits);
        out.tokens.push(token);
        let more = on_token(token);
        if !more || Some(token) == model.config.eos || pass == layout.steps {
            break;
        }
        inputs = step_inputs(model, layout, prompt.len(), pass + 1, token)?;
    }
    Ok(out)
}

/// The same generation on the cleartext fixed-point reference.
pub fn reference(
    model: &Decoder,
    plan: &Plan,
    prompt: &[u32],
    sampling: Sampling,
    la: &dyn suffuse_core::batch::BatchEval,
) -> Result<Generated, GenerateError> {
    let layout = Layout::of(plan);
    let mut sampler = Sampler::new(sampling);
    let mut tokens = Vec::new();
    let mut failed = None;
    let mut next = |pass: usize, outputs: &[Vec<u64>]| -> Option<PassInputs> {
        let made = match outputs.last() {
            None => prefill_inputs(model, &layout, prompt),
            Some(logits) => {
                let token = sampler.pick(logits, layout.logit_scale);
                tokens.push(token);
                if Some(token) == model.config.eos {
                    return None;
                }
                step_inputs(model, &layout, prompt.len(), pass, token)
            }
        };
        made.map_err(|e| failed = Some(e)).ok()
    };
    let logits = reference::run_passes(plan, &mut next, la).map_err(GenerateError::Reference)?;
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(last) = logits.last().filter(|_| tokens.len() < logits.len()) {
        tokens.push(sampler.pick(last, layout.logit_scale));
    }
    Ok(Generated { tokens, logits })
}

/// A secure generation as the client saw it.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The tokens and logits.
    pub generated: Generated,
    /// Per pass: the client's wall time from sending its shares to holding
    /// the logits.
    pub pass_s: Vec<f64>,
    /// Per pass: each server's figures so far (cumulative).
    pub reports: Vec<[PartyReport; 2]>,
    /// The plan both servers ran.
    pub plan_hash: String,
    /// The prompt bucket of the servers' keys.
    pub bucket: usize,
}

/// Runs a generation with two servers that hold keys for it: streams each
/// token to `on_token` as it is picked.
pub fn query(
    model: &Decoder,
    servers: [&str; 2],
    prompt: &[u32],
    sampling: Sampling,
    timeouts: Timeouts,
    sec: &Security,
    on_token: &mut dyn FnMut(u32),
) -> Result<Outcome, GenerateError> {
    let mut each = |t: u32| {
        on_token(t);
        true
    };
    query_until(model, servers, prompt, sampling, timeouts, sec, &mut each)
}

/// [`query`], ended early when `on_token` returns false: the servers are
/// told to stop (as at end of sequence) and learn how many passes ran.
/// The key set is spent all the same.
pub fn query_until(
    model: &Decoder,
    servers: [&str; 2],
    prompt: &[u32],
    sampling: Sampling,
    timeouts: Timeouts,
    sec: &Security,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<Outcome, GenerateError> {
    let expect = client::Expect {
        batch: 1,
        seq: None,
    };
    let mut conn = client::connect(model, servers, timeouts, sec, expect)?;
    let v = conn.view().clone();
    let layout = generation_layout(model, &v)?;
    let mut out = Outcome {
        plan_hash: conn.plan_hash().to_string(),
        bucket: v.seq,
        ..Outcome::default()
    };
    let mut run = |pass: usize, inputs: PassInputs| -> Result<Vec<u64>, GenerateError> {
        let (logits, reports, took) = exchange(&mut conn, pass, inputs, v.output_len)?;
        out.pass_s.push(took);
        out.reports.push(reports);
        Ok(logits)
    };
    let result = drive(model, &layout, prompt, sampling, &mut run, on_token);
    match result {
        Ok(generated) => {
            // Ended before the dealt passes ran out (end of sequence, or the
            // caller stopped): the servers are told to stop, and learn how
            // many passes ran.
            if generated.tokens.len() <= layout.steps {
                stop_servers(&mut conn, generated.tokens.len() as u32)?;
            }
            out.generated = generated;
            Ok(out)
        }
        Err(e) => {
            let reason = format!("the client gave up: {e}");
            for link in conn.links().iter_mut() {
                link.abort(&reason);
            }
            Err(e)
        }
    }
}

/// The generation a connection's servers were dealt for: one sequence,
/// logits over the model's vocabulary.
fn generation_layout(model: &Decoder, v: &client::ClientView) -> Result<Layout, GenerateError> {
    if v.batch != 1 || v.output_len != model.config.vocab_size {
        return Err(GenerateError::NotGeneration(format!(
            "batches of {} with outputs of {}",
            v.batch, v.output_len
        )));
    }
    Ok(Layout {
        prompt: v.seq,
        steps: v.decode_steps,
        pad_bias: v.pad_bias,
        logit_scale: v.output_scale,
    })
}

/// Tells both servers that the generation ended after `passes` passes.
fn stop_servers(conn: &mut Connected, passes: u32) -> Result<(), GenerateError> {
    for (i, link) in conn.links().iter_mut().enumerate() {
        link.send(Frame::Input, passes, &[])
            .map_err(|e| ClientError::Net {
                server: i,
                error: e,
            })?;
    }
    Ok(())
}

/// One pass: shares out, logit shares back.
fn exchange(
    conn: &mut Connected,
    pass: usize,
    mut inputs: PassInputs,
    out_len: usize,
) -> Result<(Vec<u64>, [PartyReport; 2], f64), GenerateError> {
    let shares = client::share(&ClearInputs {
        x: std::mem::take(&mut inputs.x),
        bias: std::mem::take(&mut inputs.bias),
        mask: None,
    })?;
    let start = Instant::now();
    for (i, (link, s)) in conn.links().iter_mut().zip(&shares).enumerate() {
        let mut payload =
            zeroize::Zeroizing::new(Vec::with_capacity(8 * (s.x.len() + s.bias.len())));
        put_words(&mut payload, &s.x);
        put_words(&mut payload, &s.bias);
        link.send(Frame::Input, pass as u32, &payload)
            .map_err(|e| ClientError::Net {
                server: i,
                error: e,
            })?;
    }
    let mut words = Vec::new();
    let mut reports = Vec::new();
    for (i, link) in conn.links().iter_mut().enumerate() {
        let bytes = link
            .recv(Frame::Output, pass as u32, None)
            .map_err(|e| ClientError::Net {
                server: i,
                error: e,
            })?;
        let (w, r) = client::split_output(&bytes, out_len)
            .map_err(|what| ClientError::Reply { server: i, what })?;
        words.push(w);
        reports.push(r);
    }
    let took = start.elapsed().as_secs_f64();
    let logits = words[0]
        .iter()
        .zip(&words[1])
        .map(|(a, b)| a.wrapping_add(*b))
        .collect();
    let [r0, r1]: [PartyReport; 2] = reports
        .try_into()
        .map_err(|_| ClientError::Mismatch("missing report".into()))?;
    Ok((logits, [r0, r1], took))
}

impl Figures {
    /// The figures of a generation (the type is the report's, so that
    /// the report need not know how a generation runs).
    pub fn of(prompt: &[u32], bucket: usize, layers: usize, o: &Outcome) -> Figures {
        let mut decode: Vec<f64> = o.pass_s.iter().skip(1).copied().collect();
        decode.sort_by(f64::total_cmp);
        let median = decode.get(decode.len() / 2).copied().unwrap_or(0.0);
        let per = |f: &dyn Fn(&PartyReport) -> u64| -> f64 {
            let n = o.reports.len();
            if n < 2 {
                return 0.0;
            }
            let delta = |p: usize| f(&o.reports[n - 1][p]).saturating_sub(f(&o.reports[0][p]));
            delta(0).max(delta(1)) as f64 / (n - 1) as f64
        };
        let rounds = per(&|r| r.rounds);
        Figures {
            prompt_token_ids: prompt.to_vec(),
            generated_token_ids: o.generated.tokens.clone(),
            prompt_bucket: bucket,
            prefill_online_s: o.pass_s.first().copied().unwrap_or(0.0),
            decode_online_s_per_token: median,
            comm_bytes_per_token_per_party: per(&|r| r.comm_bytes),
            rounds_per_token: rounds,
            rounds_per_layer_per_token: rounds / layers.max(1) as f64,
            key_bytes_per_token_per_party: per(&|r| r.key_bytes),
            rounds_by_gate_per_token: o.reports.last().map_or_else(BTreeMap::new, |last| {
                let decode = o.reports.len() - 1;
                crate::report::rounds_by_gate(last, 1..o.reports.len(), decode)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{self, Shape};

    #[test]
    fn reference_generation_stays_in_its_proven_bounds() {
        for name in ["tiny-llama", "tiny-gpt2"] {
            let model = Decoder::builtin(name).unwrap();
            let shape = Shape {
                batch: 1,
                seq: 8,
                decode_steps: 3,
            };
            let plan = plan::build(&model, shape).unwrap();
            assert_eq!(plan.passes.len(), 4);
            let g = reference(
                &model,
                &plan,
                &[1, 40, 41, 42, 43],
                Sampling::default(),
                crate::backend::auto(),
            )
            .unwrap();
            assert!(!g.tokens.is_empty() && g.tokens.len() <= 4, "{name}");
            assert_eq!(g.logits.len(), g.tokens.len());
            assert_eq!(g.logits[0].len(), model.config.vocab_size);
        }
    }

    #[test]
    fn greedy_breaks_ties_to_the_lowest_id_and_sampling_is_seeded() {
        let logits = [3u64, 9, 9, 1];
        assert_eq!(Sampler::new(Sampling::default()).pick(&logits, 0), 1);
        let how = Sampling {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            seed: 7,
        };
        let a: Vec<u32> = (0..20)
            .map({
                let mut s = Sampler::new(how);
                move |_| s.pick(&logits, 0)
            })
            .collect();
        let b: Vec<u32> = (0..20)
            .map({
                let mut s = Sampler::new(how);
                move |_| s.pick(&logits, 0)
            })
            .collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|t| *t == 1 || *t == 2));
    }
}
