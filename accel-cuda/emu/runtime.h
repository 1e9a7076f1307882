// The emulator's launch, shared by runtime.cpp and kernels.cpp.
#pragma once

#include <functional>

#include "emu.h"

// Shared memory per block, as on a GPU without opting in to more.
#define SUFFUSE_EMU_SHARED_BYTES (48u * 1024u)
// Threads per block, as on a GPU.
#define SUFFUSE_EMU_MAX_THREADS 1024u

// Launch results, returned to Rust (emulator.rs mirrors them).
#define SUFFUSE_EMU_BAD_BLOCK 1
#define SUFFUSE_EMU_BAD_SHARED 2
#define SUFFUSE_EMU_BAD_GRID 3
#define SUFFUSE_EMU_UNKNOWN_KERNEL 4

// Runs `kernel` on every thread of every block of `grid`.
int suffuse_emu_run(dim3 grid, dim3 block, unsigned shared_bytes, const std::function<void()>& kernel);
