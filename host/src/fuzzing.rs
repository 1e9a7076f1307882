//! What the fuzz targets in `fuzz/` drive, and nothing more: a party run
//! on a tiny model's dealt keys over a link held in memory, key files as
//! bytes, the hello and ready round, TLS handshakes fed raw records, and a
//! model folder's `config.json` and safetensors header.
//!
//! Not a supported API. Nothing here changes how the library behaves; it
//! only reaches, in memory, code that otherwise needs sockets, files or
//! certificates. The fixtures are made once per process.

use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use suffuse_core::fss::Party;

use crate::client::{self, ClientView, Expect, Hello};
use crate::keyfile::{self, KeyFileError, KeyReader};
use crate::model::{Config, Model};
use crate::net::{self, FrameHeader, Link, NetError, Peer, Timeouts};
use crate::party::{self, InputShares, PartyError, PartyReport};
use crate::plan::{Plan, bert};
use crate::{backend, dealer};

mod checkpoint;
mod peer;
mod tls;

pub use checkpoint::{
    genuine_config, genuine_index, genuine_safetensors, load_checkpoint, load_sharded,
};
pub use tls::{tls_client_hello, tls_client_reads, tls_server_reads};

/// A tiny model's plan and one key set dealt for it. Between them, the
/// two fixtures hold every section kind a party reads: the encoder's
/// (one layer, hidden 8, 2 heads, 2 tokens) gates, reciprocal and rsqrt
/// chains, max tree and triples, and the decoder's (the built-in
/// tiny-llama's scoring plan at 4 tokens) openings and fused truncations
/// with their squares.
///
/// Every function below that takes `party` reads bit 0 as the party and
/// bit 1 as the fixture: 0–1 the encoder's, 2–3 the decoder's.
struct Fixture {
    plan: Arc<Plan>,
    files: [Vec<u8>; 2],
    layouts: [Layout; 2],
}

/// Where a key file's parts lie.
struct Layout {
    header: usize,
    payloads: Vec<Range<usize>>,
}

/// The encoder's fixture (`party` bit 1 clear) or the decoder's.
fn fixture_of(party: u8) -> &'static Fixture {
    static ENCODER: OnceLock<Fixture> = OnceLock::new();
    static DECODER: OnceLock<Fixture> = OnceLock::new();
    let (cell, which) = match party & 2 {
        0 => (&ENCODER, "encoder"),
        _ => (&DECODER, "decoder"),
    };
    cell.get_or_init(|| {
        let plan = match which {
            "encoder" => bert::build(&tiny_model(), 1, 2).map_err(|e| e.to_string()),
            _ => tiny_decoder_plan(),
        };
        plan.and_then(|plan| deal(plan, which))
            .unwrap_or_else(|e| panic!("the {which} fuzz fixture: {e}"))
    })
}

/// The encoder's fixture.
fn fixture() -> &'static Fixture {
    fixture_of(0)
}

/// The built-in tiny-llama's scoring plan at 4 tokens: one pass, its
/// queries, keys and values opened, its norms' squares fused into the
/// residuals' truncations.
fn tiny_decoder_plan() -> Result<Arc<Plan>, String> {
    let model = crate::model::Decoder::builtin("tiny-llama").ok_or("no built-in tiny-llama")?;
    crate::plan::decoder::build_scoring(&model, 4).map_err(|e| e.to_string())
}

/// The one-layer, 8-wide generated encoder every fuzz fixture is built
/// from.
fn tiny_model() -> Model {
    let config = Config {
        hidden: 8,
        heads: 2,
        intermediate: 16,
        layers: 1,
        max_positions: 4,
        max_tokens: 4,
        ..Config::demo()
    };
    Model::generated(config, 1)
}

fn deal(plan: Arc<Plan>, which: &str) -> Result<Fixture, String> {
    let name = format!("suffuse-fuzz-{which}-{}", std::process::id());
    let dir = std::env::temp_dir().join(name);
    let dealt = dealer::deal(&plan, &dir, (false, dealer::KeysFor::Now), backend::auto());
    let files = dealt.map_err(|e| e.to_string()).and_then(|d| {
        let read = |p: &Path| std::fs::read(p).map_err(|e| e.to_string());
        Ok([read(&d.files[0])?, read(&d.files[1])?])
    });
    let _ = std::fs::remove_dir_all(&dir);
    let files = files?;
    let layouts = [layout(&files[0], &plan)?, layout(&files[1], &plan)?];
    Ok(Fixture {
        plan,
        files,
        layouts,
    })
}

/// Walks a well-formed key file: the header, then each section's payload.
fn layout(file: &[u8], plan: &Plan) -> Result<Layout, String> {
    let word = |at: usize, n: usize| -> Result<u64, String> {
        let b = file.get(at..at + n).ok_or("a dealt key file is short")?;
        Ok(b.iter().rev().fold(0, |acc, &x| acc << 8 | u64::from(x)))
    };
    let header = 72 + word(68, 4)? as usize;
    let mut payloads = Vec::with_capacity(plan.steps());
    let mut at = header;
    for _ in 0..plan.steps() {
        let start = at + 16;
        let end = start + word(at + 8, 8)? as usize;
        payloads.push(start..end);
        at = end + 32;
    }
    Ok(Layout { header, payloads })
}

/// The dealt key file of `party` (bit 0; bit 1 picks the fixture), whole.
pub fn key_file(party: u8) -> &'static [u8] {
    &fixture_of(party).files[usize::from(party & 1)]
}

/// The length of that file's header: the fuzzed bytes follow it.
pub fn header_len(party: u8) -> usize {
    fixture_of(party).layouts[usize::from(party & 1)].header
}

/// The section payloads of that file, in step order.
pub fn payloads(party: u8) -> Vec<&'static [u8]> {
    let p = usize::from(party & 1);
    let f = fixture_of(party);
    f.layouts[p]
        .payloads
        .iter()
        .map(|r| &f.files[p][r.clone()])
        .collect()
}

/// The key file of `party` with these payloads, one per step, sealed with
/// valid digests and an end marker: what a faulty dealer would write, so
/// that the integrity check passes and the section parsers see the bytes.
pub fn seal(party: u8, payloads: &[Vec<u8>]) -> Vec<u8> {
    let p = usize::from(party & 1);
    let f = fixture_of(party);
    let head = &f.files[p][..f.layouts[p].header];
    let mut out = head.to_vec();
    let mut chain: [u8; 32] = blake3::hash(head).into();
    for (step, payload) in (0u32..).zip(payloads) {
        let len = payload.len() as u64;
        out.extend_from_slice(&keyfile::SECTION);
        out.extend_from_slice(&step.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(payload);
        let mut hash = keyfile::section_digest(&chain, step, len);
        hash.update(payload);
        chain = hash.finalize().into();
        out.extend_from_slice(&chain);
    }
    out.extend_from_slice(&keyfile::END);
    out.extend_from_slice(&(payloads.len() as u32).to_le_bytes());
    out
}

/// Why a fuzzed party run stopped.
#[derive(Debug)]
pub enum RunError {
    /// The key file's header.
    Header(KeyFileError),
    /// The run.
    Party(PartyError),
}

/// Runs `party` on the tiny plan with `keys` as its key file, against a
/// peer that echoes every frame: each round gets a frame of the right
/// step and length, so the run goes as far as the keys allow. Returns the
/// output share.
pub fn run_with_keys(party: u8, keys: Vec<u8>) -> Result<Vec<u64>, RunError> {
    run(party, keys, Box::new(peer::Echo))
}

/// Runs `party` on its genuine keys against a peer whose every answer is
/// chosen by `script` (see `peer::Scripted`): frames of any kind, step,
/// length and content, in any order, cut short, replayed or missing.
pub fn run_with_peer(party: u8, script: &[u8]) -> Result<Vec<u64>, RunError> {
    let keys = key_file(party).to_vec();
    run(party, keys, Box::new(peer::Scripted::new(script)))
}

fn run(party: u8, keys: Vec<u8>, peer: Box<dyn Peer>) -> Result<Vec<u64>, RunError> {
    let f = fixture_of(party);
    let name = Path::new("<fuzzed key file>");
    let reader = KeyReader::from_bytes(name, keys).map_err(RunError::Header)?;
    let who = if party & 1 == 0 { Party::P0 } else { Party::P1 };
    reader
        .check(party & 1, &f.plan.hash, &party::key_sections(&f.plan, who))
        .map_err(RunError::Header)?;
    let mut link = Link::in_memory(peer, Timeouts::default());
    // On a pool's one thread, so that the party's parallel loops run where
    // it runs instead of waking a worker for each (thread handoffs were
    // most of a run's time outside the steps).
    one_thread()
        .install(|| {
            party::run(
                &f.plan,
                who,
                reader,
                &mut link,
                backend::auto(),
                inputs(&f.plan),
            )
        })
        .map(|(share, _)| share)
        .map_err(RunError::Party)
}

/// A pool of one thread for [`run`], built once per process.
fn one_thread() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "fuzz party".into())
            .build()
            .unwrap_or_else(|e| panic!("a one-thread pool: {e}"))
    })
}

/// The plan the fixture's keys were dealt for.
#[cfg(test)]
pub(crate) fn plan() -> Arc<Plan> {
    Arc::clone(&fixture().plan)
}

/// Input shares of the plan's shape (their values do not matter to
/// parsing; they are fixed so that runs repeat).
pub(crate) fn inputs(plan: &Plan) -> InputShares {
    let words = |t: usize| -> Vec<u64> {
        (0..plan.tensors[t].len() as u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect()
    };
    InputShares {
        x: words(plan.inputs.x),
        bias: words(plan.inputs.bias),
        mask: plan.inputs.mask.map(words),
    }
}

/// A link whose peer sends `bytes`, then closes.
fn link_hearing(bytes: &[u8]) -> Link {
    Link::in_memory(
        Box::new(peer::Once(Some(bytes.to_vec()))),
        Timeouts::default(),
    )
}

/// A server reading a connection's hello from `bytes` (everything the
/// connection sends).
pub fn hear_hello(bytes: &[u8]) -> Result<Result<Hello, String>, NetError> {
    client::recv_hello(&mut link_hearing(bytes))
}

/// A server's ready round with its peer, the peer sending `bytes`.
pub fn ready_round(bytes: &[u8]) -> Result<Vec<u8>, NetError> {
    link_hearing(bytes).exchange(crate::server::READY_STEP, b"ready", 5)
}

/// The client's check of the shape a server announced, for a query of
/// `batch` sentences on a model of width `hidden`.
pub fn client_checks(view: &ClientView, batch: usize, hidden: usize) -> Result<(), String> {
    let expect = Expect { batch, seq: None };
    client::check_view(view, expect, hidden).map_err(|e| e.to_string())
}

/// The client's parse of an output frame of `words` words.
pub fn output_frame(bytes: &[u8], words: usize) -> Result<(Vec<u64>, PartyReport), String> {
    client::split_output(bytes, words)
}

/// The step of the first frame in `bytes`, if they start with a header.
fn first_step(bytes: &[u8]) -> Option<u32> {
    FrameHeader::parse(bytes).ok().map(|h| h.step)
}

/// A frame header with a raw kind byte (unknown kinds included).
fn raw_header(kind: u8, step: u32, len: u64) -> Vec<u8> {
    let mut h = net::MAGIC.to_vec();
    h.push(kind);
    h.extend_from_slice(&step.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

/// A genuine server hello for the tiny plan, as JSON (a frame's payload).
pub fn server_hello() -> Vec<u8> {
    let plan = &fixture().plan;
    let hello = Hello::Server {
        party: 0,
        plan_hash: plan.hash_hex(),
        key_set: crate::plan::hex(&[0; 16]),
        batch: plan.batch,
        seq: plan.seq,
        model: plan.model.clone(),
        view: ClientView::of(plan),
    };
    serde_json::to_vec(&hello).unwrap_or_default()
}

/// The tiny model's width, for [`client_checks`].
pub fn hidden() -> usize {
    fixture().plan.hidden
}

/// Words of the output share of `party`'s fixture (bit 1).
pub fn output_len(party: u8) -> usize {
    let plan = &fixture_of(party).plan;
    plan.tensors[plan.output].len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decoder's fixture holds the section kinds the encoder's lacks,
    /// and the encoder's a LayerNorm's one-step centring.
    #[test]
    fn the_decoder_fixture_opens_and_fuses() {
        use crate::plan::Kind;
        let plan = &fixture_of(2).plan;
        let has = |f: fn(&Kind) -> bool| plan.ops.iter().any(|op| f(&op.kind));
        assert!(has(|k| matches!(k, Kind::TruncSquare(_))));
        assert!(has(|k| matches!(k, Kind::Open(_))));
        // And the encoder's, its LayerNorms' one-round centring.
        let plan = &fixture_of(0).plan;
        assert!(
            plan.ops
                .iter()
                .any(|op| matches!(op.kind, Kind::CentreSquare(_)))
        );
    }

    #[test]
    fn the_fixtures_run_and_an_altered_file_fails() {
        for party in 0..4 {
            let genuine = key_file(party).to_vec();
            let share = run_with_keys(party, genuine.clone()).expect("genuine keys run");
            assert_eq!(share.len(), output_len(party));
            // A peer scripted to echo twice per round behaves as the echo.
            let echoes = vec![0u8; 4 * fixture_of(party).plan.steps() + 8];
            let scripted = run_with_peer(party, &echoes).expect("an echo script runs");
            assert_eq!(scripted, share);
            let resealed: Vec<Vec<u8>> = payloads(party).into_iter().map(<[u8]>::to_vec).collect();
            assert_eq!(seal(party, &resealed), genuine);
            let mut flipped = genuine;
            let last = flipped.len() - 1;
            flipped[last] ^= 1;
            assert!(run_with_keys(party, flipped).is_err());
            // A peer that closes at once is a typed error.
            assert!(matches!(run_with_peer(party, &[]), Err(RunError::Party(_))));
        }
    }
}
