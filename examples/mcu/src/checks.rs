//! The checks: each returns how many answers were wrong and records the
//! stack every core call used.

use cortex_m_semihosting::hprintln;
use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::error::{Error, WireError};
use suffuse_core::fss::{Kind, Output, Params, Party};
use suffuse_core::gate::{Eval, Gate, PartyKeys, Protocol};
use suffuse_core::prg::FixedKeyAes;
use suffuse_core::ring::Width;
use suffuse_core::{dcf, dpf, wire};

use crate::Marks;
use crate::kat::{FSS, GATES};
use crate::known::{FssVector, GateTranscript};
use crate::stack::high_water;

/// Largest transcript batch, key-batch key, scratch and message (checked
/// at run time).
const MAX_ELEMENTS: usize = 8;
const MAX_BATCH_KEY: usize = 2048;
// The compiled Φ program's columns are one 64-element block long whatever
// the batch, so a GeLU of 8 elements needs 1472 words: exactly that, so
// that the `runtime-gates` build's gate slot fits the 64 KiB of RAM.
const MAX_SCRATCH: usize = 1472;
const MAX_MESSAGE: usize = 128;
/// Bytes for one check at a time: the key parser's batch, then each
/// transcript's DCF key bodies (all of a party's keys, about 1.5 KB for
/// the GeLU of 8 elements).
const BYTES: usize = wire::KEY_HEADER_LEN + MAX_BATCH_KEY + 1;
/// What the `plant-wrong-answer` feature adds to the first expected value.
const PLANTED: u64 = if cfg!(feature = "plant-wrong-answer") {
    1
} else {
    0
};

/// DPF full-domain evaluation runs for k up to this (2^k output words).
const FULL_DOMAIN_BITS: u32 = 5;

/// Memory too large for the stack: one party's buffers, reused by every
/// check in turn.
struct Buffers {
    /// The gate being checked, built here at run time.
    #[cfg(feature = "runtime-gates")]
    gate: Gate,
    bytes: [u8; BYTES],
    scratch: [u64; MAX_SCRATCH],
    send: [u8; MAX_MESSAGE],
}

static mut BUFFERS: Buffers = Buffers {
    #[cfg(feature = "runtime-gates")]
    gate: Gate::EMPTY,
    bytes: [0; BYTES],
    scratch: [0; MAX_SCRATCH],
    send: [0; MAX_MESSAGE],
};

/// The buffers; called once, from [`gates`] or [`key_parser`] in turn.
fn buffers() -> &'static mut Buffers {
    // SAFETY: single core, no interrupt handler touches BUFFERS, and each
    // caller's borrow ends before the next call (main runs the checks in
    // sequence), so no two live references exist.
    unsafe { &mut *core::ptr::addr_of_mut!(BUFFERS) }
}

const PARTIES: [Party; 2] = [Party::P0, Party::P1];

fn params_of(v: &FssVector) -> Params {
    Params::new(v.kind, Width::of(v.k), v.output)
}

fn reconstruct(output: Output, a: u64, b: u64) -> u64 {
    match output {
        Output::Bit => a ^ b,
        Output::Ring(w) | Output::Pair(w) => w.add(a, b),
    }
}

/// Every vector: both parties at every point, the reconstruction, and the
/// full domain of small DPFs.
pub fn fss_vectors(marks: &mut Marks) -> usize {
    let aes = FixedKeyAes::new();
    let mut wrong = 0;
    let mut points = 0;
    for (index, v) in FSS.iter().enumerate() {
        let p = params_of(v);
        let mut bad = 0;
        let words = v.output.words();
        for (point, &x) in v.points.iter().enumerate() {
            // Each party's output words at x (a pair's two).
            let mut y = [[0u64; 2]; 2];
            for (i, (party, out)) in PARTIES.into_iter().zip(&mut y).enumerate() {
                let key = v.keys[i];
                let (r, used) = high_water(|| eval_point(&aes, v, &p, (party, key), x));
                marks.record(eval_name(v), used);
                *out = r.unwrap_or([u64::MAX; 2]);
                let recorded = &v.outs[i][point * words..(point + 1) * words];
                bad += usize::from(out[..words] != *recorded);
            }
            let planted = if index == 0 && point == 0 { PLANTED } else { 0 };
            let values = &v.values[point * words..(point + 1) * words];
            for ((&a, &b), &want) in y[0].iter().zip(&y[1]).zip(values) {
                bad += usize::from(reconstruct(v.output, a, b) != want ^ planted);
            }
            points += 1;
        }
        if v.kind == Kind::Dpf && v.k <= FULL_DOMAIN_BITS {
            bad += full_domain(&aes, v, &p, marks);
        }
        if bad != 0 {
            hprintln!("fss vector {}: {} wrong answers", v.name, bad);
        }
        wrong += bad;
    }
    hprintln!(
        "fss vectors: {} of {} passed ({} points, both parties)",
        FSS.len() - usize::from(wrong != 0).min(FSS.len()),
        FSS.len(),
        points
    );
    wrong
}

/// One party's output words of vector `v` at `x`: a pair's two, else one
/// and a zero.
fn eval_point(
    aes: &FixedKeyAes,
    v: &FssVector,
    p: &Params,
    (party, key): (Party, &[u8]),
    x: u64,
) -> Result<[u64; 2], Error> {
    match (v.kind, v.output) {
        (Kind::Dcf, Output::Pair(_)) => dcf::eval_pair(aes, p, party, key, x),
        (Kind::Dcf, _) => dcf::eval(aes, p, party, key, x).map(|y| [y, 0]),
        (Kind::Dpf, _) => dpf::eval(aes, p, party, key, x).map(|y| [y, 0]),
    }
}

fn eval_name(v: &FssVector) -> &'static str {
    match (v.kind, v.output) {
        (Kind::Dcf, Output::Pair(_)) => "dcf::eval_pair",
        (Kind::Dcf, _) => "dcf::eval",
        (Kind::Dpf, _) => "dpf::eval",
    }
}

/// A small DPF over its whole domain must agree with its point outputs.
fn full_domain(aes: &FixedKeyAes, v: &FssVector, p: &Params, marks: &mut Marks) -> usize {
    let mut bad = 0;
    let mut outs = [[0u64; 1 << FULL_DOMAIN_BITS]; 2];
    let size = 1usize << v.k;
    for (i, party) in PARTIES.into_iter().enumerate() {
        let out = &mut outs[i][..size];
        let key = v.keys[i];
        let (r, used) = high_water(|| dpf::eval_full_domain(aes, p, party, key, out));
        marks.record("dpf::eval_full_domain", used);
        bad += usize::from(r.is_err());
    }
    for (i, &x) in v.points.iter().enumerate() {
        let x = usize::try_from(x).unwrap_or(0) % size;
        bad += usize::from(reconstruct(v.output, outs[0][x], outs[1][x]) != v.values[i]);
    }
    bad
}

/// The corruptions of a valid key batch and the error each must produce.
const CORRUPTIONS: [(&str, Corruption, WireError); 10] = [
    ("magic", Corruption::Byte(0, b'X'), WireError::BadMagic),
    (
        "version 2",
        Corruption::Byte(4, 2),
        WireError::UnsupportedVersion,
    ),
    ("kind tag 7", Corruption::Byte(6, 7), WireError::UnknownTag),
    ("input width 0", Corruption::Byte(8, 0), WireError::BadWidth),
    (
        "input width 65",
        Corruption::Byte(8, 65),
        WireError::BadWidth,
    ),
    ("party 2", Corruption::Byte(10, 2), WireError::UnknownTag),
    (
        "reserved byte",
        Corruption::Byte(11, 1),
        WireError::ReservedNonZero,
    ),
    (
        "count 2^64-1",
        Corruption::Count(u64::MAX),
        WireError::CountOverflow,
    ),
    (
        "one byte short",
        Corruption::Length(-1),
        WireError::Truncated,
    ),
    (
        "one byte extra",
        Corruption::Length(1),
        WireError::TrailingBytes,
    ),
];

#[derive(Clone, Copy)]
enum Corruption {
    Byte(usize, u8),
    Count(u64),
    Length(isize),
}

/// The key-batch parser: a valid batch parses and evaluates to the
/// vector's outputs; each corruption gives its typed error.
pub fn key_parser(marks: &mut Marks) -> usize {
    let b = buffers();
    let Some(v) = FSS.iter().find(|v| v.kind == Kind::Dcf && v.k == 64) else {
        hprintln!("key parser: no k = 64 DCF vector");
        return 1;
    };
    let p = params_of(v);
    let key = v.keys[1];
    let len = wire::KEY_HEADER_LEN + key.len();
    if len + 1 > b.bytes.len() {
        hprintln!("key parser: the byte buffer is too small");
        return 1;
    }
    let valid = {
        let mut bytes = [0u8; wire::KEY_HEADER_LEN];
        bytes.copy_from_slice(&wire::write_key_header(&p, Party::P1, 1));
        bytes
    };
    let mut wrong = 0;
    let serial = Serial::new();
    b.bytes[..wire::KEY_HEADER_LEN].copy_from_slice(&valid);
    b.bytes[wire::KEY_HEADER_LEN..len].copy_from_slice(key);
    let (parsed, used) = high_water(|| wire::parse_key_batch(&b.bytes[..len]));
    marks.record("wire::parse_key_batch", used);
    match parsed {
        Ok(keys) => {
            let mut out = [0u64; 16];
            let out = &mut out[..v.points.len()];
            let (r, used) = high_water(|| serial.eval(&keys, v.points, out));
            marks.record("Serial::eval (BatchEval)", used);
            let ok = r.is_ok() && out == v.outs[1];
            wrong += usize::from(!ok);
            hprintln!(
                "key parser: valid {} batch parsed, {} points evaluated: {}",
                v.name,
                v.points.len(),
                if ok { "equal to the vector" } else { "WRONG" }
            );
        }
        Err(e) => {
            hprintln!("key parser: valid batch refused: {:?}", e);
            wrong += 1;
        }
    }
    wrong + corrupted_batches(&mut b.bytes[..], (&valid, len), marks)
}

/// Each corruption of a valid batch (`valid` its header, `len` its
/// length, its key already in `bytes`) against its typed error. Returns
/// the corruptions that did not give theirs.
fn corrupted_batches(
    bytes: &mut [u8],
    (valid, len): (&[u8; wire::KEY_HEADER_LEN], usize),
    marks: &mut Marks,
) -> usize {
    let mut wrong = 0;
    for (name, corruption, want) in CORRUPTIONS {
        bytes[..wire::KEY_HEADER_LEN].copy_from_slice(valid);
        bytes[len] = 0;
        let end = match corruption {
            Corruption::Byte(at, value) => {
                bytes[at] = value;
                len
            }
            Corruption::Count(c) => {
                bytes[12..20].copy_from_slice(&c.to_le_bytes());
                len
            }
            Corruption::Length(d) => len.saturating_add_signed(d),
        };
        let (got, used) = high_water(|| wire::parse_key_batch(&bytes[..end]).map(|_| ()));
        marks.record("wire::parse_key_batch", used);
        let ok = got == Err(want);
        wrong += usize::from(!ok);
        hprintln!(
            "key parser: {:<15} -> {:?} ({})",
            name,
            got.err(),
            if ok { "expected" } else { "WRONG" }
        );
    }
    wrong
}

/// Every recorded gate transcript, played from this party's side.
pub fn gates(marks: &mut Marks) -> usize {
    GATES
        .iter()
        .map(|t| {
            #[cfg(feature = "runtime-gates")]
            let parts = crate::constructors::spline_parts(t, &mut buffers().gate, marks);
            #[cfg(not(feature = "runtime-gates"))]
            let parts = 0;
            parts + gate_transcript(t, marks)
        })
        .sum()
}

fn gate_transcript(t: &GateTranscript, marks: &mut Marks) -> usize {
    let b = buffers();
    #[cfg(feature = "runtime-gates")]
    let gate = {
        let (built, used) = high_water(|| t.build.init(&mut b.gate));
        marks.record(t.build.entry(), used);
        built.map(|()| &b.gate)
    };
    #[cfg(not(feature = "runtime-gates"))]
    let gate = t.flash.as_ref().map_err(|e| *e);
    let gate = match gate {
        Ok(g) => g,
        Err(e) => {
            hprintln!("gate {}: construction failed: {:?}", t.name, e);
            return 1;
        }
    };
    if cfg!(feature = "runtime-gates") {
        let same = matches!(t.flash, Ok(g) if g == gate);
        hprintln!(
            "gate {}: built at run time by {}, {} to the compile-time gate",
            t.name,
            t.build.entry(),
            if same { "equal" } else { "NOT EQUAL" }
        );
        if !same {
            return 1;
        }
    }
    [Layout::Whole, Layout::Split]
        .into_iter()
        .map(|layout| {
            match run_party(
                gate,
                t,
                layout,
                &mut b.bytes,
                &mut b.scratch,
                &mut b.send,
                marks,
            ) {
                Ok(wrong) => wrong,
                Err(e) => {
                    hprintln!("gate {} ({}): core error {:?}", t.name, layout.name(), e);
                    1
                }
            }
        })
        .sum()
}

/// How a party holds its DCF keys: the two layouts `PartyKeys` accepts.
#[derive(Clone, Copy)]
enum Layout {
    /// Whole keys in RAM: each body copied beside a root slot that
    /// `Gate::fill_roots` fills.
    Whole,
    /// The bodies read where they lie (flash) and only the roots in RAM,
    /// from `Gate::derive_roots`: what a host does with a key file.
    Split,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Whole => "whole keys",
            Layout::Split => "roots apart",
        }
    }

    /// The core call that derives the roots, for the stack marks.
    fn roots_entry(self) -> &'static str {
        match self {
            Layout::Whole => "Gate::fill_roots",
            Layout::Split => "Gate::derive_roots",
        }
    }
}

/// Plays one party of a transcript; returns the number of wrong answers.
fn run_party(
    gate: &Gate,
    t: &GateTranscript,
    layout: Layout,
    bytes: &mut [u8; BYTES],
    scratch: &mut [u64; MAX_SCRATCH],
    send: &mut [u8; MAX_MESSAGE],
    marks: &mut Marks,
) -> Result<usize, Error> {
    let aes = FixedKeyAes::new();
    let party = t.party();
    let n = t.input.len();
    let words = gate.scratch_words(n);
    if n > MAX_ELEMENTS || words > scratch.len() {
        hprintln!(
            "gate {}: {} elements need {} scratch words",
            t.name,
            n,
            words
        );
        return Ok(1);
    }
    let Some(keys) = party_keys(gate, t, layout, &aes, bytes, marks)? else {
        hprintln!(
            "gate {}: the DCF keys exceed {} bytes or do not fit the gate",
            t.name,
            BYTES
        );
        return Ok(1);
    };
    let scratch = &mut scratch[..words];
    let (ev, used) = high_water(|| {
        Eval::new(
            gate, &aes, party, &t.seed, None, t.first, n, keys, t.input, scratch,
        )
    });
    marks.record("Eval::new", used);
    let mut ev = ev?;
    let Some(messages_wrong) = play_rounds(&mut ev, t, send, marks)? else {
        return Ok(1);
    };
    let mut arith = [0u64; 2 * MAX_ELEMENTS];
    let mut bits = [0u64; 4 * MAX_ELEMENTS];
    let arith = &mut arith[..n * gate.outputs()];
    let bits = &mut bits[..n * gate.bit_outputs()];
    let (r, used) = high_water(|| ev.outputs(arith, bits));
    marks.record("Eval::outputs", used);
    r?;
    let shares_ok = *arith == *t.arith && *bits == *t.bits;
    let reference_ok = reference_agrees(gate, t, arith, bits, marks);
    let verdicts = [messages_wrong == 0, shares_ok, reference_ok];
    say_verdicts(t, (layout, n, ev.rounds()), verdicts);
    Ok(messages_wrong + usize::from(!shares_ok) + usize::from(!reference_ok))
}

/// One line per party and gate: the messages, the output shares and the
/// reconstruction, each equal or wrong.
fn say_verdicts(
    t: &GateTranscript,
    (layout, n, rounds): (Layout, usize, usize),
    [messages, shares, reference]: [bool; 3],
) {
    let verdict = |ok: bool| if ok { "equal" } else { "WRONG" };
    hprintln!(
        "gate {} P{} ({}): {} elements, {} rounds; sent messages {} to the host's, output shares {} to the host's, reconstruction {} to the reference",
        t.name,
        t.party,
        layout.name(),
        n,
        rounds,
        verdict(messages),
        verdict(shares),
        verdict(reference)
    );
}

/// Plays the transcript's rounds on `ev`: each message this party sends
/// against the host's, then the host's reply. Returns the messages that
/// differ, or `None` (said why) if the round counts differ.
fn play_rounds(
    ev: &mut Eval<'_>,
    t: &GateTranscript,
    send: &mut [u8; MAX_MESSAGE],
    marks: &mut Marks,
) -> Result<Option<usize>, Error> {
    if ev.rounds() != t.sent.len() || ev.rounds() != t.received.len() {
        hprintln!(
            "gate {}: {} rounds, transcript has {}",
            t.name,
            ev.rounds(),
            t.sent.len()
        );
        return Ok(None);
    }
    let serial = Serial::new();
    let mut wrong = 0;
    for i in 0..ev.rounds() {
        let len = ev.send_len(i);
        let out = &mut send[..len];
        let (r, used) = high_water(|| ev.prepare(i, out));
        marks.record("Eval::prepare", used);
        r?;
        wrong += usize::from(*out != *t.sent[i]);
        let (r, used) = high_water(|| ev.finish(i, t.received[i], &serial));
        marks.record("Eval::finish", used);
        r?;
    }
    Ok(Some(wrong))
}

/// The party's keys in `layout`, with the roots derived from its seed into
/// `bytes`; `None` if they do not fit.
fn party_keys<'a>(
    gate: &Gate,
    t: &'a GateTranscript,
    layout: Layout,
    aes: &FixedKeyAes,
    bytes: &'a mut [u8],
    marks: &mut Marks,
) -> Result<Option<PartyKeys<'a>>, Error> {
    let party = t.party();
    let (seed, first) = (&t.seed, t.first);
    // Elements per key width: the transcript's, for the widths the gate uses.
    let count = |k: usize| usize::from(k < gate.compiled.key_count) * t.input.len();
    let Some(mut held) = (match layout {
        Layout::Whole => {
            let lens = core::array::from_fn(|k| count(k) * gate.key_params(k).key_len());
            whole_keys(gate, bytes, &t.dcf, lens)
        }
        Layout::Split => zeroed_slices(bytes, core::array::from_fn(|k| count(k) * 16)),
    }) else {
        return Ok(None);
    };
    let (r, used) = match layout {
        Layout::Whole => high_water(|| gate.fill_roots(aes, party, seed, first, &mut held)),
        Layout::Split => high_water(|| gate.derive_roots(aes, party, seed, first, &mut held)),
    };
    marks.record(layout.roots_entry(), used);
    r?;
    let held: [&'a [u8]; MAX_KEYS] = held.map(|h| &*h);
    let (dcf, roots) = match layout {
        Layout::Whole => (held, [&[][..]; MAX_KEYS]),
        Layout::Split => (t.dcf, held),
    };
    Ok(Some(PartyKeys {
        dcf,
        roots,
        explicit: t.explicit,
    }))
}

/// Consecutive zeroed slices of `lens` bytes at the start of `bytes`;
/// `None` if they do not fit.
fn zeroed_slices(bytes: &mut [u8], lens: [usize; MAX_KEYS]) -> Option<[&mut [u8]; MAX_KEYS]> {
    let total = lens.iter().sum::<usize>();
    let (used, _) = bytes.split_at_mut_checked(total)?;
    used.fill(0);
    let mut rest = used;
    Some(core::array::from_fn(|k| {
        let (key, tail) = core::mem::take(&mut rest).split_at_mut(lens[k]);
        rest = tail;
        key
    }))
}

/// Whole keys of `lens` bytes in `bytes`: each body as the key file holds
/// it (`bodies`, back to back) after a zeroed root slot for
/// `Gate::fill_roots`; `None` if they do not fit or the bodies are not
/// one per key.
fn whole_keys<'a>(
    gate: &Gate,
    bytes: &'a mut [u8],
    bodies: &[&[u8]; MAX_KEYS],
    lens: [usize; MAX_KEYS],
) -> Option<[&'a mut [u8]; MAX_KEYS]> {
    let mut keys = zeroed_slices(bytes, lens)?;
    for (k, (keys, bodies)) in keys.iter_mut().zip(bodies).enumerate() {
        if keys.is_empty() {
            continue;
        }
        let len = gate.key_params(k).key_len();
        if bodies.len() != keys.len() / len * (len - 16) {
            return None;
        }
        for (key, body) in keys.chunks_mut(len).zip(bodies.chunks(len - 16)) {
            key[16..].copy_from_slice(body);
        }
    }
    Some(keys)
}

/// My shares plus the peer's recorded ones equal `Gate::reference`,
/// computed on this target.
fn reference_agrees(
    gate: &Gate,
    t: &GateTranscript,
    arith: &[u64],
    bits: &[u64],
    marks: &mut Marks,
) -> bool {
    let (outs, nb) = (gate.outputs(), gate.bit_outputs());
    let mut ok = t.peer_arith.len() == arith.len() && t.peer_bits.len() == bits.len();
    for (j, &x) in t.xs.iter().enumerate() {
        let mut want = [0u64; 2];
        let (bitmask, used) = high_water(|| gate.reference(x, &mut want));
        marks.record("Gate::reference", used);
        for o in 0..outs {
            let ring = gate.phi.outputs[o].ring;
            let got = ring.add(
                arith[j * outs + o],
                t.peer_arith.get(j * outs + o).copied().unwrap_or(0),
            );
            ok &= got == want[o];
        }
        for o in 0..nb {
            let got = bits[j * nb + o] ^ t.peer_bits.get(j * nb + o).copied().unwrap_or(0);
            ok &= got == u64::from((bitmask >> o) & 1);
        }
    }
    ok
}
