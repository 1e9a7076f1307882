//! The parts of a run-time spline gate, each measured on its own (the
//! `runtime-gates` build): `Spline::suf_init` and
//! `activation::spline_gate_init`, under `activation::gelu_init`.

use cortex_m_semihosting::hprintln;
use suffuse_core::gate::Gate;
use suffuse_core::gate::activation::{self, COEFF_BITS, GeluForm};
use suffuse_core::gate::spline::Spline;
use suffuse_core::ring::Width;
use suffuse_core::suf::Suf;

use crate::Marks;
use crate::known::{GateBuild, GateTranscript};
use crate::stack::high_water;

/// For a spline transcript: the SUF written in place must equal the one in
/// the flash gate, and the gate built in `slot` must equal the flash gate.
/// Returns the number of wrong answers.
pub fn spline_parts(t: &GateTranscript, slot: &mut Gate, marks: &mut Marks) -> usize {
    let GateBuild::GeluErf { ring, k, frac } = t.build else {
        return 0;
    };
    let Ok(flash) = t.flash else {
        return 1;
    };
    let spline = activation::gelu_spline(GeluForm::Erf);
    let (ring, k) = (Width::of(ring), Width::of(k));
    let suf_ok = suf_part(spline, ring, frac, &flash.compiled.suf, marks);
    let (r, used) =
        high_water(|| activation::spline_gate_init(slot, spline, ring, k, frac, COEFF_BITS));
    marks.record("activation::spline_gate_init", used);
    let gate_ok = r.is_ok() && slot == flash;
    let verdict = |ok: bool| if ok { "equal" } else { "NOT EQUAL" };
    hprintln!(
        "gate {}: Spline::suf_init {} to the compile-time gate's SUF, activation::spline_gate_init {} to the compile-time gate",
        t.name,
        verdict(suf_ok),
        verdict(gate_ok)
    );
    usize::from(!suf_ok) + usize::from(!gate_ok)
}

/// Whether `Spline::suf_init` writes `want`. Never inlined: its `Suf`
/// (about 4.7 KB) must be off the stack before the gate is built, or the
/// two would overflow the 16 KiB stack of memory/runtime.x.
#[inline(never)]
fn suf_part(spline: &Spline, ring: Width, frac: u32, want: &Suf, marks: &mut Marks) -> bool {
    let mut suf = Suf::EMPTY;
    let (r, used) = high_water(|| spline.suf_init(&mut suf, ring, frac, COEFF_BITS));
    marks.record("Spline::suf_init", used);
    r.is_ok() && suf == *want
}
