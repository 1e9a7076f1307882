//! Dealing test keys: random key pairs and batches from a seeded PRG, so
//! every failure is reproducible from its seed.

use suffuse_core::fss::{KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{Block, FixedKeyAes, Prg};
use suffuse_core::ring::Width;
use suffuse_core::{dcf, dpf};

/// Both key kinds.
pub const KINDS: [Kind; 2] = [Kind::Dcf, Kind::Dpf];

/// Both parties, in index order.
pub const PARTIES: [Party; 2] = [Party::P0, Party::P1];

/// One key pair and the function it shares.
pub struct KeyPair {
    /// The shape.
    pub params: Params,
    /// The threshold or point, reduced mod `2^k`.
    pub alpha: u64,
    /// The payload, reduced mod `2^w` (1 for bit output; a pair's first
    /// word).
    pub beta: u64,
    /// A pair's second payload word, reduced mod `2^w` (0 for every other
    /// output).
    pub second: u64,
    /// The root seeds handed to generation (before their low bits are set).
    pub roots: [Block; 2],
    /// P0's and P1's keys.
    pub keys: [Vec<u8>; 2],
    /// The AES calls generation reported.
    pub gen_aes_calls: u64,
}

impl KeyPair {
    /// The key of `party`.
    pub fn key(&self, party: Party) -> &[u8] {
        &self.keys[usize::from(party == Party::P1)]
    }
}

/// The output groups: bit, and Z_2^w for each of `ring_widths`.
pub fn outputs(ring_widths: &[u32]) -> Vec<Output> {
    std::iter::once(Output::Bit)
        .chain(ring_widths.iter().map(|&w| Output::Ring(Width::of(w))))
        .collect()
}

/// Pair-output DCFs ([`Output::Pair`]) over domains `k` and ring widths.
pub fn pair_shapes(domains: &[u32], ring_widths: &[u32]) -> Vec<Params> {
    let mut all = Vec::new();
    for &k in domains {
        for &w in ring_widths {
            all.push(Params::new(
                Kind::Dcf,
                Width::of(k),
                Output::Pair(Width::of(w)),
            ));
        }
    }
    all
}

/// The cross product of kinds, domains `k` and output groups.
pub fn shapes(domains: &[u32], ring_widths: &[u32]) -> Vec<Params> {
    let mut all = Vec::new();
    for kind in KINDS {
        for &k in domains {
            for output in outputs(ring_widths) {
                all.push(Params::new(kind, Width::of(k), output));
            }
        }
    }
    all
}

/// Generates a key pair with roots drawn from `rng`.
pub fn deal(aes: &FixedKeyAes, params: &Params, alpha: u64, beta: u64, rng: &mut Prg) -> KeyPair {
    let roots = [rng.next_block(), rng.next_block()];
    deal_with_roots(aes, params, alpha, beta, roots, rng)
}

/// Generates a key pair with the given roots; `rng` supplies the rest of
/// the dealer's randomness.
pub fn deal_with_roots(
    aes: &FixedKeyAes,
    params: &Params,
    alpha: u64,
    beta: u64,
    roots: [Block; 2],
    rng: &mut Prg,
) -> KeyPair {
    let alpha = params.domain().reduce(alpha);
    let (beta, second) = match params.output() {
        Output::Bit => (1, 0),
        Output::Ring(w) => (w.reduce(beta), 0),
        Output::Pair(w) => (w.reduce(beta), w.reduce(rng.next_u64())),
    };
    let mut key0 = vec![0u8; params.key_len()];
    let mut key1 = vec![0u8; params.key_len()];
    let generated = match (params.kind(), params.output()) {
        (Kind::Dcf, Output::Pair(_)) => {
            let betas = [beta, second];
            dcf::generate_pair(aes, params, alpha, betas, roots, rng, &mut key0, &mut key1)
        }
        (Kind::Dcf, _) => dcf::generate(aes, params, alpha, beta, roots, rng, &mut key0, &mut key1),
        (Kind::Dpf, _) => dpf::generate(aes, params, alpha, beta, roots, rng, &mut key0, &mut key1),
    };
    let gen_aes_calls = generated.unwrap_or_else(|e| panic!("generating {params:?} failed: {e}"));
    KeyPair {
        params: *params,
        alpha,
        beta,
        second,
        roots,
        keys: [key0, key1],
        gen_aes_calls,
    }
}

/// A threshold or point that hits the edges of `[0, 2^k)` often: 0, 1,
/// `2^k − 1`, `2^k − 2` and `2^(k−1)` each about one time in ten.
pub fn edgy_alpha(params: &Params, rng: &mut Prg) -> u64 {
    let k = params.domain();
    let alpha = match rng.next_u64() % 10 {
        0 => 0,
        1 => 1,
        2 => k.mask(),
        3 => k.mask().wrapping_sub(1),
        4 => k.half(),
        _ => rng.next_u64(),
    };
    k.reduce(alpha)
}

/// Keys `0..count` of both parties for one shape, stored contiguously as
/// key batches, with the functions they share.
pub struct DealtBatch {
    /// The common shape.
    pub params: Params,
    /// α of each key.
    pub alphas: Vec<u64>,
    /// β of each key (a pair's first word).
    pub betas: Vec<u64>,
    /// A pair's second payload word of each key (0 for other outputs).
    pub seconds: Vec<u64>,
    /// P0's and P1's keys, `count · key_len` bytes each.
    pub bytes: [Vec<u8>; 2],
}

impl DealtBatch {
    /// Deals `count` random key pairs of shape `params`.
    pub fn deal(aes: &FixedKeyAes, params: &Params, count: usize, rng: &mut Prg) -> DealtBatch {
        let mut batch = DealtBatch {
            params: *params,
            alphas: Vec::with_capacity(count),
            betas: Vec::with_capacity(count),
            seconds: Vec::with_capacity(count),
            bytes: [Vec::new(), Vec::new()],
        };
        for _ in 0..count {
            let alpha = edgy_alpha(params, rng);
            let beta = rng.next_u64();
            let pair = deal(aes, params, alpha, beta, rng);
            batch.alphas.push(pair.alpha);
            batch.betas.push(pair.beta);
            batch.seconds.push(pair.second);
            let [k0, k1] = pair.keys;
            batch.bytes[0].extend_from_slice(&k0);
            batch.bytes[1].extend_from_slice(&k1);
        }
        batch
    }

    /// The number of key pairs.
    pub fn count(&self) -> usize {
        self.alphas.len()
    }

    /// All of `party`'s keys.
    pub fn bytes(&self, party: Party) -> &[u8] {
        &self.bytes[usize::from(party == Party::P1)]
    }

    /// `party`'s keys `0..count` as a batch.
    /// Party `party`'s whole key `i`.
    pub fn key(&self, party: Party, i: usize) -> &[u8] {
        let len = self.params.key_len();
        &self.bytes(party)[i * len..(i + 1) * len]
    }

    pub fn batch(&self, party: Party, count: usize) -> KeyBatch<'_> {
        let bytes = &self.bytes(party)[..count * self.params.key_len()];
        KeyBatch::new(self.params, party, bytes).unwrap()
    }
}
