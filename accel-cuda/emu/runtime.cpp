// The CPU emulator's launch: every thread of a block is an OS thread (from
// a pool kept across launches), and blocks run one after another. `__syncthreads` is a real barrier among the block's
// threads, and the one shared-memory array is poisoned before each block.
#include "emu.h"
#include "runtime.h"

#include <barrier>
#include <condition_variable>
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

// One launch at a time: the shared memory and the launch shape are global.
std::mutex& launch_lock = *new std::mutex;

// The launch the pool's workers run: set under the pool's lock before a new
// generation starts, read by the workers after they see it.
struct Launch {
    dim3 grid;
    dim3 block;
    unsigned shared_bytes;
    unsigned long long threads;
    const std::function<void()>* kernel;
    std::barrier<>* barrier;
};

// Worker threads, kept across launches (starting an OS thread per emulated
// thread per launch dominated the emulator's time). Worker t plays thread t
// of every block of a launch with at least t + 1 threads per block.
//
// The pool's state is never destroyed: detached workers wait on its
// condition variable until the process ends, and destroying a condition
// variable with waiters blocks (glibc), so it lives on the heap for good.
struct Pool {
    std::mutex lock;
    std::condition_variable start;
    std::condition_variable done;
    unsigned long long workers = 0;
    unsigned long long generation = 0;
    unsigned long long running = 0;
    Launch current;
};
Pool& pool = *new Pool;

std::barrier<>* block_barrier = nullptr;

// Runs thread `t` of every block of `job`.
void play(const Launch& job, unsigned long long t) {
    const dim3 b = job.block;
    threadIdx = dim3{(unsigned)(t % b.x), (unsigned)((t / b.x) % b.y),
                     (unsigned)(t / ((unsigned long long)b.x * b.y))};
    for (unsigned z = 0; z < job.grid.z; z++) {
        for (unsigned y = 0; y < job.grid.y; y++) {
            for (unsigned x = 0; x < job.grid.x; x++) {
                // Every thread has left the previous block before thread 0
                // poisons its shared memory.
                if (t == 0) {
                    std::memset(suffuse_smem, POISON, job.shared_bytes);
                }
                blockIdx = dim3{x, y, z};
                job.barrier->arrive_and_wait();
                (*job.kernel)();
                job.barrier->arrive_and_wait();
            }
        }
    }
}

void worker(unsigned long long t) {
    unsigned long long seen = 0;
    for (;;) {
        Launch job;
        {
            std::unique_lock<std::mutex> guard(pool.lock);
            pool.start.wait(guard, [&] { return pool.generation != seen; });
            seen = pool.generation;
            job = pool.current;
        }
        if (t < job.threads) {
            play(job, t);
            std::lock_guard<std::mutex> guard(pool.lock);
            if (--pool.running == 0) {
                pool.done.notify_all();
            }
        }
    }
}

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
    std::lock_guard<std::mutex> one_launch(launch_lock);
    std::barrier<> barrier((std::ptrdiff_t)threads);
    block_barrier = &barrier;
    blockDim = block;
    gridDim = grid;
    std::unique_lock<std::mutex> guard(pool.lock);
    // Workers live until the process ends: they wait on the pool, holding
    // nothing, so they are detached rather than joined at exit.
    while (pool.workers < threads) {
        std::thread(worker, pool.workers).detach();
        pool.workers++;
    }
    pool.current = Launch{grid, block, shared_bytes, threads, &kernel, &barrier};
    pool.running = threads;
    pool.generation++;
    pool.start.notify_all();
    pool.done.wait(guard, [] { return pool.running == 0; });
    block_barrier = nullptr;
    return 0;
}
