// Ring matrix products mod 2^64: C_t (+)= A_t · B_t (or A_t · B_tᵀ) for
// `batches` independent products, all row-major and stored one after
// another (core's `MatShape`). Wrapping 64-bit arithmetic is exact in
// Z/2^64. The operands are public weights and shares: no secret steers a
// branch or an index here.
//
// A block of MM_TILE × MM_TILE threads computes one tile of C, walking the
// inner dimension a tile at a time through shared memory. Grids stride in
// all three dimensions, so any shape fits the grid limits.

#define MM_TILE 16u

extern "C" __global__ void suffuse_matmul(const u64* a, const u64* b, u64* c, u64 batches, u64 m,
                                          u64 k, u64 n, u32 transpose_b, u32 accumulate) {
    extern __shared__ u64 suffuse_smem[];
    u64* ta = suffuse_smem;
    u64* tb = suffuse_smem + MM_TILE * MM_TILE;
    const u32 tx = threadIdx.x;
    const u32 ty = threadIdx.y;
    for (u64 t = blockIdx.z; t < batches; t += gridDim.z) {
        const u64* at = a + t * m * k;
        const u64* bt = b + t * k * n;
        u64* ct = c + t * m * n;
        for (u64 bi = blockIdx.y; bi * MM_TILE < m; bi += gridDim.y) {
            for (u64 bj = blockIdx.x; bj * MM_TILE < n; bj += gridDim.x) {
                const u64 row = bi * MM_TILE + ty;
                const u64 col = bj * MM_TILE + tx;
                u64 sum = 0;
                for (u64 p0 = 0; p0 < k; p0 += MM_TILE) {
                    ta[ty * MM_TILE + tx] = (row < m && p0 + tx < k) ? at[row * k + p0 + tx] : 0;
                    if (transpose_b) {
                        // Row bj·T + ty of Bᵀ, read along p so that a warp's
                        // loads coalesce; stored as column ty of the tile.
                        const u64 p = p0 + tx;
                        const u64 j = bj * MM_TILE + ty;
                        tb[tx * MM_TILE + ty] = (p < k && j < n) ? bt[j * k + p] : 0;
                    } else {
                        const u64 p = p0 + ty;
                        tb[ty * MM_TILE + tx] = (p < k && col < n) ? bt[p * n + col] : 0;
                    }
                    __syncthreads();
                    for (u32 q = 0; q < MM_TILE; q++) {
                        sum += ta[ty * MM_TILE + q] * tb[q * MM_TILE + tx];
                    }
                    __syncthreads();
                }
                if (row < m && col < n) {
                    u64* slot = ct + row * n + col;
                    *slot = accumulate ? *slot + sum : sum;
                }
            }
        }
    }
}

// RoPE folded into a linear layer (core's `Turned`): row i of C is row i of
// A times B with row i's factors applied to the turned columns,
//   W_i[p][j] = (own[i][j]·B[p][j] + other[i][j]·B[p][j'] + 2^(frac−1)) >> frac
// (signed, wrapping before the shift) for j < turned, j' its partner in the
// other half of j's block of `block` columns (2 pairs neighbours), and
// W_i[p][j] = B[p][j] for the other columns. The factors and weights are
// public (positions' angles, the model), A holds shares: the branches
// follow column indices only. One thread per output, A's tile through
// shared memory as in `suffuse_matmul`; each thread keeps its column's two
// factors in registers and reads its partner's weight beside its own.

__device__ __forceinline__ u64 suffuse_turn(u64 w, u64 v, u64 own, u64 other, u32 frac) {
    const u64 sum = own * w + other * v + (((u64)1) << (frac - 1));
    return (u64)(((long long)sum) >> frac);
}

extern "C" __global__ void suffuse_turned_matmul(const u64* a, const u64* b, u64* c, const u64* own,
                                                 const u64* other, u64 m, u64 k, u64 n, u64 turned,
                                                 u64 block, u32 frac) {
    extern __shared__ u64 suffuse_smem[];
    u64* ta = suffuse_smem;
    const u32 tx = threadIdx.x;
    const u32 ty = threadIdx.y;
    const u64 half = block / 2;
    for (u64 bi = blockIdx.y; bi * MM_TILE < m; bi += gridDim.y) {
        for (u64 bj = blockIdx.x; bj * MM_TILE < n; bj += gridDim.x) {
            const u64 row = bi * MM_TILE + ty;
            const u64 col = bj * MM_TILE + tx;
            const bool live = row < m && col < n;
            const bool turns = live && col < turned;
            u64 mate = col;
            u64 f = 0;
            u64 g = 0;
            if (turns) {
                const u64 off = col % block;
                mate = col - off + (off < half ? off + half : off - half);
                f = own[row * turned + col];
                g = other[row * turned + col];
            }
            u64 sum = 0;
            for (u64 p0 = 0; p0 < k; p0 += MM_TILE) {
                ta[ty * MM_TILE + tx] = (row < m && p0 + tx < k) ? a[row * k + p0 + tx] : 0;
                __syncthreads();
                const u64 end = k - p0 < MM_TILE ? k - p0 : MM_TILE;
                if (live) {
                    for (u64 q = 0; q < end; q++) {
                        const u64 p = p0 + q;
                        u64 w = b[p * n + col];
                        if (turns) {
                            w = suffuse_turn(w, b[p * n + mate], f, g, frac);
                        }
                        sum += ta[ty * MM_TILE + q] * w;
                    }
                }
                __syncthreads();
            }
            if (live) {
                c[row * n + col] = sum;
            }
        }
    }
}
