// DCF/DPF evaluation, full-domain DPF expansion, seed expansion and key
// generation: the kernels behind `CudaEval`'s `BatchEval` methods. Each is
// a line-for-line port of core's reference (core/src/fss.rs and
// core/src/fss/keygen.rs), one thread per evaluation, key or node.
//
// Keys arrive level-major (the host transposes them): level l's correction
// word of key i is at cw[2·(l·count + i)], so neighbouring threads read
// neighbouring words. Roots and leaf corrections are two words per key. A
// ring DCF's value corrections are `words` per level and key, at
// vcw[words·(l·count + i) + h] for output word h (a pair's two, core's
// `Output::Pair`; one otherwise).
//
// Public (may steer branches and indices): shapes, the points (masked,
// opened values), the party and domain indices. Secret (may not): seeds,
// control bits, correction words, α, β and the random words.

// Shape flags of a key batch.
#define FSS_DCF 1u
// Two output words per point from one seed chain (a ring DCF only): word
// h takes half h of the value hash and the level's h-th value correction,
// and leaf lane 2·j + h of `word_bits` bits.
#define FSS_PAIR 2u

// Output words per point of a key batch with `flags`.
__device__ __forceinline__ u32 fss_words(u32 flags) {
    return 1u + ((flags & FSS_PAIR) >> 1);
}

// Half `h` (0 or 1, public) of a block: a pair's word h of the value hash;
// also a pair's word h of two scalars (`blk` as a pair of words).
__device__ __forceinline__ u64 blk_half(blk b, u32 h) {
    return h == 0 ? b.lo : b.hi;
}

// The pair (a, b) as a block, so that blk_half picks a word by a public
// index without an array (which the compiler puts in local memory).
__device__ __forceinline__ blk blk_pair(u64 a, u64 b) {
    blk r;
    r.lo = a;
    r.hi = b;
    return r;
}

// Evaluates `queries` queries: query q is key q / per_key at points[q],
// taken mod 2^k, and writes its `words` outputs (fss_words) at
// out[words·q + h]. Bit outputs are 0 or 1, ring outputs canonical in
// Z_2^w (w = 0 means bit output). A pair's outputs must not overlap the
// points (a thread's two words would overwrite a later query's point);
// one word per query may evaluate in place.
extern "C" __global__ void suffuse_fss_eval(const u32* aes_keys, const u64* roots, const u64* cw,
                                            const u64* vcw, const u64* leaf, const u64* points,
                                            u64* out, u64 queries, u64 per_key, u64 count, u32 k,
                                            u32 levels, u32 nu, u32 word_bits, u32 w, u32 flags,
                                            u32 party) {
    extern __shared__ u64 suffuse_smem[];
    u32* sh = (u32*)suffuse_smem;
    aes_setup(sh, aes_keys);
    const u32 dcf = flags & FSS_DCF;
    const u32 words = fss_words(flags);
    const u64 wmask = low_mask(w);
    for (u64 q = global_thread(); q < queries; q += grid_threads()) {
        const u64 key = q / per_key;
        const u64 x = points[q] & low_mask(k);
        blk s = blk_load(roots + 2 * key);
        // DCF accumulators: XOR of control bits (bit output) or a sum per
        // output word.
        blk acc = blk_pair(0, 0);
        for (u32 level = 0; level < levels; level++) {
            const u32 shift = k - 1 - level;
            blk h = hash_block(sh, DOMAIN_TREE, s);
            blk c = blk_load(cw + 2 * ((u64)level * count + key));
            blk left = blk_xor(h, blk_and(c, word_mask(s.lo)));
            blk right = blk_xor(left, s);
            const u64 xb = (x >> shift) & 1;
            // When x_i = 0 the right sibling is on α's path exactly when this
            // level decides x < α; its control bit is then a share of that.
            const u64 keep = xb ^ 1;
            const u64 t_right = right.lo & 1;
            s = blk_xor(left, blk_and(s, word_mask(xb)));
            if (dcf) {
                if (w == 0) {
                    acc.lo ^= t_right & keep;
                } else {
                    const blk v = hash_block(sh, DOMAIN_VALUE, right);
                    const u64* corr = vcw + words * ((u64)level * count + key);
                    const u64 t = word_mask(t_right);
                    const u64 kept = word_mask(keep);
                    acc.lo = (acc.lo + ((v.lo + (corr[0] & t)) & kept)) & wmask;
                    // A pair's second word: the hash's high half.
                    if (words == 2) {
                        acc.hi = (acc.hi + ((v.hi + (corr[1] & t)) & kept)) & wmask;
                    }
                }
            }
        }
        const blk h = hash_block(sh, DOMAIN_LEAF, s);
        const u64 t = s.lo & 1;
        const blk lcw = blk_load(leaf + 2 * key);
        // A pair's lane is two words: the first at 2·lane, the second next.
        const u32 lane = (u32)(x & low_mask(nu)) * words;
        if (w == 0) {
            out[q] = (acc.lo ^ blk_bit(blk_xor(h, blk_and(lcw, word_mask(t))), lane)) & 1;
        } else {
            for (u32 i = 0; i < words; i++) {
                const u64 v = blk_lane(h, word_bits, lane + i) +
                              (blk_lane(lcw, word_bits, lane + i) & word_mask(t));
                const u64 sum = blk_half(acc, i) + v;
                // P1 negates so that the two shares add up to the output.
                const u64 neg = (u64)0 - party;
                out[words * q + i] = ((sum ^ neg) + party) & wmask;
            }
        }
    }
}

// One level of a breadth-first DPF expansion: `src` holds `2^level` seeds
// per key, `dst` receives their `2^(level+1)` children, key-major.
extern "C" __global__ void suffuse_dpf_level(const u32* aes_keys, const u64* cw, const u64* src,
                                             u64* dst, u64 count, u32 level) {
    extern __shared__ u64 suffuse_smem[];
    u32* sh = (u32*)suffuse_smem;
    aes_setup(sh, aes_keys);
    const u64 nodes = (u64)1 << level;
    for (u64 i = global_thread(); i < count * nodes; i += grid_threads()) {
        const u64 key = i >> level;
        const blk s = blk_load(src + 2 * i);
        const blk h = hash_block(sh, DOMAIN_TREE, s);
        const blk c = blk_load(cw + 2 * ((u64)level * count + key));
        const blk left = blk_xor(h, blk_and(c, word_mask(s.lo)));
        // Node i of the level is node (i mod nodes) of key i / nodes; its
        // children are at 2i and 2i + 1 of the next level, key-major too.
        blk_store(dst + 4 * i, left);
        blk_store(dst + 4 * i + 2, blk_xor(left, s));
    }
}

// The leaves of a DPF expansion: `seeds` holds 2^levels leaf seeds per key;
// each writes its 2^nu outputs, key-major over the whole domain.
extern "C" __global__ void suffuse_dpf_leaves(const u32* aes_keys, const u64* leaf,
                                              const u64* seeds, u64* out, u64 count, u32 levels,
                                              u32 nu, u32 lane_bits, u32 w, u32 party) {
    extern __shared__ u64 suffuse_smem[];
    u32* sh = (u32*)suffuse_smem;
    aes_setup(sh, aes_keys);
    const u64 leaves = (u64)1 << levels;
    const u64 per_leaf = (u64)1 << nu;
    const u64 wmask = low_mask(w);
    for (u64 i = global_thread(); i < count * leaves; i += grid_threads()) {
        const u64 key = i >> levels;
        const blk s = blk_load(seeds + 2 * i);
        const blk h = hash_block(sh, DOMAIN_LEAF, s);
        const u64 t = s.lo & 1;
        const blk lcw = blk_load(leaf + 2 * key);
        for (u32 lane = 0; lane < per_leaf; lane++) {
            u64 v;
            if (w == 0) {
                v = blk_bit(blk_xor(h, blk_and(lcw, word_mask(t))), lane);
            } else {
                const u64 sum = blk_lane(h, lane_bits, lane) + (blk_lane(lcw, lane_bits, lane) & word_mask(t));
                const u64 neg = (u64)0 - party;
                v = ((sum ^ neg) + party) & wmask;
            }
            out[i * per_leaf + lane] = v;
        }
    }
}

// H_d of every block of `blocks` (two words each), in place.
extern "C" __global__ void suffuse_hash(const u32* aes_keys, u64* blocks, u64 n, u32 domain) {
    extern __shared__ u64 suffuse_smem[];
    u32* sh = (u32*)suffuse_smem;
    aes_setup(sh, aes_keys);
    for (u64 i = global_thread(); i < n; i += grid_threads()) {
        blk_store(blocks + 2 * i, hash_block(sh, domain, blk_load(blocks + 2 * i)));
    }
}

// `v` mod 2^w, negated if `flip` is 1, without a branch.
__device__ __forceinline__ u64 cond_neg(u64 wmask, u64 v, u64 flip) {
    const u64 m = word_mask(flip);
    return ((v ^ m) + (m & 1)) & wmask;
}

// [a < b] for a, b < 2^63, without a branch.
__device__ __forceinline__ u64 ct_lt(u64 a, u64 b) {
    return (a - b) >> 63;
}

// [a = b] without a branch.
__device__ __forceinline__ u64 ct_eq(u64 a, u64 b) {
    const u64 d = a ^ b;
    return ((d | ((u64)0 - d)) >> 63) ^ 1;
}

// Writes the low `n` bytes of `v` little-endian.
__device__ __forceinline__ void put_word(u8* p, u64 v, u32 n) {
    for (u32 i = 0; i < n; i++) {
        p[i] = (u8)(v >> (8 * i));
    }
}

__device__ __forceinline__ void put_block(u8* p, blk b) {
    put_word(p, b.lo, 8);
    put_word(p + 8, b.hi, 8);
}

// The leaf correction of one key pair (core's `gen_leaf`); `beta` holds
// `words` words, and lane i of `word_bits` bits belongs to point i / words
// and carries β's word i mod words.
__device__ blk gen_leaf_cw(const u32* sh, blk s0, blk s1, u64 a_lo, const u64* beta, u32 dcf,
                           u32 word_bits, u32 w, u32 words) {
    const blk g0 = hash_block(sh, DOMAIN_LEAF, s0);
    const blk g1 = hash_block(sh, DOMAIN_LEAF, s1);
    blk lcw;
    lcw.lo = 0;
    lcw.hi = 0;
    if (w == 0) {
        lcw = blk_xor(g0, g1);
        for (u32 i = 0; i < 128; i++) {
            const u64 bit = dcf ? ct_lt(i, a_lo) : ct_eq(i, a_lo);
            if (i < 64) {
                lcw.lo ^= bit << i;
            } else {
                lcw.hi ^= bit << (i - 64);
            }
        }
        return lcw;
    }
    const u64 wmask = low_mask(w);
    const u64 flip = (s0.lo & 1) ^ 1;
    for (u32 i = 0; i < 128 / word_bits; i++) {
        // words is 1 or 2: lane i is point i >> (words − 1), word i & (words − 1).
        const u32 point = i >> (words - 1);
        const u64 bit = dcf ? ct_lt(point, a_lo) : ct_eq(point, a_lo);
        const u64 pj = beta[i & (words - 1)] & word_mask(bit);
        const u64 v = (pj - (blk_lane(g0, word_bits, i) & wmask) + (blk_lane(g1, word_bits, i) & wmask)) & wmask;
        const u64 lanev = cond_neg(wmask, v, flip) & low_mask(word_bits);
        const u32 pos = i * word_bits;
        if (pos < 64) {
            lcw.lo |= lanev << pos;
        } else {
            lcw.hi |= lanev << (pos - 64);
        }
    }
    return lcw;
}

// One value correction (core's `value_cw`) from both parties' hashed right
// siblings' words v0 and v1: on α's path (m all ones) P0's +(v0 + t0·V) and
// P1's −(v1 + t1·V) sum to β; off it V cancels, and the random word makes
// the two cases look alike.
__device__ __forceinline__ u64 value_cw(u64 wmask, u64 v0, u64 v1, u64 t0, u64 beta, u64 rnd,
                                        u64 m) {
    u64 on = (beta - (v0 & wmask) + (v1 & wmask)) & wmask;
    on = cond_neg(wmask, on, t0 ^ 1);
    return ((rnd & wmask) & ~m) | (on & m);
}

// Generates key pair j of a batch into P0's key bytes (key-major,
// `key_len` bytes each; core's layout). P1's key is P0's body behind its
// own root, which the host writes. `betas` holds `words` words per pair
// (fss_words), `roots` both parties' root seeds (four words per pair),
// `random` the ring DCF's words, `words` per level, level-major per pair;
// `value_bytes` is a level's value corrections, all words together.
extern "C" __global__ void suffuse_fss_gen(const u32* aes_keys, const u64* alphas, const u64* betas,
                                           const u64* roots, const u64* random, u8* key0, u64 count,
                                           u64 key_len, u32 k, u32 levels, u32 nu, u32 word_bits,
                                           u32 w, u32 flags, u32 value_bytes) {
    extern __shared__ u64 suffuse_smem[];
    u32* sh = (u32*)suffuse_smem;
    aes_setup(sh, aes_keys);
    const u32 dcf = flags & FSS_DCF;
    const u32 words = fss_words(flags);
    const u32 vb = value_bytes / words;
    const u64 wmask = low_mask(w);
    const u64 level_bytes = 16 + value_bytes;
    for (u64 j = global_thread(); j < count; j += grid_threads()) {
        u8* key = key0 + j * key_len;
        // α and β are secret: reduced, not range-checked.
        const u64 alpha = alphas[j] & low_mask(k);
        const u64 a_hi = alpha >> nu;
        const u64 a_lo = alpha & low_mask(nu);
        // β's words (a pair's two), read where they are used rather than
        // held across the levels (bit outputs ignore them).
        const u64* beta = betas + (u64)words * j;
        blk s0 = blk_load(roots + 4 * j);
        blk s1 = blk_load(roots + 4 * j + 2);
        s0.lo &= ~(u64)1;
        s1.lo |= 1;
        const blk delta = blk_xor(s0, s1);
        put_block(key, s0);
        for (u32 level = 0; level < levels; level++) {
            const blk h0 = hash_block(sh, DOMAIN_TREE, s0);
            const blk h1 = hash_block(sh, DOMAIN_TREE, s1);
            const u64 a_i = (a_hi >> (levels - 1 - level)) & 1;
            // Keeps the child toward α on the path (difference Δ) and makes
            // the other child's seeds equal.
            const blk c = blk_xor(blk_xor(h0, h1), blk_and(delta, word_mask(a_i ^ 1)));
            u8* at = key + 16 + level * level_bytes;
            put_block(at, c);
            const blk l0 = blk_xor(h0, blk_and(c, word_mask(s0.lo)));
            const blk l1 = blk_xor(h1, blk_and(c, word_mask(s1.lo)));
            const blk r0 = blk_xor(l0, s0);
            const blk r1 = blk_xor(l1, s1);
            s0 = blk_xor(l0, blk_and(s0, word_mask(a_i)));
            s1 = blk_xor(l1, blk_and(s1, word_mask(a_i)));
            if (dcf && w != 0) {
                const u64 t0 = r0.lo & 1;
                const blk g0 = hash_block(sh, DOMAIN_VALUE, r0);
                const blk g1 = hash_block(sh, DOMAIN_VALUE, r1);
                const u64 m = word_mask(a_i);
                const u64* rnd = random + ((u64)j * levels + level) * words;
                put_word(at + 16, value_cw(wmask, g0.lo, g1.lo, t0, beta[0], rnd[0], m), vb);
                // A pair's second word: the hashes' high halves.
                if (words == 2) {
                    put_word(at + 16 + vb, value_cw(wmask, g0.hi, g1.hi, t0, beta[1], rnd[1], m),
                             vb);
                }
            }
        }
        put_block(key + 16 + levels * level_bytes,
                  gen_leaf_cw(sh, s0, s1, a_lo, beta, dcf, word_bits, w, words));
    }
}

// A little-endian word of `n` (≤ 8) bytes at any alignment.
__device__ __forceinline__ u64 get_word(const u8* p, u32 n) {
    u64 v = 0;
    for (u32 i = 0; i < n; i++) {
        v |= (u64)p[i] << (8 * i);
    }
    return v;
}

// Transposes key bodies that already lie in device memory (a staged key
// section, in core's byte layout: per key, each level's 16-byte seed
// correction and `words` value corrections of `vbytes` bytes each, then
// the 16-byte leaf correction; keys `stride` bytes apart) into the
// level-major words the evaluation reads: keys first .. first + count of a
// batch of `total`.
extern "C" __global__ void suffuse_gather_keys(const u8* bodies, u64 stride, u64 count, u64 first,
                                               u64 total, u32 levels, u32 vbytes, u32 words,
                                               u64* cw, u64* vcw, u64* leaf) {
    const u64 level_bytes = 16 + (u64)words * vbytes;
    for (u64 j = global_thread(); j < count; j += grid_threads()) {
        const u8* body = bodies + j * stride;
        const u64 i = first + j;
        for (u32 l = 0; l < levels; l++) {
            const u8* at = body + l * level_bytes;
            cw[2 * ((u64)l * total + i)] = get_word(at, 8);
            cw[2 * ((u64)l * total + i) + 1] = get_word(at + 8, 8);
            for (u32 h = 0; vbytes > 0 && h < words; h++) {
                vcw[words * ((u64)l * total + i) + h] = get_word(at + 16 + h * vbytes, vbytes);
            }
        }
        const u8* at = body + levels * level_bytes;
        leaf[2 * i] = get_word(at, 8);
        leaf[2 * i + 1] = get_word(at + 8, 8);
    }
}
