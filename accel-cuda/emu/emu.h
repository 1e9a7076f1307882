// The CPU emulator's stand-in for the CUDA language: with it, g++ compiles
// the kernels under ../kernels unchanged. It is a test vehicle only: it
// runs every thread of a block as an OS thread, and blocks one after
// another, so it checks the arithmetic, the indexing and the barriers of a
// kernel, never a GPU's warps, memory model or speed.
#pragma once

struct dim3 {
    unsigned x;
    unsigned y;
    unsigned z;
};

// The calling thread's index in its block and its block's index: set by
// the launch for every emulated thread.
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
// The launch's shape, the same for every thread of a launch.
extern dim3 blockDim;
extern dim3 gridDim;

// A barrier among the threads of the block.
void __syncthreads();

#define __global__
#define __device__
#define __forceinline__ inline
// `extern __shared__ T name[]` becomes a declaration of the emulator's one
// shared-memory array (blocks run one at a time), poisoned before each
// block so that a read before a write returns garbage, as on a GPU.
#define __shared__
