//! Deliberate side-channel leaks for `cargo xtask ct`'s planted run, compiled
//! only with the test-only `ct-planted` feature (never in a shipped build:
//! `suffuse` refuses to start when [`crate::PLANTED_LEAKS`] is set, and
//! `cargo xtask audit` checks the host's feature set).
//!
//! They are called from real gate code paths, the DCF walk and the Φ block
//! program, on real secrets, so memcheck reporting them proves the harness
//! marks secrets that reach library code. Their results are discarded, so
//! outputs are unchanged.

use core::hint::black_box;

/// A lookup table, as a naive AES S-box would be.
static TABLE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = (i as u8).wrapping_mul(167).wrapping_add(13);
        i += 1;
    }
    t
};

/// Leaks `secret`'s low byte through a table index.
#[inline(never)]
pub(crate) fn secret_index(secret: u64) {
    black_box(TABLE[usize::from(black_box(secret).to_le_bytes()[0])]);
}

#[inline(never)]
fn path_a(x: u64) -> u64 {
    black_box(x.wrapping_mul(3))
}

#[inline(never)]
fn path_b(x: u64) -> u64 {
    black_box(x.rotate_left(7))
}

/// Leaks `secret`'s low bit through a branch to different code (so the
/// compiler cannot make it a conditional move).
#[inline(never)]
pub(crate) fn secret_branch(secret: u64) {
    let r = if black_box(secret) & 1 == 1 {
        path_a(secret)
    } else {
        path_b(secret)
    };
    black_box(r);
}
