//! Known answers for the Cortex-M firmware (`examples/mcu`), written as
//! Rust source (`examples/mcu/src/kat.rs`) so that they are built into the
//! binary.
//!
//! * The DCF/DPF vectors of `vectors/v1/fss.json`, as committed.
//! * Gate transcripts: a ReLU and a GeLU gate dealt and run by both parties
//!   here, recording for each party what a key file and the network give
//!   it (seed, key bodies without roots, explicit words, input shares, the
//!   peer's message of every round) and what it must produce (its own
//!   messages and output shares).
//!
//! Everything is reproducible from fixed seeds. `cargo xtask vectors`
//! writes the file; `tests/tests/mcu_kat.rs` checks that the committed
//! file equals [`render`] and that the transcripts reconstruct to the
//! gates' cleartext reference.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use suffuse_core::batch::Serial;
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::fss::Party;
use suffuse_core::gate::activation::{self, GeluForm};
use suffuse_core::gate::{DealScratch, Eval, Gate, Input, PartyKeys, Protocol, relu};
use suffuse_core::phi::{Phi, PolyMode};
use suffuse_core::prg::{Block, FixedKeyAes, Prg};
use suffuse_core::ring::Width;
use suffuse_core::suf::{Domain, MAX_ARITH, MAX_DEGREE, Suf};

use crate::keys::PARTIES;
use crate::vectors::{self, Vector, VectorFile};

/// The ring of every recorded gate: the one the BERT plan uses.
pub const RING: u32 = 64;

/// A recorded gate: its constructor's arguments and its inputs.
pub struct GateCase {
    /// The label.
    pub name: &'static str,
    /// `relu` or `gelu_erf`: which constructor.
    pub kind: &'static str,
    /// Effective width.
    pub k: u32,
    /// Input fraction bits (GeLU only).
    pub frac: u32,
    /// Cleartext inputs, signed.
    pub xs: [i64; 8],
}

/// The recorded gates, at small effective widths.
pub const GATES: [GateCase; 2] = [
    GateCase {
        name: "relu-k16",
        kind: "relu",
        k: 16,
        frac: 0,
        xs: [0, 1, -1, 32767, -32768, 1234, -5678, 42],
    },
    GateCase {
        name: "gelu-erf-k20",
        kind: "gelu_erf",
        k: 20,
        frac: 12,
        // −6, −2.5, −1, −1/8, 0, 0.75, 2, 5.5 at 2^-12.
        xs: [-24576, -10240, -4096, -512, 0, 3072, 8192, 22528],
    },
];

/// The gate a case names, built as the host builds it.
pub fn gate_of(case: &GateCase) -> Gate {
    let (ring, k) = (Width::of(RING), Width::of(case.k));
    match case.kind {
        "relu" => relu::relu(ring, k).unwrap(),
        "gelu_erf" => activation::gelu(GeluForm::Erf, ring, k, case.frac).unwrap(),
        other => panic!("unknown gate kind {other}"),
    }
}

/// A spline gate's SUF as the data of `Suf::piecewise`: interior cuts and
/// per-interval coefficients. The firmware builds its compile-time copy of
/// the gate from these (`Spline::suf` is not `const`); the copy it builds
/// at run time with `activation::gelu_init` must equal it (docs/MCU.md).
pub fn piecewise_data(suf: &Suf) -> (Vec<i128>, Vec<[[u64; MAX_DEGREE + 1]; MAX_ARITH]>) {
    let m = suf.intervals;
    let cuts = suf.bounds[1..m].to_vec();
    let coeffs = suf.pieces[..m].iter().map(|p| p.coeffs).collect();
    (cuts, coeffs)
}

/// A spline gate rebuilt from [`piecewise_data`] exactly as the firmware's
/// `const` does; it must equal [`gate_of`].
pub fn gate_from_piecewise(case: &GateCase) -> Gate {
    let host = gate_of(case);
    let suf = &host.compiled.suf;
    let (cuts, coeffs) = piecewise_data(suf);
    let ring = Width::of(RING);
    let rebuilt = Suf::piecewise(
        ring,
        Domain::Signed,
        case.frac,
        suf.arith,
        suf.degree,
        &cuts,
        &coeffs,
    );
    Gate::new(
        &rebuilt,
        Width::of(case.k),
        Phi::poly(ring, PolyMode::Beaver),
        Input::Shares,
    )
    .unwrap()
}

/// The firmware's `static` of a case's gate, built at compile time.
fn render_gate(s: &mut String, case: &GateCase) {
    let name = static_name(case);
    writeln!(s, "/// {}: built at compile time, into flash.", case.name).unwrap();
    match case.kind {
        "relu" => {
            writeln!(
                s,
                "pub static {name}: Result<Gate, SufError> = relu::relu(Width::of({RING}), Width::of({}));",
                case.k
            )
            .unwrap();
        }
        _ => {
            let gate = gate_of(case);
            let suf = &gate.compiled.suf;
            let (cuts, coeffs) = piecewise_data(suf);
            let cuts: Vec<String> = cuts.iter().map(|c| c.to_string()).collect();
            writeln!(s, "pub static {name}: Result<Gate, SufError> = Gate::new(").unwrap();
            writeln!(s, "    &Suf::piecewise(").unwrap();
            writeln!(s, "        Width::of({RING}),").unwrap();
            writeln!(s, "        Domain::Signed,").unwrap();
            writeln!(s, "        {},", case.frac).unwrap();
            writeln!(s, "        {},", suf.arith).unwrap();
            writeln!(s, "        {},", suf.degree).unwrap();
            writeln!(s, "        &[{}],", cuts.join(", ")).unwrap();
            writeln!(s, "        &[").unwrap();
            for piece in &coeffs {
                let outs: Vec<String> = piece
                    .iter()
                    .map(|c| {
                        let w: Vec<String> = c.iter().map(|x| format!("{x:#x}")).collect();
                        format!("[{}]", w.join(", "))
                    })
                    .collect();
                writeln!(s, "            [{}],", outs.join(", ")).unwrap();
            }
            writeln!(s, "        ],").unwrap();
            writeln!(s, "    ),").unwrap();
            writeln!(s, "    Width::of({}),", case.k).unwrap();
            writeln!(s, "    Phi::poly(Width::of({RING}), PolyMode::Beaver),").unwrap();
            writeln!(s, "    Input::Shares,").unwrap();
            writeln!(s, ");").unwrap();
        }
    }
    s.push('\n');
}

/// The firmware's run-time constructor of a case's gate (`GateBuild`).
fn build_of(case: &GateCase) -> String {
    match case.kind {
        "relu" => format!("GateBuild::Relu {{ ring: {RING}, k: {} }}", case.k),
        _ => format!(
            "GateBuild::GeluErf {{ ring: {RING}, k: {}, frac: {} }}",
            case.k, case.frac
        ),
    }
}

fn static_name(case: &GateCase) -> String {
    case.name.to_uppercase().replace('-', "_")
}

/// One party's side of a two-party gate run.
pub struct PartyRecord {
    /// The party's PRF seed.
    pub seed: [u8; 16],
    /// Its input shares.
    pub input: Vec<u64>,
    /// Its DCF key bodies, without roots, back to back (a key file's
    /// layout).
    pub dcf: [Vec<u8>; MAX_KEYS],
    /// Its explicit words.
    pub explicit: Vec<u64>,
    /// What it sent in each round.
    pub sent: Vec<Vec<u8>>,
    /// Its ring output shares.
    pub arith: Vec<u64>,
    /// Its bit output shares.
    pub bits: Vec<u64>,
}

/// The first element index the transcripts' key material starts at.
pub const FIRST: u64 = 1000;

/// Deals `case` and runs both parties in memory, recording each side.
pub fn record(case: &GateCase) -> [PartyRecord; 2] {
    let gate = gate_of(case);
    let w = gate.ring();
    let n = case.xs.len();
    let aes = FixedKeyAes::new();
    let mut seeds = [*b"suffuse-mcu-P0\0\0", *b"suffuse-mcu-P1\0\0"];
    for s in &mut seeds {
        s[15] = u8::try_from(case.k).unwrap();
    }
    let lens: Vec<usize> = (0..MAX_KEYS)
        .map(|k| {
            if k < gate.compiled.key_count {
                n * gate.key_params(k).key_len()
            } else {
                0
            }
        })
        .collect();
    let mut full: [[Vec<u8>; MAX_KEYS]; 2] =
        std::array::from_fn(|_| std::array::from_fn(|k| vec![0u8; lens[k]]));
    let mut explicit = vec![0u64; n * gate.explicit_words()];
    {
        let [f0, f1] = &mut full;
        let mut d0: [&mut [u8]; MAX_KEYS] = f0.each_mut().map(Vec::as_mut_slice);
        let mut d1: [&mut [u8]; MAX_KEYS] = f1.each_mut().map(Vec::as_mut_slice);
        let mut prf = vec![Block::ZERO; gate.deal_scratch_blocks(n, n)];
        let mut words = vec![0u64; DealScratch::words(n)];
        gate.deal(
            &Serial::new(),
            seeds,
            None,
            FIRST,
            n,
            &mut d0,
            &mut d1,
            &mut explicit,
            &mut DealScratch::new(&mut prf, &mut words),
        )
        .unwrap();
    }
    let xs: Vec<u64> = case.xs.iter().map(|&x| w.reduce(x as u64)).collect();
    let mut prg = Prg::new(b"suffuse-mcu-x0\0\0");
    let x0: Vec<u64> = xs.iter().map(|_| w.reduce(prg.next_u64())).collect();
    let x1: Vec<u64> = xs.iter().zip(&x0).map(|(x, a)| w.sub(*x, *a)).collect();
    let inputs = [x0, x1];
    let explicit_of = |p: Party| if p == Party::P1 { &explicit[..] } else { &[] };
    let mut scratch = [
        vec![0u64; gate.scratch_words(n)],
        vec![0u64; gate.scratch_words(n)],
    ];
    let [s0, s1] = &mut scratch;
    let mut evals = [(0, s0), (1, s1)].map(|(i, s)| {
        let p = PARTIES[i];
        let keys = PartyKeys {
            dcf: full[i].each_ref().map(Vec::as_slice),
            roots: [&[]; MAX_KEYS],
            explicit: explicit_of(p),
        };
        Eval::new(
            &gate, &aes, p, &seeds[i], None, FIRST, n, keys, &inputs[i], s,
        )
        .unwrap()
    });
    let serial = Serial::new();
    let mut sent: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    for i in 0..evals[0].rounds() {
        let len = evals[0].send_len(i);
        for p in 0..2 {
            let mut buf = vec![0u8; len];
            evals[p].prepare(i, &mut buf).unwrap();
            sent[p].push(buf);
        }
        for p in 0..2 {
            evals[p].finish(i, &sent[1 - p][i], &serial).unwrap();
        }
    }
    let outs = [0, 1].map(|i| {
        let mut arith = vec![0u64; n * gate.outputs()];
        let mut bits = vec![0u64; n * gate.bit_outputs()];
        evals[i].outputs(&mut arith, &mut bits).unwrap();
        (arith, bits)
    });
    let [(a0, b0), (a1, b1)] = outs;
    let [i0, i1] = inputs;
    let [sent0, sent1] = sent;
    let [f0, f1] = full;
    [(0, i0, f0, sent0, a0, b0), (1, i1, f1, sent1, a1, b1)].map(
        |(p, input, dcf, sent, arith, bits)| PartyRecord {
            seed: seeds[p],
            input,
            dcf: {
                let mut k = 0;
                dcf.map(|d| {
                    k += 1;
                    without_roots(&gate, k - 1, d)
                })
            },
            explicit: if p == 1 { explicit.clone() } else { Vec::new() },
            sent,
            arith,
            bits,
        },
    )
}

/// Key bodies as a key file stores them: each key without its 16-byte
/// root, back to back.
fn without_roots(gate: &Gate, k: usize, keys: Vec<u8>) -> Vec<u8> {
    if k >= gate.compiled.key_count {
        return keys;
    }
    let len = gate.key_params(k).key_len();
    keys.chunks(len)
        .flat_map(|key| &key[16..])
        .copied()
        .collect()
}

/// The source file written at [`default_path`].
pub fn render(file: &VectorFile) -> String {
    let mut s = String::new();
    s.push_str(HEADER);
    writeln!(s, "pub const FSS: [FssVector; {}] = [", file.vectors.len()).unwrap();
    for v in &file.vectors {
        render_vector(&mut s, v);
    }
    s.push_str("];\n\n");
    for case in &GATES {
        render_gate(&mut s, case);
    }
    writeln!(
        s,
        "pub const GATES: [GateTranscript; {}] = [",
        2 * GATES.len()
    )
    .unwrap();
    for case in &GATES {
        let records = record(case);
        for p in 0..2 {
            render_transcript(&mut s, case, p, &records[p], &records[1 - p]);
        }
    }
    s.push_str("];\n");
    s
}

const HEADER: &str = "\
//! Known answers, written by `cargo xtask vectors` (suffuse_tests::mcu) from
//! tests/vectors/v1/fss.json and from gate runs on the host. Do not edit:
//! tests/tests/mcu_kat.rs checks that this file equals what the host computes.

use suffuse_core::error::SufError;
use suffuse_core::fss::{Kind, Output};
use suffuse_core::gate::{Gate, Input, relu};
use suffuse_core::phi::{Phi, PolyMode};
use suffuse_core::ring::Width;
use suffuse_core::suf::{Domain, Suf};

use crate::known::{FssVector, GateBuild, GateTranscript};

";

fn render_vector(s: &mut String, v: &Vector) {
    let kind = match v.kind.as_str() {
        "dcf" => "Kind::Dcf",
        _ => "Kind::Dpf",
    };
    let output = match v.output.as_str() {
        "bit" => "Output::Bit".to_owned(),
        "pair" => format!("Output::Pair(Width::of({}))", v.w),
        _ => format!("Output::Ring(Width::of({}))", v.w),
    };
    let key = |hex: &str| vectors::from_hex(hex).unwrap();
    writeln!(s, "    FssVector {{").unwrap();
    writeln!(s, "        name: {:?},", v.name).unwrap();
    writeln!(s, "        kind: {kind},").unwrap();
    writeln!(s, "        k: {},", v.k).unwrap();
    writeln!(s, "        output: {output},").unwrap();
    writeln!(
        s,
        "        keys: [{}, {}],",
        bytes(&key(&v.key0)),
        bytes(&key(&v.key1))
    )
    .unwrap();
    writeln!(s, "        points: {},", words(&v.points)).unwrap();
    writeln!(s, "        outs: [{}, {}],", words(&v.out0), words(&v.out1)).unwrap();
    writeln!(s, "        values: {},", words(&v.values)).unwrap();
    writeln!(s, "    }},").unwrap();
}

fn render_transcript(
    s: &mut String,
    case: &GateCase,
    party: usize,
    me: &PartyRecord,
    peer: &PartyRecord,
) {
    let w = Width::of(RING);
    let xs: Vec<u64> = case.xs.iter().map(|&x| w.reduce(x as u64)).collect();
    let list = |msgs: &[Vec<u8>]| {
        let inner: Vec<String> = msgs.iter().map(|m| bytes(m)).collect();
        format!("&[{}]", inner.join(", "))
    };
    writeln!(s, "    GateTranscript {{").unwrap();
    writeln!(s, "        name: {:?},", case.name).unwrap();
    writeln!(s, "        build: {},", build_of(case)).unwrap();
    writeln!(s, "        flash: &{},", static_name(case)).unwrap();
    writeln!(s, "        party: {party},").unwrap();
    writeln!(s, "        seed: *{},", byte_string(&me.seed)).unwrap();
    writeln!(s, "        first: {FIRST},").unwrap();
    writeln!(s, "        xs: {},", words(&xs)).unwrap();
    writeln!(s, "        input: {},", words(&me.input)).unwrap();
    let dcf: Vec<String> = me.dcf.iter().map(|d| bytes(d)).collect();
    writeln!(s, "        dcf: [{}],", dcf.join(", ")).unwrap();
    writeln!(s, "        explicit: {},", words(&me.explicit)).unwrap();
    writeln!(s, "        sent: {},", list(&me.sent)).unwrap();
    writeln!(s, "        received: {},", list(&peer.sent)).unwrap();
    writeln!(s, "        arith: {},", words(&me.arith)).unwrap();
    writeln!(s, "        bits: {},", words(&me.bits)).unwrap();
    writeln!(s, "        peer_arith: {},", words(&peer.arith)).unwrap();
    writeln!(s, "        peer_bits: {},", words(&peer.bits)).unwrap();
    writeln!(s, "    }},").unwrap();
}

/// A byte slice as a byte-string literal (`b"\x00..."`).
fn byte_string(b: &[u8]) -> String {
    let mut s = String::from("b\"");
    for x in b {
        write!(s, "\\x{x:02x}").unwrap();
    }
    s.push('"');
    s
}

fn bytes(b: &[u8]) -> String {
    byte_string(b)
}

fn words(w: &[u64]) -> String {
    let inner: Vec<String> = w.iter().map(|x| format!("{x:#x}")).collect();
    format!("&[{}]", inner.join(", "))
}

/// `examples/mcu/src/kat.rs` in this checkout.
pub fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mcu/src/kat.rs")
}

/// Writes [`render`] of the committed vectors under `vectors_root` to
/// `path`.
pub fn write(vectors_root: &Path, path: &Path) -> std::io::Result<()> {
    let text = std::fs::read_to_string(vectors::file_path(vectors_root))?;
    let file: VectorFile = serde_json::from_str(&text).map_err(std::io::Error::other)?;
    std::fs::write(path, render(&file))
}
