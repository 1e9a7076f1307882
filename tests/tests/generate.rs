//! Private generation end to end: dealer, two servers over loopback TCP and
//! the client, with the KV cache held as shares, against the fixed-point
//! reference bit for bit on every pass (prefill and each decode step).

#![allow(clippy::unwrap_used)]

use suffuse_host::generate::{self, Sampling};
use suffuse_host::model::Decoder;
use suffuse_host::plan::{self, Shape};
use suffuse_host::session::{self, Options};

fn run(name: &str, prompt: &[u32], max_new: usize, sampling: Sampling) -> session::Generation {
    let model = Decoder::builtin(name).unwrap();
    let mut streamed = Vec::new();
    let g = session::generate(
        &model,
        prompt,
        max_new,
        sampling,
        &Options::default(),
        &mut |t| streamed.push(t),
    )
    .unwrap();
    assert_eq!(
        streamed, g.outcome.generated.tokens,
        "{name}: streamed tokens"
    );
    assert_eq!(g.report.bit_exact, Some(true), "{name}: not bit-exact");
    g
}

#[test]
fn tiny_llama_generates_eight_greedy_tokens_bit_exact() {
    let g = run("tiny-llama", &[1, 40, 41, 42, 43], 8, Sampling::default());
    let model = Decoder::builtin("tiny-llama").unwrap();
    let eos = model.config.eos;
    let tokens = &g.outcome.generated.tokens;
    assert!(tokens.len() == 8 || tokens.last().copied() == eos);
    assert_eq!(g.outcome.pass_s.len(), tokens.len());
    let fig = g.report.generation.as_ref().unwrap();
    assert_eq!(fig.generated_token_ids, *tokens);
    assert!(fig.rounds_per_token > 0.0 && fig.comm_bytes_per_token_per_party > 0.0);
    assert!(fig.key_bytes_per_token_per_party > 0.0);
    // A decode pass's rounds, by kind of step, add up to its rounds.
    let by_step: f64 = fig
        .rounds_by_gate_per_token
        .values()
        .map(|g| g.rounds)
        .sum();
    assert!(
        (by_step - fig.rounds_per_token).abs() < 1e-9,
        "{by_step} rounds by step"
    );
    assert!(fig.rounds_by_gate_per_token["max"].rounds > 0.0);
    let all: f64 = g.report.rounds_by_gate.values().map(|k| k.rounds).sum();
    assert_eq!(all, g.report.rounds as f64);

    // A planted fault: the reference of a model one weight away differs,
    // so the bit-exact comparison can fail.
    let mut other = model.clone();
    other.layers[0].up.w.held_mut()[0] += 0.05;
    let shape = Shape {
        batch: 1,
        seq: g.report.tokens,
        decode_steps: 7,
    };
    let plan = plan::build(&other, shape).unwrap();
    let prompt = [1, 40, 41, 42, 43];
    let theirs = generate::reference(
        &other,
        &plan,
        &prompt,
        Sampling::default(),
        suffuse_host::backend::auto(),
    )
    .unwrap();
    assert_ne!(theirs.logits[0], g.outcome.generated.logits[0]);
}

/// A prompt of 12 tokens pads to 16 slots: the prefill's causal max runs
/// one causal tree (row `i` over its own `i + 1` keys, a tree over 16
/// values' rounds), and the servers stay bit-exact (tiny-llama, and
/// tiny-gemma under its window).
#[test]
fn a_prefill_of_16_slots_runs_its_causal_max_bit_exact() {
    let prompt: Vec<u32> = (40..52).collect();
    for name in ["tiny-llama", "tiny-gemma"] {
        let g = run(name, &prompt, 2, Sampling::default());
        assert_eq!(g.report.tokens, 16, "{name}");
    }
}

#[test]
fn tiny_gpt2_generates_bit_exact_with_sampling() {
    let sampling = Sampling {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        seed: 3,
    };
    run("tiny-gpt2", &[1, 50, 51], 4, sampling);
}

#[test]
fn padding_changes_nothing_but_rounding_and_logits_track_the_position() {
    // The same prompt in two buckets: the greedy continuation is the same.
    let model = Decoder::builtin("tiny-llama").unwrap();
    let prompt = [1u32, 60, 61, 62, 63, 64];
    let mut outs = Vec::new();
    for seq in [8, 16] {
        let shape = Shape {
            batch: 1,
            seq,
            decode_steps: 3,
        };
        let plan = plan::build(&model, shape).unwrap();
        outs.push(
            generate::reference(
                &model,
                &plan,
                &prompt,
                Sampling::default(),
                suffuse_host::backend::auto(),
            )
            .unwrap()
            .tokens,
        );
    }
    assert_eq!(outs[0], outs[1]);
}

#[test]
fn generation_stops_at_eos_and_the_servers_stop_with_it() {
    // The logits do not depend on which token is eos: make the first
    // greedy token the end of sequence, so the client stops the servers
    // after the prefill, with four dealt decode passes unused.
    let mut model = Decoder::builtin("tiny-llama").unwrap();
    let prompt = [1u32, 30, 31, 32];
    let shape = Shape {
        batch: 1,
        seq: 8,
        decode_steps: 4,
    };
    let plan = plan::build(&model, shape).unwrap();
    let free = generate::reference(
        &model,
        &plan,
        &prompt,
        Sampling::default(),
        suffuse_host::backend::auto(),
    )
    .unwrap();
    model.config.eos = Some(free.tokens[0]);
    let want: Vec<u32> = free.tokens[..1].to_vec();
    let g = session::generate(
        &model,
        &prompt,
        5,
        Sampling::default(),
        &Options::default(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(g.outcome.generated.tokens, want);
    assert_eq!(g.outcome.pass_s.len(), 1);
    assert_eq!(g.report.bit_exact, Some(true));
    // The report's traffic by kind of step counts the prefill's steps
    // alone, not those of the decode passes that never ran.
    let r = &g.report;
    let steps: f64 = r.rounds_by_gate.values().map(|k| k.steps).sum();
    let prefill = plan.pass_ops(0).filter(|op| plan.step_of[*op].is_some());
    assert_eq!(steps, prefill.count() as f64);
    let rounds: f64 = r.rounds_by_gate.values().map(|k| k.rounds).sum();
    assert_eq!(rounds, r.rounds as f64);
}

/// A prompt longer than the bucket asked for is refused before the dealer
/// runs: no key file is written, so nothing is dealt for nothing.
#[test]
fn a_prompt_over_its_bucket_is_refused_before_any_key_is_dealt() {
    let model = Decoder::builtin("tiny-llama").unwrap();
    let dir = std::env::temp_dir().join(format!("suffuse-bucket-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let opts = Options {
        keys_dir: Some(dir.clone()),
        prompt_bucket: Some(8),
        ..Options::default()
    };
    let prompt: Vec<u32> = (30..39).collect();
    let err =
        session::generate(&model, &prompt, 2, Sampling::default(), &opts, &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            session::SessionError::Generate(generate::GenerateError::PromptTooLong {
                tokens: 9,
                bucket: 8
            })
        ),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "keys were dealt"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A scoring plan (every row's logits, for teacher-forced accuracy) is the
/// generation's prefill with the head on every row: its last row equals
/// the generation's first logits bit for bit, and every other row is a
/// full row of logits at the same scale.
#[test]
fn a_scoring_plans_last_row_is_the_prefills_logits() {
    // A generation's prefill runs its last layer for the last row only;
    // the scoring plan runs every row: the same logits on that row, with
    // query and key norms (tiny-gemma) and with LayerNorm (tiny-gpt2).
    for name in ["tiny-llama", "tiny-gemma", "tiny-gpt2"] {
        last_row_equals_the_prefills_logits(name);
    }
}

fn last_row_equals_the_prefills_logits(name: &str) {
    use suffuse_host::plan::decoder::{self as planner, Generation};
    let model = Decoder::builtin(name).unwrap();
    let prompt = [1u32, 60, 61, 62, 63, 64];
    let la = suffuse_host::backend::auto();
    let mut logits = Vec::new();
    let generation = Generation {
        prompt: 8,
        steps: 0,
    };
    for plan in [
        planner::build(&model, generation).unwrap(),
        planner::build_scoring(&model, 8).unwrap(),
    ] {
        let layout = generate::Layout::of(&plan);
        let mut next = |pass: usize, _: &[Vec<u64>]| {
            (pass == 0).then(|| generate::prefill_inputs(&model, &layout, &prompt).unwrap())
        };
        let out = suffuse_host::reference::run_passes(&plan, &mut next, la).unwrap();
        logits.push((out[0].clone(), layout.logit_scale));
    }
    let vocab = model.config.vocab_size;
    let (last, every) = (&logits[0], &logits[1]);
    assert_eq!(last.1, every.1, "{name}");
    assert_eq!(every.0.len(), 8 * vocab, "{name}");
    assert_eq!(last.0[..], every.0[7 * vocab..], "{name}");
}

/// Gemma 3's block (QK-norm, sandwich norms, GeGLU, scaled embeddings, two
/// local layers with a window of 4 keys and one global layer) through
/// dealer, both servers and client: a prefill of 8 slots (the window
/// binds: a band, not the causal triangle) and decode passes beyond the
/// window, bit-exact against the reference on every pass.
#[test]
fn tiny_gemma_generates_bit_exact_under_a_sliding_window() {
    let g = run(
        "tiny-gemma",
        &[1, 60, 61, 62, 63, 64],
        4,
        Sampling::default(),
    );
    assert_eq!(g.outcome.generated.tokens.len(), 4);
    // Local layers pack bands (the prefill's and each decode row's), the
    // global one the causal triangle.
    use suffuse_host::plan::decoder::{self as planner, Generation};
    use suffuse_host::plan::{Band, Kind};
    let model = Decoder::builtin("tiny-gemma").unwrap();
    let plan = planner::build(
        &model,
        Generation {
            prompt: 8,
            steps: 3,
        },
    )
    .unwrap();
    let bands: Vec<(Option<usize>, Band)> = plan
        .ops
        .iter()
        .filter_map(|op| match op.kind {
            Kind::Triangle { band: Some(b), .. } => Some((op.layer, b)),
            _ => None,
        })
        .collect();
    let window = |queries| Band { queries, window: 4 };
    assert!(bands.iter().all(|(l, _)| *l != Some(2)), "global layer 2");
    assert!(bands.contains(&(Some(0), window(8))) && bands.contains(&(Some(1), window(1))));
}

/// A decoder whose query/key/value projections carry biases, as Qwen2's
/// do. Its decode passes take the attention norm's output untruncated and
/// add the biases after the projection's truncation, turned by RoPE for
/// the pass's position (`plan::decoder` `add_turned_bias`; the exec
/// module's tests check the offsets against the fold's integer rotation);
/// its prefill keeps them in the projection's words. Dealer, both servers
/// and the client equal the reference bit for bit on every pass, and the
/// reference generates the same tokens.
#[test]
fn a_biased_projection_generates_bit_exact_with_its_biases_after_the_truncation() {
    use suffuse_host::plan::decoder::{self as planner, Generation};
    let mut model = Decoder::builtin("tiny-llama").unwrap();
    for (l, layer) in model.layers.iter_mut().enumerate() {
        let parts = [&mut layer.query, &mut layer.key, &mut layer.value];
        for (j, part) in parts.into_iter().enumerate() {
            part.b = (0..part.outputs)
                .map(|i| 0.5 * (((3 * l + 5 * j + 7 * i) % 13) as f32 / 6.0 - 1.0))
                .collect();
        }
    }
    let prompt = [1u32, 60, 61, 62, 63, 64];
    let steps = 3;
    let g = session::generate(
        &model,
        &prompt,
        steps + 1,
        Sampling::default(),
        &Options::default(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(g.report.bit_exact, Some(true), "not bit-exact");
    let plan = planner::build(&model, Generation { prompt: 8, steps }).unwrap();
    let biased = plan
        .tensors
        .iter()
        .filter(|t| t.name.ends_with("query/key/value (biased)"))
        .count();
    assert_eq!(biased, steps * model.layers.len());
    let la = suffuse_host::backend::auto();
    let made = generate::reference(&model, &plan, &prompt, Sampling::default(), la).unwrap();
    assert_eq!(made.tokens, g.outcome.generated.tokens);
}
