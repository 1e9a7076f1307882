//! The half-tree key structure shared by [`dcf`](crate::dcf) and
//! [`dpf`](crate::dpf): parameters, key layout, and the lane-pipelined walk.
//!
//! # Construction
//!
//! Both primitives are half-tree DPF keys (Guo et al., EUROCRYPT 2023) over
//! the high `k − ν` bits of the input, with an early-terminated leaf block that
//! covers the low `ν` bits. A node's two children come from one hash call:
//! `left = H(s) ⊕ t·CW_i` and `right = left ⊕ s`, where `t = lsb(s)` is the
//! node's control bit. On the path of the secret point α the two parties'
//! seeds differ by a global Δ with `lsb(Δ) = 1`; everywhere else they are
//! equal. The dealer's correction word `CW_i = H(s_0) ⊕ H(s_1) ⊕ (1 − α_i)·Δ`
//! keeps exactly the child toward α on the path (the corrected form of the
//! paper's formula, as recorded in myl7/fss's spec corrections).
//!
//! * **DPF** (`f(x) = β·[x = α]`): the leaf block `Conv(s) ⊕ t·LCW` holds the
//!   payload `β·e_{α mod 2^ν}` at the on-path leaf and cancels elsewhere.
//! * **DCF** (`f(x) = β·[x < α]`): walking toward `x`, whenever `x_i = 0` the
//!   right sibling is on α's path exactly when α and x first differ at bit
//!   `i` with `α_i = 1`, i.e. when `x < α` is decided there. So the output is
//!   the sum over those right siblings of their "on path" share, plus the
//!   leaf block programmed with `β·[j < α mod 2^ν]`. For bit output the
//!   sibling's share is its control bit (free: the hash already produced it);
//!   for ring output each level carries a value correction `VCW_i` and the
//!   sibling is converted with a second, independent hash.
//!
//! # Exact evaluation rules
//!
//! Let `s` be a party's seed at a node, `t = lsb(s)`, and let the leaf block
//! be split into lanes of `lane` bits, lane `j` at bits `j·lane ..`; the
//! input's low `ν = min(k, log2(128 / lane))` bits pick the lane.
//!
//! * Bit output: the result is the XOR of the accumulated sibling control
//!   bits (DCF only) and bit `x mod 2^ν` of `H_leaf(s) ⊕ t·LCW`.
//! * Ring output: the sibling term at level i (DCF only, when `x_i = 0`) is
//!   `H_value(right).low64 + lsb(right)·VCW_i`; the leaf term is
//!   `lane_j(H_leaf(s)) + t·lane_j(LCW)`; both are added in Z_2^w. P0
//!   outputs the sum and P1 its negation, so the shares add up.
//! * Root seeds have `lsb = party` (fixed public control bits).
//!
//! # Costs (AES calls per evaluation)
//!
//! | output | DPF | DCF |
//! | --- | --- | --- |
//! | bit | `k − ν + 1` | `k − ν + 1` |
//! | Z_2^w | `k − ν + 1` | `2(k − ν) + 1` |
//!
//! with `ν = 7` for bit output and `ν = log2(128 / lane)` for ring output,
//! `lane` the smallest of 8/16/32/64 bits holding `w`.

mod keygen;

pub use keygen::{GEN_LANES, GenBatch, generate, key_buffers_fit, p1_keys_fit, p1_span};

use crate::error::Error;
use crate::prg::{Block, Domain, HASH_CHUNK, Hasher, word_mask};
use crate::ring::{Width, cast};

/// Which function family a key encodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Distributed comparison function `f(x) = β·[x < α]`.
    Dcf,
    /// Distributed point function `f(x) = β·[x = α]`.
    Dpf,
}

/// The output group of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// Z_2, XOR-shared; the payload is always 1.
    Bit,
    /// Z_2^w, additively shared.
    Ring(Width),
    /// Two words of Z_2^w per point, additively shared, from one seed
    /// chain: a DCF `(β_0, β_1)·[x < α]` whose two value corrections per
    /// level are converted by one value hash (its low and high halves).
    /// Two ring keys with the same threshold in one walk, for a key of
    /// `k·(16 + 2·⌈w/8⌉) + 16` bytes instead of two of
    /// `(k − ν)·(16 + ⌈w/8⌉) + 16`.
    Pair(Width),
}

impl Output {
    /// The output width: 1 for bits.
    pub const fn width(self) -> Width {
        match self {
            Output::Bit => Width::of(1),
            Output::Ring(w) | Output::Pair(w) => w,
        }
    }

    /// Words per evaluation: 2 for a pair, else 1.
    pub const fn words(self) -> usize {
        match self {
            Output::Pair(_) => 2,
            _ => 1,
        }
    }
}

/// One of the two evaluating parties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Party {
    /// P0.
    P0,
    /// P1.
    P1,
}

impl Party {
    /// 0 or 1.
    pub const fn index(self) -> u64 {
        match self {
            Party::P0 => 0,
            Party::P1 => 1,
        }
    }

    /// The party with this index; an error unless 0 or 1.
    pub const fn from_index(i: u64) -> Result<Party, Error> {
        match i {
            0 => Ok(Party::P0),
            1 => Ok(Party::P1),
            _ => Err(Error::ValueOutOfRange),
        }
    }

    /// The other party.
    pub const fn other(self) -> Party {
        match self {
            Party::P0 => Party::P1,
            Party::P1 => Party::P0,
        }
    }
}

/// The public shape of a key: kind, input width `k` and output group.
///
/// Everything about a key's size and cost is a `const fn` of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    kind: Kind,
    domain: Width,
    output: Output,
}

impl Params {
    /// Parameters for keys over `domain`-bit inputs.
    pub const fn new(kind: Kind, domain: Width, output: Output) -> Params {
        Params {
            kind,
            domain,
            output,
        }
    }

    /// Bit-output DCF over `k`-bit inputs: the comparison key of the gates.
    pub const fn dcf_bit(k: Width) -> Params {
        Params::new(Kind::Dcf, k, Output::Bit)
    }

    /// The key kind.
    pub const fn kind(&self) -> Kind {
        self.kind
    }

    /// The input width k.
    pub const fn domain(&self) -> Width {
        self.domain
    }

    /// The output group.
    pub const fn output(&self) -> Output {
        self.output
    }

    /// Bits per output lane of the leaf block: 1 for bits, else the smallest
    /// of 8/16/32/64 that holds the ring width, twice that for a pair (its
    /// two words side by side, [`Params::word_bits`] each).
    pub const fn lane_bits(&self) -> u32 {
        match self.output {
            Output::Pair(_) => 2 * self.word_bits(),
            _ => self.word_bits(),
        }
    }

    /// Bits per output word in the leaf block: 1 for bits, else the
    /// smallest of 8/16/32/64 that holds the ring width.
    pub const fn word_bits(&self) -> u32 {
        match self.output {
            Output::Bit => 1,
            Output::Ring(w) | Output::Pair(w) => {
                let b = w.bits();
                if b <= 8 {
                    8
                } else if b <= 16 {
                    16
                } else if b <= 32 {
                    32
                } else {
                    64
                }
            }
        }
    }

    /// ν: input bits resolved inside the leaf block.
    pub const fn leaf_bits(&self) -> u32 {
        let full = (128 / self.lane_bits()).trailing_zeros();
        let k = self.domain.bits();
        if k < full { k } else { full }
    }

    /// Tree levels walked before the leaf: `k − ν`.
    pub const fn levels(&self) -> u32 {
        self.domain.bits() - self.leaf_bits()
    }

    /// Bytes of the value corrections per level (ring and pair DCFs
    /// only): one word of `⌈w/8⌉` bytes per output word.
    pub const fn value_bytes(&self) -> usize {
        match (self.kind, self.output) {
            (Kind::Dcf, Output::Ring(w) | Output::Pair(w)) => {
                self.output.words() * cast::usize_from_u32(w.bits().div_ceil(8))
            }
            _ => 0,
        }
    }

    /// Bytes per tree level: the seed correction and any value correction.
    pub const fn level_bytes(&self) -> usize {
        16 + self.value_bytes()
    }

    /// Length of one party's key: root seed, levels, leaf correction.
    pub const fn key_len(&self) -> usize {
        16 + cast::usize_from_u32(self.levels()) * self.level_bytes() + 16
    }

    /// Length of a key's body: the key without its 16-byte root.
    pub const fn body_len(&self) -> usize {
        self.key_len() - 16
    }

    /// Offset of level `i`'s seed correction word.
    pub const fn cw_offset(&self, level: u32) -> usize {
        16 + self.body_cw_offset(level)
    }

    /// Offset of the leaf correction block.
    pub const fn leaf_offset(&self) -> usize {
        16 + self.body_leaf_offset()
    }

    /// Offset of level `i`'s seed correction word in a key's body.
    pub const fn body_cw_offset(&self, level: u32) -> usize {
        cast::usize_from_u32(level) * self.level_bytes()
    }

    /// Offset of the leaf correction block in a key's body.
    pub const fn body_leaf_offset(&self) -> usize {
        cast::usize_from_u32(self.levels()) * self.level_bytes()
    }

    /// AES calls per evaluation at one point.
    pub const fn aes_per_eval(&self) -> u64 {
        let l = cast::u64_from_u32(self.levels());
        match (self.kind, self.output) {
            (Kind::Dcf, Output::Ring(_) | Output::Pair(_)) => 2 * l + 1,
            _ => l + 1,
        }
    }

    /// Uniform words generating one key pair draws: one per level and
    /// output word for ring-output DCFs (the off-path value corrections),
    /// none otherwise.
    pub const fn gen_random_words(&self) -> usize {
        match (self.kind, self.output) {
            (Kind::Dcf, Output::Ring(_) | Output::Pair(_)) => {
                self.output.words() * cast::usize_from_u32(self.levels())
            }
            _ => 0,
        }
    }

    /// AES calls to generate one key pair.
    pub const fn aes_per_gen(&self) -> u64 {
        2 * self.aes_per_eval()
    }

    /// AES calls for a full-domain evaluation of one key.
    pub const fn aes_per_full_domain(&self) -> u64 {
        // 2^L − 1 inner nodes plus 2^L leaves.
        (1u64 << (self.levels() + 1)) - 1
    }
}

/// A borrowed, length-checked batch of one party's keys with common params.
///
/// A key is its 16-byte root seed followed by its body (each level's
/// correction words, then the leaf correction). A batch holds either whole
/// keys back to back ([`KeyBatch::new`], the wire layout) or the roots and
/// the bodies in two arrays ([`KeyBatch::split`]): a key file stores bodies
/// only and the roots are re-derived from a seed, so the split layout lets
/// the bodies be evaluated where they were read, without a copy.
#[derive(Clone, Copy)]
pub struct KeyBatch<'a> {
    params: Params,
    party: Party,
    count: usize,
    /// Key `i`'s root at `roots[i · root_stride..][..16]`.
    roots: &'a [u8],
    root_stride: usize,
    /// Key `i`'s body at `bodies[i · body_stride..][..body_len]`.
    bodies: &'a [u8],
    body_stride: usize,
    /// Whole keys back to back, when the batch was made from them.
    whole: Option<&'a [u8]>,
}

impl core::fmt::Debug for KeyBatch<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyBatch")
            .field("params", &self.params)
            .field("party", &self.party)
            .field("count", &self.count())
            .finish_non_exhaustive()
    }
}

/// One key of a batch: its root seed and its body. Secret: no `Debug`.
#[derive(Clone, Copy)]
pub struct KeyRef<'a> {
    root: &'a [u8],
    body: &'a [u8],
}

impl<'a> KeyRef<'a> {
    /// One whole key's bytes (`params.key_len()` of them), taken apart.
    pub fn whole(params: &Params, key: &'a [u8]) -> Result<KeyRef<'a>, Error> {
        if key.len() != params.key_len() {
            return Err(Error::BufferLength);
        }
        let (root, body) = key.split_at(16);
        Ok(KeyRef { root, body })
    }

    /// The 16-byte root seed.
    #[inline]
    pub fn root(&self) -> &'a [u8] {
        self.root
    }

    /// The correction words: level `i`'s at [`Params::body_cw_offset`],
    /// the leaf's at [`Params::body_leaf_offset`].
    #[inline]
    pub fn body(&self) -> &'a [u8] {
        self.body
    }
}

/// The byte range of items `start..end` in an array with `stride` bytes
/// between item starts and `len` bytes per item.
#[inline]
fn span(stride: usize, len: usize, start: usize, end: usize) -> core::ops::Range<usize> {
    let from = start * stride;
    if end > start {
        from..(end - 1) * stride + len
    } else {
        from..from
    }
}

impl<'a> KeyBatch<'a> {
    /// A batch over `bytes`, which must hold a whole number of keys.
    pub fn new(params: Params, party: Party, bytes: &'a [u8]) -> Result<KeyBatch<'a>, Error> {
        let len = params.key_len();
        if !bytes.len().is_multiple_of(len) {
            return Err(Error::BufferLength);
        }
        Ok(KeyBatch {
            params,
            party,
            count: bytes.len() / len,
            roots: bytes,
            root_stride: len,
            bodies: bytes.get(16..).unwrap_or_default(),
            body_stride: len,
            whole: Some(bytes),
        })
    }

    /// A batch of keys whose 16-byte roots lie back to back in `roots` and
    /// whose bodies ([`Params::body_len`] bytes each) lie back to back in
    /// `bodies`; both must hold the same number of keys.
    pub fn split(
        params: Params,
        party: Party,
        roots: &'a [u8],
        bodies: &'a [u8],
    ) -> Result<KeyBatch<'a>, Error> {
        let count = roots.len() / 16;
        if !roots.len().is_multiple_of(16)
            || Some(bodies.len()) != count.checked_mul(params.body_len())
        {
            return Err(Error::BufferLength);
        }
        Ok(KeyBatch {
            params,
            party,
            count,
            roots,
            root_stride: 16,
            bodies,
            body_stride: params.body_len(),
            whole: None,
        })
    }

    /// The common parameters.
    pub fn params(&self) -> Params {
        self.params
    }

    /// Whose keys these are.
    pub fn party(&self) -> Party {
        self.party
    }

    /// The number of keys.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Key `i`; panics if `i ≥ count()`.
    #[inline]
    pub fn key(&self, i: usize) -> KeyRef<'a> {
        assert!(i < self.count, "key index out of range");
        KeyRef {
            root: &self.roots[span(self.root_stride, 16, i, i + 1)],
            body: &self.bodies[span(self.body_stride, self.params.body_len(), i, i + 1)],
        }
    }

    /// The bytes that hold keys `start..end`'s bodies (with the roots
    /// between them when the batch holds whole keys); for prefetching.
    pub fn bodies(&self, start: usize, end: usize) -> &'a [u8] {
        let end = end.min(self.count);
        let start = start.min(end);
        &self.bodies[span(self.body_stride, self.params.body_len(), start, end)]
    }

    /// All key bytes, when the batch holds whole keys back to back.
    pub fn bytes(&self) -> Option<&'a [u8]> {
        self.whole
    }

    /// The sub-batch of keys `start..end`.
    pub fn slice(&self, start: usize, end: usize) -> KeyBatch<'a> {
        let len = self.params.key_len();
        KeyBatch {
            count: end - start,
            roots: &self.roots[span(self.root_stride, 16, start, end)],
            bodies: &self.bodies[span(self.body_stride, self.params.body_len(), start, end)],
            whole: self.whole.map(|w| &w[start * len..end * len]),
            ..*self
        }
    }

    /// Points per key for a query buffer of `points` entries.
    pub fn points_per_key(&self, points: usize) -> Result<usize, Error> {
        let n = self.count();
        if n == 0 {
            return if points == 0 {
                Ok(0)
            } else {
                Err(Error::BufferLength)
            };
        }
        if !points.is_multiple_of(n) {
            return Err(Error::BufferLength);
        }
        Ok(points / n)
    }
}

/// Evaluates queries `first .. first + points.len()` of a batch in which
/// query `q` is key `q / per_key` at `points[q − first]` (taken mod `2^k`),
/// walking up to `lanes` queries in lockstep so their AES calls pipeline.
/// Each query writes [`Output::words`] words to `out` (a pair's two words
/// side by side).
///
/// `lanes = 1` is the dependent AES chain of a one-at-a-time evaluator.
/// Returns the number of AES calls made.
pub fn eval_queries<H: Hasher + ?Sized>(
    aes: &H,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
    lanes: usize,
) -> Result<u64, Error> {
    let words = keys.params.output.words();
    if Some(out.len()) != points.len().checked_mul(words) {
        return Err(Error::BufferLength);
    }
    if per_key == 0 || (first + points.len()).div_ceil(per_key) > keys.count() {
        return if points.is_empty() {
            Ok(0)
        } else {
            Err(Error::BufferLength)
        };
    }
    let lanes = lanes.clamp(1, HASH_CHUNK);
    let mut calls = 0;
    let mut q = 0;
    while q < points.len() {
        let n = lanes.min(points.len() - q);
        let (p, o) = (&points[q..q + n], &mut out[q * words..(q + n) * words]);
        // One lane gets one-entry stack arrays: the serial baseline pays for
        // its dependent AES chain, not for zeroing unused lanes.
        calls += if lanes == 1 {
            walk_group::<H, 1>(aes, keys, per_key, first + q, p, o)
        } else {
            walk_group::<H, HASH_CHUNK>(aes, keys, per_key, first + q, p, o)
        };
        q += n;
    }
    Ok(calls)
}

/// One lockstep group of at most `L` queries.
fn walk_group<H: Hasher + ?Sized, const L: usize>(
    aes: &H,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
) -> u64 {
    let p = keys.params;
    let n = points.len();
    let k = p.domain.bits();
    let ring = match p.output {
        Output::Bit => None,
        Output::Ring(w) | Output::Pair(w) => Some(w),
    };
    // A pair's second word has its own accumulator, value correction and
    // lane.
    let words = p.output.words();
    let dcf = p.kind == Kind::Dcf;
    let vbytes = p.value_bytes() / words;

    let mut key_of = [&[][..]; L];
    let mut x = [0u64; L];
    let mut seed = [Block::ZERO; L];
    // DCF accumulators: XOR of control bits (bit output) or a sum per
    // output word (ring output).
    let mut acc = [[0u64; L]; 2];
    let mut h = [Block::ZERO; L];
    let mut right = [Block::ZERO; L];
    let mut t_right = [0u64; L];
    let mut keep = [0u64; L];
    for j in 0..n {
        let key = keys.key((first + j) / per_key);
        key_of[j] = key.body();
        x[j] = points[j] & p.domain.mask();
        seed[j] = Block::read(key.root());
    }

    let mut calls = 0;
    for level in 0..p.levels() {
        let shift = k - 1 - level;
        let off = p.body_cw_offset(level);
        h[..n].copy_from_slice(&seed[..n]);
        calls += aes.hash_many(Domain::Tree, &mut h[..n]);
        for j in 0..n {
            let s = seed[j];
            let cw = Block::read(&key_of[j][off..]);
            let left = h[j] ^ (cw & Block::mask(s.lsb()));
            let r = left ^ s;
            let xb = (x[j] >> shift) & 1;
            // When x_i = 0 the right sibling is on α's path exactly when this
            // level decides x < α; its control bit is then a share of that.
            keep[j] = xb ^ 1;
            t_right[j] = r.lsb();
            right[j] = r;
            seed[j] = left ^ (s & Block::mask(xb));
            #[cfg(feature = "ct-planted")]
            crate::planted::secret_branch(t_right[j]);
        }
        if dcf {
            match ring {
                None => {
                    for j in 0..n {
                        acc[0][j] ^= t_right[j] & keep[j];
                    }
                }
                Some(w) => {
                    calls += aes.hash_many(Domain::Value, &mut right[..n]);
                    // Word i (a pair's 0 and 1): half i of the value hash
                    // and the level's i-th value correction.
                    for (i, acc) in acc.iter_mut().enumerate().take(words) {
                        let voff = off + 16 + i * vbytes;
                        let half = cast::u32_from_small_usize(i);
                        for j in 0..n {
                            let vcw = read_word(&key_of[j][voff..voff + vbytes]);
                            let v = right[j].lane(64, half);
                            let share = v.wrapping_add(vcw & word_mask(t_right[j]));
                            acc[j] = acc[j].wrapping_add(share & 0u64.wrapping_sub(keep[j]));
                            acc[j] &= w.mask();
                        }
                    }
                }
            }
        }
    }

    h[..n].copy_from_slice(&seed[..n]);
    calls += aes.hash_many(Domain::Leaf, &mut h[..n]);
    let leaf_off = p.body_leaf_offset();
    let word_bits = p.word_bits();
    let lane_mask = (1u64 << p.leaf_bits()) - 1;
    let sign = keys.party.index();
    for j in 0..n {
        let t = seed[j].lsb();
        let lcw = Block::read(&key_of[j][leaf_off..]);
        // A pair's lane is two words: the first at 2·lane, the second next.
        let lane = cast::u32_from_small_u64(x[j] & lane_mask) * cast::u32_from_small_usize(words);
        let o = &mut out[j * words..(j + 1) * words];
        match ring {
            None => o[0] = (acc[0][j] ^ (h[j] ^ (lcw & Block::mask(t))).bit(lane)) & 1,
            Some(w) => {
                for (i, (o, a)) in o.iter_mut().zip([acc[0][j], acc[1][j]]).enumerate() {
                    let lane = lane + cast::u32_from_small_usize(i);
                    let v = h[j]
                        .lane(word_bits, lane)
                        .wrapping_add(lcw.lane(word_bits, lane) & word_mask(t));
                    let sum = a.wrapping_add(v);
                    // P1 negates so that the two shares add up to the output.
                    let neg = 0u64.wrapping_sub(sign);
                    *o = w.reduce((sum ^ neg).wrapping_add(sign));
                }
            }
        }
    }
    calls
}

/// Reads a little-endian word of up to 8 bytes.
#[inline(always)]
pub(crate) fn read_word(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

/// Writes the low `bytes.len()` bytes of `v` little-endian.
#[inline(always)]
pub(crate) fn write_word(bytes: &mut [u8], v: u64) {
    let n = bytes.len();
    bytes.copy_from_slice(&v.to_le_bytes()[..n]);
}

/// Generates both parties' keys for `f(x) = β·[x < α]` (DCF) or
/// `β·[x = α]` (DPF), writing full keys into `key0` and `key1`; `beta`
/// holds [`Output::words`] words (a pair's two).
///
/// `roots` are the parties' root seeds; their low bits are overwritten with
/// the parties' indices (public root control bits, as in BGI16). α is taken
/// modulo `2^k` and β modulo `2^w`; bit-output keys ignore β (it is 1). All
/// inputs except `params` are secret and steer no branch or index. Returns
/// the number of AES calls made.
///
/// `rng` draws the off-path value corrections of ring-output DCF keys, so
/// it must be fresh dealer randomness that neither party can predict; it is
/// required exactly for those keys (`KindMismatch` otherwise), and
/// bit-output keys and DPFs take `None`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gen_pair<H: Hasher + ?Sized, R: rand_core::CryptoRng + ?Sized>(
    aes: &H,
    params: &Params,
    alpha: u64,
    beta: &[u64],
    roots: [Block; 2],
    rng: Option<&mut R>,
    key0: &mut [u8],
    key1: &mut [u8],
) -> Result<u64, Error> {
    // The words a ring DCF draws, per level in level order (a pair's two
    // side by side): the same stream a level-by-level generator reads.
    // Only ring DCFs draw any.
    let draws = params.kind == Kind::Dcf && params.output != Output::Bit;
    if draws != rng.is_some() {
        return Err(Error::KindMismatch);
    }
    let words = params.gen_random_words();
    let mut random = [0u64; 128];
    if let Some(rng) = rng {
        for r in &mut random[..words] {
            *r = rng.next_u64();
        }
    }
    let (alphas, roots) = ([alpha], [roots]);
    let batch = GenBatch::new(*params, &alphas, beta, &roots, &random[..words])?;
    keygen::generate(aes, &batch, key0, key1, 1)
}

/// `−v mod 2^w` if `flip` is 1, else `v`, without a branch.
#[inline(always)]
fn cond_neg(w: Width, v: u64, flip: u64) -> u64 {
    let m = word_mask(flip);
    w.reduce((v ^ m).wrapping_add(m & 1))
}

/// `b` if `bit` is 1, else `a`, without a branch.
#[inline(always)]
fn select_u64(bit: u64, a: u64, b: u64) -> u64 {
    let m = word_mask(bit);
    (a & !m) | (b & m)
}

/// `[a < b]` for `a, b < 2^63`, without a branch.
#[inline(always)]
fn ct_lt(a: u64, b: u64) -> u64 {
    a.wrapping_sub(b) >> 63
}

/// `[a = b]` without a branch.
#[inline(always)]
fn ct_eq(a: u64, b: u64) -> u64 {
    let d = a ^ b;
    ((d | d.wrapping_neg()) >> 63) ^ 1
}

/// Levels a tile of [`full_domain`] expands, for several subtrees in
/// lockstep: `HASH_CHUNK >> TILE` of them, so that a tile's hash calls take
/// 8, 16, 32 and 64 blocks (a call of fewer blocks costs nearly as much as
/// one of 8 on the vector AES paths).
const TILE: u32 = 3;

/// Evaluates one DPF key at every point of its domain:
/// `out[x] = Eval(key, x)` for `x < 2^k` (k ≤ 40). Returns the AES calls made.
pub fn full_domain<H: Hasher + ?Sized>(
    aes: &H,
    params: &Params,
    party: Party,
    key: KeyRef<'_>,
    out: &mut [u64],
) -> Result<u64, Error> {
    full_domain_tiles(aes, params, party, key, (out, Tiles::InPlace), |_, _| {})
}

/// Where [`full_domain_tiles`] writes each tile of outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tiles {
    /// At its own place: `out` ends up as the whole domain.
    InPlace,
    /// Every tile into the same window at the end of `out`, which stays in
    /// the first-level cache: for callers that consume each tile in
    /// `visit` and need no domain afterwards.
    Window,
}

/// [`full_domain`], handing each tile of outputs to `visit` as soon as it
/// is written, while it is still in cache: `visit(x0, tile)` with `tile`
/// the outputs at `x0..x0 + tile.len()`, tiles in descending order of `x0`.
///
/// The top `levels − TILE` levels expand breadth first inside `out` itself
/// (a level of `2^l` seeds fits in `2^(l+1) ≤ 2^k` words), so it needs no
/// scratch memory beyond two chunks of blocks on the stack. Then the seeds
/// of that level go through the last `TILE` levels in tiles of `group`
/// consecutive seeds, their subtrees in lockstep, from the last tile to
/// the first: a tile of `group` seeds writes `group·2^(TILE+ν) ≥
/// 2·group` words, so [`Tiles::InPlace`] overwrites only seeds already
/// read. [`Tiles::Window`]'s window is the last tile's place; where there
/// is more than one tile (`top > TILE`, `group = 2^(6 − TILE)`), the
/// seeds' `2^(top+1)` words end below it.
pub(crate) fn full_domain_tiles<H: Hasher + ?Sized>(
    aes: &H,
    params: &Params,
    party: Party,
    key: KeyRef<'_>,
    (out, tiles): (&mut [u64], Tiles),
    mut visit: impl FnMut(usize, &[u64]),
) -> Result<u64, Error> {
    let p = params;
    // A full domain is one word per point: pairs are DCFs' (eval only).
    if p.kind != Kind::Dpf || matches!(p.output, Output::Pair(_)) {
        return Err(Error::KindMismatch);
    }
    if key.root.len() != 16 || key.body.len() != p.body_len() {
        return Err(Error::BufferLength);
    }
    let k = p.domain.bits();
    if k > 40 || cast::u64_from_usize(out.len()) != 1u64 << k {
        return Err(Error::BufferLength);
    }
    let tile = p.levels().min(TILE);
    let top = p.levels() - tile;
    store_seed(out, 0, Block::read(key.root));
    let mut chunks = [[Block::ZERO; HASH_CHUNK]; 2];
    let mut calls = expand_top(aes, p, key, (top, out), &mut chunks);
    // Each tile: `group` consecutive seeds of level `top` and their
    // subtrees, at most a hash chunk of leaves.
    let group = (1usize << top).min(HASH_CHUNK >> tile);
    let count = (1usize << top) / group;
    let width = group << (tile + p.leaf_bits());
    for i in (0..count).rev() {
        for (g, s) in chunks[0][..group].iter_mut().enumerate() {
            *s = load_seed(out, i * group + g);
        }
        let place = match tiles {
            Tiles::InPlace => i,
            Tiles::Window => count - 1,
        };
        let tile_out = &mut out[place * width..(place + 1) * width];
        calls += expand_tile(
            aes,
            p,
            party,
            key,
            (top, tile, group),
            &mut chunks,
            tile_out,
        );
        visit(i * width, tile_out);
    }
    Ok(calls)
}

/// Seed `i` of a breadth-first level kept in `out` (two words a seed).
#[inline(always)]
fn load_seed(out: &[u64], i: usize) -> Block {
    Block::from_bytes(((u128::from(out[2 * i + 1]) << 64) | u128::from(out[2 * i])).to_le_bytes())
}

#[inline(always)]
fn store_seed(out: &mut [u64], i: usize, b: Block) {
    out[2 * i] = b.low64();
    out[2 * i + 1] = b.high64();
}

/// Expands the root (seed 0 of `out`) breadth first down to level `top`,
/// in place, with `chunks` as the seeds' and hashes' scratch; returns the
/// AES calls.
fn expand_top<H: Hasher + ?Sized>(
    aes: &H,
    p: &Params,
    key: KeyRef<'_>,
    (top, out): (u32, &mut [u64]),
    [seeds, h]: &mut [[Block; HASH_CHUNK]; 2],
) -> u64 {
    let mut calls = 0;
    for level in 0..top {
        let cw = Block::read(&key.body[p.body_cw_offset(level)..]);
        // Descending chunks: children 2i, 2i+1 overwrite only nodes ≥ i,
        // which are already read.
        let mut end = 1usize << level;
        while end > 0 {
            let start = end.saturating_sub(HASH_CHUNK);
            let n = end - start;
            for (j, s) in seeds[..n].iter_mut().enumerate() {
                *s = load_seed(out, start + j);
            }
            h[..n].copy_from_slice(&seeds[..n]);
            calls += aes.hash_many(Domain::Tree, &mut h[..n]);
            for j in (0..n).rev() {
                let (left, right) = children(seeds[j], h[j], cw);
                store_seed(out, 2 * (start + j) + 1, right);
                store_seed(out, 2 * (start + j), left);
            }
            end = start;
        }
    }
    calls
}

/// A node's children from its seed `s`, its hash `h` and the level's
/// correction word: `left = h ⊕ t·CW`, `right = left ⊕ s`.
#[inline(always)]
fn children(s: Block, h: Block, cw: Block) -> (Block, Block) {
    let left = h ^ (cw & Block::mask(s.lsb()));
    (left, left ^ s)
}

/// Expands the `group` seeds in `chunks[0]`, consecutive nodes at level
/// `top`, through the last `tile` levels in lockstep (node j's children at
/// 2j and 2j + 1 keep the level's order) and writes their `group·2^tile`
/// leaves' outputs to `out`, with `chunks` as the seeds' and hashes'
/// scratch; returns the AES calls.
fn expand_tile<H: Hasher + ?Sized>(
    aes: &H,
    p: &Params,
    party: Party,
    key: KeyRef<'_>,
    (top, tile, group): (u32, u32, usize),
    [seeds, h]: &mut [[Block; HASH_CHUNK]; 2],
    out: &mut [u64],
) -> u64 {
    let mut calls = 0;
    for t in 0..tile {
        let cw = Block::read(&key.body[p.body_cw_offset(top + t)..]);
        let n = group << t;
        h[..n].copy_from_slice(&seeds[..n]);
        calls += aes.hash_many(Domain::Tree, &mut h[..n]);
        for j in (0..n).rev() {
            let (left, right) = children(seeds[j], h[j], cw);
            seeds[2 * j + 1] = right;
            seeds[2 * j] = left;
        }
    }
    let n = group << tile;
    h[..n].copy_from_slice(&seeds[..n]);
    calls += aes.hash_many(Domain::Leaf, &mut h[..n]);
    let lcw = Block::read(&key.body[p.body_leaf_offset()..]);
    write_leaves(p, party, lcw, (&seeds[..n], &h[..n]), out);
    calls
}

/// Each leaf's outputs, `per_leaf` consecutive words per leaf: the leaf
/// block `H_leaf(s) ⊕ t·LCW` (bits) or `lane(H_leaf(s)) + t·lane(LCW)`
/// (ring, negated at P1).
fn write_leaves(
    p: &Params,
    party: Party,
    lcw: Block,
    (seeds, h): (&[Block], &[Block]),
    out: &mut [u64],
) {
    let per_leaf = 1usize << p.leaf_bits();
    let sign = party.index();
    let neg = 0u64.wrapping_sub(sign);
    match p.output {
        Output::Ring(w) if p.lane_bits() == 64 => {
            let conv = |v: u64| w.reduce((v ^ neg).wrapping_add(sign));
            let (lo, hi) = (lcw.low64(), lcw.high64());
            for ((s, h), o) in seeds.iter().zip(h).zip(out.chunks_exact_mut(2)) {
                let m = word_mask(s.lsb());
                o[0] = conv(h.low64().wrapping_add(lo & m));
                o[1] = conv(h.high64().wrapping_add(hi & m));
            }
        }
        Output::Ring(w) => {
            let lane_bits = p.lane_bits();
            for ((s, h), o) in seeds.iter().zip(h).zip(out.chunks_exact_mut(per_leaf)) {
                let m = word_mask(s.lsb());
                for (lane, o) in (0u32..).zip(o.iter_mut()) {
                    let v = h
                        .lane(lane_bits, lane)
                        .wrapping_add(lcw.lane(lane_bits, lane) & m);
                    *o = w.reduce((v ^ neg).wrapping_add(sign));
                }
            }
        }
        // Refused by `full_domain_tiles`.
        Output::Pair(_) => {}
        Output::Bit => {
            for ((s, h), o) in seeds.iter().zip(h).zip(out.chunks_exact_mut(per_leaf)) {
                let b = *h ^ (lcw & Block::mask(s.lsb()));
                for (lane, o) in (0u32..).zip(o.iter_mut()) {
                    *o = b.bit(lane);
                }
            }
        }
    }
}
