use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{Block, FixedKeyAes, Prg};
use suffuse_core::ring::Width;
use suffuse_core::{dcf, dpf};

#[test]
fn quick() {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(&[1; 16]);
    for kind in [Kind::Dcf, Kind::Dpf] {
        for out in [
            Output::Bit,
            Output::Ring(Width::of(64)),
            Output::Ring(Width::of(13)),
            Output::Ring(Width::of(5)),
        ] {
            for k in [1u32, 2, 3, 5, 8, 9] {
                let p = Params::new(kind, Width::of(k), out);
                let len = p.key_len();
                for alpha in 0..(1u64 << k) {
                    let beta = match out {
                        Output::Bit => 1,
                        Output::Ring(w) => w.reduce(0x1234_5678_9abc_def1),
                    };
                    let mut k0 = vec![0u8; len];
                    let mut k1 = vec![0u8; len];
                    let roots = [rng.next_block(), rng.next_block()];
                    match kind {
                        Kind::Dcf => {
                            dcf::generate(&aes, &p, alpha, beta, roots, &mut rng, &mut k0, &mut k1)
                                .unwrap()
                        }
                        Kind::Dpf => {
                            dpf::generate(&aes, &p, alpha, beta, roots, &mut rng, &mut k0, &mut k1)
                                .unwrap()
                        }
                    };
                    let points: Vec<u64> = (0..(1u64 << k)).collect();
                    let mut o0 = vec![0; points.len()];
                    let mut o1 = vec![0; points.len()];
                    let s = Serial::new();
                    s.eval(&KeyBatch::new(p, Party::P0, &k0).unwrap(), &points, &mut o0)
                        .unwrap();
                    s.eval(&KeyBatch::new(p, Party::P1, &k1).unwrap(), &points, &mut o1)
                        .unwrap();
                    for x in 0..(1u64 << k) {
                        let hit = match kind {
                            Kind::Dcf => x < alpha,
                            Kind::Dpf => x == alpha,
                        };
                        let got = match out {
                            Output::Bit => o0[x as usize] ^ o1[x as usize],
                            Output::Ring(w) => w.add(o0[x as usize], o1[x as usize]),
                        };
                        let want = if hit { beta } else { 0 };
                        assert_eq!(got, want, "{kind:?} {out:?} k={k} alpha={alpha} x={x}");
                    }
                }
            }
        }
    }
}
