//! The interactive steps of a plan. Each step kind implements `Step` in
//! its own module: the layout of its key section, the dealer's side, the
//! parties' side and the cleartext reference, in one place. `resolve` is
//! the one place that maps a plan's operation to its kind.
//!
//! Scalar gates are dealt and evaluated in chunks of [`CHUNK`] elements:
//! each chunk is an independent core evaluation (its element indices
//! continue the previous chunk's, so the PRF inputs never repeat), chunks
//! run in parallel on the party's threads, and one round of the step sends
//! every chunk's message in one frame.
//!
//! Key sections (per party b):
//!
//! | step | section |
//! | --- | --- |
//! | gate | seed_b · per chunk: DCF key bodies (roots are re-derived from the seed; the same bytes in both parties' sections), then P1's explicit words |
//! | chain (reciprocal, rsqrt, a per-row truncation) | seed_b · per chain step: the same, a one-round truncation's ring-output key bodies and P1's two words |
//! | max | seed_b · per tree level: the same, for that level's ReLUs (a one-round level: both ring-output key bodies, no words) |
//! | matmul, mulrows, square | seed_b · P1: its share of the triple's product (the rest is expanded from the seeds) |
//! | open | seed_b (the mask share is expanded from it) |
//! | truncation, residual and square | seed_b · per chunk: the carry keys' bodies, then P1's five words |

mod beaver;
mod centre_square;
mod chain;
mod gate;
mod material;
mod max;
mod open;
mod trunc_square;

use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use suffuse_core::gate::Protocol;
use zeroize::Zeroizing;

use crate::exec::{ExecError, Store};
use crate::lanes::{Exchange, LaneError};
use crate::net::NetError;
use crate::plan::{Built, Kind, Plan};
use crate::wipe;

/// Elements per evaluation chunk of a scalar gate.
pub const CHUNK: usize = 16 * 1024;

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The core rejected a buffer or state (a malformed key section).
    #[error("step {step}: {error}")]
    Core {
        /// The step.
        step: u32,
        /// The error.
        error: suffuse_core::Error,
    },
    /// The peer.
    #[error("step {step}: {error}")]
    Net {
        /// The step.
        step: u32,
        /// The error.
        error: NetError,
    },
    /// The interpreter.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The rounds of this step's group of lanes stopped: the link or
    /// another lane failed, and the group reports which.
    #[error("step {step}: the rounds of its group of lanes stopped")]
    Lane {
        /// The step.
        step: u32,
    },
    /// A key section shorter or longer than its layout.
    #[error("step {step}: key section is malformed ({what})")]
    Section {
        /// The step.
        step: u32,
        /// What is wrong.
        what: &'static str,
    },
}

/// Why dealing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DealError {
    /// The core.
    #[error("step {step}: {error}")]
    Core {
        /// The step.
        step: u32,
        /// The error.
        error: suffuse_core::Error,
    },
    /// Writing the key files.
    #[error(transparent)]
    KeyFile(#[from] crate::keyfile::KeyFileError),
    /// The interpreter.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The operating system gave no randomness for a ring-output key.
    #[error("step {step}: the operating system gave no randomness: {error}")]
    Random {
        /// The step.
        step: u32,
        /// What the operating system said.
        error: String,
    },
}

fn core(step: u32) -> impl Fn(suffuse_core::Error) -> ProtoError {
    move |source| ProtoError::Core {
        step,
        error: source,
    }
}

fn deal_core(step: u32) -> impl Fn(suffuse_core::Error) -> DealError {
    move |error| DealError::Core { step, error }
}

/// A run of section bytes as the dealer produces it. Key bytes are
/// secrets: `Debug` shows lengths only.
pub enum Dealt {
    /// Bytes both servers' sections hold alike: a gate's key bodies (P1's
    /// keys are P0's but for the roots, which each party re-derives from
    /// its seed), made and queued once for both files.
    Same(Vec<u8>),
    /// Server P0's bytes, then server P1's.
    Each([Vec<u8>; 2]),
}

impl Dealt {
    /// The bytes it adds to server `server`'s section (0 or 1).
    pub fn len(&self, server: usize) -> usize {
        match self {
            Dealt::Same(b) => b.len(),
            Dealt::Each(parts) => parts[server].len(),
        }
    }
}

impl std::fmt::Debug for Dealt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Dealt::Same(_) => "Same",
            Dealt::Each(_) => "Each",
        };
        write!(f, "Dealt::{kind}({} / {} bytes)", self.len(0), self.len(1))
    }
}

/// Receives both parties' section bytes as the dealer produces them.
pub type Emit<'a> = dyn FnMut(Dealt) -> Result<(), crate::keyfile::KeyFileError> + 'a;

/// One kind of interactive step, bound to its operation in a plan. Every
/// method sees the section after its seed, which [`deal`] and [`run`]
/// handle for all kinds.
trait Step {
    /// Bytes of `party`'s section after the seed.
    fn body_len(&self, party: Party) -> usize;
    /// Deals both parties' material from their seeds and emits it, in
    /// pieces, in section order. `opened` holds the whole masks of the
    /// opened tensors so far ([`dealt_mask`]), for products that read them.
    /// By default nothing, for steps whose section is the seed alone: the
    /// dealer checks every section's length against [`Step::body_len`], so
    /// a step that forgets to deal its material fails there.
    fn deal(
        &self,
        _fss: &dyn BatchEval,
        _seeds: [[u8; 16]; 2],
        _opened: &Store,
        _emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        Ok(())
    }
    /// An opening step's output as the dealer keeps it: zeros, then the
    /// whole mask (both parties' shares added).
    fn mask(&self, _seeds: &[[u8; 16]; 2]) -> Option<Vec<u64>> {
        None
    }
    /// Runs the step as `on.party` from its section; returns its output
    /// share (a step with two outputs, [`Kind::outputs`], returns both,
    /// one after the other).
    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError>;
    /// The step on cleartext values, with the protocol's own algebra (both
    /// outputs, as [`Step::run`]).
    fn reference(&self, store: &Store, la: &dyn BatchEval) -> Result<Vec<u64>, ExecError>;
}

/// Where a step sits: its plan and step number.
#[derive(Clone, Copy)]
struct At<'a> {
    plan: &'a Plan,
    step: u32,
}

/// Operation `op` as a step, or `None` for a local operation.
fn resolve(plan: &Plan, op: usize) -> Option<Box<dyn Step + '_>> {
    let at = At {
        plan,
        step: plan.step_of[op].unwrap_or(u32::MAX),
    };
    Some(match (&plan.ops[op].kind, plan.built[op].as_ref()?) {
        (Kind::Gate(s), Built::Gate(g)) => Box::new(gate::Scalar { at, g, x: s.x }),
        (Kind::Chain(s), Built::Chain(c)) => Box::new(chain::RowChain { at, c, x: s.x }),
        (Kind::Max(s), Built::Max(t)) => Box::new(max::RowMax { at, t, x: s.x }),
        (Kind::MatMul(s), _) => Box::new(beaver::MatMul::of(at, s)),
        (Kind::MulRows(s), _) => Box::new(beaver::RowProduct::rows(at, s)),
        (Kind::Mul(s), _) => Box::new(beaver::RowProduct::elementwise(at, s)),
        (Kind::Square(s), _) => Box::new(beaver::Square { at, x: s.x }),
        (Kind::Open(s), _) => Box::new(open::Open { at, x: s.x }),
        (Kind::CentreSquare(s), Built::CentreSquare(g)) => {
            Box::new(centre_square::Centre { at, g, x: s.x })
        }
        (Kind::TruncSquare(s), Built::TruncOpen(g)) => Box::new(trunc_square::TruncSquare {
            at,
            g,
            x: s.x,
            add: s.add,
        }),
        _ => return None,
    })
}

/// The role (P0 or P1) that `server` plays in step `op`.
///
/// A step's P1 section is its P0 section plus P1's explicit words (P0
/// expands its share of the dealer's words from its seed), so with fixed
/// roles one server's key file was 17–22 % larger than the other's. The
/// servers therefore exchange roles step by step: going through a pass's
/// steps in order, a step's roles are exchanged where that makes the
/// larger of the two servers' bytes so far in the pass smaller, which
/// keeps them within one step's words of each other at every step of
/// every pass. Both servers and the dealer derive the assignment from the
/// plan alone. Each step is the same two-party protocol whichever server
/// plays which role: its inputs and outputs are additive shares (an
/// opening's mask shares are two shares of the whole mask, which every
/// later step takes as a whole), and local operations keep the servers'
/// own roles (server P0 adds public terms).
pub fn role(plan: &Plan, op: usize, server: Party) -> Party {
    let swapped = plan.swapped.get_or_init(|| balance(plan));
    match swapped.get(op) {
        Some(true) => server.other(),
        _ => server,
    }
}

/// Per operation, whether its step's roles are exchanged (see [`role`]).
/// Each pass is balanced on its own: a decode pass's small steps would
/// otherwise make up for the prefill's last difference, and one pass's
/// keys would lean to one server.
fn balance(plan: &Plan) -> Vec<bool> {
    let mut total = [0u64; 2];
    (0..plan.ops.len())
        .map(|op| {
            if plan.passes.iter().any(|p| p.first_op == op) {
                total = [0, 0];
            }
            if plan.step_of[op].is_none() {
                return false;
            }
            let [p0, p1] = [Party::P0, Party::P1].map(|p| role_len(plan, op, p));
            let swap = (total[0] + p1).max(total[1] + p0) < (total[0] + p0).max(total[1] + p1);
            let [a, b] = if swap { [p1, p0] } else { [p0, p1] };
            total = [total[0] + a, total[1] + b];
            swap
        })
        .collect()
}

/// Bytes of step `op`'s key section for the role `role`.
fn role_len(plan: &Plan, op: usize, role: Party) -> u64 {
    16 + resolve(plan, op).map_or(0, |s| s.body_len(role)) as u64
}

/// Bytes of step `op`'s key section in `server`'s key file.
pub fn section_len(plan: &Plan, op: usize, server: Party) -> u64 {
    role_len(plan, op, role(plan, op, server))
}

/// Deals step `op` with the per-role seeds (P0's, P1's); `emit` receives
/// both servers' section bytes (server P0's, server P1's: each its role's,
/// [`role`]) in order, in pieces (the seed first). Large gates are dealt
/// chunk by chunk so that memory stays bounded. `opened` holds the
/// dealer's view of the opened tensors so far: [`dealt_mask`] of each
/// opening step, moved by the layout operations since.
pub fn deal(
    plan: &Plan,
    op: usize,
    fss: &dyn BatchEval,
    seeds: [[u8; 16]; 2],
    opened: &Store,
    emit: &mut Emit<'_>,
) -> Result<(), DealError> {
    let swapped = role(plan, op, Party::P0) == Party::P1;
    let mut to_servers = |mut dealt: Dealt| {
        if let (true, Dealt::Each(parts)) = (swapped, &mut dealt) {
            parts.swap(0, 1);
        }
        emit(dealt)
    };
    to_servers(Dealt::Each([seeds[0].to_vec(), seeds[1].to_vec()]))?;
    match resolve(plan, op) {
        Some(s) => s.deal(fss, seeds, opened, &mut to_servers),
        None => Ok(()),
    }
}

/// For an opening step ([`Kind::Open`]) dealt with `seeds`, the dealer's
/// view of its output: zeros where the parties hold the masked values,
/// then the whole mask. `None` for any other operation.
pub fn dealt_mask(plan: &Plan, op: usize, seeds: &[[u8; 16]; 2]) -> Option<Vec<u64>> {
    resolve(plan, op)?.mask(seeds)
}

/// Runs step `op` with its key section, as the role `on.party` (the
/// server) plays in it ([`role`]); writes the output share.
pub fn run(
    plan: &Plan,
    op: usize,
    on: &mut Online<'_>,
    section: &[u8],
    store: &mut Store,
) -> Result<(), ProtoError> {
    let mut cur = Cursor {
        bytes: section,
        step: plan.step_of[op].unwrap_or(u32::MAX),
    };
    let seed = Zeroizing::new(cur.seed()?);
    let Some(s) = resolve(plan, op) else {
        return Ok(());
    };
    let server = on.party;
    on.party = role(plan, op, server);
    let out = s.run(on, &seed, &mut cur, store);
    on.party = server;
    set_outputs(plan, op, store, out?)?;
    Ok(())
}

/// Stores operation `op`'s outputs from `out`, which holds them one after
/// the other.
pub fn set_outputs(
    plan: &Plan,
    op: usize,
    store: &mut Store,
    mut out: Vec<u64>,
) -> Result<(), ExecError> {
    let outputs = plan.ops[op].kind.outputs();
    for (i, &t) in outputs.iter().enumerate().rev() {
        let at = match i {
            0 => 0,
            _ => out.len().saturating_sub(plan.tensors[t].words()),
        };
        let part = out.split_off(at);
        store.set(plan, t, part)?;
    }
    Ok(())
}

/// Step `op` in the clear: its output, or `None` for a local operation.
pub fn reference(
    plan: &Plan,
    op: usize,
    store: &Store,
    la: &dyn BatchEval,
) -> Result<Option<Vec<u64>>, ExecError> {
    resolve(plan, op)
        .map(|s| s.reference(store, la))
        .transpose()
}

/// A key section being consumed front to back.
struct Cursor<'a> {
    bytes: &'a [u8],
    step: u32,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.bytes.len() < n {
            return Err(ProtoError::Section {
                step: self.step,
                what: "too short",
            });
        }
        let (a, b) = self.bytes.split_at(n);
        self.bytes = b;
        Ok(a)
    }

    fn seed(&mut self) -> Result<[u8; 16], ProtoError> {
        let mut s = [0u8; 16];
        s.copy_from_slice(self.take(16)?);
        Ok(s)
    }

    fn done(&self) -> Result<(), ProtoError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Section {
                step: self.step,
                what: "too long",
            })
        }
    }
}

/// What a party needs to run steps.
pub struct Online<'a> {
    /// Which party.
    pub party: Party,
    /// Where rounds go, and as which lane.
    rounds: &'a dyn Exchange,
    lane: usize,
    /// The backend: FSS evaluation, seed expansion, matrix products.
    pub fss: &'a dyn BatchEval,
    /// The evaluators' area, one for the whole query.
    area: Area,
}

/// The one evaluator area of a query's steps. Each step once allocated a
/// zeroed area of its own, and the binary's allocator zeroed it again
/// when it was freed: those two `memset`s were 7 % of MiniLM-128's online
/// CPU samples (`perf`, 2 cores). This area grows to the largest step's
/// need and is wiped when it grows and when the query ends. A step gets
/// it as the last one left it: core's evaluators write every scratch word
/// before they read it, which core's two-party test drivers check by
/// handing them dirty areas.
#[derive(Default)]
struct Area(Vec<u64>);

impl Area {
    /// The first `words` words, grown to fit.
    fn fit(&mut self, words: usize) -> &mut [u64] {
        if self.0.len() < words {
            wipe::vec(&mut self.0);
            self.0 = vec![0; words];
        }
        &mut self.0[..words]
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        wipe::vec(&mut self.0);
    }
}

impl std::fmt::Debug for Online<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Online")
            .field("party", &self.party)
            .finish_non_exhaustive()
    }
}

impl<'a> Online<'a> {
    /// A party's means to run steps, with an empty evaluator area.
    /// `rounds` is the link (a [`crate::lanes::Rounds`]), shared with the
    /// other lanes of a group, and `lane` this one's index in a group
    /// (0 outside groups).
    pub fn new(
        party: Party,
        rounds: &'a dyn Exchange,
        lane: usize,
        fss: &'a dyn BatchEval,
    ) -> Self {
        Online {
            party,
            rounds,
            lane,
            fss,
            area: Area::default(),
        }
    }

    /// Runs `f` with the query's evaluator area, cut to `words` words.
    fn with_area<T>(&mut self, words: usize, f: impl FnOnce(&mut Self, &mut [u64]) -> T) -> T {
        let mut area = std::mem::take(&mut self.area);
        let out = f(self, area.fit(words));
        self.area = area;
        out
    }

    /// Runs later steps as lane `lane` of a group.
    pub fn set_lane(&mut self, lane: usize) {
        self.lane = lane;
    }

    fn exchange(&mut self, step: u32, send: &[u8]) -> Result<Vec<u8>, ProtoError> {
        self.rounds
            .exchange(self.lane, step, send)
            .map_err(|e| match e {
                LaneError::Net(error) => ProtoError::Net { step, error },
                LaneError::Stopped => ProtoError::Lane { step },
            })
    }

    /// Runs several core protocols of one step side by side (a step's
    /// chunks): each round sends every protocol's message in one frame.
    fn drive_all<P: Protocol + Send>(
        &mut self,
        step: u32,
        evs: &mut [P],
    ) -> Result<(), ProtoError> {
        use rayon::prelude::*;
        let rounds = evs.first().map_or(0, |e| e.rounds());
        for i in 0..rounds {
            let lens: Vec<usize> = evs.iter().map(|e| e.send_len(i)).collect();
            let mut send = vec![0u8; lens.iter().sum()];
            let mut parts = Vec::with_capacity(evs.len());
            let mut rest = send.as_mut_slice();
            for l in &lens {
                let (a, b) = rest.split_at_mut(*l);
                parts.push(a);
                rest = b;
            }
            (evs.par_iter_mut().zip(parts))
                .try_for_each(|(ev, buf)| ev.prepare(i, buf))
                .map_err(core(step))?;
            let recv = self.exchange(step, &send)?;
            let mut at = 0;
            let mut theirs = Vec::with_capacity(evs.len());
            for l in &lens {
                theirs.push(&recv[at..at + l]);
                at += l;
            }
            let fss = self.fss;
            (evs.par_iter_mut().zip(theirs))
                .try_for_each(|(ev, buf)| ev.finish(i, buf, fss))
                .map_err(core(step))?;
        }
        Ok(())
    }

    /// Runs a core protocol's rounds over the link; returns its output.
    fn drive(&mut self, step: u32, ev: &mut impl Protocol) -> Result<Vec<u64>, ProtoError> {
        for i in 0..ev.rounds() {
            let mut send = vec![0u8; ev.send_len(i)];
            ev.prepare(i, &mut send).map_err(core(step))?;
            let recv = self.exchange(step, &send)?;
            ev.finish(i, &recv, self.fss).map_err(core(step))?;
        }
        let mut y = vec![0u64; ev.output_len()];
        ev.output(&mut y).map_err(core(step))?;
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step's two sections go one to each server, and the servers'
    /// bytes within a pass stay within one step's difference of each other
    /// after every step (so a decode pass is balanced, not only the whole
    /// file): an encoder's plan and a decoder's with four passes.
    #[test]
    fn the_servers_exchange_roles_to_keep_their_key_files_even() {
        let decoder = crate::model::Decoder::builtin("tiny-llama").unwrap();
        let generation = crate::plan::decoder::Generation {
            prompt: 8,
            steps: 3,
        };
        let decoding = crate::plan::decoder::build(&decoder, generation).unwrap();
        assert_eq!(decoding.passes.len(), 4);
        for plan in [crate::fuzzing::plan(), decoding] {
            even_within_every_pass(&plan);
        }
    }

    /// `Kind::step` (the planner's side of a step) and `resolve` (the
    /// protocol's) agree on every operation, and every kind of step is in
    /// these plans: an encoder's and three decoders' with decode passes.
    #[test]
    fn the_planner_and_the_protocol_know_the_same_steps() {
        let mut kinds = std::collections::HashSet::new();
        let decoding = |name| {
            let d = crate::model::Decoder::builtin(name).unwrap();
            let g = crate::plan::decoder::Generation {
                prompt: 8,
                steps: 2,
            };
            crate::plan::decoder::build(&d, g).unwrap()
        };
        let plans = [
            crate::fuzzing::plan(),
            decoding("tiny-llama"),
            decoding("tiny-gpt2"),
            decoding("tiny-gemma"),
        ];
        for plan in plans {
            for (i, op) in plan.ops.iter().enumerate() {
                let kind = &op.kind;
                assert_eq!(resolve(&plan, i).is_some(), kind.is_step(), "{kind:?}");
                assert_eq!(kind.step().is_some(), kind.key_label().is_some());
                assert_eq!(kind.is_step(), kind.round_label().is_some());
                assert_eq!(kind.outputs()[0], kind.output());
                if kind.is_step() {
                    kinds.insert(std::mem::discriminant(kind));
                }
            }
        }
        assert_eq!(kinds.len(), 10, "every kind of step is planned");
    }

    fn even_within_every_pass(plan: &Plan) {
        let steps: Vec<usize> = (0..plan.ops.len())
            .filter(|op| plan.step_of[*op].is_some())
            .collect();
        let lens = |op: usize| [Party::P0, Party::P1].map(|r| role_len(plan, op, r));
        let widest = steps
            .iter()
            .map(|op| lens(*op)[1].abs_diff(lens(*op)[0]))
            .max()
            .unwrap_or(0);
        assert!(widest > 0, "no step with explicit words to balance");
        let pass_of = |op: usize| plan.passes.iter().filter(|p| p.first_op <= op).count();
        let (mut total, mut swapped, mut pass) = ([0u64; 2], 0, 0);
        for &op in &steps {
            if pass_of(op) != pass {
                (total, pass) = ([0, 0], pass_of(op));
            }
            let roles = [Party::P0, Party::P1].map(|s| role(plan, op, s));
            assert_ne!(roles[0], roles[1], "op {op}: both servers in one role");
            swapped += usize::from(roles[0] == Party::P1);
            for (s, server) in [Party::P0, Party::P1].into_iter().enumerate() {
                let len = section_len(plan, op, server);
                assert_eq!(len, lens(op)[usize::from(roles[s] == Party::P1)]);
                total[s] += len;
            }
            assert!(
                total[0].abs_diff(total[1]) <= widest,
                "{total:?} after op {op}"
            );
        }
        let n = steps.len();
        assert!(swapped > 0 && swapped < n, "{swapped} of {n} swapped");
    }
}
