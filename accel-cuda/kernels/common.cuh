// Shared by every suffuse kernel: integer types, the fixed-key hash of
// core's `prg` module, and the per-block AES tables.
//
// This file is CUDA C with no CUDA headers. It is compiled two ways: by
// NVRTC for the device (the Rust side puts it in front of each kernel file),
// and by g++ for the CPU emulator (`emu/emu.h` supplies the CUDA keywords).
//
// # The hash
//
// H_d(x) = AES_{k_d}(σ(x)) ⊕ σ(x), σ(x_L ‖ x_R) = (x_L ⊕ x_R) ‖ x_L with x_L
// the high half (core/src/prg.rs). A 128-bit block is two words, `lo` and
// `hi`; its AES state bytes are the little-endian bytes of lo then hi, so
// column c of the state is the little-endian 32-bit word c.
//
// # AES with T-tables
//
// One round maps column c to
//   T0[s(0,c)] ⊕ T1[s(1,c+1)] ⊕ T2[s(2,c+2)] ⊕ T3[s(3,c+3)] ⊕ rk[c],
// with s(r,c) byte r of column c (ShiftRows folded into the indices) and
// T0[x] = (2·S[x], S[x], S[x], 3·S[x]) in little-endian byte order; T1..T3
// are T0 rotated left by 8, 16 and 24 bits. The last round has no
// MixColumns and takes S[x] = byte 1 of T0[x].
//
// The table lookups are indexed by secret state bytes. On a GPU, shared
// memory has no cache lines to evict, but bank conflicts make the time of
// a warp's lookup depend on the indices: core/SIDE-CHANNELS.md says what
// is and is not claimed for this path.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

// A 128-bit block: `lo` holds bytes 0..8, `hi` bytes 8..16.
struct blk {
    u64 lo;
    u64 hi;
};

// Words of shared memory the AES tables and round keys take: four 256-entry
// T-tables, then 11 round keys of 4 columns for each of the four domains.
#define AES_TABLE_WORDS 1024u
#define AES_ROUND_WORDS 44u
#define AES_DOMAINS 4u
#define AES_SHARED_WORDS (AES_TABLE_WORDS + AES_DOMAINS * AES_ROUND_WORDS)
#define AES_SHARED_BYTES (4u * AES_SHARED_WORDS)

// Domains, in the order of the keys the host passes (core's `Domain`).
#define DOMAIN_TREE 0u
#define DOMAIN_LEAF 1u
#define DOMAIN_VALUE 2u
#define DOMAIN_PRF 3u

// The AES S-box (FIPS-197, figure 7). Indexed only by public values here:
// the table entries and the public domain keys' expansion.
__device__ const u8 AES_SBOX[256] = {
    0x63, 0x7c, 0x77, 0x7b, 0xf2, 0x6b, 0x6f, 0xc5, 0x30, 0x01, 0x67, 0x2b, 0xfe, 0xd7, 0xab, 0x76,
    0xca, 0x82, 0xc9, 0x7d, 0xfa, 0x59, 0x47, 0xf0, 0xad, 0xd4, 0xa2, 0xaf, 0x9c, 0xa4, 0x72, 0xc0,
    0xb7, 0xfd, 0x93, 0x26, 0x36, 0x3f, 0xf7, 0xcc, 0x34, 0xa5, 0xe5, 0xf1, 0x71, 0xd8, 0x31, 0x15,
    0x04, 0xc7, 0x23, 0xc3, 0x18, 0x96, 0x05, 0x9a, 0x07, 0x12, 0x80, 0xe2, 0xeb, 0x27, 0xb2, 0x75,
    0x09, 0x83, 0x2c, 0x1a, 0x1b, 0x6e, 0x5a, 0xa0, 0x52, 0x3b, 0xd6, 0xb3, 0x29, 0xe3, 0x2f, 0x84,
    0x53, 0xd1, 0x00, 0xed, 0x20, 0xfc, 0xb1, 0x5b, 0x6a, 0xcb, 0xbe, 0x39, 0x4a, 0x4c, 0x58, 0xcf,
    0xd0, 0xef, 0xaa, 0xfb, 0x43, 0x4d, 0x33, 0x85, 0x45, 0xf9, 0x02, 0x7f, 0x50, 0x3c, 0x9f, 0xa8,
    0x51, 0xa3, 0x40, 0x8f, 0x92, 0x9d, 0x38, 0xf5, 0xbc, 0xb6, 0xda, 0x21, 0x10, 0xff, 0xf3, 0xd2,
    0xcd, 0x0c, 0x13, 0xec, 0x5f, 0x97, 0x44, 0x17, 0xc4, 0xa7, 0x7e, 0x3d, 0x64, 0x5d, 0x19, 0x73,
    0x60, 0x81, 0x4f, 0xdc, 0x22, 0x2a, 0x90, 0x88, 0x46, 0xee, 0xb8, 0x14, 0xde, 0x5e, 0x0b, 0xdb,
    0xe0, 0x32, 0x3a, 0x0a, 0x49, 0x06, 0x24, 0x5c, 0xc2, 0xd3, 0xac, 0x62, 0x91, 0x95, 0xe4, 0x79,
    0xe7, 0xc8, 0x37, 0x6d, 0x8d, 0xd5, 0x4e, 0xa9, 0x6c, 0x56, 0xf4, 0xea, 0x65, 0x7a, 0xae, 0x08,
    0xba, 0x78, 0x25, 0x2e, 0x1c, 0xa6, 0xb4, 0xc6, 0xe8, 0xdd, 0x74, 0x1f, 0x4b, 0xbd, 0x8b, 0x8a,
    0x70, 0x3e, 0xb5, 0x66, 0x48, 0x03, 0xf6, 0x0e, 0x61, 0x35, 0x57, 0xb9, 0x86, 0xc1, 0x1d, 0x9e,
    0xe1, 0xf8, 0x98, 0x11, 0x69, 0xd9, 0x8e, 0x94, 0x9b, 0x1e, 0x87, 0xe9, 0xce, 0x55, 0x28, 0xdf,
    0x8c, 0xa1, 0x89, 0x0d, 0xbf, 0xe6, 0x42, 0x68, 0x41, 0x99, 0x2d, 0x0f, 0xb0, 0x54, 0xbb, 0x16,
};

__device__ __forceinline__ u32 rotl32(u32 x, u32 n) {
    return (x << n) | (x >> (32u - n));
}

// Multiplication by 2 in GF(2^8), for public table entries only.
__device__ __forceinline__ u32 xtime(u32 b) {
    return ((b << 1) ^ ((b >> 7) * 0x1bu)) & 0xffu;
}

// Expands one public AES-128 key (4 little-endian column words) into its 44
// round-key columns.
__device__ void aes_expand(const u32* key, u32* rk) {
    u32 rcon = 1;
    for (u32 i = 0; i < 4; i++) {
        rk[i] = key[i];
    }
    for (u32 i = 4; i < 44; i++) {
        u32 t = rk[i - 1];
        if (i % 4 == 0) {
            // RotWord moves byte 0 to byte 3: a right rotation of the
            // little-endian word. Then SubWord and the round constant.
            t = (t >> 8) | (t << 24);
            t = (u32)AES_SBOX[t & 0xff] | ((u32)AES_SBOX[(t >> 8) & 0xff] << 8) |
                ((u32)AES_SBOX[(t >> 16) & 0xff] << 16) | ((u32)AES_SBOX[t >> 24] << 24);
            t ^= rcon;
            rcon = xtime(rcon);
        }
        rk[i] = rk[i - 4] ^ t;
    }
}

// Fills the block's shared AES tables and round keys. Every thread of the
// block must call it before hashing: it ends with a barrier.
// `keys` holds the four domains' 16-byte keys as little-endian words.
__device__ void aes_setup(u32* sh, const u32* keys) {
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) {
        u32 s = AES_SBOX[i];
        u32 t0 = xtime(s) | (s << 8) | (s << 16) | ((xtime(s) ^ s) << 24);
        sh[i] = t0;
        sh[256 + i] = rotl32(t0, 8);
        sh[512 + i] = rotl32(t0, 16);
        sh[768 + i] = rotl32(t0, 24);
    }
    for (u32 d = threadIdx.x; d < AES_DOMAINS; d += blockDim.x) {
        aes_expand(keys + 4 * d, sh + AES_TABLE_WORDS + AES_ROUND_WORDS * d);
    }
    // The planted fault of the race check (`cargo xtask cuda-tsan`): without
    // this barrier a thread can hash with tables another thread has not yet
    // written. Only the emulator's ThreadSanitizer build defines the macro.
#ifndef SUFFUSE_PLANT_MISSING_SYNC
    __syncthreads();
#endif
}

// One AES-128 encryption of the four columns `c` under round keys `rk`.
__device__ __forceinline__ void aes_encrypt(const u32* T, const u32* rk, u32* c) {
    u32 c0 = c[0] ^ rk[0], c1 = c[1] ^ rk[1], c2 = c[2] ^ rk[2], c3 = c[3] ^ rk[3];
    for (u32 r = 1; r < 10; r++) {
        const u32* k = rk + 4 * r;
        u32 n0 = T[c0 & 0xff] ^ T[256 + ((c1 >> 8) & 0xff)] ^ T[512 + ((c2 >> 16) & 0xff)] ^
                 T[768 + (c3 >> 24)] ^ k[0];
        u32 n1 = T[c1 & 0xff] ^ T[256 + ((c2 >> 8) & 0xff)] ^ T[512 + ((c3 >> 16) & 0xff)] ^
                 T[768 + (c0 >> 24)] ^ k[1];
        u32 n2 = T[c2 & 0xff] ^ T[256 + ((c3 >> 8) & 0xff)] ^ T[512 + ((c0 >> 16) & 0xff)] ^
                 T[768 + (c1 >> 24)] ^ k[2];
        u32 n3 = T[c3 & 0xff] ^ T[256 + ((c0 >> 8) & 0xff)] ^ T[512 + ((c1 >> 16) & 0xff)] ^
                 T[768 + (c2 >> 24)] ^ k[3];
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    // S[x] is byte 1 of T0[x].
    const u32* k = rk + 40;
#define SB(x) ((T[(x)] >> 8) & 0xffu)
    c[0] = (SB(c0 & 0xff) | (SB((c1 >> 8) & 0xff) << 8) | (SB((c2 >> 16) & 0xff) << 16) |
            (SB(c3 >> 24) << 24)) ^ k[0];
    c[1] = (SB(c1 & 0xff) | (SB((c2 >> 8) & 0xff) << 8) | (SB((c3 >> 16) & 0xff) << 16) |
            (SB(c0 >> 24) << 24)) ^ k[1];
    c[2] = (SB(c2 & 0xff) | (SB((c3 >> 8) & 0xff) << 8) | (SB((c0 >> 16) & 0xff) << 16) |
            (SB(c1 >> 24) << 24)) ^ k[2];
    c[3] = (SB(c3 & 0xff) | (SB((c0 >> 8) & 0xff) << 8) | (SB((c1 >> 16) & 0xff) << 16) |
            (SB(c2 >> 24) << 24)) ^ k[3];
#undef SB
}

// H_d(x) with the block's tables (`sh` as filled by aes_setup).
__device__ __forceinline__ blk hash_block(const u32* sh, u32 domain, blk x) {
    blk s;
    s.lo = x.hi;
    s.hi = x.hi ^ x.lo;
    u32 c[4] = {(u32)s.lo, (u32)(s.lo >> 32), (u32)s.hi, (u32)(s.hi >> 32)};
    aes_encrypt(sh, sh + AES_TABLE_WORDS + AES_ROUND_WORDS * domain, c);
    blk h;
    h.lo = ((u64)c[0] | ((u64)c[1] << 32)) ^ s.lo;
    h.hi = ((u64)c[2] | ((u64)c[3] << 32)) ^ s.hi;
    return h;
}

__device__ __forceinline__ blk blk_xor(blk a, blk b) {
    blk r;
    r.lo = a.lo ^ b.lo;
    r.hi = a.hi ^ b.hi;
    return r;
}

// `a` where `m` is all ones, zero where it is zero (m is 0 or ~0).
__device__ __forceinline__ blk blk_and(blk a, u64 m) {
    blk r;
    r.lo = a.lo & m;
    r.hi = a.hi & m;
    return r;
}

__device__ __forceinline__ blk blk_load(const u64* p) {
    blk r;
    r.lo = p[0];
    r.hi = p[1];
    return r;
}

__device__ __forceinline__ void blk_store(u64* p, blk b) {
    p[0] = b.lo;
    p[1] = b.hi;
}

// All ones if `bit` is 1, else 0.
__device__ __forceinline__ u64 word_mask(u64 bit) {
    return (u64)0 - (bit & 1);
}

// The low `bits` bits set (bits ≤ 64).
__device__ __forceinline__ u64 low_mask(u32 bits) {
    return bits >= 64 ? ~(u64)0 : (((u64)1 << bits) - 1);
}

// Lane `i` of `lane_bits` bits (8, 16, 32 or 64) of a block; `i` is public.
__device__ __forceinline__ u64 blk_lane(blk b, u32 lane_bits, u32 i) {
    u32 pos = i * lane_bits;
    u64 word = pos < 64 ? b.lo : b.hi;
    return (word >> (pos % 64)) & low_mask(lane_bits);
}

// Bit `i` (< 128) of a block; `i` is public.
__device__ __forceinline__ u64 blk_bit(blk b, u32 i) {
    u64 word = i < 64 ? b.lo : b.hi;
    return (word >> (i % 64)) & 1;
}

// The global index of this thread in a one-dimensional launch.
__device__ __forceinline__ u64 global_thread() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

// Threads in a one-dimensional launch, for grid-stride loops.
__device__ __forceinline__ u64 grid_threads() {
    return (u64)gridDim.x * blockDim.x;
}
