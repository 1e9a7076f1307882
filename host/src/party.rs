//! The online executor of one server: the plan run on shares, steps fed
//! from the key file as a stream and exchanged with the peer.
//!
//! A background thread reads key sections ahead (two at a time), so disk
//! reads overlap computation; memory holds at most the step being run and
//! the next ones in flight, never the whole key file.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use zeroize::Zeroize;

use crate::exec::{self, ExecError, Store};
use crate::keyfile::{KeyFileError, KeyReader, Section};
use crate::lanes::{self, Rounds};
use crate::net::Link;
use crate::plan::{Category, Plan};
use crate::proto::{self, Online, ProtoError};
use crate::wipe::Wiped;

/// Figures of one category on one party.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct CategoryFigures {
    /// Wall time of the category's operations.
    pub online_s: f64,
    /// Bytes this party sent.
    pub comm_bytes: u64,
    /// Rounds.
    pub rounds: u64,
    /// This party's key bytes.
    pub key_bytes: u64,
}

/// The key bytes one party holds for one kind of gate, and the elements
/// those gates output.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct GateKeys {
    /// Output elements.
    pub elements: u64,
    /// This party's key bytes.
    pub key_bytes: u64,
}

/// The traffic of one kind of step ([`crate::plan::Kind::round_label`]) in
/// one pass, on one party.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct StepTraffic {
    /// Steps of this kind in the pass.
    pub steps: u64,
    /// Rounds counted under them. A round that lanes share is one frame,
    /// counted under the step of the first lane that sent in it.
    pub rounds: u64,
    /// Bytes this party sent for them.
    pub sent: u64,
}

/// What one party measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PartyReport {
    /// 0 or 1.
    pub party: u8,
    /// Wall time from the inputs to the output share.
    pub online_s: f64,
    /// Bytes sent to the peer (frame headers included).
    pub comm_bytes: u64,
    /// Bytes received from the peer.
    pub recv_bytes: u64,
    /// Rounds with the peer.
    pub rounds: u64,
    /// Key bytes consumed.
    pub key_bytes: u64,
    /// Per category.
    pub breakdown: BTreeMap<Category, CategoryFigures>,
    /// Key bytes and output elements per gate ([`crate::plan::Kind::key_label`]).
    #[serde(default)]
    pub by_gate: BTreeMap<String, GateKeys>,
    /// Rounds and bytes sent per kind of step, one map per pass that ran
    /// (a generation's prefill first, then its decode passes), each
    /// gathered when its pass ends.
    #[serde(default)]
    pub traffic_by_pass: Vec<BTreeMap<String, StepTraffic>>,
    /// The backend that ran the heavy operations ([`BatchEval::name`]).
    #[serde(default)]
    pub backend: String,
    /// Its AES path ([`BatchEval::aes_path`]).
    #[serde(default)]
    pub aes_path: String,
    /// The device it ran on ([`BatchEval::device`]); empty on CPUs.
    #[serde(default)]
    pub device: String,
    /// The most device memory it had held when the pass ended
    /// ([`BatchEval::device_peak_bytes`]); 0 on CPUs.
    #[serde(default)]
    pub device_peak_bytes: u64,
    /// Seconds per phase of its device work so far
    /// ([`BatchEval::device_phases`]); empty on CPUs.
    #[serde(default)]
    pub device_phases: BTreeMap<String, f64>,
}

impl PartyReport {
    /// A report with nothing measured yet: the party and its backend.
    fn starting(party: Party, fss: &dyn BatchEval) -> PartyReport {
        PartyReport {
            party: u8::from(party == Party::P1),
            backend: fss.name().to_owned(),
            aes_path: fss.aes_path().to_owned(),
            device: fss.device().unwrap_or_default().to_owned(),
            ..PartyReport::default()
        }
    }
}

/// The backend's device phases ([`BatchEval::device_phases`]) as a map.
pub fn device_phases(fss: &dyn BatchEval) -> BTreeMap<String, f64> {
    let mut phases = BTreeMap::new();
    fss.device_phases(&mut |name, s| {
        phases.insert(name.to_owned(), s);
    });
    phases
}

/// Why a party failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PartyError {
    /// The key file.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// A step.
    #[error(transparent)]
    Proto(#[from] ProtoError),
    /// The interpreter.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The client's side of a pass (its input or the output's delivery).
    #[error("client: {0}")]
    Client(String),
    /// The key reader thread stopped early.
    #[error("the key reader stopped before step {step}")]
    Reader {
        /// The step.
        step: u32,
    },
}

/// This party's shares of the plan's inputs: wiped on drop, redacted in
/// `Debug`.
pub struct InputShares {
    /// Embeddings.
    pub x: Vec<u64>,
    /// Attention bias.
    pub bias: Vec<u64>,
    /// Pooling mask (mean pooling).
    pub mask: Option<Vec<u64>>,
}

impl std::fmt::Debug for InputShares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputShares")
            .field("x", &format_args!("[{} words, redacted]", self.x.len()))
            .field(
                "bias",
                &format_args!("[{} words, redacted]", self.bias.len()),
            )
            .finish_non_exhaustive()
    }
}

impl Drop for InputShares {
    fn drop(&mut self) {
        self.x.zeroize();
        self.bias.zeroize();
        self.mask.zeroize();
    }
}

/// Runs a one-pass plan as `party`; returns the output share and the
/// figures. `keys` must be positioned after the header (already checked).
pub fn run(
    plan: &Plan,
    party: Party,
    keys: KeyReader,
    link: &mut Link,
    fss: &dyn BatchEval,
    inputs: InputShares,
) -> Result<(Vec<u64>, PartyReport), PartyError> {
    let mut io = OnePass(None);
    let report = run_passes(plan, party, keys, link, fss, inputs, &mut io)?;
    let share = io.0.ok_or(PartyError::Reader { step: 0 })?;
    Ok((share, report))
}

/// The client's side of a multi-pass plan, as a party sees it.
pub trait PassIo {
    /// This party's shares of pass `pass`'s embeddings and key bias, or
    /// `None` when the client stops (end of sequence): the remaining
    /// passes are not run and their keys are never used.
    fn input(&mut self, pass: usize) -> Result<Option<InputShares>, PartyError>;
    /// This party's share of pass `pass`'s output, with the figures so far.
    fn output(
        &mut self,
        pass: usize,
        share: Vec<u64>,
        so_far: &PartyReport,
    ) -> Result<(), PartyError>;
}

/// Keeps the output of a one-pass plan.
struct OnePass(Option<Vec<u64>>);

impl PassIo for OnePass {
    fn input(&mut self, _: usize) -> Result<Option<InputShares>, PartyError> {
        Ok(None)
    }

    fn output(&mut self, _: usize, share: Vec<u64>, _: &PartyReport) -> Result<(), PartyError> {
        self.0 = Some(share);
        Ok(())
    }
}

/// `party`'s key sections for `plan`: `(step, length)` in step order, what
/// its key file must hold.
pub fn key_sections(plan: &Plan, party: Party) -> Vec<(u32, u64)> {
    plan.step_of
        .iter()
        .enumerate()
        .filter_map(|(op, s)| s.map(|s| (s, proto::section_len(plan, op, party))))
        .collect()
}

/// Stack bytes overwritten below the caller when a party stops: several
/// times the deepest a step was seen to reach (about 20 KiB on the demo
/// model, `host/tests/memscan.rs`).
const STACK_SCRUB: usize = 256 * 1024;

/// Wipes the stacks that held a step's secrets when dropped. Seeds and
/// key words pass through stack frames as values: a move or a copy leaves
/// its bytes behind, and `Zeroizing` wipes only the copy it owns. Without
/// this, a server waiting for its next query kept the seeds of its last
/// steps, which the memory scan found. So the running thread and every
/// worker of the global rayon pool (which evaluates the keys) overwrite
/// their stacks below the caller, whether the party ends or fails.
struct ScrubStacks;

impl Drop for ScrubStacks {
    fn drop(&mut self) {
        scrub_stack();
        rayon::broadcast(|_| scrub_stack());
    }
}

/// The key reader: stages each section on the backend
/// ([`BatchEval::stage`]) and sends it, then the end marker's check, until
/// the receiver goes or a read fails. Spent sections come
/// back on `spent`; each is read into the smallest spent buffer long
/// enough, and a mapped one is unmapped here, off the steps' thread.
/// `drained` is dropped once every section sent back has been dropped.
fn read_ahead<'f>(
    mut keys: KeyReader,
    lens: Vec<(u32, u64)>,
    tx: &mpsc::SyncSender<Result<Staged<'f>, KeyFileError>>,
    spent: mpsc::Receiver<Section>,
    drained: mpsc::Sender<()>,
    fss: &'f dyn BatchEval,
) {
    let mut spares = Spares::default();
    for (step, len) in lens {
        spares.take_back(spent.try_iter().map(Section::into_buffer));
        // A backend with its own memory copies the section there now,
        // while the party runs the steps before it.
        let section = (keys.section_in(step, len, spares.fit(len))).map(|s| Staged::new(fss, s));
        let failed = section.is_err();
        if tx.send(section).is_err() || failed {
            return;
        }
    }
    let _ = tx.send(keys.finish().map(|()| Staged::new(fss, Section::default())));
    // The last close of a spent key file (unlinked at the spend) frees its
    // blocks, and so does the last unmapping of a section of it: seconds
    // for a 2.2 GB MiniLM-128 file on ext4 (docs/BACKENDS.md, fifth and
    // eleventh sessions), which were in every query's online time. So the
    // file closes on a thread of its own, after the end marker has gone to
    // the party; the last sections come back to that thread and are
    // unmapped before the file closes. The party waits for them
    // (`drained`), not for the close.
    // With no thread to spare, the failed spawn drops the closure, and the
    // file closes here: late, but closed.
    let closer = std::thread::Builder::new().name("key-file close".into());
    let _ = closer.spawn(move || {
        spent.iter().for_each(drop);
        drop(drained);
        drop(keys);
    });
}

/// A key section staged on the backend ([`BatchEval::stage`]) for as long
/// as it lives: it is unstaged when given back ([`Staged::release`]) or
/// dropped anywhere (an error, a channel dropped with sections in it), so
/// no staged copy outlives the bytes it was made from, whose memory a later
/// section may reuse.
struct Staged<'f> {
    fss: &'f dyn BatchEval,
    section: Option<Section>,
}

impl<'f> Staged<'f> {
    fn new(fss: &'f dyn BatchEval, section: Section) -> Staged<'f> {
        fss.stage(&section);
        Staged {
            fss,
            section: Some(section),
        }
    }

    /// The section, unstaged.
    fn release(mut self) -> Section {
        let section = self.section.take().unwrap_or_default();
        self.fss.unstage(&section);
        section
    }
}

impl std::ops::Deref for Staged<'_> {
    type Target = Section;

    fn deref(&self) -> &Section {
        // Taken only by `release` and `drop`, which consume the wrapper.
        static EMPTY: std::sync::LazyLock<Section> = std::sync::LazyLock::new(Section::default);
        self.section.as_ref().unwrap_or(&EMPTY)
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if let Some(section) = self.section.take() {
            self.fss.unstage(&section);
        }
    }
}

/// The party's way back to the key reader for spent sections. Dropped
/// on every return of [`run_passes`], errors included, it closes the way
/// and waits until the reader's side has dropped every section sent back
/// (`drained`), so that no spent section outlives the query: a mapped one
/// would keep key bytes in this process's memory.
struct GiveBack {
    to: Option<mpsc::Sender<Section>>,
    drained: mpsc::Receiver<()>,
}

impl GiveBack {
    /// Refused once the reader has ended: the section is then dropped
    /// here (wiped, or unmapped).
    fn send(&self, section: Section) {
        if let Some(to) = &self.to {
            let _ = to.send(section);
        }
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        drop(self.to.take());
        // Ends at once where no closing thread holds the other end.
        let _ = self.drained.recv();
    }
}

/// Lowers the calling thread's priority (Linux: `setpriority` on a thread
/// id applies to that thread alone). The key reader hashes ahead of the
/// steps; when both want a core, the step, whose round the other server
/// waits on, should have it. A refusal is harmless: the reader then just
/// competes as before.
fn yield_to_steps() {
    #[cfg(target_os = "linux")]
    let _ = rustix::process::setpriority_process(None, READER_NICE);
}

/// The key reader's nice value.
#[cfg(target_os = "linux")]
const READER_NICE: i32 = 10;

/// Spent section buffers kept for reuse: at most [`Spares::KEEP`], so
/// that a party holds at most that many beside the ones in flight (the
/// channel's two, the one running, the one being read).
#[derive(Default)]
struct Spares(Vec<Wiped>);

impl Spares {
    const KEEP: usize = 2;

    fn take_back(&mut self, spent: impl Iterator<Item = Wiped>) {
        self.0.extend(spent);
        // Keep the longest: a short buffer is a fresh allocation's worth.
        self.0.sort_by_key(|b| std::cmp::Reverse(b.len()));
        self.0.truncate(Self::KEEP);
    }

    /// The shortest buffer of at least `len` bytes, or an empty one.
    fn fit(&mut self, len: u64) -> Wiped {
        let best = (0..self.0.len())
            .filter(|&i| self.0[i].len() as u64 >= len)
            .min_by_key(|&i| self.0[i].len());
        best.map(|i| self.0.swap_remove(i)).unwrap_or_default()
    }
}

/// Words, not bytes: `zeroize` writes one volatile store per element, so
/// eight bytes a store cost an eighth of the time (the fuzz targets that
/// run a party per input spent 30 % of it here with bytes).
#[inline(never)]
fn scrub_stack() {
    let mut area = [0u64; STACK_SCRUB / 8];
    area.zeroize();
    std::hint::black_box(&mut area);
}

/// Runs the plan pass by pass as `party`: `first` are the first pass's
/// inputs, `io` gives the later ones and takes every pass's output share.
/// Returns the figures.
pub fn run_passes(
    plan: &Plan,
    party: Party,
    keys: KeyReader,
    link: &mut Link,
    fss: &dyn BatchEval,
    first: InputShares,
    io: &mut dyn PassIo,
) -> Result<PartyReport, PartyError> {
    // Dropped last, on every return.
    let _scrub = ScrubStacks;
    let start = Instant::now();
    // Only this run's traffic: not the hellos or the servers' ready round.
    let before = link.traffic();
    let mut store = Store::new(plan);
    set_inputs(plan, &mut store, (plan.inputs.x, plan.inputs.bias), first)?;
    let mut report = PartyReport::starting(party, fss);
    let figures = (before, start, fss);
    let (to, spent) = mpsc::channel::<Section>();
    let (drained_tx, drained) = mpsc::channel::<()>();
    // Dropped after the reader has been joined, on every return.
    let give_back = GiveBack {
        to: Some(to),
        drained,
    };
    let rounds = Rounds::new(link);
    let reader = (keys, key_sections(plan, party), spent, drained_tx);
    let result = run_ops(
        (plan, party, fss),
        reader,
        (&rounds, &give_back),
        (&mut store, &mut report),
        |store, report, pass| pass_done(plan, (store, report), pass, (&rounds, figures), io),
    );
    drop(rounds);
    let finished = result?;
    // The passes that ran: every one, or up to the one after which the
    // client sent no more input.
    let ran = match finished {
        true => plan.passes.len(),
        false => report.traffic_by_pass.len(),
    };
    final_figures(&mut report, plan, (link, before, ran), fss);
    report.online_s = start.elapsed().as_secs_f64();
    if finished {
        let last = plan.passes.len().saturating_sub(1);
        io.output(last, store.take(plan, plan.output)?, &report)?;
    }
    Ok(report)
}

/// The key reader, what it reads and its ways back: the key file, its
/// sections' lengths, the spent sections' channel and the drained signal
/// ([`read_ahead`]).
type Reader = (
    KeyReader,
    Vec<(u32, u64)>,
    mpsc::Receiver<Section>,
    mpsc::Sender<()>,
);

/// Runs the plan's operations while `reader` reads key sections ahead on a
/// thread of its own and the helpers run lanes on theirs; `between` as in
/// [`Run::ops`]. Returns whether every pass ran.
fn run_ops<'f>(
    (plan, party, fss): (&Plan, Party, &'f dyn BatchEval),
    (keys, lens, spent, drained): Reader,
    (rounds, give_back): (&Rounds<'_>, &GiveBack),
    (store, report): (&mut Store, &mut PartyReport),
    between: impl FnMut(&mut Store, &mut PartyReport, usize) -> Result<bool, PartyError>,
) -> Result<bool, PartyError> {
    let (tx, rx) = mpsc::sync_channel::<Result<Staged<'f>, KeyFileError>>(2);
    std::thread::scope(|scope| {
        // The receiver moves into this closure, so an early return drops it
        // and a reader blocked on the full channel wakes and stops, instead
        // of `scope` waiting for it forever.
        let rx = rx;
        scope.spawn(move || {
            yield_to_steps();
            read_ahead(keys, lens, &tx, spent, drained, fss);
            // The section digests hash key bytes in a stack buffer.
            scrub_stack();
        });
        let mut run = Run {
            plan,
            party,
            on: Online::new(party, rounds, 0, fss),
            rounds,
            rx,
            give_back,
            times: Times::new(party),
        };
        let helpers = Helpers::spawn(scope, plan, party, fss, rounds);
        let finished = run.ops(&helpers, store, report, between)?;
        if finished {
            run.end_marker()?;
        }
        for (c, s) in run.times.by_category {
            report.breakdown.entry(c).or_default().online_s = s;
        }
        Ok(finished)
    })
}

/// After pass `pass`: its output share and the figures so far go to `io`,
/// and the next pass's inputs, if `io` has them, into the store (false
/// when it has none: the generation ends). `before` is the link's traffic
/// before the run, `start` its start.
fn pass_done(
    plan: &Plan,
    (store, report): (&mut Store, &mut PartyReport),
    pass: usize,
    (rounds, (before, start, fss)): (&Rounds<'_>, (crate::net::Traffic, Instant, &dyn BatchEval)),
    io: &mut dyn PassIo,
) -> Result<bool, PartyError> {
    let share = store.take(plan, plan.passes[pass].output)?;
    let traffic = rounds.traffic();
    report.rounds = traffic.rounds - before.rounds;
    // This pass's kinds only: the passes before keep theirs.
    let kinds = rounds.with_traffic_by_step(|by_step| pass_traffic(plan, pass, by_step));
    report.traffic_by_pass.truncate(pass);
    report.traffic_by_pass.push(kinds);
    report.comm_bytes = traffic.sent - before.sent;
    device_figures(report, fss);
    report.online_s = start.elapsed().as_secs_f64();
    io.output(pass, share, report)?;
    let Some(next) = io.input(pass + 1)? else {
        return Ok(false);
    };
    let p = &plan.passes[pass + 1];
    set_inputs(plan, store, (p.x, p.bias), next)?;
    Ok(true)
}

/// Moves a pass's input shares into the store (which wipes them in its
/// turn): embeddings and key bias into `x` and `bias`, and a pooling mask
/// into the plan's.
fn set_inputs(
    plan: &Plan,
    store: &mut Store,
    (x, bias): (usize, usize),
    mut shares: InputShares,
) -> Result<(), PartyError> {
    store.set(plan, x, std::mem::take(&mut shares.x))?;
    store.set(plan, bias, std::mem::take(&mut shares.bias))?;
    if let (Some(t), Some(m)) = (plan.inputs.mask, shares.mask.take()) {
        store.set(plan, t, m)?;
    }
    Ok(())
}

/// The figures of the whole run from the link: traffic per category, per
/// kind of step in the passes `pass_done` did not gather (up to `ran`, the
/// passes that ran: the last, when every pass did), and in all, and the
/// device's.
fn final_figures(
    report: &mut PartyReport,
    plan: &Plan,
    (link, before, ran): (&Link, crate::net::Traffic, usize),
    fss: &dyn BatchEval,
) {
    let trace = tracing();
    let by_step = link.traffic_by_step();
    for (op, step) in plan.step_of.iter().enumerate() {
        let Some((step, traffic)) = step.and_then(|s| Some((s, by_step.get(&s)?))) else {
            continue;
        };
        let f = report.breakdown.entry(plan.ops[op].category).or_default();
        f.comm_bytes += traffic.sent;
        f.rounds += traffic.rounds;
        if trace {
            trace_step_traffic(plan, report.party, (op, step), traffic);
        }
    }
    for p in report.traffic_by_pass.len()..ran {
        report.traffic_by_pass.push(pass_traffic(plan, p, by_step));
    }
    let total = link.traffic();
    report.comm_bytes = total.sent - before.sent;
    report.recv_bytes = total.received - before.received;
    report.rounds = total.rounds - before.rounds;
    device_figures(report, fss);
}

/// The link's traffic per step for pass `pass`'s steps, gathered by kind
/// of step ([`step_label`]).
fn pass_traffic(
    plan: &Plan,
    pass: usize,
    by_step: &BTreeMap<u32, crate::net::Traffic>,
) -> BTreeMap<String, StepTraffic> {
    let mut kinds = BTreeMap::new();
    for op in plan.pass_ops(pass) {
        let Some(step) = plan.step_of[op] else {
            continue;
        };
        let t: &mut StepTraffic = kinds.entry(step_label(plan, op)).or_default();
        t.steps += 1;
        if let Some(traffic) = by_step.get(&step) {
            t.rounds += traffic.rounds;
            t.sent += traffic.sent;
        }
    }
    kinds
}

/// A step's kind in the report's traffic: its round label, else its
/// category's name.
fn step_label(plan: &Plan, op: usize) -> String {
    let op = &plan.ops[op];
    op.kind
        .round_label()
        .unwrap_or_else(|| op.category.name().to_owned())
}

/// The device's figures so far.
fn device_figures(report: &mut PartyReport, fss: &dyn BatchEval) {
    report.device_peak_bytes = fss.device_peak_bytes().unwrap_or(0);
    report.device_phases = device_phases(fss);
}

/// Online time per category, and per operation on stderr with
/// `SUFFUSE_TRACE` (for profiling).
struct Times {
    party: Party,
    by_category: BTreeMap<Category, f64>,
    trace: bool,
}

impl Times {
    fn new(party: Party) -> Times {
        Times {
            party,
            by_category: BTreeMap::new(),
            trace: tracing(),
        }
    }

    fn record(&mut self, plan: &Plan, op: usize, took: f64) {
        *self.by_category.entry(plan.ops[op].category).or_default() += took;
        if self.trace {
            trace_op(plan, self.party, op, took);
        }
    }
}

/// One party's run of a plan's operations, with its key sections
/// arriving on `rx` and going back through `give_back`.
struct Run<'r, 'l, 'f> {
    plan: &'r Plan,
    party: Party,
    on: Online<'r>,
    rounds: &'r Rounds<'l>,
    rx: mpsc::Receiver<Result<Staged<'f>, KeyFileError>>,
    give_back: &'r GiveBack,
    times: Times,
}

impl<'f> Run<'_, '_, 'f> {
    /// Runs every operation in order, calling `between(store, report,
    /// pass)` where pass `pass` ends and the next begins; it returns
    /// whether the client goes on. Returns whether every pass ran.
    fn ops(
        &mut self,
        helpers: &Helpers<'f>,
        store: &mut Store,
        report: &mut PartyReport,
        mut between: impl FnMut(&mut Store, &mut PartyReport, usize) -> Result<bool, PartyError>,
    ) -> Result<bool, PartyError> {
        let plan = self.plan;
        let (mut pass, mut i) = (0, 0);
        while i < plan.ops.len() {
            if pass + 1 < plan.passes.len() && plan.passes[pass + 1].first_op == i {
                if !between(store, report, pass)? {
                    return Ok(false);
                }
                pass += 1;
            }
            i = match plan.group_at(i) {
                Some(group) => self.group(group, helpers, store, report)?,
                None => self.op(i, store, report).map(|()| i + 1)?,
            };
        }
        Ok(true)
    }

    /// The end marker: a file with extra sections or bytes is refused.
    /// (After an early stop the rest of the file is never read.)
    fn end_marker(&self) -> Result<(), PartyError> {
        let steps = self.plan.steps() as u32;
        self.rx
            .recv()
            .map_err(|_| PartyError::Reader { step: steps })??;
        Ok(())
    }

    /// A group of lanes; returns the operation after it.
    fn group(
        &mut self,
        group: std::ops::Range<usize>,
        helpers: &Helpers<'f>,
        store: &mut Store,
        report: &mut PartyReport,
    ) -> Result<usize, PartyError> {
        let plan = self.plan;
        let sections = group_sections(plan, group.clone(), &self.rx, report)?;
        let lanes = (&mut self.on, self.rounds, helpers);
        let took = run_group(plan, group.clone(), lanes, sections, store)?;
        for (op, section, s) in took {
            if let Some(section) = section {
                self.give_back.send(section.release());
            }
            self.times.record(plan, op, s);
        }
        Ok(group.end)
    }

    /// Operation `i` outside any group.
    fn op(
        &mut self,
        i: usize,
        store: &mut Store,
        report: &mut PartyReport,
    ) -> Result<(), PartyError> {
        let (plan, t) = (self.plan, Instant::now());
        match plan.step_of[i] {
            Some(step) => {
                let section = self.rx.recv().map_err(|_| PartyError::Reader { step })??;
                if self.times.trace {
                    eprintln!(
                        "P{} step {step}: waited {:.1} ms for {} key bytes",
                        u8::from(self.party == Party::P1),
                        t.elapsed().as_secs_f64() * 1e3,
                        section.len()
                    );
                }
                count_keys(report, plan, i, section.len());
                proto::run(plan, i, &mut self.on, &section, store)?;
                self.give_back.send(section.release());
            }
            None => exec::run_local(plan, i, store, self.party == Party::P0, self.on.fss)?,
        }
        store.release_after(plan, i);
        self.times.record(plan, i, t.elapsed().as_secs_f64());
        Ok(())
    }
}

/// Whether `SUFFUSE_TRACE` asks for the per-operation and per-step
/// lines on stderr.
fn tracing() -> bool {
    std::env::var_os("SUFFUSE_TRACE").is_some()
}

/// " lane N" for an operation in a lane group, else nothing: the trace
/// lines' tag.
fn lane_suffix(plan: &Plan, op: usize) -> String {
    plan.ops[op]
        .lane
        .map_or(String::new(), |l| format!(" lane {}", l.lane))
}

/// One operation's line of `SUFFUSE_TRACE` (a lane's operations are
/// timed on their own threads and overlap).
fn trace_op(plan: &Plan, party: Party, i: usize, took: f64) {
    let op = &plan.ops[i];
    let out = &plan.tensors[op.kind.output()];
    let lane = lane_suffix(plan, i);
    let keys = op
        .kind
        .key_label()
        .map_or(String::new(), |l| format!(" [{l}]"));
    eprintln!(
        "P{} op {i:4} {:>9.3} ms  {:<16} {:<40} {}{lane}{keys}",
        u8::from(party == Party::P1),
        took * 1e3,
        op.category.name(),
        out.name,
        serde_json::to_string(&op.kind)
            .unwrap_or_default()
            .chars()
            .take(60)
            .collect::<String>()
    );
}

/// A step's rounds and bytes sent, one line of `SUFFUSE_TRACE` at the
/// end of a run. A round that lanes share is one frame, counted under the
/// step of the first lane that sent in it (`lanes`), so a group's other
/// steps show only the rounds they had alone.
fn trace_step_traffic(
    plan: &Plan,
    party: u8,
    (op, step): (usize, u32),
    traffic: &crate::net::Traffic,
) {
    let out = &plan.tensors[plan.ops[op].kind.output()];
    let lane = lane_suffix(plan, op);
    eprintln!(
        "P{party} traffic: step {step:5} op {op:5} rounds {:3} sent {:>10}  {:<16} {}{lane}",
        traffic.rounds,
        traffic.sent,
        plan.ops[op].category.name(),
        out.name
    );
}

/// The key sections of a group's steps, in plan order, counted in the
/// report.
fn group_sections<'f>(
    plan: &Plan,
    group: std::ops::Range<usize>,
    rx: &mpsc::Receiver<Result<Staged<'f>, KeyFileError>>,
    report: &mut PartyReport,
) -> Result<Vec<(usize, Staged<'f>)>, PartyError> {
    let mut sections = Vec::new();
    for op in group {
        if let Some(step) = plan.step_of[op] {
            let section = rx.recv().map_err(|_| PartyError::Reader { step })??;
            count_keys(report, plan, op, section.len());
            sections.push((op, section));
        }
    }
    Ok(sections)
}

/// Counts a step's key section in the report.
fn count_keys(report: &mut PartyReport, plan: &Plan, op: usize, len: usize) {
    report.key_bytes += len as u64;
    let entry = report.breakdown.entry(plan.ops[op].category).or_default();
    entry.key_bytes += len as u64;
    let kind = &plan.ops[op].kind;
    if let Some(label) = kind.key_label() {
        let gate = report.by_gate.entry(label).or_default();
        gate.elements += plan.tensors[kind.output()].len() as u64;
        gate.key_bytes += len as u64;
    }
}

/// One lane of a group: its operations, its store (the party's own for
/// lane 0; for the others, copies of their inputs) and its steps'
/// sections.
struct LaneWork<'f> {
    lane: usize,
    ops: Vec<usize>,
    store: Store,
    sections: Vec<(usize, Staged<'f>)>,
}

/// Per operation of a lane: its section (to give back) and its wall time.
type Took<'f> = Vec<(usize, Option<Staged<'f>>, f64)>;

/// What a helper hands back: the lane's store and what it took.
type LaneDone<'f> = Result<(Store, Took<'f>), PartyError>;

/// The threads that run lanes 1.. of every group (lane 0 runs on the
/// party's thread), one per lane, spawned once per query: a thread per
/// group cost about 130 µs with its stack scrub on a 2-vCPU VM. Each
/// overwrites its stack when the query ends, as the party's threads do.
struct Helpers<'f> {
    jobs: Vec<mpsc::Sender<LaneWork<'f>>>,
    done: Vec<mpsc::Receiver<LaneDone<'f>>>,
}

impl<'f> Helpers<'f> {
    fn spawn<'s>(
        scope: &'s std::thread::Scope<'s, '_>,
        plan: &'s Plan,
        party: Party,
        fss: &'f dyn BatchEval,
        rounds: &'s Rounds<'_>,
    ) -> Helpers<'f>
    where
        'f: 's,
    {
        let lanes = plan
            .ops
            .iter()
            .filter_map(|op| op.lane)
            .map(|l| usize::from(l.lane))
            .max()
            .unwrap_or(0);
        let (mut jobs, mut done) = (Vec::new(), Vec::new());
        for _ in 0..lanes {
            let (job_tx, job_rx) = mpsc::channel::<LaneWork<'f>>();
            let (done_tx, done_rx) = mpsc::channel();
            scope.spawn(move || {
                let mut on = Online::new(party, rounds, 0, fss);
                for work in job_rx {
                    on.set_lane(work.lane);
                    let out = run_lane(plan, &mut on, rounds, work);
                    if done_tx.send(out).is_err() {
                        break;
                    }
                }
                drop(on);
                // The lanes' steps held key material on this stack.
                scrub_stack();
            });
            jobs.push(job_tx);
            done.push(done_rx);
        }
        Helpers { jobs, done }
    }
}

/// Runs the group of lanes `group` (see [`crate::lanes`]) with its steps'
/// `sections` (in plan order): lane 0 here on the party's store, the
/// others on the helpers with copies of their inputs, their rounds shared;
/// then moves the lanes' outputs into `store`. Returns per operation its
/// section and its wall time (the lanes' times overlap).
fn run_group<'f>(
    plan: &Plan,
    group: std::ops::Range<usize>,
    (on, rounds, helpers): (&mut Online<'_>, &Rounds<'_>, &Helpers<'f>),
    sections: Vec<(usize, Staged<'f>)>,
    store: &mut Store,
) -> Result<Took<'f>, PartyError> {
    let step = plan.step_of[group.start].unwrap_or(u32::MAX);
    let works = lane_works(plan, group.clone(), sections, store, helpers.jobs.len() + 1)?;
    let count = works.len();
    rounds.begin(count);
    let mut works = works.into_iter();
    let mine = works.next();
    for (work, jobs) in works.zip(&helpers.jobs) {
        // A helper that ended (it panicked) would never take its turns.
        if jobs.send(work).is_err() {
            rounds.fail();
        }
    }
    // Lane 0 on the party's own store.
    let here = match mine {
        Some(mut work) => {
            std::mem::swap(&mut work.store, store);
            let out = run_lane(plan, on, rounds, work);
            match out {
                Ok((own, took)) => {
                    *store = own;
                    Ok(took)
                }
                Err(e) => Err(e),
            }
        }
        None => Ok(Vec::new()),
    };
    let theirs: Vec<LaneDone<'f>> = helpers.done[..count.saturating_sub(1)]
        .iter()
        .map(|done| done.recv().unwrap_or(Err(ProtoError::Lane { step }.into())))
        .collect();
    // A lane that failed has stopped the rounds; its error says why.
    rounds.end();
    let lanes = std::iter::once(here.map(|t| (Store::new(plan), t))).chain(theirs);
    let took = absorb_lanes(plan, lanes, store)?;
    for i in group {
        store.release_after(plan, i);
    }
    Ok(took)
}

/// The group's work per lane (at most `most` lanes): lane 0 on a fresh
/// store (the party's own is swapped in when it runs), the others on
/// copies of their inputs from `store`, each with its steps' sections.
fn lane_works<'f>(
    plan: &Plan,
    group: std::ops::Range<usize>,
    sections: Vec<(usize, Staged<'f>)>,
    store: &Store,
    most: usize,
) -> Result<Vec<LaneWork<'f>>, PartyError> {
    let lane_of = |i: usize| plan.ops[i].lane.map_or(0, |l| usize::from(l.lane));
    let count = group.clone().map(|i| lane_of(i) + 1).max().unwrap_or(0);
    if count > most {
        return Err(ProtoError::Section {
            step: plan.step_of[group.start].unwrap_or(u32::MAX),
            what: "more lanes than the plan's widest group",
        }
        .into());
    }
    let mut works = Vec::with_capacity(count);
    for lane in 0..count {
        let ops: Vec<usize> = group.clone().filter(|i| lane_of(*i) == lane).collect();
        let lane_store = if lane == 0 {
            Store::new(plan)
        } else {
            store.for_ops(plan, &ops)?
        };
        works.push(LaneWork {
            lane,
            ops,
            store: lane_store,
            sections: Vec::new(),
        });
    }
    for (op, section) in sections {
        works[lane_of(op)].sections.push((op, section));
    }
    Ok(works)
}

/// Moves every finished lane's outputs into `store` and returns their
/// operations' times. The first cause wins: a lane's own failure, else
/// what stopped the rounds.
fn absorb_lanes<'f>(
    plan: &Plan,
    lanes: impl Iterator<Item = LaneDone<'f>>,
    store: &mut Store,
) -> Result<Took<'f>, PartyError> {
    let mut stopped = None;
    let mut took = Vec::new();
    for out in lanes {
        match out {
            Ok((lane_store, times)) => {
                let outputs: Vec<usize> = times
                    .iter()
                    .flat_map(|(i, _, _)| plan.ops[*i].kind.outputs())
                    .collect();
                store.absorb(lane_store, &outputs);
                took.extend(times);
            }
            Err(e @ PartyError::Proto(ProtoError::Lane { .. })) => stopped = Some(e),
            Err(e) => return Err(e),
        }
    }
    match stopped {
        Some(e) => Err(e),
        None => Ok(took),
    }
}

/// Runs one lane's operations in order as `on`'s lane, then tells
/// `rounds` it is done; on a failure, stops the group's rounds.
fn run_lane<'f>(
    plan: &Plan,
    on: &mut Online<'_>,
    rounds: &Rounds<'_>,
    work: LaneWork<'f>,
) -> LaneDone<'f> {
    let LaneWork {
        lane,
        ops,
        mut store,
        mut sections,
    } = work;
    // Stops the group's rounds unless the lane ends well, a panic
    // included: the other lanes would wait for its turns.
    let mut guard = StopUnlessDone(rounds, false);
    let out = lane_ops(plan, on, &ops, &mut store, &mut sections);
    let step = ops
        .last()
        .and_then(|i| plan.step_of[*i])
        .unwrap_or(u32::MAX);
    let out = out.and_then(|took| match rounds.done(lane) {
        Ok(()) => Ok(took),
        Err(lanes::LaneError::Net(error)) => Err(ProtoError::Net { step, error }.into()),
        Err(lanes::LaneError::Stopped) => Err(ProtoError::Lane { step }.into()),
    });
    guard.1 = out.is_ok();
    out.map(|took| (store, took))
}

/// Stops a group's rounds when dropped unarmed (see [`run_lane`]).
struct StopUnlessDone<'a, 'l>(&'a Rounds<'l>, bool);

impl Drop for StopUnlessDone<'_, '_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fail();
        }
    }
}

/// A lane's operations in order on its store.
fn lane_ops<'f>(
    plan: &Plan,
    on: &mut Online<'_>,
    ops: &[usize],
    store: &mut Store,
    sections: &mut Vec<(usize, Staged<'f>)>,
) -> Result<Took<'f>, PartyError> {
    let mut took = Vec::with_capacity(ops.len());
    for &i in ops {
        let t = Instant::now();
        let section = match plan.step_of[i] {
            Some(step) => {
                let at = sections.iter().position(|(op, _)| *op == i);
                let (_, section) =
                    at.map(|a| sections.swap_remove(a))
                        .ok_or(ProtoError::Section {
                            step,
                            what: "missing from its group",
                        })?;
                proto::run(plan, i, on, &section, store)?;
                Some(section)
            }
            None => {
                exec::run_local(plan, i, store, on.party == Party::P0, on.fss)?;
                None
            }
        };
        store.release_after(plan, i);
        took.push((i, section, t.elapsed().as_secs_f64()));
    }
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::net::{Peer, Timeouts};
    use crate::{backend, fuzzing};

    /// Echoes `left` answers, then closes the link; notes whether the key
    /// file at `path` was mapped at any answer.
    struct EchoFor {
        left: usize,
        path: String,
        saw_mapped: Arc<AtomicBool>,
    }

    impl Peer for EchoFor {
        fn answer(&mut self, written: &[u8]) -> Vec<u8> {
            if mapped(&self.path) {
                self.saw_mapped.store(true, Ordering::Relaxed);
            }
            self.left = self.left.saturating_sub(1);
            if self.left == 0 {
                Vec::new()
            } else {
                written.to_vec()
            }
        }
    }

    /// Refuses the output.
    struct Refuses;

    impl PassIo for Refuses {
        fn input(&mut self, _: usize) -> Result<Option<InputShares>, PartyError> {
            Ok(None)
        }

        fn output(&mut self, _: usize, _: Vec<u64>, _: &PartyReport) -> Result<(), PartyError> {
            Err(PartyError::Client("refused".into()))
        }
    }

    /// A peer that goes away at any round, inside a group of lanes too,
    /// is an error for the whole query, not a hang; every group's rounds
    /// are shared (the full run takes fewer rounds than its steps).
    #[test]
    fn a_peer_gone_in_any_round_is_an_error_not_a_hang() {
        let plan = fuzzing::plan();
        assert!((0..plan.ops.len()).any(|i| plan.group_at(i).is_some()));
        let run = |left: usize| {
            let name = std::path::Path::new("p0.keys");
            let keys = KeyReader::from_bytes(name, fuzzing::key_file(0).to_vec()).unwrap();
            keys.check(0, &plan.hash, &key_sections(&plan, Party::P0))
                .unwrap();
            let peer = EchoFor {
                left,
                path: String::from("/nowhere"),
                saw_mapped: Arc::new(AtomicBool::new(false)),
            };
            let mut link = Link::in_memory(Box::new(peer), Timeouts::default());
            let inputs = fuzzing::inputs(&plan);
            let out = run_passes(
                &plan,
                Party::P0,
                keys,
                &mut link,
                backend::auto(),
                inputs,
                &mut Refuses,
            );
            (out, link.traffic().rounds)
        };
        // To the end: the client refuses the output.
        let (out, rounds) = run(usize::MAX);
        assert!(matches!(out, Err(PartyError::Client(_))));
        for left in 1..rounds as usize {
            let (out, _) = run(left);
            assert!(
                matches!(out, Err(PartyError::Proto(ProtoError::Net { .. }))),
                "peer gone after {left} of {rounds} rounds: {out:?}"
            );
        }
    }

    fn mapped(path: &str) -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|l| l.contains(path))
    }

    /// Whether a query fails at a step's round (the peer closes while the
    /// reader still reads) or at the output's delivery (every section
    /// read and given back), no mapped section outlives it. As a control,
    /// the peer sees the key file mapped during the rounds, so the check
    /// does see mappings.
    #[test]
    fn no_mapped_section_outlives_a_failed_query() {
        let dir = std::env::temp_dir().join(format!("suffuse-unmapped-{}", std::process::id()));
        crate::private::private_dir(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, fuzzing::key_file(0)).unwrap();
        let path = file.to_str().unwrap();
        let plan = fuzzing::plan();
        for rounds in [1, 3, usize::MAX] {
            let keys = KeyReader::open(&file).unwrap().mapping_from(1);
            keys.check(0, &plan.hash, &key_sections(&plan, Party::P0))
                .unwrap();
            let saw_mapped = Arc::new(AtomicBool::new(false));
            let peer = EchoFor {
                left: rounds,
                path: path.to_owned(),
                saw_mapped: Arc::clone(&saw_mapped),
            };
            let mut link = Link::in_memory(Box::new(peer), Timeouts::default());
            let inputs = fuzzing::inputs(&plan);
            let fss = backend::auto();
            let run = run_passes(&plan, Party::P0, keys, &mut link, fss, inputs, &mut Refuses);
            assert!(run.is_err(), "{rounds} rounds");
            assert!(
                !mapped(path),
                "{path} is still mapped after {rounds} rounds"
            );
            assert!(saw_mapped.load(Ordering::Relaxed), "{rounds} rounds");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn spares_keep_the_longest_and_fit_the_shortest_long_enough() {
        let mut spares = Spares::default();
        spares.take_back(
            [10, 40, 20, 30]
                .into_iter()
                .map(|len| Wiped(vec![0u8; len])),
        );
        // The two longest (40, 30) stay; 10 and 20 were freed.
        let mut lens: Vec<usize> = spares.0.iter().map(|b| b.len()).collect();
        lens.sort_unstable();
        assert_eq!(lens, [30, 40]);
        assert_eq!(spares.fit(25).len(), 30);
        assert_eq!(
            spares.fit(41).len(),
            0,
            "none fits: a new buffer is read into"
        );
        assert_eq!(spares.fit(0).len(), 40);
        assert!(spares.0.is_empty());
    }
}
