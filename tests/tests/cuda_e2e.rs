//! The demo encoder and the demo decoder end to end with every heavy
//! operation (dealing, both servers, the reference) on the CUDA kernels,
//! run on the CPU emulator: each must equal the CPU backend bit for bit,
//! every pass. The emulator is a test vehicle; this proves the kernels'
//! arithmetic and the host's use of them, not anything about a GPU.

#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;
use std::time::Duration;

use suffuse_accel_cpu::CpuEval;
use suffuse_accel_cuda::{CudaEval, Emulator};
use suffuse_core::batch::BatchEval;
use suffuse_host::generate::Sampling;
use suffuse_host::model::{Decoder, Model};
use suffuse_host::net::Timeouts;
use suffuse_host::session::{self, Options};

/// Large seed expansions on the device's hash kernel, as they ran before
/// the default moved them to the host (`DEVICE_HASH_MIN`): the runs below
/// keep that path tested end to end.
fn emulated() -> &'static CudaEval<Emulator> {
    static EMU: OnceLock<CudaEval<Emulator>> = OnceLock::new();
    EMU.get_or_init(|| CudaEval::emulated().with_device_hash_min(1 << 14))
}

/// No float model, and patient links: the emulator runs one launch at a
/// time for both servers, far slower than a GPU or the CPU backend.
fn opts() -> Options {
    Options {
        compare_float: false,
        timeouts: Timeouts {
            connect: Duration::from_secs(600),
            io: Duration::from_secs(600),
        },
        ..Options::default()
    }
}

#[test]
fn demo_encoder_on_emulated_cuda_equals_the_cpu_backend() {
    let model = Model::demo();
    let texts = ["the secure output must equal the cpu's", "short"];
    let batch: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| model.tokenizer.encode(t, model.config.max_tokens).unwrap())
        .collect();
    let cpu = CpuEval::new();
    let emu = emulated();
    let on_cpu = session::run_on(&model, &batch, &opts(), &cpu).unwrap();
    let on_emu = session::run_on(&model, &batch, &opts(), emu).unwrap();
    assert_eq!(
        on_emu.report.bit_exact,
        Some(true),
        "emulated: not bit-exact"
    );
    assert_eq!(on_cpu.report.bit_exact, Some(true), "cpu: not bit-exact");
    assert_eq!(on_emu.query.output, on_cpu.query.output);
    assert_eq!(on_emu.embeddings, on_cpu.embeddings);
    assert_eq!(emu.name(), "cuda-emu");
    assert!(emu.peak_memory() > 0);
    assert_eq!(emu.last_failure(), None);
}

#[test]
fn demo_decoder_on_emulated_cuda_equals_the_cpu_backend_every_pass() {
    let model = Decoder::builtin("tiny-llama").unwrap();
    let prompt = [1, 40, 41, 42, 43];
    let cpu = CpuEval::new();
    let emu = emulated();
    let run = |fss: &dyn BatchEval| {
        let mut streamed = Vec::new();
        let g = session::generate_on(
            &model,
            (&prompt, 4),
            Sampling::default(),
            &opts(),
            fss,
            &mut |t| streamed.push(t),
        )
        .unwrap();
        assert_eq!(streamed, g.outcome.generated.tokens);
        g
    };
    let on_cpu = run(&cpu);
    let on_emu = run(emu);
    assert_eq!(
        on_emu.report.bit_exact,
        Some(true),
        "emulated: not bit-exact"
    );
    assert_eq!(
        on_emu.outcome.generated.tokens,
        on_cpu.outcome.generated.tokens
    );
    // Every pass's logits, prefill and each decode step.
    assert_eq!(
        on_emu.outcome.generated.logits,
        on_cpu.outcome.generated.logits
    );
    assert_eq!(emu.last_failure(), None);
}
