//! `ct_harness`: the program that `cargo xtask ct` runs under valgrind
//! memcheck to check that secrets steer no branch and no memory address
//! (the ctgrind technique).
//!
//! Every secret byte is marked *undefined* before it is used: root seeds, α,
//! β and the seed of the dealer's randomness for key generation, and every
//! key byte (seeds and correction words) for evaluation. Memcheck then
//! reports any conditional jump or memory address that depends on them.
//! Public inputs (parameters, evaluation points) stay defined. Output shares
//! are marked defined only at the very end, when the harness reconstructs
//! them and checks them against the cleartext functions.
//!
//! * `ct_harness` (or `ct_harness real`): DCF and DPF key generation and
//!   evaluation, bit and ring outputs, several input widths, through
//!   `Serial`, the single-point evaluators, full-domain DPF evaluation and
//!   `CpuEval` with the AES-NI backend on one thread. Memcheck must report
//!   nothing. (Under valgrind CPUID hides AVX-512, so the VAES-512 backend is
//!   not reachable here; see `core/SIDE-CHANNELS.md`.)
//! * `ct_harness planted`: a secret-indexed table lookup and a
//!   secret-dependent branch, which memcheck must report; this shows the
//!   marking works and the real run is not vacuous.
//!
//! Outside valgrind the client requests are no-ops and the harness is an
//! ordinary correctness run.

use std::process::ExitCode;

use suffuse_accel_cpu::{Backend, CpuEval};
use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{Block, FixedKeyAes, Prg};
use suffuse_core::ring::Width;
use suffuse_core::{dcf, dpf};

// A crate root resolves modules beside itself; keep them in ct_harness/.
#[path = "ct_harness/gates.rs"]
mod gates;
#[path = "ct_harness/host.rs"]
mod host;

/// Valgrind client requests, issued with the amd64 "magic sequence".
mod memcheck {
    // Client requests are inline assembly; nothing else in the harness is
    // unsafe.
    #![allow(unsafe_code)]

    /// `VG_USERREQ_TOOL_BASE('M', 'C')` in valgrind's `memcheck.h`.
    const MEMCHECK_BASE: u64 = (b'M' as u64) << 24 | (b'C' as u64) << 16;
    const MAKE_MEM_UNDEFINED: u64 = MEMCHECK_BASE + 1;
    const MAKE_MEM_DEFINED: u64 = MEMCHECK_BASE + 2;
    /// Core requests from `valgrind.h`.
    const RUNNING_ON_VALGRIND: u64 = 0x1001;
    const COUNT_ERRORS: u64 = 0x1201;

    /// Issues request `args[0]` with arguments `args[1..]`; returns valgrind's
    /// answer, or 0 when not running under valgrind.
    #[cfg(target_arch = "x86_64")]
    fn request(args: &[u64; 6]) -> u64 {
        let result: u64;
        // SAFETY: the four rotations of rdi add up to 128 bits, so they leave
        // it unchanged, and `xchg rbx, rbx` changes nothing: natively the
        // sequence only writes rdx (our output) and the flags (which Rust asm
        // assumes clobbered). Under valgrind it is the documented client
        // request: valgrind reads the six words at rax, which point into
        // `args`, alive for the whole block, and writes rdx. Memory is not
        // declared untouched because memcheck changes the shadow state of
        // the buffers named in the request.
        unsafe {
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") 0u64 => result,
                options(nostack),
            );
        }
        result
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn request(_args: &[u64; 6]) -> u64 {
        0
    }

    fn address_request<T: ?Sized>(code: u64, value: &mut T) {
        let len = core::mem::size_of_val(value);
        let addr = core::ptr::from_mut(value).cast::<u8>() as usize;
        request(&[code, addr as u64, len as u64, 0, 0, 0]);
    }

    /// Marks every byte of `value` as secret: memcheck reports any branch or
    /// address computed from it.
    pub fn mark_secret<T: ?Sized>(value: &mut T) {
        address_request(MAKE_MEM_UNDEFINED, value);
    }

    /// Marks every byte of `value` as public again (declassifies it).
    pub fn declassify<T: ?Sized>(value: &mut T) {
        address_request(MAKE_MEM_DEFINED, value);
    }

    /// [`declassify`] through a shared reference: the request changes
    /// memcheck's shadow state only, never the bytes.
    pub fn declassify_shared(value: &[u64]) {
        let addr = value.as_ptr() as usize;
        let len = core::mem::size_of_val(value);
        request(&[MAKE_MEM_DEFINED, addr as u64, len as u64, 0, 0, 0]);
    }

    /// How many valgrind instances we are nested in (0 natively).
    pub fn running_on_valgrind() -> u64 {
        request(&[RUNNING_ON_VALGRIND, 0, 0, 0, 0, 0])
    }

    /// Errors memcheck has reported so far (0 natively).
    pub fn errors_so_far() -> u64 {
        request(&[COUNT_ERRORS, 0, 0, 0, 0, 0])
    }
}

type HarnessResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Evaluates one party's key at public points into its output shares;
/// returns the AES calls made.
type EvalOneParty<'a> = dyn Fn(Party, &[u8], &[u64], &mut [u64]) -> HarnessResult<u64> + 'a;

/// A deterministic public generator for test inputs, kept separate from the
/// dealer's (secret-seeded) randomness.
struct PublicInputs(u64);

impl PublicInputs {
    fn next(&mut self) -> u64 {
        // splitmix64: public values only, so speed and simplicity win.
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn block(&mut self) -> Block {
        let lo = u128::from(self.next());
        let hi = u128::from(self.next());
        Block::from_bytes(((hi << 64) | lo).to_le_bytes())
    }
}

/// One key pair with its cleartext function, for checking at the end.
struct KeyPair {
    params: Params,
    alpha: u64,
    /// β, and a pair's second word.
    beta: [u64; 2],
    key0: Vec<u8>,
    key1: Vec<u8>,
}

impl KeyPair {
    /// Word `word` of the cleartext function at `x`.
    fn expected(&self, x: u64, word: usize) -> u64 {
        let x = self.params.domain().reduce(x);
        let hit = match self.params.kind() {
            Kind::Dcf => x < self.alpha,
            Kind::Dpf => x == self.alpha,
        };
        match self.params.output() {
            Output::Bit => u64::from(hit),
            Output::Ring(_) | Output::Pair(_) if hit => self.beta[word],
            Output::Ring(_) | Output::Pair(_) => 0,
        }
    }

    /// Reconstructs the output from two shares.
    fn reconstruct(&self, share0: u64, share1: u64) -> u64 {
        match self.params.output() {
            Output::Bit => share0 ^ share1,
            Output::Ring(w) | Output::Pair(w) => w.add(share0, share1),
        }
    }
}

/// Output shares of both parties for one key pair at public points, kept
/// secret (undefined) until [`Shares::check`].
struct Shares<'a> {
    pair: &'a KeyPair,
    points: Vec<u64>,
    share0: Vec<u64>,
    share1: Vec<u64>,
}

impl Shares<'_> {
    /// Declassifies the shares and counts reconstructions that differ from
    /// the cleartext function.
    fn check(mut self) -> (usize, usize) {
        memcheck::declassify(self.share0.as_mut_slice());
        memcheck::declassify(self.share1.as_mut_slice());
        // A pair's query has two words, side by side.
        let words = self.pair.params.output().words();
        let wrong = (0..self.share0.len())
            .filter(|&i| {
                let (x, word) = (self.points[i / words], i % words);
                let got = self.pair.reconstruct(self.share0[i], self.share1[i]);
                got != self.pair.expected(x, word)
            })
            .count();
        (self.share0.len(), wrong)
    }
}

/// Generates a key pair from secret-marked inputs.
fn generate(
    aes: &FixedKeyAes,
    params: Params,
    inputs: &mut PublicInputs,
    stats: &mut Stats,
) -> HarnessResult<KeyPair> {
    let alpha = params.domain().reduce(inputs.next());
    let beta = match params.output() {
        Output::Bit => [1, 0],
        Output::Ring(w) => [w.reduce(inputs.next()), 0],
        Output::Pair(w) => [w.reduce(inputs.next()), w.reduce(inputs.next())],
    };
    // Secret copies; the cleartext `alpha`/`beta` above stay public for the
    // final check and for choosing points (points are public in the protocol).
    let mut secret_alpha = alpha;
    let mut secret_beta = beta;
    let mut roots = [inputs.block(), inputs.block()];
    let mut dealer_seed = [0u8; 16];
    for (i, b) in dealer_seed.iter_mut().enumerate() {
        *b = inputs.next().to_le_bytes()[i % 8];
    }
    memcheck::mark_secret(&mut secret_alpha);
    memcheck::mark_secret(&mut secret_beta);
    memcheck::mark_secret(&mut roots);
    memcheck::mark_secret(&mut dealer_seed);
    stats.secret_bytes += 8 + 16 + 32 + 16;
    let mut dealer_rng = Prg::new(&dealer_seed);

    let mut key0 = vec![0u8; params.key_len()];
    let mut key1 = vec![0u8; params.key_len()];
    let (keys, rng) = ((&mut key0[..], &mut key1[..]), &mut dealer_rng);
    let calls = if let Output::Pair(_) = params.output() {
        dcf::generate_pair(
            aes,
            &params,
            secret_alpha,
            secret_beta,
            roots,
            rng,
            keys.0,
            keys.1,
        )?
    } else {
        let generate = match params.kind() {
            Kind::Dcf => dcf::generate::<FixedKeyAes, Prg>,
            Kind::Dpf => dpf::generate::<FixedKeyAes, Prg>,
        };
        generate(
            aes,
            &params,
            secret_alpha,
            secret_beta[0],
            roots,
            rng,
            keys.0,
            keys.1,
        )?
    };
    stats.key_pairs += 1;
    stats.aes_calls += calls;
    Ok(KeyPair {
        params,
        alpha,
        beta,
        key0,
        key1,
    })
}

/// Public evaluation points for a key: edges of the domain, the neighbours
/// of α (chosen from the cleartext α: points are public in the protocol and
/// it is α's *key* that must stay hidden) and random points.
fn points_for(pair: &KeyPair, inputs: &mut PublicInputs, random: usize) -> Vec<u64> {
    let w = pair.params.domain();
    let mut points = vec![
        0,
        w.mask(),
        pair.alpha,
        w.sub(pair.alpha, 1),
        w.add(pair.alpha, 1),
    ];
    points.extend((0..random).map(|_| w.reduce(inputs.next())));
    points
}

/// Evaluates both parties' keys (re-marked secret) with `eval` at `points`.
fn evaluate_pair<'a>(
    pair: &'a KeyPair,
    points: Vec<u64>,
    stats: &mut Stats,
    eval: &EvalOneParty<'_>,
) -> HarnessResult<Shares<'a>> {
    let words = pair.params.output().words();
    let mut share0 = vec![0u64; points.len() * words];
    let mut share1 = vec![0u64; points.len() * words];
    for (party, key, out) in [
        (Party::P0, &pair.key0, &mut share0),
        (Party::P1, &pair.key1, &mut share1),
    ] {
        // Evaluators receive keys from disk: mark every key byte secret again
        // rather than relying on what generation left undefined.
        let mut key = key.clone();
        memcheck::mark_secret(key.as_mut_slice());
        stats.secret_bytes += key.len();
        stats.aes_calls += eval(party, &key, &points, out)?;
        stats.evaluations += points.len();
    }
    Ok(Shares {
        pair,
        points,
        share0,
        share1,
    })
}

#[derive(Default)]
struct Stats {
    key_pairs: usize,
    evaluations: usize,
    secret_bytes: usize,
    aes_calls: u64,
    checked: usize,
    wrong: usize,
}

impl Stats {
    fn record(&mut self, shares: Shares<'_>) {
        let (checked, wrong) = shares.check();
        self.checked += checked;
        self.wrong += wrong;
    }
}

/// The shapes exercised: several input widths, bit and ring outputs.
fn shapes() -> Vec<Params> {
    let domains = [1u32, 5, 7, 8, 13, 32, 50, 64];
    let outputs = [
        Output::Bit,
        Output::Ring(Width::of(8)),
        Output::Ring(Width::of(13)),
        Output::Ring(Width::of(32)),
        Output::Ring(Width::of(64)),
    ];
    let mut shapes = Vec::new();
    for kind in [Kind::Dcf, Kind::Dpf] {
        for k in domains {
            for output in outputs {
                shapes.push(Params::new(kind, Width::of(k), output));
            }
        }
    }
    // Pair outputs: comparison keys only.
    for k in domains {
        for w in [8, 13, 64] {
            shapes.push(Params::new(
                Kind::Dcf,
                Width::of(k),
                Output::Pair(Width::of(w)),
            ));
        }
    }
    shapes
}

/// The AES-NI backend on one thread: the widest path valgrind can execute.
fn cpu_aesni() -> HarnessResult<Option<CpuEval>> {
    #[cfg(target_arch = "x86_64")]
    if let Some(h) = suffuse_accel_cpu::x86::AesNi::detect() {
        let cpu = CpuEval::with_threads(1)?.with_backend(Backend::AesNi(h));
        return Ok(Some(cpu));
    }
    Ok(None)
}

fn real_run() -> HarnessResult<Stats> {
    let aes = FixedKeyAes::new();
    let serial = Serial::new();
    let cpu = cpu_aesni()?;
    let mut inputs = PublicInputs(0x5eed);
    let mut stats = Stats::default();
    match &cpu {
        Some(cpu) => println!("CpuEval backend: {}, 1 thread", cpu.backend().name()),
        None => println!("CpuEval: no AES-NI on this CPU; checking Serial only"),
    }

    for params in shapes() {
        let pair = generate(&aes, params, &mut inputs, &mut stats)?;

        // One point at a time, through the single-key evaluators.
        let points = points_for(&pair, &mut inputs, 3);
        let single =
            |party: Party, key: &[u8], points: &[u64], out: &mut [u64]| -> HarnessResult<u64> {
                let words = params.output().words();
                for (x, y) in points.iter().zip(out.chunks_exact_mut(words)) {
                    match (params.kind(), params.output()) {
                        (Kind::Dcf, Output::Pair(_)) => {
                            y.copy_from_slice(&dcf::eval_pair(&aes, &params, party, key, *x)?);
                        }
                        (Kind::Dcf, _) => y[0] = dcf::eval(&aes, &params, party, key, *x)?,
                        (Kind::Dpf, _) => y[0] = dpf::eval(&aes, &params, party, key, *x)?,
                    }
                }
                Ok(params.aes_per_eval() * points.len() as u64)
            };
        let shares = evaluate_pair(&pair, points, &mut stats, &single)?;
        stats.record(shares);

        // Batches: `Serial`, then the lane-pipelined `CpuEval`, with enough
        // points (70) for one full lockstep group of 64 and a partial one.
        let mut batch_evaluators: Vec<&dyn BatchEval> = vec![&serial];
        if let Some(cpu) = &cpu {
            batch_evaluators.push(cpu);
        }
        for evaluator in batch_evaluators {
            let points = points_for(&pair, &mut inputs, 65);
            let batch =
                |party: Party, key: &[u8], points: &[u64], out: &mut [u64]| -> HarnessResult<u64> {
                    let keys = KeyBatch::new(params, party, key)?;
                    Ok(evaluator.eval(&keys, points, out)?.aes_calls)
                };
            let shares = evaluate_pair(&pair, points, &mut stats, &batch)?;
            stats.record(shares);
        }

        // Full-domain DPF evaluation, for domains small enough to expand.
        if params.kind() == Kind::Dpf && params.domain().bits() <= 13 {
            let points: Vec<u64> = (0..=params.domain().mask()).collect();
            let full = |party: Party,
                        key: &[u8],
                        _points: &[u64],
                        out: &mut [u64]|
             -> HarnessResult<u64> {
                Ok(dpf::eval_full_domain(&aes, &params, party, key, out)?)
            };
            let shares = evaluate_pair(&pair, points, &mut stats, &full)?;
            stats.record(shares);
        }
    }

    // Many keys, one point each: the gate pattern, across lockstep groups.
    for params in [
        Params::dcf_bit(Width::of(50)),
        Params::new(Kind::Dcf, Width::of(50), Output::Ring(Width::W64)),
    ] {
        let mut pairs = Vec::new();
        for _ in 0..70 {
            pairs.push(generate(&aes, params, &mut inputs, &mut stats)?);
        }
        let points: Vec<u64> = pairs
            .iter()
            .map(|p| points_for(p, &mut inputs, 0)[2 + (p.alpha % 3) as usize])
            .collect();
        let mut batch_evaluators: Vec<&dyn BatchEval> = vec![&serial];
        if let Some(cpu) = &cpu {
            batch_evaluators.push(cpu);
        }
        for evaluator in batch_evaluators {
            let mut share0 = vec![0u64; points.len()];
            let mut share1 = vec![0u64; points.len()];
            for (party, out) in [(Party::P0, &mut share0), (Party::P1, &mut share1)] {
                let mut bytes: Vec<u8> = pairs
                    .iter()
                    .flat_map(|p| match party {
                        Party::P0 => p.key0.iter(),
                        Party::P1 => p.key1.iter(),
                    })
                    .copied()
                    .collect();
                memcheck::mark_secret(bytes.as_mut_slice());
                stats.secret_bytes += bytes.len();
                let keys = KeyBatch::new(params, party, &bytes)?;
                stats.aes_calls += evaluator.eval(&keys, &points, out)?.aes_calls;
                stats.evaluations += points.len();
            }
            memcheck::declassify(share0.as_mut_slice());
            memcheck::declassify(share1.as_mut_slice());
            for (i, pair) in pairs.iter().enumerate() {
                stats.checked += 1;
                if pair.reconstruct(share0[i], share1[i]) != pair.expected(points[i], 0) {
                    stats.wrong += 1;
                }
            }
        }
    }

    // The gate layer: dealing, every protocol round, Φ, mpc, linalg.
    let mut evals: Vec<&dyn BatchEval> = vec![&serial];
    if let Some(cpu) = &cpu {
        evals.push(cpu);
    }
    let fss: &dyn BatchEval = match &cpu {
        Some(cpu) => cpu,
        None => &serial,
    };
    let g = gates::run(
        &gates::Backends {
            fss,
            evals: evals.clone(),
        },
        &mut inputs,
    )?;
    println!(
        "gate layer: {} protocol runs, {} outputs checked, {} wrong",
        g.protocols, g.checked, g.wrong
    );
    stats.checked += g.checked;
    stats.wrong += g.wrong;
    let (steps, bytes) = host::run(evals.last().copied().unwrap_or(&serial), &mut inputs)?;
    println!("host Beaver dealing: {steps} triple steps, {bytes} section bytes");
    Ok(stats)
}

/// A lookup table indexed by a secret, as a naive AES S-box would be.
static PLANTED_TABLE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = (i as u8).wrapping_mul(167).wrapping_add(13);
        i += 1;
    }
    t
};

/// Deliberately leaky: indexes a table with a secret byte. Test-only: it
/// exists so that `cargo xtask ct` can show memcheck catches this.
#[inline(never)]
fn planted_secret_index(secret: u8) -> u8 {
    PLANTED_TABLE[usize::from(std::hint::black_box(secret))]
}

#[inline(never)]
fn planted_path_a(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(3))
}

#[inline(never)]
fn planted_path_b(x: u64) -> u64 {
    std::hint::black_box(x.rotate_left(7))
}

/// Deliberately leaky: branches on a secret bit, calling different code on
/// each side so the compiler cannot turn it into a conditional move.
#[inline(never)]
fn planted_secret_branch(secret: u64) -> u64 {
    if std::hint::black_box(secret) & 1 == 1 {
        planted_path_a(secret)
    } else {
        planted_path_b(secret)
    }
}

fn planted_run() -> u64 {
    let mut index = 0x2au8;
    let mut bit = 0x1234_5679u64;
    memcheck::mark_secret(&mut index);
    memcheck::mark_secret(&mut bit);
    let mut looked_up = planted_secret_index(index);
    let mut branched = planted_secret_branch(bit);
    memcheck::declassify(&mut looked_up);
    memcheck::declassify(&mut branched);
    u64::from(looked_up) ^ branched
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "real".to_owned());
    println!(
        "ct_harness {mode}: running on valgrind: {}",
        memcheck::running_on_valgrind() > 0
    );
    match mode.as_str() {
        "real" => match real_run() {
            Ok(stats) => {
                println!(
                    "key pairs generated: {}, evaluations: {}, AES calls: {}, \
                     secret bytes marked: {}",
                    stats.key_pairs, stats.evaluations, stats.aes_calls, stats.secret_bytes
                );
                println!(
                    "outputs reconstructed: {}, wrong: {}, memcheck errors: {}",
                    stats.checked,
                    stats.wrong,
                    memcheck::errors_so_far()
                );
                if stats.wrong == 0 {
                    ExitCode::SUCCESS
                } else {
                    eprintln!("ct_harness: {} outputs were wrong", stats.wrong);
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("ct_harness: {e}");
                ExitCode::FAILURE
            }
        },
        "planted" => {
            let result = planted_run();
            println!(
                "planted leaks ran (result {result:#x}); memcheck errors: {}",
                memcheck::errors_so_far()
            );
            if !suffuse_core::PLANTED_LEAKS {
                println!("library leaks: not built (core without `ct-planted`)");
                return ExitCode::SUCCESS;
            }
            let serial = Serial::new();
            let backends = gates::Backends {
                fss: &serial,
                evals: vec![&serial],
            };
            match gates::planted(&backends, &mut PublicInputs(0x91a7)) {
                Ok(g) => {
                    println!(
                        "library leaks ran (gelu, {} outputs, {} wrong); memcheck errors: {}",
                        g.checked,
                        g.wrong,
                        memcheck::errors_so_far()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("ct_harness: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        other => {
            eprintln!("usage: ct_harness [real|planted] (got {other:?})");
            ExitCode::from(2)
        }
    }
}
