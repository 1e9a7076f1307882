//! The conformance harness: every [`BatchEval`] must reproduce [`Serial`]
//! bit for bit, report the AES calls the [`Params`] formulas predict, and
//! answer malformed buffers with typed errors instead of panics.
//!
//! The cases are built once per process (keys, points and `Serial`'s
//! answers) and shared by every evaluator that is checked, so checking one
//! more configuration costs only its own evaluations.
//!
//! What is swept:
//!
//! * shapes: DCF and DPF × k ∈ [`DOMAINS`] × bit and Z_2^w, w ∈ [`RING_WIDTHS`];
//! * both parties, [`BATCH_SIZES`] keys at each of [`POINTS_PER_KEY`] points
//!   per key, with points at α, α ± 1, 0, 2^k − 1 and above 2^k (points are
//!   taken mod 2^k);
//! * [`LARGE_QUERIES`]-query batches for a few shapes, which cross every
//!   lane and rayon chunk boundary, including keys whose points straddle two
//!   chunks;
//! * full-domain DPF evaluation for k ∈ [`FULL_DOMAINS`], and the table
//!   lookup on it ([`BatchEval::lookup`]) for the ring-output keys, against
//!   `Serial`'s default (expand, then sum), with scratch for one, two and
//!   every key's domain;
//! * buffer-length errors and full-domain requests on DCF keys;
//! * seed expansion ([`suffuse_core::prg::Hasher::hash_many`]) in every domain at
//!   [`HASH_LENGTHS`] blocks, against the `aes` crate;
//! * batched key generation for every shape at [`GEN_COUNTS`] keys, byte
//!   for byte and AES call for AES call;
//! * ring matrix products in every layout ([`MAT_SHAPES`] × transposed ×
//!   accumulating), against the triple loop, and their shape errors.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use suffuse_core::Error;
use suffuse_core::batch::{
    BatchEval, EvalStats, MatShape, Pairing, Resident, Serial, Turned, matmul_reference,
    turned_reference,
};
use suffuse_core::fss::{GenBatch, KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{Block, Domain, FixedKeyAes, Prg};
use suffuse_core::ring::Width;

use crate::keys::{self, DealtBatch, PARTIES};

/// Input widths k of the point-evaluation cases: the smallest, around the
/// bit-output leaf (ν = 7), the plan's typical widths and the word's edge.
pub const DOMAINS: [u32; 11] = [1, 2, 3, 5, 7, 8, 24, 32, 50, 63, 64];
/// Ring output widths w; together they cover every leaf lane size.
pub const RING_WIDTHS: [u32; 6] = [1, 8, 13, 32, 50, 64];
/// Keys per batch: empty, single, and both sides of the 8- and 64-lane
/// group sizes.
pub const BATCH_SIZES: [usize; 8] = [0, 1, 7, 8, 9, 63, 64, 65];
/// Points per key: one, and a count that does not divide any lane group or
/// chunk size.
pub const POINTS_PER_KEY: [usize; 2] = [1, 3];
/// Queries in a large batch: several rayon chunks of `suffuse-accel-cpu`.
pub const LARGE_QUERIES: usize = 20_000;
/// Input widths of the full-domain DPF cases.
pub const FULL_DOMAINS: [u32; 5] = [1, 5, 7, 8, 12];
/// Keys per full-domain batch.
pub const FULL_DOMAIN_KEYS: [usize; 4] = [0, 1, 3, 9];

/// Blocks per seed-expansion case: around every register and group width
/// of the AES paths (2, 4, 8, 16, 32, 64 blocks).
pub const HASH_LENGTHS: [usize; 14] = [0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 33, 64, 65, 1000];
/// Key pairs per generation case: around the 32-key lockstep group and,
/// for a few shapes, across several 512-key tasks.
pub const GEN_COUNTS: [usize; 6] = [0, 1, 31, 32, 33, 65];
/// Key pairs of the large generation cases.
pub const GEN_LARGE: usize = 1100;
/// `(batches, m, k, n)` of the matrix cases: empty, vectors, odd sizes and
/// sizes that cross register and cache tiles.
pub const MAT_SHAPES: [(usize, usize, usize, usize); 9] = [
    (1, 0, 3, 4),
    (1, 3, 0, 4),
    (2, 1, 1, 1),
    (1, 1, 17, 5),
    (3, 5, 7, 9),
    (1, 17, 33, 65),
    (2, 64, 64, 64),
    (1, 130, 40, 300),
    (4, 9, 64, 128),
];

/// What filling `out` with this before a call catches: an evaluator that
/// leaves some outputs unwritten. It is no canonical output of any shape
/// except 64-bit rings, where it is vanishingly unlikely.
const UNWRITTEN: u64 = 0xA5A5_5A5A_DEAD_BEEF;

/// Failures listed in a panic message; the rest are counted.
const FAILURES_SHOWN: usize = 25;

/// The outcome of running the harness on one evaluator.
#[derive(Debug)]
pub struct Report {
    /// The evaluator's [`BatchEval::name`].
    pub evaluator: &'static str,
    /// Calls made to the evaluator.
    pub calls: usize,
    /// Outputs compared with `Serial`.
    pub outputs: usize,
    /// One line per disagreement.
    pub failures: Vec<String>,
}

impl Report {
    fn fail(&mut self, what: String) {
        self.failures.push(what);
    }

    /// Whether every case agreed with `Serial`.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The failures, one per line, at most `FAILURES_SHOWN` of them; empty
    /// when the evaluator conforms.
    pub fn failure_summary(&self) -> String {
        if self.passed() {
            return String::new();
        }
        let mut text = format!(
            "{} does not conform: {} failure(s) in {} calls",
            self.evaluator,
            self.failures.len(),
            self.calls
        );
        for line in self.failures.iter().take(FAILURES_SHOWN) {
            text.push_str("\n  ");
            text.push_str(line);
        }
        if self.failures.len() > FAILURES_SHOWN {
            text.push_str("\n  ...");
        }
        text
    }
}

/// Runs the harness and panics, listing the failures, unless `eval` agrees
/// with [`Serial`] everywhere. Returns the report for printing.
pub fn check(eval: &dyn BatchEval) -> Report {
    let report = run(eval);
    assert!(report.passed(), "{}", report.failure_summary());
    report
}

/// How much of the harness a run covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every case.
    Full,
    /// A few cases of every method and output kind, at small batch sizes:
    /// for runs that are slow per call, such as the CUDA emulator under
    /// ThreadSanitizer (`cargo xtask cuda-tsan`).
    Small,
}

impl Scope {
    fn small(self) -> bool {
        self == Scope::Small
    }
}

/// Runs every case against `eval` and collects the disagreements.
pub fn run(eval: &dyn BatchEval) -> Report {
    run_in(eval, Scope::Full)
}

/// Runs the cases of `scope` against `eval`.
pub fn run_in(eval: &dyn BatchEval, scope: Scope) -> Report {
    let suite = suite();
    let mut report = Report {
        evaluator: eval.name(),
        calls: 0,
        outputs: 0,
        failures: Vec::new(),
    };
    for case in &suite.point_cases {
        if !scope.small() || SMALL_DOMAINS.contains(&case.keys.params.domain().bits()) {
            check_point_case(eval, case, scope, &mut report);
        }
    }
    if !scope.small() {
        for case in &suite.large_cases {
            check_large_case(eval, case, &mut report);
        }
    }
    for case in &suite.full_domain_cases {
        if !scope.small() || case.keys.params.domain().bits() <= 7 {
            check_full_domain_case(eval, case, scope, &mut report);
        }
    }
    check_eval_many(eval, suite, &mut report);
    check_staged(eval, suite, &mut report);
    check_errors(eval, suite, &mut report);
    if !scope.small() {
        for gate in phi_gates() {
            check_phi(eval, &gate, &mut report);
        }
    }
    check_hashes(eval, scope, &mut report);
    check_generation(eval, scope, &mut report);
    check_matmul(eval, scope, &mut report);
    check_turned(eval, &mut report);
    report
}

/// Input widths of [`Scope::Small`]'s point and generation cases: below,
/// at and above the bit-output leaf, and the word.
const SMALL_DOMAINS: [u32; 3] = [3, 8, 64];

/// Largest batch (keys, blocks or key pairs) of [`Scope::Small`].
const SMALL_BATCH: usize = 65;

/// Gates whose Φ programs cover every operation: Beaver-style spline
/// (GeLU), a spline with dealer monomials (the plans' GeLU), wraps and
/// mask constants (exact truncation), monomials (ReLU), and a ring
/// narrower than the word.
fn phi_gates() -> Vec<suffuse_core::gate::Gate> {
    use suffuse_core::gate::activation::{GeluForm, gelu, gelu_monomials};
    use suffuse_core::gate::relu::relu;
    use suffuse_core::gate::trunc::{Range, Shift, trunc};
    let n = Width::W64;
    vec![
        gelu(GeluForm::Erf, n, Width::of(26), 12).unwrap(),
        gelu_monomials(GeluForm::Erf, n, Width::of(26), 12).unwrap(),
        trunc(n, Width::of(40), 12, Shift::Arithmetic, Range::Exact).unwrap(),
        relu(n, Width::of(26)).unwrap(),
        trunc(
            Width::of(20),
            Width::of(16),
            4,
            Shift::Arithmetic,
            Range::Exact,
        )
        .unwrap(),
    ]
}

/// Both sections of `gate`'s Φ program for both parties, on pseudorandom
/// inputs over a batch with a partial last block, against core's
/// evaluator.
fn check_phi(eval: &dyn BatchEval, gate: &suffuse_core::gate::Gate, report: &mut Report) {
    use suffuse_core::phi::program::{self, Inputs, Section};
    let prog = &gate.program;
    let n = 2 * program::BLOCK + 7;
    let mut rng = Prg::new(b"conformance phi\0");
    let mut words = |len: usize| -> Vec<u64> { (0..len).map(|_| rng.next_u64()).collect() };
    let x_hat = words(n);
    let e: Vec<u64> = words(n * prog.bits).iter().map(|b| b & 1).collect();
    let (u, a, shares) = (
        words(n * prog.beaver),
        words(n * prog.beaver),
        words(n * prog.monos),
    );
    let input = Inputs {
        x_hat: &x_hat,
        e: &e,
        u: &u,
        a: &a,
        shares: &shares,
    };
    for section in [Section::Beaver, Section::Outputs] {
        let width = match section {
            Section::Beaver => prog.beaver,
            Section::Outputs => prog.outputs,
        };
        for party in PARTIES {
            let what = format!("eval_phi {section:?} {party:?} ({} ops)", prog.len);
            let mut cols = vec![UNWRITTEN; prog.scratch_words()];
            let mut want = vec![UNWRITTEN; n * width];
            program::run(prog, section, party, &input, &mut want, &mut cols).unwrap();
            let mut got = vec![UNWRITTEN; n * width];
            let call = || eval.eval_phi(prog, section, party, &input, &mut got, &mut cols);
            if !called(report, &what, call) {
                continue;
            }
            report.outputs += got.len();
            if let Some(q) = (0..got.len()).find(|&q| got[q] != want[q]) {
                report.fail(format!(
                    "{what}: word {q} differs: core {:#x}, got {:#x}",
                    want[q], got[q]
                ));
            }
        }
    }
}

/// One shape's keys with points and `Serial`'s answers for every
/// points-per-key count.
struct PointCase {
    keys: DealtBatch,
    point_sets: Vec<PointSet>,
}

/// Points for `per_key` points per key over a whole [`DealtBatch`].
struct PointSet {
    per_key: usize,
    points: Vec<u64>,
    /// `Serial`'s outputs for P0 and P1.
    expected: [Vec<u64>; 2],
}

/// A large batch that tiles a pool of keys, evaluated at fresh points.
struct LargeCase {
    pool: DealtBatch,
    party: Party,
    per_key: usize,
    points: Vec<u64>,
    expected: Vec<u64>,
}

impl LargeCase {
    fn key_count(&self) -> usize {
        self.points.len() / self.per_key
    }

    /// The batch's keys: key `i` is pool key `i mod pool size`. The pool
    /// size is prime to the lane and chunk sizes, so a key index that is
    /// off by a lane group or a chunk lands on a different key.
    fn key_bytes(&self) -> Vec<u8> {
        let pool = self.pool.bytes(self.party);
        let len = self.pool.params.key_len();
        let mut bytes = Vec::with_capacity(self.key_count() * len);
        for i in 0..self.key_count() {
            let j = i % self.pool.count();
            bytes.extend_from_slice(&pool[j * len..(j + 1) * len]);
        }
        bytes
    }
}

/// DPF keys with `Serial`'s full-domain outputs for P0 and P1.
struct FullDomainCase {
    keys: DealtBatch,
    expected: [Vec<u64>; 2],
}

struct Suite {
    point_cases: Vec<PointCase>,
    large_cases: Vec<LargeCase>,
    full_domain_cases: Vec<FullDomainCase>,
    /// Seven bit-DCF keys at k = 8, for the error cases.
    dcf_keys: DealtBatch,
    /// One DPF key at k = 8 and one at k = 50, for the error cases.
    dpf_keys: [DealtBatch; 2],
}

fn suite() -> &'static Suite {
    static SUITE: OnceLock<Suite> = OnceLock::new();
    SUITE.get_or_init(build_suite)
}

fn party_index(party: Party) -> usize {
    usize::from(party == Party::P1)
}

/// Points for a batch: each key's points are drawn from α, α ± 1, 0,
/// 2^k − 1, α with bits above k set, and uniform words.
fn points_for(batch: &DealtBatch, per_key: usize, queries: usize, rng: &mut Prg) -> Vec<u64> {
    let k = batch.params.domain();
    (0..queries)
        .map(|q| {
            let alpha = batch.alphas[(q / per_key) % batch.count()];
            match rng.next_u64() % 8 {
                0 | 1 => alpha,
                2 => alpha.wrapping_sub(1),
                3 => alpha.wrapping_add(1),
                4 => 0,
                5 => k.mask(),
                6 => alpha | !k.mask(),
                _ => rng.next_u64(),
            }
        })
        .collect()
}

fn serial_eval(keys: &KeyBatch<'_>, points: &[u64]) -> Vec<u64> {
    let mut out = vec![UNWRITTEN; points.len() * keys.params().output().words()];
    Serial::new()
        .eval(keys, points, &mut out)
        .unwrap_or_else(|e| panic!("Serial failed on {:?}: {e}", keys.params()));
    out
}

fn serial_full_domain(keys: &KeyBatch<'_>) -> Vec<u64> {
    let mut out = vec![UNWRITTEN; keys.count() << keys.params().domain().bits()];
    Serial::new()
        .eval_full_domain(keys, &mut out)
        .unwrap_or_else(|e| panic!("Serial full domain failed on {:?}: {e}", keys.params()));
    out
}

/// The large cases: batching is shape-independent, so a few shapes cover
/// it, one per output kind and lane size class, and both parties.
fn large_shapes() -> [(Params, Party, usize); 5] {
    let shape = |kind, k, output| Params::new(kind, Width::of(k), output);
    let ring = |w| Output::Ring(Width::of(w));
    [
        (shape(Kind::Dcf, 64, Output::Bit), Party::P0, 1),
        (shape(Kind::Dcf, 64, Output::Bit), Party::P1, 3),
        (shape(Kind::Dcf, 24, ring(13)), Party::P1, 3),
        (shape(Kind::Dpf, 50, ring(64)), Party::P0, 1),
        (shape(Kind::Dpf, 24, Output::Bit), Party::P1, 3),
    ]
}

fn build_suite() -> Suite {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"conformance v1\0\0");
    let max_keys = BATCH_SIZES.iter().copied().max().unwrap_or(0);

    let mut shapes = keys::shapes(&DOMAINS, &RING_WIDTHS);
    shapes.extend(keys::pair_shapes(&DOMAINS, &RING_WIDTHS));
    let point_cases = shapes
        .iter()
        .map(|params| {
            let keys = DealtBatch::deal(&aes, params, max_keys, &mut rng);
            let point_sets = POINTS_PER_KEY
                .iter()
                .map(|&per_key| {
                    let points = points_for(&keys, per_key, max_keys * per_key, &mut rng);
                    let expected = PARTIES.map(|p| serial_eval(&keys.batch(p, max_keys), &points));
                    PointSet {
                        per_key,
                        points,
                        expected,
                    }
                })
                .collect();
            PointCase { keys, point_sets }
        })
        .collect();

    let mut large_cases = Vec::new();
    for (params, party, per_key) in large_shapes() {
        // 65 keys: prime to 8, 64 and 4096.
        let pool = DealtBatch::deal(&aes, &params, 65, &mut rng);
        let queries = LARGE_QUERIES.div_ceil(per_key) * per_key;
        let mut case = LargeCase {
            points: points_for(&pool, per_key, queries, &mut rng),
            pool,
            party,
            per_key,
            expected: Vec::new(),
        };
        let bytes = case.key_bytes();
        let keys = KeyBatch::new(params, party, &bytes).unwrap();
        case.expected = serial_eval(&keys, &case.points);
        large_cases.push(case);
    }

    let max_full = FULL_DOMAIN_KEYS.iter().copied().max().unwrap_or(0);
    let full_domain_cases = keys::shapes(&FULL_DOMAINS, &RING_WIDTHS)
        .iter()
        .filter(|p| p.kind() == Kind::Dpf)
        .map(|params| {
            let keys = DealtBatch::deal(&aes, params, max_full, &mut rng);
            let expected = PARTIES.map(|p| serial_full_domain(&keys.batch(p, max_full)));
            FullDomainCase { keys, expected }
        })
        .collect();

    let dcf_keys = DealtBatch::deal(&aes, &Params::dcf_bit(Width::of(8)), 7, &mut rng);
    let dpf_keys = [8, 50].map(|k| {
        let params = Params::new(Kind::Dpf, Width::of(k), Output::Bit);
        DealtBatch::deal(&aes, &params, 1, &mut rng)
    });

    Suite {
        point_cases,
        large_cases,
        full_domain_cases,
        dcf_keys,
        dpf_keys,
    }
}

/// Calls `f`, turning a panic into a failure line.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_owned())
    })
}

/// One call of the backend under test, counted: an error or a panic is
/// recorded as a failure of `what`. True when it returned `Ok`.
fn called(report: &mut Report, what: &str, f: impl FnOnce() -> Result<(), Error>) -> bool {
    report.calls += 1;
    match guarded(f) {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            report.fail(format!("{what}: returned error {e:?}"));
            false
        }
        Err(panic) => {
            report.fail(format!("{what}: panicked: {panic}"));
            false
        }
    }
}

fn u64_from(n: usize) -> u64 {
    u64::try_from(n).unwrap()
}

/// Runs `check` on `keys` as given and again with their roots apart from
/// their bodies (how the host evaluates keys read from a key file), the
/// second time with ", roots apart" after `what`.
fn in_both_layouts(keys: &KeyBatch<'_>, what: &str, mut check: impl FnMut(&KeyBatch<'_>, &str)) {
    check(keys, what);
    let (roots, bodies) = taken_apart(keys);
    let split = KeyBatch::split(keys.params(), keys.party(), &roots, &bodies).unwrap();
    check(&split, &format!("{what}, roots apart"));
}

/// Evaluates `points` and compares outputs and AES calls with `expected`,
/// in both key layouts ([`in_both_layouts`]).
fn compare_eval(
    eval: &dyn BatchEval,
    keys: &KeyBatch<'_>,
    points: &[u64],
    expected: &[u64],
    what: &str,
    report: &mut Report,
) {
    in_both_layouts(keys, what, |keys, what| {
        compare_layout(eval, keys, (points, expected), what, report);
    });
}

/// [`compare_eval`] on one layout.
fn compare_layout(
    eval: &dyn BatchEval,
    keys: &KeyBatch<'_>,
    (points, expected): (&[u64], &[u64]),
    what: &str,
    report: &mut Report,
) {
    // A pair's query writes two words.
    let words = keys.params().output().words();
    let mut out = vec![UNWRITTEN; points.len() * words];
    report.calls += 1;
    let stats = match guarded(|| eval.eval(keys, points, &mut out)) {
        Ok(Ok(stats)) => stats,
        Ok(Err(e)) => return report.fail(format!("{what}: returned error {e:?}")),
        Err(panic) => return report.fail(format!("{what}: panicked: {panic}")),
    };
    report.outputs += out.len();
    let per_key = points.len().checked_div(keys.count()).unwrap_or(0);
    if let Some(i) = (0..out.len()).find(|&i| out[i] != expected[i]) {
        let wrong = (0..out.len()).filter(|&i| out[i] != expected[i]).count();
        let q = i / words;
        report.fail(format!(
            "{what}: {wrong} of {} output words differ; first at query {q} (key {}, point \
             {:#x}, word {}): Serial {:#x}, got {:#x}",
            out.len(),
            q / per_key.max(1),
            points[q],
            i % words,
            expected[i],
            out[i]
        ));
    }
    let predicted = keys.params().aes_per_eval() * u64_from(points.len());
    if stats.aes_calls != predicted {
        report.fail(format!(
            "{what}: reported {} AES calls, Params::aes_per_eval predicts {predicted}",
            stats.aes_calls
        ));
    }
}

/// The batch's keys taken apart: their roots back to back, then their
/// bodies back to back (the layout of [`KeyBatch::split`]).
pub fn taken_apart(keys: &KeyBatch<'_>) -> (Vec<u8>, Vec<u8>) {
    let (mut roots, mut bodies) = (Vec::new(), Vec::new());
    for i in 0..keys.count() {
        roots.extend_from_slice(keys.key(i).root());
        bodies.extend_from_slice(keys.key(i).body());
    }
    (roots, bodies)
}

fn check_point_case(eval: &dyn BatchEval, case: &PointCase, scope: Scope, report: &mut Report) {
    let params = case.keys.params;
    for set in &case.point_sets {
        for party in PARTIES {
            for count in BATCH_SIZES {
                if scope.small() && count > 9 {
                    continue;
                }
                let keys = case.keys.batch(party, count);
                let queries = count * set.per_key;
                let words = queries * params.output().words();
                let what = format!(
                    "eval {params:?} {party:?}, {count} keys × {} points",
                    set.per_key
                );
                compare_eval(
                    eval,
                    &keys,
                    &set.points[..queries],
                    &set.expected[party_index(party)][..words],
                    &what,
                    report,
                );
            }
        }
    }
}

fn check_large_case(eval: &dyn BatchEval, case: &LargeCase, report: &mut Report) {
    let bytes = case.key_bytes();
    let keys = KeyBatch::new(case.pool.params, case.party, &bytes).unwrap();
    let what = format!(
        "large eval {:?} {:?}, {} keys × {} points",
        case.pool.params,
        case.party,
        case.key_count(),
        case.per_key
    );
    compare_eval(eval, &keys, &case.points, &case.expected, &what, report);
}

fn check_full_domain_case(
    eval: &dyn BatchEval,
    case: &FullDomainCase,
    scope: Scope,
    report: &mut Report,
) {
    let params = case.keys.params;
    let size = 1usize << params.domain().bits();
    for party in PARTIES {
        for count in FULL_DOMAIN_KEYS {
            if scope.small() && count > 3 {
                continue;
            }
            let keys = case.keys.batch(party, count);
            let what = format!("full domain {params:?} {party:?}, {count} keys");
            let expected = &case.expected[party_index(party)][..count * size];
            in_both_layouts(&keys, &what, |keys, what| {
                compare_full_domain(eval, keys, expected, what, report);
                if matches!(params.output(), Output::Ring(_)) {
                    compare_lookup(eval, keys, what, report);
                }
            });
        }
    }
}

/// [`BatchEval::lookup`] on `keys` against `Serial`'s (the trait's default:
/// every domain expanded, then summed), at indices 0, 2^k − 1, one above
/// the domain and uniform words, with scratch for one key's domain, two,
/// and every key's.
fn compare_lookup(eval: &dyn BatchEval, keys: &KeyBatch<'_>, what: &str, report: &mut Report) {
    let (n, bits) = (keys.count(), keys.params().domain().bits());
    let size = 1usize << bits;
    let mut rng = Prg::with_stream(b"conformance lut\0", u64_from(n) << 8 | u64::from(bits));
    let table: Vec<u64> = (0..size).map(|_| rng.next_u64()).collect();
    let points: Vec<u64> = (0..n)
        .map(|i| match i % 4 {
            0 => 0,
            1 => u64_from(size - 1),
            2 => u64_from(size),
            _ => rng.next_u64(),
        })
        .collect();
    let mut expected = vec![UNWRITTEN; n];
    let mut scratch = vec![0u64; size.max(n * size)];
    if let Err(e) = Serial::new().lookup(keys, (&points, &table), &mut scratch, &mut expected) {
        return report.fail(format!("{what}: Serial's lookup failed: {e:?}"));
    }
    for slots in [1, 2, n.max(1)] {
        let mut out = vec![UNWRITTEN; n];
        let domain = &mut scratch[..slots.min(n.max(1)) * size];
        report.calls += 1;
        let stats = match guarded(|| eval.lookup(keys, (&points, &table), domain, &mut out)) {
            Ok(Ok(stats)) => stats,
            Ok(Err(e)) => return report.fail(format!("{what}: lookup returned error {e:?}")),
            Err(panic) => return report.fail(format!("{what}: lookup panicked: {panic}")),
        };
        report.outputs += n;
        if let Some(i) = (0..n).find(|&i| out[i] != expected[i]) {
            report.fail(format!(
                "{what}: lookup with {slots} domain(s) of scratch differs at key {i}: Serial {:#x}, got {:#x}",
                expected[i], out[i]
            ));
        }
        let predicted = keys.params().aes_per_full_domain() * u64_from(n);
        if stats.aes_calls != predicted {
            report.fail(format!(
                "{what}: lookup reported {} AES calls, Params::aes_per_full_domain predicts {predicted}",
                stats.aes_calls
            ));
        }
    }
}

/// Evaluates `keys` on their whole domain and compares outputs and AES
/// calls with `expected`.
fn compare_full_domain(
    eval: &dyn BatchEval,
    keys: &KeyBatch<'_>,
    expected: &[u64],
    what: &str,
    report: &mut Report,
) {
    let params = keys.params();
    let size = 1usize << params.domain().bits();
    let mut out = vec![UNWRITTEN; expected.len()];
    report.calls += 1;
    let stats = match guarded(|| eval.eval_full_domain(keys, &mut out)) {
        Ok(Ok(stats)) => stats,
        Ok(Err(e)) => return report.fail(format!("{what}: returned error {e:?}")),
        Err(panic) => return report.fail(format!("{what}: panicked: {panic}")),
    };
    report.outputs += out.len();
    if let Some(i) = (0..out.len()).find(|&i| out[i] != expected[i]) {
        report.fail(format!(
            "{what}: first difference at key {}, x = {:#x}: Serial {:#x}, got {:#x}",
            i / size,
            i % size,
            expected[i],
            out[i]
        ));
    }
    let predicted = params.aes_per_full_domain() * u64_from(keys.count());
    if stats.aes_calls != predicted {
        report.fail(format!(
            "{what}: reported {} AES calls, Params::aes_per_full_domain predicts {predicted}",
            stats.aes_calls
        ));
    }
}

/// [`BatchEval::eval_many`]: the keys of two shapes cut into jobs of
/// uneven sizes (as a step's chunks are), the shapes interleaved so that a
/// backend that groups jobs must split the groups, against `Serial`'s
/// answers for the whole batches.
fn check_eval_many(eval: &dyn BatchEval, suite: &Suite, report: &mut Report) {
    use suffuse_core::batch::EvalJob;
    let wanted = |bits: u32, ring: bool| {
        suite.point_cases.iter().find(|c| {
            let p = c.keys.params;
            p.domain().bits() == bits && matches!(p.output(), Output::Ring(_)) == ring
        })
    };
    let (Some(a), Some(b)) = (wanted(50, false), wanted(24, true)) else {
        return report.fail("eval_many: the suite lacks its shapes".into());
    };
    let cuts = [0, 7, 9, 40, 65];
    for party in PARTIES {
        let mut outs: Vec<(Vec<u64>, &[u64])> = Vec::new();
        let mut layout = Vec::new();
        for w in cuts.windows(2) {
            for case in [a, b] {
                let set = &case.point_sets[1];
                let per = set.per_key;
                let (q0, q1) = (w[0] * per, w[1] * per);
                outs.push((
                    vec![UNWRITTEN; q1 - q0],
                    &set.expected[party_index(party)][q0..q1],
                ));
                layout.push((case, w[0], w[1], &set.points[q0..q1]));
            }
        }
        let batches: Vec<KeyBatch<'_>> = layout
            .iter()
            .map(|(case, k0, k1, _)| case.keys.batch(party, 65).slice(*k0, *k1))
            .collect();
        let mut jobs: Vec<EvalJob<'_>> = batches
            .iter()
            .zip(&layout)
            .zip(outs.iter_mut())
            .map(|((keys, (_, _, _, points)), (out, _))| EvalJob {
                keys: *keys,
                points,
                out,
            })
            .collect();
        let what = format!("eval_many {party:?}, {} jobs of two shapes", jobs.len());
        report.calls += 1;
        let predicted: u64 = jobs
            .iter()
            .map(|j| j.keys.params().aes_per_eval() * u64_from(j.points.len()))
            .sum();
        let stats = match guarded(|| eval.eval_many(&mut jobs)) {
            Ok(Ok(stats)) => stats,
            Ok(Err(e)) => return report.fail(format!("{what}: returned error {e:?}")),
            Err(panic) => return report.fail(format!("{what}: panicked: {panic}")),
        };
        drop(jobs);
        for (i, (got, want)) in outs.iter().enumerate() {
            report.outputs += got.len();
            if got.as_slice() != *want {
                report.fail(format!("{what}: job {i} differs from Serial"));
            }
        }
        if stats.aes_calls != predicted {
            report.fail(format!(
                "{what}: reported {} AES calls, the params predict {predicted}",
                stats.aes_calls
            ));
        }
    }
}

/// [`BatchEval::stage`]: keys evaluated after their bytes were staged (in
/// both layouts, alone and through `eval_many`) must give `Serial`'s
/// answers, and again after `unstage`.
fn check_staged(eval: &dyn BatchEval, suite: &Suite, report: &mut Report) {
    for case in &suite.point_cases {
        let bits = case.keys.params.domain().bits();
        if ![5, 50, 64].contains(&bits) {
            continue;
        }
        let set = &case.point_sets[1];
        let words = case.keys.params.output().words();
        for party in PARTIES {
            let keys = case.keys.batch(party, 65);
            let points = &set.points[..65 * set.per_key];
            let expected = &set.expected[party_index(party)][..65 * set.per_key * words];
            let what = format!("staged {:?} {party:?}", case.keys.params);
            let whole = keys.bytes().unwrap_or_default();
            eval.stage(whole);
            compare_layout(
                eval,
                &keys,
                (points, expected),
                &format!("{what}, whole"),
                report,
            );
            eval.unstage(whole);
            let (roots, bodies) = taken_apart(&keys);
            let split = KeyBatch::split(keys.params(), party, &roots, &bodies).unwrap();
            eval.stage(&bodies);
            let what = format!("{what}, roots apart");
            compare_layout(eval, &split, (points, expected), &what, report);
            // Two chunks of one staged section, as a step's chunks are.
            let cut = 40 * set.per_key;
            let (mut lo, mut hi) = (
                vec![UNWRITTEN; cut * words],
                vec![UNWRITTEN; (points.len() - cut) * words],
            );
            let mut jobs = [
                suffuse_core::batch::EvalJob {
                    keys: split.slice(0, 40),
                    points: &points[..cut],
                    out: &mut lo,
                },
                suffuse_core::batch::EvalJob {
                    keys: split.slice(40, 65),
                    points: &points[cut..],
                    out: &mut hi,
                },
            ];
            report.calls += 1;
            match guarded(|| eval.eval_many(&mut jobs)) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => report.fail(format!("{what}, eval_many: returned error {e:?}")),
                Err(panic) => report.fail(format!("{what}, eval_many: panicked: {panic}")),
            }
            if lo != expected[..cut * words] || hi != expected[cut * words..] {
                report.fail(format!("{what}, eval_many: differs from Serial"));
            }
            eval.unstage(&bodies);
            let what = format!("{what}, unstaged");
            compare_layout(eval, &split, (points, expected), &what, report);
        }
    }
}

/// Expects `call` to return exactly `Err(want)`.
fn expect_error(
    report: &mut Report,
    what: &str,
    want: Error,
    call: impl FnOnce() -> Result<EvalStats, Error>,
) {
    report.calls += 1;
    match guarded(call) {
        Ok(Err(e)) if e == want => {}
        Ok(Err(e)) => report.fail(format!("{what}: expected Err({want:?}), got Err({e:?})")),
        Ok(Ok(stats)) => report.fail(format!("{what}: expected Err({want:?}), got Ok({stats:?})")),
        Err(panic) => report.fail(format!("{what}: expected Err({want:?}), panicked: {panic}")),
    }
}

fn check_errors(eval: &dyn BatchEval, suite: &Suite, report: &mut Report) {
    use Error::{BufferLength, KindMismatch};

    let seven = suite.dcf_keys.batch(Party::P0, 7);
    let none = suite.dcf_keys.batch(Party::P0, 0);
    let points = [3u64; 15];
    let mut out = [0u64; 15];
    expect_error(report, "eval: out longer than points", BufferLength, || {
        eval.eval(&seven, &points[..7], &mut out[..8])
    });
    expect_error(
        report,
        "eval: out shorter than points",
        BufferLength,
        || eval.eval(&seven, &points[..14], &mut out[..13]),
    );
    expect_error(
        report,
        "eval: points not a multiple of keys",
        BufferLength,
        || eval.eval(&seven, &points[..8], &mut out[..8]),
    );
    expect_error(report, "eval: fewer points than keys", BufferLength, || {
        eval.eval(&seven, &points[..6], &mut out[..6])
    });
    expect_error(report, "eval: points but no keys", BufferLength, || {
        eval.eval(&none, &points[..1], &mut out[..1])
    });

    let dcf_one = suite.dcf_keys.batch(Party::P1, 1);
    let mut table = vec![0u64; 1 << 8];
    expect_error(report, "full domain on DCF keys", KindMismatch, || {
        eval.eval_full_domain(&dcf_one, &mut table)
    });

    let [small, wide] = &suite.dpf_keys;
    let small = small.batch(Party::P0, 1);
    let mut long = vec![0u64; (1 << 8) + 1];
    expect_error(
        report,
        "full domain: out one too long",
        BufferLength,
        || eval.eval_full_domain(&small, &mut long),
    );
    expect_error(
        report,
        "full domain: out one too short",
        BufferLength,
        || eval.eval_full_domain(&small, &mut long[..(1 << 8) - 1]),
    );
    expect_error(
        report,
        "full domain: empty out for one key",
        BufferLength,
        || eval.eval_full_domain(&small, &mut []),
    );
    let none = KeyBatch::new(small.params(), Party::P0, &[]).unwrap();
    expect_error(report, "full domain: out but no keys", BufferLength, || {
        eval.eval_full_domain(&none, &mut long[..1 << 8])
    });
    // 2^50 outputs cannot be asked for; the evaluator must refuse, not
    // allocate or index past the buffer it was given.
    let wide = wide.batch(Party::P1, 1);
    expect_error(report, "full domain at k = 50", BufferLength, || {
        eval.eval_full_domain(&wide, &mut long)
    });
}

// ---------------------------------------------------------------------------
// Seed expansion, key generation and matrix products.
// ---------------------------------------------------------------------------

fn random_blocks(n: usize, rng: &mut Prg) -> Vec<Block> {
    (0..n).map(|_| rng.next_block()).collect()
}

fn blocks_equal(a: &[Block], b: &[Block]) -> Option<usize> {
    (0..a.len()).find(|&i| a[i].to_bytes() != b[i].to_bytes())
}

fn check_hashes(eval: &dyn BatchEval, scope: Scope, report: &mut Report) {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"conformance hash");
    for d in [Domain::Tree, Domain::Leaf, Domain::Value, Domain::Prf] {
        for n in HASH_LENGTHS {
            if scope.small() && n > SMALL_BATCH {
                continue;
            }
            let input = random_blocks(n, &mut rng);
            let mut want = input.clone();
            aes.hash_many(d, &mut want);
            let mut got = input;
            report.calls += 1;
            let what = format!("hash_many {d:?}, {n} blocks");
            let calls = match guarded(|| eval.hash_many(d, &mut got)) {
                Ok(calls) => calls,
                Err(panic) => {
                    report.fail(format!("{what}: panicked: {panic}"));
                    continue;
                }
            };
            report.outputs += n;
            if let Some(i) = blocks_equal(&want, &got) {
                report.fail(format!("{what}: block {i} differs from the aes crate"));
            }
            if calls != u64_from(n) {
                report.fail(format!("{what}: reported {calls} AES calls"));
            }
        }
    }
}

/// A generation case's secret inputs.
struct GenInputs {
    alphas: Vec<u64>,
    betas: Vec<u64>,
    roots: Vec<[Block; 2]>,
    random: Vec<u64>,
}

impl GenInputs {
    fn new(params: &Params, count: usize, rng: &mut Prg) -> GenInputs {
        GenInputs {
            alphas: (0..count).map(|_| keys::edgy_alpha(params, rng)).collect(),
            betas: (0..count * params.output().words())
                .map(|_| rng.next_u64())
                .collect(),
            roots: (0..count)
                .map(|_| [rng.next_block(), rng.next_block()])
                .collect(),
            random: (0..count * params.gen_random_words())
                .map(|_| rng.next_u64())
                .collect(),
        }
    }

    fn batch(&self, params: Params) -> GenBatch<'_> {
        GenBatch::new(params, &self.alphas, &self.betas, &self.roots, &self.random).unwrap()
    }
}

/// Both parties' keys, or P0's alone (`p1` false: an empty `key1`).
fn generate_with(
    eval: &dyn BatchEval,
    batch: &GenBatch<'_>,
    p1: bool,
) -> Result<([Vec<u8>; 2], u64), String> {
    let len = batch.params().key_len() * batch.count();
    let mut keys = [vec![0xA5u8; len], vec![0x5Au8; if p1 { len } else { 0 }]];
    let [k0, k1] = &mut keys;
    match guarded(|| eval.generate(batch, k0, k1)) {
        Ok(Ok(stats)) => Ok((keys, stats.aes_calls)),
        Ok(Err(e)) => Err(format!("returned error {e:?}")),
        Err(panic) => Err(format!("panicked: {panic}")),
    }
}

fn check_generation(eval: &dyn BatchEval, scope: Scope, report: &mut Report) {
    let mut rng = Prg::new(b"conformance gen\0");
    let large = [Params::dcf_bit(Width::of(50)), {
        Params::new(Kind::Dcf, Width::of(24), Output::Ring(Width::of(13)))
    }];
    let mut cases: Vec<(Params, usize)> = Vec::new();
    let mut shapes = keys::shapes(&DOMAINS, &RING_WIDTHS);
    shapes.extend(keys::pair_shapes(&DOMAINS, &RING_WIDTHS));
    for params in shapes {
        cases.extend(GEN_COUNTS.iter().map(|&c| (params, c)));
    }
    if scope.small() {
        cases.retain(|(p, c)| SMALL_DOMAINS.contains(&p.domain().bits()) && *c <= SMALL_BATCH);
    } else {
        cases.extend(large.iter().map(|&p| (p, GEN_LARGE)));
    }
    for (params, count) in cases {
        let inputs = GenInputs::new(&params, count, &mut rng);
        let batch = inputs.batch(params);
        let what = format!("generate {params:?}, {count} keys");
        report.calls += 1;
        let (want, _) = match generate_with(&Serial::new(), &batch, true) {
            Ok(w) => w,
            Err(e) => panic!("Serial failed to {what}: {e}"),
        };
        match generate_with(eval, &batch, false) {
            Ok(([alone, _], _)) if alone != want[0] => {
                report.fail(format!("{what}: P0's keys alone differ from Serial's"));
            }
            Ok(_) => {}
            Err(e) => report.fail(format!("{what}, P0's keys alone: {e}")),
        }
        let (got, calls) = match generate_with(eval, &batch, true) {
            Ok(g) => g,
            Err(e) => {
                report.fail(format!("{what}: {e}"));
                continue;
            }
        };
        report.outputs += count;
        let len = params.key_len().max(1);
        for p in 0..2 {
            if let Some(i) = (0..want[p].len()).find(|&i| want[p][i] != got[p][i]) {
                report.fail(format!(
                    "{what}: P{p}'s key {} differs from Serial at byte {}",
                    i / len,
                    i % len
                ));
            }
        }
        let predicted = params.aes_per_gen() * u64_from(count);
        if calls != predicted {
            report.fail(format!(
                "{what}: reported {calls} AES calls, Params::aes_per_gen predicts {predicted}"
            ));
        }
    }
    let params = Params::dcf_bit(Width::of(8));
    let inputs = GenInputs::new(&params, 3, &mut rng);
    let batch = inputs.batch(params);
    let len = params.key_len();
    let (mut short, mut long) = (vec![0u8; 3 * len - 1], vec![0u8; 3 * len]);
    expect_error(
        report,
        "generate: key0 one byte short",
        Error::BufferLength,
        || eval.generate(&batch, &mut short, &mut long),
    );
    let mut other = vec![0u8; 3 * len];
    let mut longer = vec![0u8; 3 * len + len];
    expect_error(
        report,
        "generate: key1 a key too long",
        Error::BufferLength,
        || eval.generate(&batch, &mut other, &mut longer),
    );
}

fn check_matmul(eval: &dyn BatchEval, scope: Scope, report: &mut Report) {
    let mut rng = Prg::new(b"conformance mat\0");
    for (batches, m, k, n) in MAT_SHAPES {
        if scope.small() && batches * m * k * n > 17 * 33 * 65 {
            continue;
        }
        for transpose_b in [false, true] {
            for accumulate in [false, true] {
                let shape = MatShape {
                    batches,
                    m,
                    k,
                    n,
                    transpose_b,
                    accumulate,
                };
                check_one_product(eval, &shape, &mut rng, report);
            }
        }
    }
    let shape = MatShape {
        batches: 2,
        m: 3,
        k: 4,
        n: 5,
        transpose_b: false,
        accumulate: false,
    };
    let (a, b) = (vec![1u64; 24], vec![1u64; 40]);
    let mut c = vec![0u64; 31];
    report.calls += 1;
    match guarded(|| eval.matmul(&shape, &a, &b, &mut c)) {
        Ok(Err(Error::BufferLength)) => {}
        other => report.fail(format!(
            "matmul: c one word long: expected Err(BufferLength), got {other:?}"
        )),
    }
    report.calls += 1;
    match guarded(|| eval.matmul(&shape, &a[..23], &b, &mut c[..30])) {
        Ok(Err(Error::BufferLength)) => {}
        other => report.fail(format!(
            "matmul: a one word short: expected Err(BufferLength), got {other:?}"
        )),
    }
}

/// Products whose weights turn with each row ([`BatchEval::turned_matmul`])
/// against [`turned_reference`]: both pairings, no turned column, all
/// columns turned, ragged widths past any vector length, the rounding at
/// both signs (factors up to 2^17, weights up to 2^44), one and many rows;
/// and the length checks.
fn check_turned(eval: &dyn BatchEval, report: &mut Report) {
    let mut rng = Prg::new(b"conformance turn");
    let shapes = [
        (1, 1, 2, 2, Pairing::Adjacent),
        (3, 5, 9, 0, Pairing::Adjacent),
        (2, 7, 18, 18, Pairing::Adjacent),
        (5, 33, 70, 64, Pairing::Halves(8)),
        (17, 65, 131, 96, Pairing::Halves(32)),
        (1, 576, 960, 768, Pairing::Adjacent),
        (9, 64, 100, 60, Pairing::Halves(6)),
    ];
    for (m, k, n, t, pairing) in shapes {
        let [a, b, own, other] = turned_operands(&mut rng, [m, k, n, t]);
        let turned = Turned {
            m,
            k,
            n,
            turned: t,
            pairing,
            own: &own,
            other: &other,
            frac: 16,
        };
        let mut want = vec![0u64; m * n];
        turned_reference(&turned, &a, &b, &mut want).unwrap();
        let mut got: Vec<u64> = (0..m * n).map(|_| rng.next_u64()).collect();
        let what = format!("turned_matmul m {m} k {k} n {n} turned {t} {pairing:?}");
        if !called(report, &what, || {
            eval.turned_matmul(&turned, &a, &b, &mut got)
        }) {
            continue;
        }
        report.outputs += m * n;
        if let Some(i) = (0..m * n).find(|&i| want[i] != got[i]) {
            report.fail(format!(
                "{what}: entry {i} is {:#x}, the reference gives {:#x}",
                got[i], want[i]
            ));
        }
    }
    // (what, turned, pairing, frac, words of c); a is 2 × 3, b 3 × 4.
    let bad = [
        ("c one word long", 2, Pairing::Adjacent, 16, 9),
        ("odd turned columns", 1, Pairing::Adjacent, 16, 8),
        ("turned past n", 6, Pairing::Adjacent, 16, 8),
        ("a block that does not divide", 2, Pairing::Halves(4), 16, 8),
        ("an odd block", 3, Pairing::Halves(3), 16, 8),
        ("frac 0", 2, Pairing::Adjacent, 0, 8),
    ];
    for (what, turned, pairing, frac, lc) in bad {
        let factors = vec![0u64; 2 * turned];
        let t = Turned {
            m: 2,
            k: 3,
            n: 4,
            turned,
            pairing,
            own: &factors,
            other: &factors,
            frac,
        };
        let (a, b, mut c) = (vec![1u64; 6], vec![1u64; 12], vec![0u64; lc]);
        report.calls += 1;
        match guarded(|| eval.turned_matmul(&t, &a, &b, &mut c)) {
            Ok(Err(Error::BufferLength)) => {}
            other => report.fail(format!(
                "turned_matmul: {what}: expected Err(BufferLength), got {other:?}"
            )),
        }
    }
}

/// Random operands of a [`Turned`] product of shape `[m, k, n, turned]`
/// at the edges of its contract: shares `a` (`m × k`), weights `b`
/// (`k × n`) in `[−2^44, 2^44)`, and the two factor tables (`m × turned`)
/// in `[−2^17, 2^17)`.
pub fn turned_operands(rng: &mut Prg, [m, k, n, t]: [usize; 4]) -> [Vec<u64>; 4] {
    let mut small = |count: usize, bits: u32| -> Vec<u64> {
        (0..count)
            .map(|_| (rng.next_u64() >> (64 - bits)).wrapping_sub(1 << (bits - 1)))
            .collect()
    };
    let b = small(k * n, 45);
    let own = small(m * t, 18);
    let other = small(m * t, 18);
    let a = (0..m * k).map(|_| rng.next_u64()).collect();
    [a, b, own, other]
}

fn check_one_product(eval: &dyn BatchEval, shape: &MatShape, rng: &mut Prg, report: &mut Report) {
    let [la, lb, lc] = shape.lens().unwrap();
    let a: Vec<u64> = (0..la).map(|_| rng.next_u64()).collect();
    let b: Vec<u64> = (0..lb).map(|_| rng.next_u64()).collect();
    let c0: Vec<u64> = (0..lc).map(|_| rng.next_u64()).collect();
    let mut want = c0.clone();
    matmul_reference(shape, &a, &b, &mut want).unwrap();
    // Plainly, then twice with `b` as a resident operand: the second call
    // finds it kept (on backends that keep it) and must not use stale words.
    let id = resident_id(shape);
    for (pass, resident) in [(0, false), (1, true), (2, true)] {
        let mut got = c0.clone();
        let what = format!("matmul {shape:?} (resident {resident}, pass {pass})");
        report.calls += 1;
        let call = || {
            if resident {
                let b = Resident { id, words: &b };
                eval.matmul_resident(shape, &a, b, &mut got)
            } else {
                eval.matmul(shape, &a, &b, &mut got)
            }
        };
        match guarded(call) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return report.fail(format!("{what}: returned error {e:?}")),
            Err(panic) => return report.fail(format!("{what}: panicked: {panic}")),
        }
        report.outputs += lc;
        if let Some(i) = (0..lc).find(|&i| want[i] != got[i]) {
            report.fail(format!(
                "{what}: entry {i} is {:#x}, the triple loop gives {:#x}",
                got[i], want[i]
            ));
        }
    }
}

/// A resident operand's id for one case: unique per shape and per run of
/// the harness, so that no backend can hold another case's words under it.
fn resident_id(shape: &MatShape) -> [u8; 16] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let mut id = [0u8; 16];
    let [la, lb, _] = shape.lens().unwrap_or([0; 3]);
    id[..8].copy_from_slice(&run.to_le_bytes());
    id[8..12].copy_from_slice(&u32::try_from(la % (1 << 31)).unwrap_or(0).to_le_bytes());
    id[12..].copy_from_slice(&u32::try_from(lb % (1 << 31)).unwrap_or(0).to_le_bytes());
    id
}
