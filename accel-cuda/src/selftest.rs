//! The start-up self-test: a few hundred keys generated and evaluated on
//! the device, a seed expansion and a matrix product, each compared with
//! core's [`Serial`] before the device is trusted with a query. `--backend
//! auto` picks CUDA only when this passes.

use suffuse_core::batch::{BatchEval, MatShape, Serial, matmul_reference};
use suffuse_core::fss::{GenBatch, KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{Block, Domain, Hasher, Prg};
use suffuse_core::ring::Width;

use crate::launcher::Launcher;
use crate::{CudaError, CudaEval};

/// Keys per shape: more than one block of device threads.
const KEYS: usize = 300;

fn fail(what: String) -> CudaError {
    CudaError::SelfTest(what)
}

impl<L: Launcher> CudaEval<L> {
    /// Checks the device against core's reference on a small workload.
    pub fn self_test(&self) -> Result<(), CudaError> {
        let mut rng = Prg::new(b"suffuse selftest");
        let shapes = [
            Params::dcf_bit(Width::of(50)),
            Params::new(Kind::Dcf, Width::of(24), Output::Ring(Width::of(13))),
            Params::new(Kind::Dpf, Width::of(64), Output::Ring(Width::of(64))),
            // The one-round ReLU's pair key at a max tree's width.
            Params::new(Kind::Dcf, Width::of(28), Output::Pair(Width::of(64))),
        ];
        for p in shapes {
            self.check_keys(&p, &mut rng)?;
        }
        let mut blocks: Vec<Block> = (0..KEYS).map(|_| rng.next_block()).collect();
        let mut want = blocks.clone();
        Serial::new().hash_many(Domain::Tree, &mut want);
        self.hash_device(Domain::Tree, &mut blocks)
            .map_err(|(_, e)| e)?;
        if blocks
            .iter()
            .zip(&want)
            .any(|(a, b)| a.to_bytes() != b.to_bytes())
        {
            return Err(fail("seed expansion differs from core's AES".into()));
        }
        let shape = MatShape {
            batches: 2,
            m: 17,
            k: 33,
            n: 19,
            transpose_b: true,
            accumulate: true,
        };
        let [la, lb, lc] = shape.lens().ok_or_else(|| fail("matrix shape".into()))?;
        let mut words = |n: usize| -> Vec<u64> { (0..n).map(|_| rng.next_u64()).collect() };
        let (a, b, c) = (words(la), words(lb), words(lc));
        let (mut want, mut got) = (c.clone(), c);
        matmul_reference(&shape, &a, &b, &mut want).map_err(|e| fail(format!("{e}")))?;
        self.matmul_device(&shape, &a, &b, &mut got)?;
        if want != got {
            return Err(fail("a matrix product differs from the triple loop".into()));
        }
        Ok(())
    }

    /// Generates [`KEYS`] key pairs of `p` on the device and evaluates them
    /// there, both against `Serial`.
    fn check_keys(&self, p: &Params, rng: &mut Prg) -> Result<(), CudaError> {
        let mask = p.domain().mask();
        let alphas: Vec<u64> = (0..KEYS).map(|_| rng.next_u64() & mask).collect();
        let words = p.output().words();
        let betas: Vec<u64> = (0..KEYS * words).map(|_| rng.next_u64()).collect();
        let roots: Vec<[Block; 2]> = (0..KEYS)
            .map(|_| [rng.next_block(), rng.next_block()])
            .collect();
        let random: Vec<u64> = (0..KEYS * p.gen_random_words())
            .map(|_| rng.next_u64())
            .collect();
        let batch = GenBatch::new(*p, &alphas, &betas, &roots, &random)
            .map_err(|e| fail(format!("{e}")))?;
        let len = KEYS * p.key_len();
        let (mut w0, mut w1) = (vec![0u8; len], vec![0u8; len]);
        Serial::new()
            .generate(&batch, &mut w0, &mut w1)
            .map_err(|e| fail(format!("{e}")))?;
        let (mut g0, mut g1) = (vec![0u8; len], vec![0u8; len]);
        self.generate_device(&batch, &mut g0, &mut g1)?;
        if g0 != w0 || g1 != w1 {
            return Err(fail(format!("keys of {p:?} differ from core's")));
        }
        // Each key at α − 1, α and α + 1, where the comparison flips.
        let points: Vec<u64> = alphas
            .iter()
            .flat_map(|a| [a.wrapping_sub(1), *a, a.wrapping_add(1)])
            .collect();
        for (party, bytes) in [(Party::P0, &w0), (Party::P1, &w1)] {
            let keys = KeyBatch::new(*p, party, bytes).map_err(|e| fail(format!("{e}")))?;
            let mut want = vec![0u64; points.len() * words];
            Serial::new()
                .eval(&keys, &points, &mut want)
                .map_err(|e| fail(format!("{e}")))?;
            let mut got = vec![0u64; points.len() * words];
            self.eval_device(&keys, 3, &points, &mut got)?;
            if want != got {
                return Err(fail(format!("{p:?} evaluates differently from core")));
            }
        }
        Ok(())
    }
}
