// The kernels under ../kernels compiled for the CPU emulator, and the one
// entry point Rust calls: a launch by kernel name with CUDA-style
// parameters (an array of pointers to the argument values, as
// cuLaunchKernel takes them).
#include "runtime.h"

#include <cstring>
#include <utility>

#include "../kernels/common.cuh"
#include "../kernels/fss.cu"
#include "../kernels/matmul.cu"

namespace {

template <typename... A, std::size_t... I>
void call(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<A*>(params[I])...);
}

// The kernel `f` with its arguments read from `params` by their types.
template <typename... A>
std::function<void()> bind(void (*f)(A...), void** params) {
    return [f, params] { call(f, params, std::index_sequence_for<A...>{}); };
}

}  // namespace

#define SUFFUSE_KERNELS(X) \
    X(suffuse_fss_eval)    \
    X(suffuse_dpf_level)   \
    X(suffuse_dpf_leaves)  \
    X(suffuse_hash)        \
    X(suffuse_fss_gen)     \
    X(suffuse_matmul)      \
    X(suffuse_turned_matmul) \
    X(suffuse_gather_keys)

// Exported even when the library is built with hidden visibility (the race
// check's shared library), so that the emulator can load it by name.
extern "C" __attribute__((visibility("default"))) int suffuse_emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                  unsigned by, unsigned bz, unsigned shared_bytes, void** params) {
    const dim3 grid{gx, gy, gz};
    const dim3 block{bx, by, bz};
#define SUFFUSE_TRY(k)                                                  \
    if (std::strcmp(name, #k) == 0) {                                   \
        return suffuse_emu_run(grid, block, shared_bytes, bind(k, params)); \
    }
    SUFFUSE_KERNELS(SUFFUSE_TRY)
#undef SUFFUSE_TRY
    return SUFFUSE_EMU_UNKNOWN_KERNEL;
}
