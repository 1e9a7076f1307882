//! Every `BatchEval` on this machine against the conformance harness.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use suffuse_accel_cpu::{Backend, CpuEval};
use suffuse_core::batch::{BatchEval, EvalStats, MatShape, Serial, Turned};
use suffuse_core::fss::{GenBatch, KeyBatch, Party};
use suffuse_core::phi::program::{self, Inputs, Program, Section};
use suffuse_core::prg::{Block, Domain, FixedKeyAes, Hasher};
use suffuse_tests::conformance;

const LANES: [usize; 3] = [1, 5, 64];
const THREADS: [usize; 2] = [1, 2];

fn print_report(label: &str, report: &conformance::Report) {
    println!(
        "{label}: {} calls, {} outputs compared, {} failure(s)",
        report.calls,
        report.outputs,
        report.failures.len()
    );
}

/// Every lanes × threads configuration of `CpuEval` on `backend`, with its
/// SIMD walk and with core's walk; all are run before any failure is
/// reported.
fn check_cpu_backend(make_backend: impl Fn() -> Backend) {
    let mut failures = Vec::new();
    for threads in THREADS {
        for (lanes, core_walk) in LANES.map(|l| (l, false)).into_iter().chain([(64, true)]) {
            let eval = CpuEval::with_threads(threads)
                .unwrap()
                .with_backend(make_backend())
                .lanes(lanes);
            let eval = if core_walk { eval.core_walk() } else { eval };
            let label = format!(
                "cpu/{} lanes={lanes} threads={threads} core_walk={core_walk}",
                eval.backend().name()
            );
            let report = conformance::run(&eval);
            print_report(&label, &report);
            if !report.passed() {
                failures.push(format!("{label}: {}", report.failure_summary()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn serial_conforms() {
    print_report("serial", &conformance::check(&Serial::new()));
}

#[test]
fn cpu_default_conforms() {
    let eval = CpuEval::new();
    let label = format!("cpu/{} (detected, global pool)", eval.backend().name());
    print_report(&label, &conformance::check(&eval));
}

#[test]
fn cpu_portable_conforms() {
    check_cpu_backend(|| Backend::Portable(FixedKeyAes::new()));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn cpu_aesni_conforms() {
    use suffuse_accel_cpu::x86::AesNi;
    match AesNi::detect() {
        Some(h) => check_cpu_backend(|| Backend::AesNi(h)),
        None => println!("note: no AES-NI on this CPU; the AesNi backend was not checked"),
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn cpu_vaes256_conforms() {
    use suffuse_accel_cpu::x86::Vaes256;
    match Vaes256::detect() {
        Some(h) => check_cpu_backend(|| Backend::Vaes256(h)),
        None => println!("note: no VAES-256 on this CPU; the Vaes256 backend was not checked"),
    }
}

/// Every path `Backend::available` offers here is one of those checked
/// above, so a new path cannot ship without its conformance test.
#[test]
fn every_available_backend_has_a_conformance_test() {
    let checked = ["vaes512", "vaes256", "aesni", "portable"];
    for b in Backend::available() {
        assert!(
            checked.contains(&b.name()),
            "no conformance test for {}",
            b.name()
        );
        println!("available here: {}", b.name());
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn cpu_vaes512_conforms() {
    use suffuse_accel_cpu::x86::Vaes512;
    match Vaes512::detect() {
        Some(h) => check_cpu_backend(|| Backend::Vaes512(h)),
        None => println!("note: no VAES-512 on this CPU; the Vaes512 backend was not checked"),
    }
}

// ---------------------------------------------------------------------------
// CudaEval (suffuse-accel-cuda): its kernels on the CPU emulator everywhere,
// and on a device wherever one opens.
// ---------------------------------------------------------------------------

#[test]
fn cuda_emulated_conforms() {
    let eval = suffuse_accel_cuda::CudaEval::emulated().with_device_hash_min(0);
    assert_eq!(eval.name(), "cuda-emu");
    print_report("cuda-emu", &conformance::check(&eval));
}

#[test]
fn cuda_emulated_passes_its_self_test() {
    suffuse_accel_cuda::CudaEval::emulated()
        .self_test()
        .unwrap();
}

#[test]
fn cuda_conforms_where_a_device_exists() {
    for code in [
        suffuse_accel_cuda::Code::Auto,
        suffuse_accel_cuda::Code::Ptx,
    ] {
        let eval = match suffuse_accel_cuda::CudaEval::open(0, code, None) {
            Ok(eval) => eval.with_device_hash_min(0),
            Err(e) => {
                println!("note: CudaEval ({code:?}) not checked: {e}");
                return;
            }
        };
        let label = format!("cuda on {} ({})", eval.device_name(), eval.code());
        print_report(&label, &conformance::check(&eval));
    }
}

// ---------------------------------------------------------------------------
// The harness itself: evaluators with planted faults must fail it.
// ---------------------------------------------------------------------------

/// `Serial` with one planted fault.
struct Faulty {
    fault: Fault,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Flips the low bit of the output of query 4096 (a chunk boundary).
    FlipsOneOutput,
    /// Reports one AES call too many per batch.
    MiscountsAes,
    /// Leaves the last output unwritten.
    SkipsLastOutput,
    /// Panics on an empty full-domain buffer.
    PanicsOnEmptyOutput,
    /// Accepts an output buffer longer than the points.
    AcceptsLongOutput,
    /// Runs Φ programs but skips the partial last block.
    SkipsPhiTail,
    /// Hashes the 33rd block of a long run with the wrong domain.
    HashesOneBlockWrong,
    /// Swaps two parties' keys beyond the first lockstep group.
    SwapsKeysPastAGroup,
    /// Reports AES calls for one party's generation only.
    MiscountsGeneration,
    /// Refuses to generate P0's keys alone (an empty `key1`).
    RefusesP0KeysAlone,
    /// Ignores `accumulate` on transposed products.
    OverwritesTransposedAccumulate,
    /// Accepts a `c` longer than the shape.
    AcceptsLongProduct,
    /// Walks a batch whose roots lie apart from its bodies with each key's
    /// root taken from the key after it.
    ShiftsSplitRoots,
    /// The same, in full-domain evaluation only.
    ShiftsSplitRootsInFullDomain,
    /// Reads the lookup table one entry off (`(u − α + 1) mod 2^L`).
    LooksUpOneOff,
    /// Turns each weight by its own factor only, dropping its partner's.
    DropsTheTurnsCrossTerm,
}

impl Hasher for Faulty {
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        let n = Serial::new().hash_many(d, blocks);
        if let (Fault::HashesOneBlockWrong, Some(b)) = (self.fault, blocks.get_mut(32)) {
            let mut one = [*b];
            Serial::new().hash_many(Domain::Tree, &mut one);
            *b = one[0];
        }
        n
    }
}

impl BatchEval for Faulty {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn aes_path(&self) -> &'static str {
        "aes-crate"
    }

    fn preferred_batch(&self) -> usize {
        1
    }

    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, suffuse_core::Error> {
        let n = points.len();
        let (out, _) = match self.fault {
            Fault::AcceptsLongOutput if out.len() > n => out.split_at_mut(n),
            _ => (out, &mut [][..]),
        };
        let saved = out.last().copied();
        let mut shifted = Default::default();
        let keys = &self.maybe_shifted(Fault::ShiftsSplitRoots, keys, &mut shifted)?;
        let mut stats = Serial::new().eval(keys, points, out)?;
        match self.fault {
            Fault::FlipsOneOutput if n > 4096 => out[4096] ^= 1,
            Fault::MiscountsAes if n > 0 => stats.aes_calls += 1,
            Fault::SkipsLastOutput => {
                if let (Some(last), Some(saved)) = (out.last_mut(), saved) {
                    *last = saved;
                }
            }
            _ => {}
        }
        Ok(stats)
    }

    fn eval_full_domain(
        &self,
        keys: &KeyBatch<'_>,
        out: &mut [u64],
    ) -> Result<EvalStats, suffuse_core::Error> {
        if let Fault::PanicsOnEmptyOutput = self.fault {
            assert!(!out.is_empty(), "empty output");
        }
        let mut shifted = Default::default();
        let planted = Fault::ShiftsSplitRootsInFullDomain;
        Serial::new().eval_full_domain(&self.maybe_shifted(planted, keys, &mut shifted)?, out)
    }

    fn lookup(
        &self,
        keys: &KeyBatch<'_>,
        (points, table): (&[u64], &[u64]),
        domain: &mut [u64],
        out: &mut [u64],
    ) -> Result<EvalStats, suffuse_core::Error> {
        let mut rotated = table.to_vec();
        if let Fault::LooksUpOneOff = self.fault {
            rotated.rotate_left(1);
        }
        Serial::new().lookup(keys, (points, &rotated), domain, out)
    }

    fn eval_phi(
        &self,
        prog: &Program,
        section: Section,
        party: Party,
        input: &Inputs<'_>,
        out: &mut [u64],
        cols: &mut [u64],
    ) -> Result<(), suffuse_core::Error> {
        let saved = out.to_vec();
        program::run(prog, section, party, input, out, cols)?;
        if let Fault::SkipsPhiTail = self.fault {
            let full = input.x_hat.len() / program::BLOCK * program::BLOCK;
            let width = out.len().checked_div(input.x_hat.len()).unwrap_or(0);
            out[full * width..].copy_from_slice(&saved[full * width..]);
        }
        Ok(())
    }

    fn generate(
        &self,
        batch: &GenBatch<'_>,
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<EvalStats, suffuse_core::Error> {
        let mut stats = Serial::new().generate(batch, key0, key1)?;
        let len = batch.params().key_len();
        match self.fault {
            Fault::SwapsKeysPastAGroup if batch.count() > 32 && !key1.is_empty() => {
                key0[32 * len..33 * len].swap_with_slice(&mut key1[32 * len..33 * len]);
            }
            Fault::RefusesP0KeysAlone if key1.is_empty() => {
                return Err(suffuse_core::Error::BufferLength);
            }
            Fault::MiscountsGeneration => stats.aes_calls /= 2,
            _ => {}
        }
        Ok(stats)
    }

    fn matmul(
        &self,
        shape: &MatShape,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), suffuse_core::Error> {
        let mut shape = *shape;
        let c = match self.fault {
            Fault::OverwritesTransposedAccumulate if shape.transpose_b => {
                shape.accumulate = false;
                c
            }
            Fault::AcceptsLongProduct => {
                let want = shape.lens().map_or(c.len(), |l| l[2]).min(c.len());
                &mut c[..want]
            }
            _ => c,
        };
        Serial::new().matmul(&shape, a, b, c)
    }

    fn turned_matmul(
        &self,
        t: &Turned<'_>,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), suffuse_core::Error> {
        let zeros = vec![0; t.other.len()];
        let t = match self.fault {
            Fault::DropsTheTurnsCrossTerm => Turned {
                other: &zeros,
                ..*t
            },
            _ => *t,
        };
        Serial::new().turned_matmul(&t, a, b, c)
    }
}

impl Faulty {
    /// `keys`, or, when `planted` is this evaluator's fault and the batch
    /// holds its roots apart, the batch with its roots shifted (built in
    /// `store`).
    fn maybe_shifted<'k>(
        &self,
        planted: Fault,
        keys: &KeyBatch<'k>,
        store: &'k mut (Vec<u8>, Vec<u8>),
    ) -> Result<KeyBatch<'k>, suffuse_core::Error> {
        if self.fault != planted || keys.bytes().is_some() || keys.count() < 2 {
            return Ok(*keys);
        }
        *store = shifted_roots(keys);
        KeyBatch::split(keys.params(), keys.party(), &store.0, &store.1)
    }
}

/// `keys`' roots, each moved to the key before it, and their bodies.
fn shifted_roots(keys: &KeyBatch<'_>) -> (Vec<u8>, Vec<u8>) {
    let (mut roots, bodies) = conformance::taken_apart(keys);
    roots.rotate_left(16);
    (roots, bodies)
}

#[test]
fn harness_catches_planted_faults() {
    for fault in [
        Fault::FlipsOneOutput,
        Fault::MiscountsAes,
        Fault::SkipsLastOutput,
        Fault::PanicsOnEmptyOutput,
        Fault::AcceptsLongOutput,
        Fault::SkipsPhiTail,
        Fault::HashesOneBlockWrong,
        Fault::SwapsKeysPastAGroup,
        Fault::MiscountsGeneration,
        Fault::RefusesP0KeysAlone,
        Fault::OverwritesTransposedAccumulate,
        Fault::AcceptsLongProduct,
        Fault::ShiftsSplitRoots,
        Fault::ShiftsSplitRootsInFullDomain,
        Fault::LooksUpOneOff,
        Fault::DropsTheTurnsCrossTerm,
    ] {
        let report = conformance::run(&Faulty { fault });
        assert!(!report.passed(), "the harness missed {fault:?}");
        println!("{fault:?}: {} failure(s)", report.failures.len());
    }
}

/// Staged keys are read from the backend's copy: after staging, the host's
/// bytes are overwritten (which the contract forbids, and which only a
/// test may do), and the outputs must still be the staged keys' ones; the
/// same call after `unstage` reads the host's bytes again.
#[test]
fn cuda_emulated_evaluates_staged_keys_from_its_copy() {
    use suffuse_core::fss::{Kind, Output, Params};
    use suffuse_core::prg::{FixedKeyAes, Prg};
    use suffuse_core::ring::Width;
    let eval = suffuse_accel_cuda::CudaEval::emulated();
    let params = Params::new(Kind::Dcf, Width::of(24), Output::Ring(Width::of(13)));
    let mut rng = Prg::new(b"staged copy test");
    let dealt = suffuse_tests::keys::DealtBatch::deal(&FixedKeyAes::new(), &params, 50, &mut rng);
    let keys = dealt.batch(Party::P1, 50);
    let (roots, mut bodies) = conformance::taken_apart(&keys);
    let points: Vec<u64> = dealt.alphas.iter().flat_map(|a| [*a, a + 1]).collect();
    let mut want = vec![0u64; points.len()];
    let split = KeyBatch::split(params, Party::P1, &roots, &bodies).unwrap();
    Serial::new().eval(&split, &points, &mut want).unwrap();
    eval.stage(&bodies);
    for b in bodies.iter_mut() {
        *b ^= 0x5a;
    }
    let split = KeyBatch::split(params, Party::P1, &roots, &bodies).unwrap();
    let mut got = vec![0u64; points.len()];
    eval.eval(&split, &points, &mut got).unwrap();
    assert_eq!(got, want, "the staged copy was not used");
    eval.unstage(&bodies);
    eval.eval(&split, &points, &mut got).unwrap();
    assert_ne!(got, want, "unstaged keys must be read from the host again");
}
