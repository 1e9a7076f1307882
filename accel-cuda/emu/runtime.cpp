// The CPU emulator's launch: every thread of a block is an OS thread, the
// threads are reused across the blocks of a launch, and blocks run one
// after another. `__syncthreads` is a real barrier among the block's
// threads, and the one shared-memory array is poisoned before each block.
#include "emu.h"
#include "runtime.h"

#include <barrier>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
dim3 blockDim;
dim3 gridDim;

// The shared memory of the block that runs; kernels declare it as
// `extern __shared__ u64 suffuse_smem[]`.
alignas(256) unsigned long long suffuse_smem[SUFFUSE_EMU_SHARED_BYTES / 8];

namespace {

// What a read of shared memory before any write returns.
constexpr unsigned char POISON = 0xA5;

std::barrier<>* block_barrier = nullptr;

// One launch at a time: the shared memory and the launch shape are global.
std::mutex launch_lock;

}  // namespace

void __syncthreads() {
    block_barrier->arrive_and_wait();
}

int suffuse_emu_run(dim3 grid, dim3 block, unsigned shared_bytes, const std::function<void()>& kernel) {
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > SUFFUSE_EMU_MAX_THREADS) {
        return SUFFUSE_EMU_BAD_BLOCK;
    }
    if (shared_bytes > SUFFUSE_EMU_SHARED_BYTES) {
        return SUFFUSE_EMU_BAD_SHARED;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
        return SUFFUSE_EMU_BAD_GRID;
    }
    std::lock_guard<std::mutex> guard(launch_lock);
    std::barrier<> barrier((std::ptrdiff_t)threads);
    block_barrier = &barrier;
    blockDim = block;
    gridDim = grid;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned long long t = 0; t < threads; t++) {
        pool.emplace_back([&, t] {
            threadIdx = dim3{(unsigned)(t % block.x), (unsigned)((t / block.x) % block.y),
                             (unsigned)(t / ((unsigned long long)block.x * block.y))};
            for (unsigned z = 0; z < grid.z; z++) {
                for (unsigned y = 0; y < grid.y; y++) {
                    for (unsigned x = 0; x < grid.x; x++) {
                        // Every thread has left the previous block before
                        // thread 0 poisons its shared memory.
                        if (t == 0) {
                            std::memset(suffuse_smem, POISON, shared_bytes);
                        }
                        blockIdx = dim3{x, y, z};
                        barrier.arrive_and_wait();
                        kernel();
                        barrier.arrive_and_wait();
                    }
                }
            }
        });
    }
    for (auto& th : pool) {
        th.join();
    }
    block_barrier = nullptr;
    return 0;
}
