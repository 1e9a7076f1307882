//! The firmware's built-in known answers (`examples/mcu/src/kat.rs`) still
//! equal what the host computes, and the recorded gate runs reconstruct to
//! the gates' cleartext reference.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use suffuse_core::ring::Width;
use suffuse_tests::mcu::{self, GATES, PartyRecord, RING};
use suffuse_tests::vectors::{self, VectorFile};

const REGENERATE: &str = "examples/mcu/src/kat.rs is out of date with the host. If the \
     construction or a gate changed on purpose, run `cargo xtask vectors` and commit the \
     result; otherwise this is a regression.";

fn committed_vectors() -> VectorFile {
    let text = std::fs::read_to_string(vectors::file_path(&vectors::default_dir())).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn committed_firmware_answers_equal_the_host_rendering() {
    let path = mcu::default_path();
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}. {REGENERATE}", path.display()));
    let fresh = mcu::render(&committed_vectors());
    if committed != fresh {
        let line = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .map_or(committed.lines().count().min(fresh.lines().count()), |i| i);
        panic!("first difference at line {}. {REGENERATE}", line + 1);
    }
}

/// The first element whose reconstructed outputs differ from the gate's
/// reference, if any.
fn first_mismatch(case: &mcu::GateCase, records: &[PartyRecord; 2]) -> Option<usize> {
    let gate = mcu::gate_of(case);
    let w = Width::of(RING);
    let (outs, nb) = (gate.outputs(), gate.bit_outputs());
    case.xs.iter().enumerate().position(|(j, &x)| {
        let mut want = [0u64; 2];
        let bits = gate.reference(w.reduce(x as u64), &mut want);
        let arith_ok = (0..outs).all(|o| {
            let ring = gate.phi.outputs[o].ring;
            ring.add(
                records[0].arith[j * outs + o],
                records[1].arith[j * outs + o],
            ) == want[o]
        });
        let bits_ok = (0..nb).all(|o| {
            records[0].bits[j * nb + o] ^ records[1].bits[j * nb + o] == u64::from((bits >> o) & 1)
        });
        !(arith_ok && bits_ok)
    })
}

#[test]
fn recorded_gate_runs_reconstruct_to_the_reference() {
    for case in &GATES {
        let records = mcu::record(case);
        assert_eq!(first_mismatch(case, &records), None, "{}", case.name);
        // Each party sent something in every round, and the rounds agree.
        assert_eq!(records[0].sent.len(), records[1].sent.len());
        assert!(records[0].sent.iter().all(|m| !m.is_empty()));
    }
}

#[test]
fn a_planted_wrong_share_is_caught() {
    for case in &GATES {
        let mut records = mcu::record(case);
        records[1].arith[3] ^= 1;
        assert_eq!(first_mismatch(case, &records), Some(3), "{}", case.name);
    }
}

#[test]
fn key_bodies_carry_no_roots() {
    // The firmware re-derives roots from the seed, as a server does: a
    // record holds each key's body only, back to back, as a key file does.
    for case in &GATES {
        let gate = mcu::gate_of(case);
        for record in mcu::record(case) {
            let n = record.input.len();
            for k in 0..gate.compiled.key_count {
                assert_eq!(record.dcf[k].len(), n * gate.key_params(k).body_len());
            }
        }
    }
}

#[test]
fn the_firmwares_compile_time_gates_equal_the_hosts() {
    // kat.rs builds spline gates from `Suf::piecewise` data at compile time;
    // the same data must give the gate `activation::gelu` builds.
    for case in GATES.iter().filter(|c| c.kind != "relu") {
        assert!(
            mcu::gate_from_piecewise(case) == mcu::gate_of(case),
            "{}",
            case.name
        );
    }
}
