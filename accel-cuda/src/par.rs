//! Host loops split over scoped OS threads, for the host's share of a
//! device call: packing keys, unpacking generated ones, zeroing the staging.
//!
//! Not rayon. These loops run while the evaluator's state is locked, and a
//! rayon worker that waits for its own parallel loop runs other rayon jobs
//! meanwhile; the party's rayon tasks call the backend, so such a job can
//! ask for the lock its own thread already holds, and the thread waits on
//! itself for ever (`cuda_e2e` hung this way). Scoped threads run only the
//! chunks they were handed.

/// Below this many output elements a loop runs on the calling thread: a
/// thread costs more than the work.
const SERIAL_BELOW: usize = 1 << 16;

fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(32)
}

/// `f` on each pair of `out.chunks_mut(oc)` and `input.chunks(ic)` (as many
/// pairs as the shorter gives), the pairs split into contiguous runs, one
/// per thread.
pub(crate) fn zip_chunks<A: Send, B: Sync>(
    out: &mut [A],
    oc: usize,
    input: &[B],
    ic: usize,
    f: impl Fn(&mut [A], &[B]) + Sync,
) {
    let (oc, ic) = (oc.max(1), ic.max(1));
    let pairs = out.len().div_ceil(oc).min(input.len().div_ceil(ic));
    let threads = threads().min(pairs);
    if threads <= 1 || out.len() < SERIAL_BELOW {
        out.chunks_mut(oc)
            .zip(input.chunks(ic))
            .for_each(|(o, i)| f(o, i));
        return;
    }
    let per = pairs.div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let (mut o, mut i) = (out, input);
        let mut running = Vec::with_capacity(threads);
        while !o.is_empty() && !i.is_empty() {
            let (oa, ob) = o.split_at_mut((per * oc).min(o.len()));
            let (ia, ib) = i.split_at((per * ic).min(i.len()));
            running.push(s.spawn(move || {
                oa.chunks_mut(oc)
                    .zip(ia.chunks(ic))
                    .for_each(|(o, i)| f(o, i));
            }));
            (o, i) = (ob, ib);
        }
        // Joined one by one (pthread_join), not only at the scope's end:
        // the scope's own wait is a futex ThreadSanitizer cannot see, and
        // `cargo xtask cuda-tsan` then reports the caller's later use of
        // the buffers as racing with these threads.
        for t in running {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// `f` on each of `out.chunks_mut(chunk)`, split over threads as
/// [`zip_chunks`] splits them.
pub(crate) fn chunks<A: Send>(out: &mut [A], chunk: usize, f: impl Fn(&mut [A]) + Sync) {
    let units = vec![(); out.len().div_ceil(chunk.max(1))];
    zip_chunks(out, chunk, &units, 1, |o, _| f(o));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_is_visited_once_whatever_the_lengths() {
        for (n, oc, ic) in [(0, 4, 2), (5, 4, 2), (1 << 17, 8, 4), ((1 << 17) + 3, 8, 4)] {
            let input: Vec<u64> = (0..n as u64 / 2 + 2).collect();
            let mut out = vec![0u64; n];
            zip_chunks(&mut out, oc, &input, ic, |o, i| {
                for v in o.iter_mut() {
                    *v += i[0] + 1;
                }
            });
            for (j, v) in out.iter().enumerate() {
                let pair = j / oc;
                let want = if pair < input.len().div_ceil(ic) {
                    (pair * ic) as u64 + 1
                } else {
                    0
                };
                assert_eq!(*v, want, "n {n}, element {j}");
            }
        }
    }

    #[test]
    fn chunks_cover_the_slice() {
        let mut out = vec![1u8; (1 << 17) + 5];
        chunks(&mut out, 1000, |c| c.fill(0));
        assert!(out.iter().all(|v| *v == 0));
    }
}
