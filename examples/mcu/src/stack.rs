//! Stack high-water marks by painting.
//!
//! Before a measured call, every word of the free stack below the caller is
//! painted with [`PAINT`]; after it, the lowest word that no longer holds the
//! pattern is the deepest point the call reached. The mark is the distance
//! from the caller's stack pointer to that word, so it counts the call's
//! frames, its callees' and any exception frame pushed on the way, and
//! nothing of the caller.
//!
//! Painting sees the stack that was written. A frame that reserves words
//! it never writes (an array filled only in part) at the very bottom of the
//! deepest call is under-counted by those words; so is a call whose deepest
//! written word happens to equal the pattern.

use core::sync::atomic::{AtomicUsize, Ordering};

use cortex_m::register::msp;

/// The paint pattern.
const PAINT: u32 = 0xA5A5_5A5A;

/// Bytes below the painting function's own stack pointer left unpainted:
/// its frame and the call into the measured function live there.
const MARGIN: usize = 64;

unsafe extern "C" {
    /// The lowest stack address (from the memory layout, `memory/`).
    static _stack_end: u32;
    /// The initial stack pointer, the top of the stack region.
    static _stack_start: u32;
}

fn stack_end() -> usize {
    core::ptr::addr_of!(_stack_end) as usize
}

/// The stack region's size in bytes.
pub fn size() -> usize {
    core::ptr::addr_of!(_stack_start) as usize - stack_end()
}

/// Paints from the bottom of the stack up to just below this frame.
#[inline(never)]
fn paint() {
    let top = msp::read() as usize - MARGIN;
    let mut at = stack_end();
    while at < top {
        // SAFETY: [_stack_end, sp − MARGIN) is stack memory below every live
        // frame (the stack grows down and this function is the deepest
        // frame), word-aligned, and nothing else refers to it.
        unsafe { core::ptr::write_volatile(at as *mut u32, PAINT) };
        at += 4;
    }
}

/// The lowest stack address whose paint was overwritten.
#[inline(never)]
fn lowest_touched() -> usize {
    let top = msp::read() as usize;
    let mut at = stack_end();
    // SAFETY: reads of painted stack words below this function's own frame,
    // word-aligned and inside the stack region.
    while at < top && unsafe { core::ptr::read_volatile(at as *const u32) } == PAINT {
        at += 4;
    }
    at
}

/// Runs `f` and returns its result with the stack bytes it used.
#[inline(never)]
pub fn high_water<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let top = msp::read() as usize;
    paint();
    let r = below(f);
    let low = lowest_touched();
    LEAST_FREE.fetch_min(low - stack_end(), Ordering::Relaxed);
    (r, top.saturating_sub(low))
}

/// The least free stack seen below any measured call, in bytes.
static LEAST_FREE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The fewest bytes that were left between a measured call's deepest point
/// and the end of the stack region.
pub fn least_free() -> usize {
    LEAST_FREE.load(Ordering::Relaxed)
}

/// Calls `f` in a frame of its own below `top`: inlined into
/// [`high_water`], the core call's locals would join that frame, which is
/// allocated before `top` is read, and go uncounted. What this frame adds
/// (the closure's plumbing) is counted against the core call.
#[inline(never)]
fn below<R>(f: impl FnOnce() -> R) -> R {
    f()
}
