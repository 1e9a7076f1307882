//! Every kernel path against the textbook triple loop, on edge shapes,
//! thread counts that split the work differently, and values from the whole
//! ring as well as small signed weights.

use suffuse_accel_cpu::linalg::{
    LinalgError, Operand, Path, matmul, matmul_acc, matmul_bt, matmul_naive, on_threads,
};
use suffuse_core::prg::Prg;

/// Sizes around the register tiles (8 × 16 on AVX-512, 4 × 4 portable)
/// and the 256-deep panels.
const SIZES: [usize; 11] = [0, 1, 2, 7, 8, 9, 31, 33, 64, 65, 129];

/// Test values from core's seeded PRG: the same on every run.
struct Rng(Prg);

impl Rng {
    fn seeded(seed: u8) -> Rng {
        Rng(Prg::new(&[seed; 16]))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform words, as secret shares are.
    fn words(&mut self, len: usize) -> Vec<u64> {
        (0..len).map(|_| self.next()).collect()
    }

    /// Fixed-point weights in [−2^15, 2^15), sign-extended mod 2^64.
    fn weights(&mut self, len: usize) -> Vec<u64> {
        (0..len)
            .map(|_| ((self.next() >> 48) as i16) as i64 as u64)
            .collect()
    }

    /// Mostly the extremes of the ring: 0, 1, −1, 2^63, 2^63 ± 1.
    fn extremes(&mut self, len: usize) -> Vec<u64> {
        const E: [u64; 6] = [0, 1, u64::MAX, 1 << 63, (1 << 63) - 1, (1 << 63) + 1];
        (0..len)
            .map(|_| E[(self.next() % E.len() as u64) as usize])
            .collect()
    }
}

fn transpose(b: &[u64], k: usize, n: usize) -> Vec<u64> {
    let mut bt = vec![0; b.len()];
    for p in 0..k {
        for j in 0..n {
            bt[j * k + p] = b[p * n + j];
        }
    }
    bt
}

/// Runs all three products on every path and thread count and compares
/// them with the reference.
fn check_all(a: &[u64], b: &[u64], m: usize, k: usize, n: usize, rng: &mut Rng) {
    let mut want = vec![0; m * n];
    matmul_naive(a, b, &mut want, m, k, n).expect("reference");
    let bt = transpose(b, k, n);
    let c0 = rng.words(m * n);
    let want_acc: Vec<u64> = want
        .iter()
        .zip(&c0)
        .map(|(x, y)| x.wrapping_add(*y))
        .collect();
    for path in Path::available() {
        for threads in [1, 2, 3] {
            let shape = format!("{} m={m} k={k} n={n} threads={threads}", path.name());
            on_threads(threads, || {
                // Garbage in c: matmul must overwrite every entry.
                let mut c = rng_fill(m * n);
                path.matmul(a, b, &mut c, m, k, n).expect("matmul");
                assert!(c == want, "matmul {shape}");

                let mut c = c0.clone();
                path.matmul_acc(a, b, &mut c, m, k, n).expect("matmul_acc");
                assert!(c == want_acc, "matmul_acc {shape}");

                let mut c = rng_fill(m * n);
                path.matmul_bt(a, &bt, &mut c, m, k, n).expect("matmul_bt");
                assert!(c == want, "matmul_bt {shape}");
            })
            .expect("thread pool");
        }
    }
}

fn rng_fill(len: usize) -> Vec<u64> {
    vec![0xdead_beef_dead_beef; len]
}

#[test]
fn edge_shapes_full_range() {
    let mut rng = Rng::seeded(1);
    for m in SIZES {
        for k in SIZES {
            for n in SIZES {
                let a = rng.words(m * k);
                let b = rng.words(k * n);
                check_all(&a, &b, m, k, n, &mut rng);
            }
        }
    }
}

#[test]
fn edge_shapes_shares_times_weights() {
    let mut rng = Rng::seeded(2);
    for (m, k, n) in [
        (1, 1, 1),
        (9, 33, 65),
        (129, 65, 31),
        (64, 129, 64),
        (33, 300, 17),
    ] {
        let a = rng.words(m * k);
        let b = rng.weights(k * n);
        check_all(&a, &b, m, k, n, &mut rng);
        // And the transposed roles: weights on the left.
        let a = rng.weights(m * k);
        let b = rng.words(k * n);
        check_all(&a, &b, m, k, n, &mut rng);
    }
}

#[test]
fn ring_extremes() {
    let mut rng = Rng::seeded(3);
    for (m, k, n) in [(8, 16, 16), (9, 257, 17), (65, 31, 129)] {
        let a = rng.extremes(m * k);
        let b = rng.extremes(k * n);
        check_all(&a, &b, m, k, n, &mut rng);
    }
    // (−1)·(−1) = 1 and (−1)·2 = −2, each summed 300 times.
    let (m, k, n) = (1, 300, 2);
    let a = vec![u64::MAX; m * k];
    let b: Vec<u64> = (0..k * n)
        .map(|i| if i % 2 == 0 { u64::MAX } else { 2 })
        .collect();
    let mut c = vec![0; m * n];
    matmul(&a, &b, &mut c, m, k, n).unwrap();
    assert_eq!(c, [300, (300u64 * 2).wrapping_neg()]);
}

#[test]
fn transformer_shapes() {
    let mut rng = Rng::seeded(4);
    // A projection; an inner dimension that spans several 256-deep panels
    // with a remainder; more columns than one 256-wide tile, ending in a
    // partial panel.
    for (m, k, n) in [(128, 384, 1152), (130, 700, 70), (20, 40, 300)] {
        let a = rng.words(m * k);
        let b = rng.weights(k * n);
        check_all(&a, &b, m, k, n, &mut rng);
    }
}

#[test]
fn default_entry_points_match_the_detected_path() {
    let mut rng = Rng::seeded(5);
    let (m, k, n) = (33, 65, 129);
    let a = rng.words(m * k);
    let b = rng.words(k * n);
    let bt = transpose(&b, k, n);
    let path = Path::detect();
    assert_eq!(Path::available()[0], path);
    let mut want = vec![0; m * n];
    path.matmul(&a, &b, &mut want, m, k, n).unwrap();

    let mut c = vec![0; m * n];
    matmul(&a, &b, &mut c, m, k, n).unwrap();
    assert_eq!(c, want);
    let mut c = vec![0; m * n];
    matmul_bt(&a, &bt, &mut c, m, k, n).unwrap();
    assert_eq!(c, want);
    let mut c = vec![1; m * n];
    matmul_acc(&a, &b, &mut c, m, k, n).unwrap();
    let plus_one: Vec<u64> = want.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(c, plus_one);
}

#[test]
fn zero_inner_dimension() {
    let (m, n) = (3, 5);
    for path in Path::available() {
        let mut c = vec![7; m * n];
        path.matmul(&[], &[], &mut c, m, 0, n).unwrap();
        assert_eq!(c, vec![0; m * n], "{}", path.name());
        let mut c = vec![7; m * n];
        path.matmul_acc(&[], &[], &mut c, m, 0, n).unwrap();
        assert_eq!(c, vec![7; m * n], "{}", path.name());
        let mut c = vec![7; m * n];
        path.matmul_bt(&[], &[], &mut c, m, 0, n).unwrap();
        assert_eq!(c, vec![0; m * n], "{}", path.name());
    }
}

fn shape_error(r: Result<(), LinalgError>) -> Operand {
    match r {
        Err(LinalgError::Shape { operand, .. }) => operand,
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn bad_lengths_are_errors() {
    let (m, k, n) = (4, 5, 6);
    let a = vec![1; m * k];
    let b = vec![1; k * n];
    let c = vec![9; m * n];
    for path in Path::available() {
        let mut out = c.clone();
        let f = |a: &[u64], b: &[u64], c: &mut [u64]| path.matmul(a, b, c, m, k, n);
        assert_eq!(shape_error(f(&a[1..], &b, &mut out)), Operand::A);
        assert_eq!(shape_error(f(&a, &b[1..], &mut out)), Operand::B);
        assert_eq!(shape_error(f(&a, &b, &mut out[1..])), Operand::C);
        let mut longer = vec![0; m * n + 1];
        assert_eq!(shape_error(f(&a, &b, &mut longer)), Operand::C);
        let acc = path.matmul_acc(&a, &b[..k * n - 1], &mut out, m, k, n);
        assert_eq!(shape_error(acc), Operand::B);
        // bt is n × k: the same length as b here, so swap a dimension.
        let bt = vec![1; n * k];
        assert_eq!(
            shape_error(path.matmul_bt(&a, &bt[1..], &mut out, m, k, n)),
            Operand::Bt
        );
        // Nothing was written.
        assert_eq!(out, c);
    }
    let mut small = vec![0; 1];
    assert_eq!(
        shape_error(matmul_naive(&a, &b, &mut small, m, k, n)),
        Operand::C
    );
}

#[test]
fn overflowing_shapes_are_errors() {
    let mut c = vec![0; 4];
    let huge = usize::MAX / 2 + 1;
    let r = matmul(&[0; 4], &[0; 4], &mut c, huge, 2, 2);
    assert_eq!(shape_error(r), Operand::A);
    let r = matmul(&[0; 4], &[0; 4], &mut c, 2, 2, huge);
    assert_eq!(shape_error(r), Operand::B);
    let r = matmul_bt(&[0; 4], &[0; 4], &mut c, 2, huge, 2);
    assert_eq!(shape_error(r), Operand::A);
    let e = LinalgError::Shape {
        operand: Operand::A,
        rows: huge,
        cols: 2,
        len: 4,
    };
    assert!(e.to_string().contains("more elements than fit"), "{e}");
    let e = LinalgError::Shape {
        operand: Operand::Bt,
        rows: 3,
        cols: 2,
        len: 5,
    };
    assert_eq!(
        e.to_string(),
        "`bt` should be a 3×2 matrix (6 elements) but has 5 elements"
    );
    let _: &dyn std::error::Error = &e;
}

/// Every path's turned row ([`Path::turned_row`]) against core's row loop
/// ([`suffuse_core::batch::turned_reference`]): both pairings, widths
/// around the vector lengths, weights up to 2^44 and factors up to 2^17
/// of either sign (the rounding at both signs), and garbage in `c`.
#[test]
fn turned_rows_match_the_reference_on_every_path() {
    use suffuse_core::batch::{Pairing, Turned, turned_reference};
    let mut rng = Rng::seeded(9);
    let signed = |rng: &mut Rng, bits: u32| {
        ((rng.next() >> (64 - bits)) as i64 - (1i64 << (bits - 1))) as u64
    };
    for (m, k, n, turned, pairing) in [
        (1, 1, 2, 2, Pairing::Adjacent),
        (2, 9, 17, 16, Pairing::Adjacent),
        (3, 33, 30, 30, Pairing::Adjacent),
        (2, 65, 72, 64, Pairing::Halves(16)),
        (4, 7, 40, 36, Pairing::Halves(6)),
        (1, 129, 24, 0, Pairing::Halves(8)),
    ] {
        let a = rng.words(m * k);
        let b: Vec<u64> = (0..k * n).map(|_| signed(&mut rng, 45)).collect();
        let own: Vec<u64> = (0..m * turned).map(|_| signed(&mut rng, 18)).collect();
        let other: Vec<u64> = (0..m * turned).map(|_| signed(&mut rng, 18)).collect();
        let t = Turned {
            m,
            k,
            n,
            turned,
            pairing,
            own: &own,
            other: &other,
            frac: 16,
        };
        let mut want = vec![0; m * n];
        turned_reference(&t, &a, &b, &mut want).expect("reference");
        for path in Path::available() {
            let mut c = rng.words(m * n);
            for (i, ci) in c.chunks_exact_mut(n).enumerate() {
                path.turned_row(&t, i, &a[i * k..(i + 1) * k], &b, ci);
            }
            assert!(
                c == want,
                "{} m={m} k={k} n={n} turned={turned} {pairing:?}",
                path.name()
            );
        }
    }
}
