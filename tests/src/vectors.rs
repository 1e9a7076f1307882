//! Known-answer vectors for DCF/DPF key generation and evaluation.
//!
//! The committed file `vectors/v1/fss.json` pins the construction: any
//! change to the hashes, the key layout, generation or evaluation changes
//! it. `cargo xtask vectors` rewrites it through [`write_all`]; do that only
//! when the construction changed on purpose, and bump the folder (`v2/`)
//! when the change is incompatible with keys already dealt.
//!
//! Each vector is reproducible from its seed alone: `Prg::new(seed)` yields
//! the two root blocks first, then feeds `dcf::generate`/`dpf::generate` as
//! their rng. α and β are fixed per shape (edges and patterns, see
//! [`SHAPES`]); the points are 0, α − 1, α, α + 1, 2^k − 1 and three words of
//! `Prg::with_stream(seed, 1)`, all mod 2^k. A pair-output DCF
//! (`Output::Pair`) draws its second payload word from the same stream
//! right after the roots ([`keys::deal_with_roots`]) and records two
//! output words per point, point-major.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{FixedKeyAes, Prg};
use suffuse_core::ring::Width;

use crate::keys;
use crate::reference;

/// The format name in every vector file.
pub const FORMAT: &str = "suffuse-fss-vectors";
/// The vector format and construction version; also the folder name `v1`.
pub const VERSION: u32 = 1;
/// The file name inside the version folder.
pub const FILE_NAME: &str = "fss.json";

/// A vector file: a header and the vectors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// How the vectors were made, for readers without this code.
    pub description: String,
    /// The vectors.
    pub vectors: Vec<Vector>,
}

/// One key pair with its outputs at a few points.
///
/// Integers are exact unsigned 64-bit values; bytes are lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vector {
    /// A unique label, such as `dcf-ring13-k12`.
    pub name: String,
    /// `"dcf"` or `"dpf"`.
    pub kind: String,
    /// `"bit"`, `"ring"` or `"pair"` (two ring words per point).
    pub output: String,
    /// Input width k.
    pub k: u32,
    /// Output width w: 1 for bit output.
    pub w: u32,
    /// The 16-byte PRG seed everything random came from.
    pub seed: String,
    /// The root blocks passed to generation, before their low bits are set.
    pub roots: [String; 2],
    /// The threshold (DCF) or point (DPF), below 2^k.
    pub alpha: u64,
    /// The payload, below 2^w (1 for bit output); a pair's first word.
    pub beta: u64,
    /// A pair's second payload word, below 2^w; absent for other outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta1: Option<u64>,
    /// Bytes per key.
    pub key_len: usize,
    /// AES calls generation made.
    pub gen_aes_calls: u64,
    /// AES calls per evaluation at one point.
    pub eval_aes_calls: u64,
    /// P0's key.
    pub key0: String,
    /// P1's key.
    pub key1: String,
    /// Evaluation points, below 2^k.
    pub points: Vec<u64>,
    /// P0's outputs at `points` (a pair's two words per point, point-major).
    pub out0: Vec<u64>,
    /// P1's outputs at `points`, laid out as `out0`.
    pub out1: Vec<u64>,
    /// The reconstructed function values `f(points)`, laid out as `out0`.
    pub values: Vec<u64>,
}

/// A vector shape: kind, k, output, α and β.
pub struct Shape {
    /// Key kind.
    pub kind: Kind,
    /// Input width.
    pub k: u32,
    /// Output group.
    pub output: Output,
    /// α, below 2^k.
    pub alpha: u64,
    /// β, below 2^w (ignored for bit output).
    pub beta: u64,
}

const fn shape(kind: Kind, k: u32, ring: Option<u32>, alpha: u64, beta: u64) -> Shape {
    let output = match ring {
        None => Output::Bit,
        Some(w) => Output::Ring(Width::of(w)),
    };
    Shape {
        kind,
        k,
        output,
        alpha,
        beta,
    }
}

/// A pair-output DCF's shape; its second payload word comes from the
/// vector's stream.
const fn pair_shape(k: u32, w: u32, alpha: u64, beta: u64) -> Shape {
    Shape {
        kind: Kind::Dcf,
        k,
        output: Output::Pair(Width::of(w)),
        alpha,
        beta,
    }
}

/// The recorded shapes: DCF and DPF × bit and ring × k ∈ {5, 12, 50, 64};
/// ring widths 5, 13, 32 and 64 put one vector on each leaf lane size, and
/// α covers 0, 1, 2^k − 1 and interior values. Then two pair-output DCFs:
/// 13-bit words (two 16-bit lanes a point, ν = 2) and the one-round
/// ReLU's shape, 64-bit words at k = 28 (ν = 0).
pub const SHAPES: [Shape; 18] = [
    shape(Kind::Dcf, 5, None, 19, 1),
    shape(Kind::Dcf, 5, Some(5), 0, 0x17),
    shape(Kind::Dcf, 12, None, 0xA5C, 1),
    shape(Kind::Dcf, 12, Some(13), 0xFFF, 0x1ABC),
    shape(Kind::Dcf, 50, None, 0x2_F00D_CAFE_1234, 1),
    shape(Kind::Dcf, 50, Some(32), 1, 0xDEAD_BEEF),
    shape(Kind::Dcf, 64, None, 0x8000_0000_0000_0001, 1),
    shape(Kind::Dcf, 64, Some(64), 0x0123_4567_89AB_CDEF, u64::MAX),
    shape(Kind::Dpf, 5, None, 31, 1),
    shape(Kind::Dpf, 5, Some(5), 7, 0x1F),
    shape(Kind::Dpf, 12, None, 0, 1),
    shape(Kind::Dpf, 12, Some(13), 0x800, 0x0F0F),
    shape(Kind::Dpf, 50, None, 0x3_FFFF_FFFF_FFFF, 1),
    shape(Kind::Dpf, 50, Some(32), 0x1_2345_6789_ABCD, 0x8000_0001),
    shape(Kind::Dpf, 64, None, u64::MAX, 1),
    shape(
        Kind::Dpf,
        64,
        Some(64),
        0xFEDC_BA98_7654_3210,
        0x7FFF_FFFF_FFFF_FFFF,
    ),
    pair_shape(12, 13, 0x6B3, 0x1F0F),
    pair_shape(28, 64, 0x0ABC_DEF1, 0x8000_0000_0000_0000),
];

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of lowercase or uppercase hex; `None` if malformed.
pub fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The seed of vector `index`: an ASCII label and the index.
fn seed_of(index: usize) -> [u8; 16] {
    let mut seed = *b"suffuse-fss-v1\0\0";
    seed[15] = u8::try_from(index).unwrap();
    seed
}

/// The parameters a vector was made with.
pub fn params_of(vector: &Vector) -> Option<Params> {
    let kind = match vector.kind.as_str() {
        "dcf" => Kind::Dcf,
        "dpf" => Kind::Dpf,
        _ => return None,
    };
    let output = match vector.output.as_str() {
        "bit" => Output::Bit,
        "ring" => Output::Ring(Width::new(vector.w).ok()?),
        "pair" => Output::Pair(Width::new(vector.w).ok()?),
        _ => return None,
    };
    Some(Params::new(kind, Width::new(vector.k).ok()?, output))
}

fn make_vector(aes: &FixedKeyAes, index: usize, shape: &Shape) -> Vector {
    let params = Params::new(shape.kind, Width::of(shape.k), shape.output);
    let seed = seed_of(index);
    let mut rng = Prg::new(&seed);
    let roots = [rng.next_block(), rng.next_block()];
    let pair = keys::deal_with_roots(aes, &params, shape.alpha, shape.beta, roots, &mut rng);
    assert_eq!(pair.alpha, shape.alpha, "vector α must be below 2^k");

    let k = params.domain();
    let alpha = pair.alpha;
    let mut extra = Prg::with_stream(&seed, 1);
    let mut points = vec![
        0,
        alpha.wrapping_sub(1),
        alpha,
        alpha.wrapping_add(1),
        k.mask(),
    ];
    points.extend((0..3).map(|_| extra.next_u64()));
    for p in &mut points {
        *p = k.reduce(*p);
    }
    let words = params.output().words();
    let outputs = keys::PARTIES.map(|party| {
        let keys = KeyBatch::new(params, party, pair.key(party)).unwrap();
        let mut out = vec![0u64; points.len() * words];
        Serial::new().eval(&keys, &points, &mut out).unwrap();
        out
    });
    let values = outputs[0]
        .iter()
        .zip(&outputs[1])
        .map(|(&y0, &y1)| reference::reconstruct(params.output(), y0, y1))
        .collect();
    let [out0, out1] = outputs;
    let (kind, output) = (
        match shape.kind {
            Kind::Dcf => "dcf",
            Kind::Dpf => "dpf",
        },
        match shape.output {
            Output::Bit => "bit".to_owned(),
            Output::Ring(_) => "ring".to_owned(),
            Output::Pair(_) => "pair".to_owned(),
        },
    );
    let width_label = match shape.output {
        Output::Bit => "bit".to_owned(),
        Output::Ring(w) => format!("ring{}", w.bits()),
        Output::Pair(w) => format!("pair{}", w.bits()),
    };
    Vector {
        name: format!("{kind}-{width_label}-k{}", shape.k),
        kind: kind.to_owned(),
        output,
        k: shape.k,
        w: shape.output.width().bits(),
        seed: to_hex(&seed),
        roots: roots.map(|r| to_hex(&r.to_bytes())),
        alpha,
        beta: pair.beta,
        beta1: matches!(shape.output, Output::Pair(_)).then_some(pair.second),
        key_len: params.key_len(),
        gen_aes_calls: pair.gen_aes_calls,
        eval_aes_calls: params.aes_per_eval(),
        key0: to_hex(pair.key(Party::P0)),
        key1: to_hex(pair.key(Party::P1)),
        points,
        out0,
        out1,
        values,
    }
}

/// The vectors, regenerated from their seeds.
pub fn generate() -> Vec<Vector> {
    let aes = FixedKeyAes::new();
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, s)| make_vector(&aes, i, s))
        .collect()
}

/// The vector file as written to disk: pretty JSON and a final newline.
pub fn render() -> String {
    let file = VectorFile {
        format: FORMAT.to_owned(),
        version: VERSION,
        description: concat!(
            "Half-tree DCF/DPF known answers. seed seeds suffuse_core::prg::Prg ",
            "(AES-128 keyed by the seed, counter mode from 0): its first two 16-byte ",
            "blocks are the roots, and the rest of the stream is generate()'s rng. ",
            "points are 0, alpha-1, alpha, alpha+1, 2^k-1 and three words of ",
            "Prg::with_stream(seed, 1), all mod 2^k. out0/out1 are the parties' ",
            "shares (XOR for bit output, additive mod 2^w for ring output) and ",
            "values their reconstruction. A pair output (two ring words per point ",
            "from one key) takes its second payload word beta1 from the stream ",
            "right after the roots, and its out0/out1/values hold both words of ",
            "each point in turn."
        )
        .to_owned(),
        vectors: generate(),
    };
    let mut text = serde_json::to_string_pretty(&file).unwrap();
    text.push('\n');
    text
}

/// The vectors root of this crate: `tests/vectors`.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

/// The path of the vector file under a vectors root.
pub fn file_path(dir: &Path) -> PathBuf {
    dir.join(format!("v{VERSION}")).join(FILE_NAME)
}

/// Writes `v1/fss.json` under `dir` (normally [`default_dir`]).
pub fn write_all(dir: &Path) -> std::io::Result<()> {
    let path = file_path(dir);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, render())
}
