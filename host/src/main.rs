//! `suffuse`: private transformer inference on two non-colluding servers.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use suffuse_core::fss::Party;
use suffuse_host::backend::{self, Choice};
use suffuse_host::client;
use suffuse_host::dealer;
use suffuse_host::gateway::{self, Gateway, GatewayOptions, Route, text};
use suffuse_host::generate::{self, Sampling};
use suffuse_host::keyfile::KeyReader;
use suffuse_host::ledger::{Ledger, LedgerError};
use suffuse_host::metrics::{self, ServerMetrics};
use suffuse_host::model::chat::ChatTemplate;
use suffuse_host::model::gguf::{self, Gguf};
use suffuse_host::model::{Decoder, Model, Transformer};
use suffuse_host::net::{Listener, Role, Security, Timeouts, TlsConfig, make_certs};
use suffuse_host::plan::{self, Shape, bert, hex};
use suffuse_host::pool::{self, Pool};
use suffuse_host::report::{Figures, Report, bytes, cosine};
use suffuse_host::server::{self, ServeOptions};
use suffuse_host::service::{self, ServiceOptions};
use suffuse_host::session::{self, Options};

// The party allocates and frees tensors and key buffers of tens of MiB per
// step; glibc returns each to the kernel and faults it back in on the next
// step, which cost about a sixth of the online time. mimalloc keeps them.
// Every block is wiped as it is freed (see `Wiping`).
#[global_allocator]
static ALLOCATOR: Wiping<mimalloc::MiMalloc> = Wiping(mimalloc::MiMalloc);

/// An allocator that zeroes each block before its inner allocator gets it
/// back. Buffers this code does not own hold secrets too: rustls keeps
/// decrypted records (a client's whole input share) in buffers it frees
/// unwiped, and a growing `Vec` leaves its old block behind. The memory
/// scan (`host/tests/memscan.rs`) found a TLS server's entire input share
/// in freed memory after its query; with this, none.
struct Wiping<A>(A);

/// Zeroes `n` bytes at `p`; the pointer escapes afterwards, so the stores
/// cannot be dropped as dead.
///
/// # Safety
/// `p` must be valid for writes of `n` bytes.
#[allow(unsafe_code)]
unsafe fn wipe(p: *mut u8, n: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_bytes(p, 0, n) };
    std::hint::black_box(p);
}

// SAFETY: every block comes from the inner allocator with the caller's
// layout and goes back to it with the same layout; `realloc` is alloc,
// copy, dealloc, which `GlobalAlloc` allows.
#[allow(unsafe_code)]
unsafe impl<A: std::alloc::GlobalAlloc> std::alloc::GlobalAlloc for Wiping<A> {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `p` is a live block of `layout.size()` bytes, freed next.
        unsafe {
            wipe(p, layout.size());
            self.0.dealloc(p, layout);
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // Never let the inner allocator move a block and free the old one
        // unwiped: always a fresh block, the old one wiped and freed.
        // SAFETY: `new` is non-zero and, rounded to the alignment, fits in
        // `isize` (the caller's contract for `realloc`); both blocks are
        // live for the sizes copied.
        unsafe {
            let to = std::alloc::Layout::from_size_align_unchecked(new, layout.align());
            let q = self.0.alloc(to);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, layout.size().min(new));
                self.dealloc(p, layout);
            }
            q
        }
    }
}

/// mimalloc's `mi_option_purge_delay`: its place in `mi_option_t`, which
/// mimalloc keeps stable (retired options stay as `deprecated_` entries).
/// `libmimalloc-sys` 0.1.49 names no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc never to give freed memory back to the kernel. With its
/// default (mimalloc 3: purge 1000 ms after a free, ten times that in
/// arenas) the tens of MiB that each step of a query frees and allocates
/// again (key sections, gate keys, scratch) still went back and were
/// faulted in again, every page zeroed by the kernel: 123,217 page faults
/// and 13 % of the online phase's CPU samples on MiniLM-128 (2 cores),
/// against 1,617 faults with this. `suffuse embed` at MiniLM-128 (dealer
/// and both servers in one process, three alternating runs each): online
/// 5.29–5.49 s without, 4.91–5.10 s with; peak RSS 1.23–1.25 GB without,
/// 1.26–1.30 GB with, as a process now keeps its peak. Freed blocks are
/// wiped either way (`Wiping`).
#[allow(unsafe_code)]
fn keep_freed_memory() {
    // SAFETY: sets an integer option; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// While a plan is built, mimalloc gives freed memory back at once: the
/// planner's transient buffers (a layer's weights as f64 for its bounds,
/// and the like) would otherwise stay resident for the life of the
/// process. A Qwen2.5-Coder-0.5B server (bucket 64, 16 passes) kept its
/// 12.3 GB planning peak, where the plan and model need 7.0 GB, so two
/// servers and a client did not fit in 24 GB. The online phase, which
/// starts after its plan is built, keeps its memory as before.
#[allow(unsafe_code)]
fn give_back_while_planning() {
    // SAFETY: sets an integer option; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

/// After a plan is built: what is free goes back now, then memory is kept.
#[allow(unsafe_code)]
fn keep_after_planning() {
    // SAFETY: collects this thread's heap and the arenas' free memory.
    unsafe { libmimalloc_sys::mi_collect(true) };
    keep_freed_memory();
}

const ABOUT: &str = "\
Private transformer inference with function secret sharing.

A client secret-shares its input between two servers that do not collude.
They run a public model on the shares and return shares of the output, which
only the client can put together. Neither server sees the text, the
activations or the embedding. A dealer prepares one-time keys beforehand.

Start with `suffuse demo`: it runs everything on this machine with a small
built-in model. `suffuse embed` does the same with a real Hugging Face
checkpoint. `suffuse dealer`, `suffuse serve` and `suffuse query` are the
same computation as separate processes (see the README's walkthrough).";

/// The longest duration any flag takes, in seconds (a day): larger values
/// overflowed deadlines (issue 27).
const MAX_SECONDS: u64 = 86_400;

/// Queries a pool server serves at once, at most.
const MAX_CONCURRENT: u64 = 1024;

/// Requests a gateway lets wait, at most.
const MAX_QUEUE: u64 = 1 << 16;

/// Tokens a generation may ask for, at most.
const MAX_NEW_TOKENS: u64 = 1 << 16;

/// A duration flag in seconds: 1 s to a day.
fn seconds() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=MAX_SECONDS)
}

/// A count flag in `low..=high`.
fn count_in(low: u64, high: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(low..=high)
}

#[derive(Parser, Debug)]
#[command(name = "suffuse", version, about = ABOUT, long_about = ABOUT)]
struct Cli {
    /// Where the heavy operations run (FSS evaluation, key generation,
    /// matrix products); `auto` picks the fastest available here. Recorded
    /// in the report.
    #[arg(long, global = true, value_enum, default_value_t = Choice::Auto)]
    backend: Choice,
    /// Device memory the CUDA backend may hold, in MiB (default: 80 % of
    /// what the device has free). Calls larger than it run in pieces.
    #[arg(long, global = true, value_name = "MIB", value_parser = clap::value_parser!(u64).range(16..=1 << 24))]
    device_memory: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs dealer, both servers and the client on this machine (loopback
    /// TCP) with the built-in model; checks the secure output against the
    /// fixed-point reference bit for bit and against the float model.
    Demo {
        #[command(flatten)]
        out: Output,
    },
    /// Private sentence embeddings with a real checkpoint, all on this
    /// machine: prints one JSON line per text and the report on stderr.
    Embed {
        /// A Hugging Face model folder (config.json, model.safetensors,
        /// tokenizer.json), or a built-in model: `demo`, or
        /// `generated-bert-base` / `generated-minilm` (random weights in
        /// those architectures' shapes, for measuring cost).
        #[arg(long)]
        model: String,
        /// Truncate each text to this many tokens (CLS and SEP
        /// included), like sentence-transformers' max_seq_length. Default:
        /// the model's limit.
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Also print each embedding's cosine to the float model.
        #[arg(long, value_enum)]
        compare: Option<Compare>,
        /// Keep the key files in this folder (default: a temporary folder,
        /// removed afterwards).
        #[arg(long)]
        keys_dir: Option<PathBuf>,
        #[command(flatten)]
        out: Output,
        /// The texts.
        #[arg(required = true)]
        texts: Vec<String>,
    },
    /// Deals the one-time keys of both servers for sentences of up to
    /// `--seq` tokens: writes OUT/p0.keys and OUT/p1.keys.
    Dealer(DealerArgs),
    /// Runs one server: for one query with --keys, then exits (keys are
    /// one-time); with --keys-dir, for many queries from a key pool until
    /// SIGTERM or SIGINT.
    Serve(ServeArgs),
    /// Sends texts to two running servers and prints their embeddings.
    Query(QueryArgs),
    /// Private text generation with a decoder, all on this machine: the
    /// tokens stream to stdout, the report goes to stderr.
    Generate(GenerateArgs),
    /// An OpenAI-compatible HTTP API on the client's side: each request
    /// becomes a secure query to two servers (docs/GATEWAY.md).
    Gateway(GatewayArgs),
    /// Makes a CA and one certificate per role (p0, p1, client) in OUT, for
    /// `--tls OUT`; copy ca.pem and each role's .pem and .key to that
    /// role's machine only.
    Certs {
        /// Output folder (created 0700; must not hold certificates yet).
        #[arg(long)]
        out: PathBuf,
        /// Days the certificates are valid, from now (a day earlier, for
        /// clock skew). Rotate before they expire (docs/DEPLOY.md).
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36_500))]
        valid_days: u32,
    },
    /// Prints a key file's header, plan hash and section sizes, and
    /// whether this machine's ledger has it spent.
    Inspect {
        /// The key file.
        keyfile: PathBuf,
        #[command(flatten)]
        state: State,
    },
}

/// `suffuse dealer`'s arguments.
#[derive(clap::Args, Debug)]
struct DealerArgs {
    /// Model folder, or a built-in model (see `embed --help`).
    #[arg(long)]
    model: String,
    /// Tokens per sentence (CLS and SEP included); shorter
    /// sentences are padded (the servers do not learn by how much).
    #[arg(long)]
    seq: usize,
    /// Sentences per query.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// A decoder: deal for generating up to this many tokens (the
    /// prefill and K − 1 decode passes); `--seq` is then the prompt
    /// bucket.
    #[arg(long, value_parser = count_in(1, MAX_NEW_TOKENS))]
    max_new_tokens: Option<usize>,
    /// Output folder (OUT/p0.keys and OUT/p1.keys; with --count or
    /// --keep-pool, a key pool: one folder per set, named by its id).
    #[arg(long)]
    out: PathBuf,
    /// Deal this many key sets into the key pool OUT, for `serve
    /// --keys-dir`.
    #[arg(long)]
    count: Option<usize>,
    /// After --count, keep dealing whenever the pool OUT holds fewer
    /// than M unspent sets, until SIGTERM or SIGINT.
    #[arg(long, value_name = "M")]
    keep_pool: Option<usize>,
    /// Write the dealer's figures as JSON to this file.
    #[arg(long)]
    report_json: Option<PathBuf>,
}

/// `suffuse serve`'s arguments.
#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// 0 or 1.
    #[arg(long)]
    party: u8,
    /// Model folder, or a built-in model (see `embed --help`).
    #[arg(long)]
    model: String,
    /// This server's key file from `suffuse dealer`.
    #[arg(
        long,
        required_unless_present = "keys_dir",
        conflicts_with = "keys_dir"
    )]
    keys: Option<PathBuf>,
    /// A key pool from `suffuse dealer --count`: serve queries, one
    /// unspent set each, until SIGTERM or SIGINT.
    #[arg(long)]
    keys_dir: Option<PathBuf>,
    /// With --keys-dir: queries served at once (P1 keeps this many links
    /// to P0; give both servers the same).
    #[arg(long, default_value_t = 4, value_parser = count_in(1, MAX_CONCURRENT))]
    max_concurrent: usize,
    /// With --keys-dir, at P0: of those, at most this many for one
    /// client address (default: half, rounded up), so that one client
    /// cannot hold every slot. Raise it for a gateway that queries on
    /// behalf of many users.
    #[arg(long, value_parser = count_in(1, MAX_CONCURRENT))]
    max_per_client: Option<usize>,
    /// With --keys-dir: seconds that queries in flight get to finish
    /// after SIGTERM.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=MAX_SECONDS))]
    drain: u64,
    /// Address to listen on, e.g. 127.0.0.1:7000.
    #[arg(long)]
    listen: String,
    /// Party 0's listening address (party 1 connects to it; party 0
    /// ignores it).
    #[arg(long)]
    peer: String,
    /// Seconds to wait for the peer and the client (in all), and for
    /// each message, before giving up.
    #[arg(long, default_value_t = 120, value_parser = seconds())]
    timeout: u64,
    /// Write this server's figures as JSON to this file.
    #[arg(long)]
    report_json: Option<PathBuf>,
    #[command(flatten)]
    state: State,
    #[command(flatten)]
    transport: Transport,
    /// Keep the key file on disk once spent (it is deleted otherwise;
    /// the ledger refuses it either way).
    #[arg(long)]
    keep_spent: bool,
    /// With --keys-dir: serve Prometheus metrics, liveness and readiness
    /// at http://ADDR/metrics, /livez and /readyz (e.g. 127.0.0.1:9100).
    #[arg(long, value_name = "ADDR", requires = "keys_dir")]
    metrics: Option<String>,
}

/// `suffuse gateway`'s arguments.
#[derive(clap::Args, Debug)]
struct GatewayArgs {
    /// A model to offer, as `query --model` takes it; repeat it for more
    /// models, each followed by its --servers. Clients name it by the
    /// model's name (a built-in's name, a folder's or file's name).
    #[arg(long, required = true)]
    model: Vec<String>,
    /// The two servers of the --model in the same place, ADDR0,ADDR1.
    #[arg(long, required = true)]
    servers: Vec<String>,
    /// Address to listen on. Loopback by default: whoever reaches the
    /// gateway queries the servers with this client's certificate.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Seconds for meeting both servers, and for each message from them
    /// (a pass's logits come after the servers' whole pass).
    #[arg(long, default_value_t = 600, value_parser = seconds())]
    timeout: u64,
    /// Queries run at once (each holds a key set of the servers' pool).
    #[arg(long, default_value_t = 1, value_parser = count_in(1, MAX_CONCURRENT))]
    max_concurrent: usize,
    /// Requests that may wait for a turn; beyond them the answer is 429.
    #[arg(long, default_value_t = 16, value_parser = count_in(0, MAX_QUEUE))]
    queue: usize,
    /// Texts per embedding query: the `--batch` the encoder's keys were
    /// dealt for.
    #[arg(long, default_value_t = 1, value_parser = count_in(1, MAX_CONCURRENT))]
    batch: usize,
    #[command(flatten)]
    transport: Transport,
}

/// `suffuse query`'s arguments.
#[derive(clap::Args, Debug)]
struct QueryArgs {
    /// Model folder, or a built-in model (the client embeds and tokenizes
    /// locally).
    #[arg(long)]
    model: String,
    /// The two servers, ADDR0,ADDR1 (party 0 first).
    #[arg(long)]
    servers: String,
    /// Also print each embedding's cosine to the float model.
    #[arg(long, value_enum)]
    compare: Option<Compare>,
    /// Seconds for meeting both servers, in all (connections, TLS
    /// handshakes, hellos, P0 then P1): a server that stalls there ends
    /// the query within this. Then each message from a server gets as
    /// long again, so a stalled query ends within it too.
    #[arg(long, default_value_t = 120, value_parser = seconds())]
    timeout: u64,
    /// Sentences the servers' keys must be dealt for (default: the
    /// number of texts); a server announcing another shape is refused.
    #[arg(long)]
    batch: Option<usize>,
    /// Tokens per sentence the servers' keys must be dealt for (default:
    /// any up to the model's limit).
    #[arg(long)]
    seq: Option<usize>,
    #[command(flatten)]
    transport: Transport,
    /// Generate text from the prompt with a decoder whose keys the
    /// servers hold (instead of embedding texts).
    #[arg(long)]
    generate: bool,
    /// With --generate: wrap the prompt in the model's chat template.
    #[arg(long, requires = "generate")]
    chat: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    out: Output,
    /// The texts (with --generate: the prompt).
    #[arg(required = true)]
    texts: Vec<String>,
}

/// `suffuse generate`'s arguments.
#[derive(clap::Args, Debug)]
struct GenerateArgs {
    /// A GGUF file of a Llama-architecture model, or a folder holding
    /// one (tokenizer and chat template from its metadata), or a
    /// built-in decoder: `tiny-llama`, `tiny-gpt2` or `generated-gpt2`
    /// (GPT-2-small's shape, random weights).
    #[arg(long)]
    model: String,
    /// Wrap the prompt in the model's chat template as a user message
    /// (special tokens written in the prompt are recognised either way);
    /// a model with none, such as the built-in ones, gets `user: PROMPT`
    /// and `assistant:` on the next line, as the gateway gives it.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most (fewer when the model ends the
    /// text).
    #[arg(long, default_value_t = 32, value_parser = count_in(1, MAX_NEW_TOKENS))]
    max_new_tokens: usize,
    /// The prompt bucket to deal for (default: the next power of two
    /// from 8 on); the servers learn it, not the prompt's length.
    #[arg(long)]
    seq: Option<usize>,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Keep the key files in this folder.
    #[arg(long)]
    keys_dir: Option<PathBuf>,
    /// Seconds each party waits for any one message before giving up.
    /// The client's wait for a pass's logits spans the servers' whole
    /// pass (a SmolLM2 prefill of 128 tokens takes minutes on 2
    /// cores), so the default is generous; every party runs here.
    #[arg(long, default_value_t = 600, value_parser = seconds())]
    timeout: u64,
    #[command(flatten)]
    out: Output,
    /// The prompt.
    prompt: String,
}

#[derive(clap::Args, Debug)]
struct Transport {
    /// Mutual TLS with the certificates in this folder (from `suffuse
    /// certs`): ca.pem and this role's p0, p1 or client .pem and .key.
    #[arg(long, required_unless_present = "insecure_transport")]
    tls: Option<PathBuf>,
    /// Plain TCP, unauthenticated and unencrypted: for a private test
    /// network only. Every party must say so (a TLS party and a plain one
    /// cannot talk).
    #[arg(long, conflicts_with = "tls")]
    insecure_transport: bool,
}

impl Transport {
    fn security(&self, role: Role) -> Result<Security> {
        match &self.tls {
            Some(dir) => Ok(Security::Tls(Arc::new(
                TlsConfig::load(dir, role)
                    .with_context(|| format!("loading {role}'s TLS identity"))?,
            ))),
            None => Ok(Security::Insecure),
        }
    }
}

#[derive(clap::Args, Debug)]
struct State {
    /// The server's state folder, where the ledger of spent key sets lives
    /// (default: $XDG_STATE_HOME/suffuse, else ~/.local/state/suffuse).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

impl State {
    fn ledger(&self) -> Result<Ledger> {
        let dir = match &self.state_dir {
            Some(d) => d.clone(),
            None => Ledger::default_dir()
                .context("no --state-dir, and neither XDG_STATE_HOME nor HOME is set")?,
        };
        Ok(Ledger::open(&dir)?)
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Compare {
    /// The f32 model.
    Float,
}

#[derive(clap::Args, Debug)]
struct SamplingArgs {
    /// Sampling temperature; 0 (the default) is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample from the smallest set of tokens with this much probability.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    fn get(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

#[derive(clap::Args, Debug)]
struct Output {
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Write the report as JSON to this file.
    #[arg(long)]
    report_json: Option<PathBuf>,
}

fn main() -> ExitCode {
    if suffuse_core::PLANTED_LEAKS {
        eprintln!(
            "suffuse: error: built with suffuse-core's test-only `ct-planted` feature, \
             which leaks secrets on purpose; rebuild without it"
        );
        return ExitCode::FAILURE;
    }
    // `Wiping` zeroes every freed block, so secret buffers need no pass of
    // their own before they are freed.
    suffuse_host::wipe::allocator_wipes_freed_blocks();
    keep_freed_memory();
    suffuse_host::plan::around_builds(give_back_while_planning, keep_after_planning);
    no_core_dumps();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // An error may quote a peer (an abort reason): printable only.
            let text = suffuse_host::logline::printable(&format!("{e:#}"));
            eprintln!("suffuse: error: {text}");
            ExitCode::FAILURE
        }
    }
}

/// Every command holds secrets (keys, shares, the client's input and
/// output), and an abort or a SIGBUS would write them into a core dump: the
/// process is made undumpable and its core-size limit 0 (issue 27;
/// `docs/DEPLOY.md`). Failures are reported, not fatal: a sandbox may
/// forbid the calls, and a process that cannot dump is no worse off.
fn no_core_dumps() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{
            DumpableBehavior, Resource, Rlimit, set_dumpable_behavior, setrlimit,
        };
        let none = Rlimit {
            current: Some(0),
            maximum: Some(0),
        };
        if let Err(e) = setrlimit(Resource::Core, none) {
            eprintln!("suffuse: warning: could not set the core-dump limit to 0: {e}");
        }
        if let Err(e) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
            eprintln!("suffuse: warning: could not make the process undumpable: {e}");
        }
    }
}

/// An encoder; for a decoder, an error that says `for_decoders` (what to
/// run instead).
fn load_model(spec: &str, for_decoders: &str) -> Result<Model> {
    match load_any(spec)? {
        Transformer::Encoder(m) => Ok(m),
        Transformer::Decoder(_) => bail!("{spec} is a decoder: {for_decoders}"),
    }
}

/// A model of either kind: a built-in name, a GGUF file or a folder
/// holding one (a Llama decoder), or a Hugging Face folder (BERT, Llama
/// or GPT-2, as its `config.json` says).
fn load_any(spec: &str) -> Result<Transformer> {
    if let Some(model) = Transformer::builtin(spec) {
        return Ok(model);
    }
    if let Some(file) = gguf_file(spec)? {
        let d = Decoder::load_gguf(&file)
            .with_context(|| format!("loading the GGUF model {}", file.display()))?;
        return Ok(Transformer::Decoder(d));
    }
    Transformer::load(Path::new(spec)).with_context(|| format!("loading the model from {spec}"))
}

/// The GGUF file `spec` names: the file itself or a folder's only one.
fn gguf_file(spec: &str) -> Result<Option<PathBuf>> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(gguf::gguf_in(path)?);
    }
    let is_gguf = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    Ok(is_gguf.then(|| path.to_path_buf()))
}

/// The prompt, wrapped in the model's chat template as one user message
/// when `chat` is set.
fn chat_text(spec: &str, prompt: &str, chat: bool) -> Result<String> {
    if !chat {
        return Ok(prompt.to_string());
    }
    Ok(chat_template(spec)?.user_prompt(prompt)?)
}

/// A decoder's chat template: a GGUF file's own, else the short one the
/// gateway uses for models that ship none (`role: content` lines).
fn chat_template(spec: &str) -> Result<ChatTemplate> {
    if let Some(file) = gguf_file(spec)?
        && let Some(t) = ChatTemplate::from_gguf(&Gguf::open(&file)?)?
    {
        return Ok(t);
    }
    Ok(text::fallback_template()?)
}

fn load_decoder(spec: &str) -> Result<Decoder> {
    match load_any(spec)? {
        Transformer::Decoder(d) => Ok(d),
        Transformer::Encoder(_) => bail!("{spec} is an encoder; generation needs a decoder"),
    }
}

/// A `--keys-dir` the dealer will refuse is refused before the model
/// loads (a minute and GBs for a real decoder), with the dealer's message.
fn keys_folder_ready(dir: Option<&std::path::Path>) -> Result<()> {
    if let Some(d) = dir {
        suffuse_host::private::private_dir(d).with_context(|| d.display().to_string())?;
    }
    Ok(())
}

fn timeouts(secs: u64) -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(secs),
        io: Duration::from_secs(secs),
    }
}

fn write_json(path: &Option<PathBuf>, value: &impl serde::Serialize) -> Result<()> {
    if let Some(p) = path {
        let s = serde_json::to_string_pretty(value)?;
        std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    let choice = cli.backend;
    if let Some(mib) = cli.device_memory {
        backend::set_device_memory(usize::try_from(mib << 20)?);
    }
    match cli.command {
        Command::Demo { out } => demo(&out, choice),
        Command::Embed {
            model,
            max_tokens,
            compare,
            keys_dir,
            out,
            texts,
        } => embed(&model, max_tokens, compare, keys_dir, &out, &texts, choice),
        Command::Dealer(args) => dealer_command(args, choice),
        Command::Serve(args) => serve_command(args, choice),
        Command::Query(args) => query_command(args),
        Command::Generate(args) => generate_command(args, choice),
        Command::Inspect { keyfile, state } => inspect(&keyfile, &state),
        Command::Gateway(args) => gateway_command(args),
        Command::Certs { out, valid_days } => {
            make_certs(&out, valid_days)?;
            eprintln!(
                "wrote ca.pem and p0, p1, client .pem/.key to {}, valid for {valid_days} days; \
                 give each role only its own",
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `suffuse dealer`.
fn dealer_command(args: DealerArgs, choice: Choice) -> Result<ExitCode> {
    let DealerArgs {
        model,
        seq,
        batch,
        max_new_tokens,
        out,
        count,
        keep_pool,
        report_json,
    } = args;
    let spec = model;
    let model = load_any(&spec)?;
    if max_new_tokens.is_some() && matches!(model, Transformer::Encoder(_)) {
        bail!("--max-new-tokens is for decoders, and {spec} is an encoder");
    }
    let decode_steps = max_new_tokens.map_or(0, |k| k.max(1) - 1);
    let shape = Shape {
        batch,
        seq,
        decode_steps,
    };
    let plan = plan::build(&model, shape)?;
    if count == Some(0) && keep_pool.is_none() {
        bail!(
            "--count 0 deals nothing: give a count of at least 1, or --keep-pool M \
             to keep the pool at M unspent sets"
        );
    }
    if count.is_some() || keep_pool.is_some() {
        let fill = Fill {
            count: count.unwrap_or(0),
            keep: keep_pool,
        };
        return deal_pool(&plan, &out, fill, &report_json, choice);
    }
    let r = dealer::deal(
        &plan,
        &out,
        (true, dealer::KeysFor::Later),
        backend::resolve(choice)?,
    )?;
    report_deal(&plan, &r, (batch, seq), &report_json)?;
    Ok(ExitCode::SUCCESS)
}

/// Says what one `suffuse dealer` run dealt for `batch` sentences of
/// `seq` tokens, and writes its JSON report.
fn report_deal(
    plan: &plan::Plan,
    r: &dealer::DealReport,
    (batch, seq): (usize, usize),
    report_json: &Option<PathBuf>,
) -> Result<()> {
    eprintln!(
        "dealt plan {} for {} sentence(s) × {} tokens in {:.2} s",
        plan.hash_hex(),
        batch,
        seq,
        r.keygen_s
    );
    for (p, f) in r.files.iter().enumerate() {
        eprintln!("  P{p}: {} ({})", f.display(), bytes(r.file_bytes[p]));
    }
    let json = serde_json::json!({
        "model": plan.model,
        "tokens": seq,
        "batch": batch,
        "keygen_s": r.keygen_s,
        "key_bytes_per_party": r.file_bytes,
        "plan_hash": plan.hash_hex(),
        "key_set": hex(&r.key_set),
        "breakdown": r.by_category.iter().map(|(c, b)| (c.name().to_string(), serde_json::json!({"key_bytes_per_party": b}))).collect::<serde_json::Map<_, _>>(),
    });
    write_json(report_json, &json)
}

/// `suffuse serve`.
fn serve_command(args: ServeArgs, choice: Choice) -> Result<ExitCode> {
    let ServeArgs {
        party,
        model,
        keys,
        keys_dir,
        max_concurrent,
        max_per_client,
        drain,
        listen,
        peer,
        timeout,
        report_json,
        state,
        transport,
        keep_spent,
        metrics,
    } = args;
    let party = match party {
        0 => Party::P0,
        1 => Party::P1,
        p => bail!("--party must be 0 or 1, not {p}"),
    };
    let model = load_any(&model)?;
    let listener =
        Listener::bind(listen.as_str()).with_context(|| format!("listening on {listen}"))?;
    eprintln!(
        "P{}: listening on {}",
        u8::from(party == Party::P1),
        listener.local_addr()?
    );
    let opts = serve_options(party, timeout, (&state, &transport), keep_spent)?;
    let fss = backend::resolve(choice)?;
    let keys = match (keys, keys_dir) {
        (Some(k), _) => k,
        (None, Some(dir)) => {
            let pooled = Pooled {
                max_concurrent,
                max_per_client,
                drain,
                metrics,
            };
            let me = (party, peer.as_str(), &report_json);
            return serve_pool(&model, me, &dir, (listener, opts), &pooled, fss);
        }
        (None, None) => bail!("give --keys FILE or --keys-dir DIR"),
    };
    let r = server::serve(&model, party, &keys, &listener, &peer, &opts, fss)?;
    eprintln!(
        "P{}: done in {:.3} s, sent {}, {} rounds",
        r.party,
        r.online_s,
        bytes(r.comm_bytes),
        r.rounds
    );
    write_json(&report_json, &r)?;
    Ok(ExitCode::SUCCESS)
}

/// A server's options as party `party`: `timeout` seconds, the state
/// folder's ledger, the transport's security.
fn serve_options(
    party: Party,
    timeout: u64,
    (state, transport): (&State, &Transport),
    keep_spent: bool,
) -> Result<ServeOptions> {
    Ok(ServeOptions {
        timeouts: timeouts(timeout),
        ledger: state.ledger()?,
        keep_spent,
        security: transport.security(match party {
            Party::P0 => Role::P0,
            _ => Role::P1,
        })?,
    })
}

/// `serve --keys-dir`'s limits and metrics address.
struct Pooled {
    max_concurrent: usize,
    max_per_client: Option<usize>,
    drain: u64,
    metrics: Option<String>,
}

/// `suffuse serve --keys-dir DIR`: queries from the key pool in `dir`
/// until SIGTERM or SIGINT, then the service's report.
fn serve_pool(
    model: &Transformer,
    (party, peer, report_json): (Party, &str, &Option<PathBuf>),
    dir: &Path,
    (listener, serve): (Listener, ServeOptions),
    pooled: &Pooled,
    fss: &dyn suffuse_core::batch::BatchEval,
) -> Result<ExitCode> {
    let me = u8::from(party == Party::P1);
    let pool = Pool::open(dir, me)?;
    let opts = ServiceOptions {
        serve,
        max_concurrent: pooled.max_concurrent,
        max_per_client: pooled
            .max_per_client
            .unwrap_or(pooled.max_concurrent.div_ceil(2)),
        drain: Duration::from_secs(pooled.drain),
        metrics: metrics_endpoint(pooled.metrics.as_deref(), &pool, me)?,
    };
    let stop = stop_on_signals()?;
    let r = service::run(model, party, &pool, listener, peer, &opts, fss, &stop);
    eprintln!(
        "P{me}: stopped: {} served, {} failed, {} refused, {} dropped",
        r.served, r.failed, r.refused, r.dropped
    );
    write_json(report_json, &r)?;
    Ok(ExitCode::SUCCESS)
}

/// `serve --metrics ADDR`: the metrics, served from a thread of their own.
fn metrics_endpoint(
    addr: Option<&str>,
    pool: &Pool,
    party: u8,
) -> Result<Option<Arc<ServerMetrics>>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let m = Arc::new(ServerMetrics::new());
    m.watch_pool(pool, party);
    let bound =
        metrics::serve(addr, m.clone()).with_context(|| format!("serving metrics on {addr}"))?;
    eprintln!("P{party}: metrics on http://{bound}/metrics");
    Ok(Some(m))
}

/// `suffuse gateway`.
fn gateway_command(args: GatewayArgs) -> Result<ExitCode> {
    if args.model.len() != args.servers.len() {
        bail!(
            "give each --model its --servers ({} models, {} server pairs)",
            args.model.len(),
            args.servers.len()
        );
    }
    let mut routes: Vec<Route> = Vec::new();
    for (spec, servers) in args.model.iter().zip(&args.servers) {
        let Some((a, b)) = servers.split_once(',') else {
            bail!("--servers takes two addresses, ADDR0,ADDR1 (got {servers:?})");
        };
        let model = load_any(spec)?;
        let template = match &model {
            Transformer::Decoder(_) => Some(chat_template(spec)?),
            Transformer::Encoder(_) => None,
        };
        let id = model.name().to_string();
        if routes.iter().any(|r| r.id == id) {
            bail!("two --model flags name the model {id}");
        }
        routes.push(Route::new(id, model, template, [a.into(), b.into()]));
    }
    let ids: Vec<String> = routes.iter().map(|r| r.id.clone()).collect();
    let listener = std::net::TcpListener::bind(&args.listen)
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    eprintln!("gateway: listening on http://{addr}");
    if !addr.ip().is_loopback() {
        eprintln!(
            "gateway: warning: {addr} is reachable from other machines, and whoever reaches it \
             queries the servers with this client's certificate"
        );
    }
    eprintln!("gateway: models {}", ids.join(", "));
    let gw = Gateway::new(GatewayOptions {
        routes,
        security: args.transport.security(Role::Client)?,
        timeouts: timeouts(args.timeout),
        max_concurrent: args.max_concurrent,
        queue: args.queue,
        embed_batch: args.batch,
    });
    gateway::run(listener, gw, stop_on_signals()?).context("serving HTTP")?;
    eprintln!("gateway: stopped");
    Ok(ExitCode::SUCCESS)
}

/// `suffuse query`.
fn query_command(args: QueryArgs) -> Result<ExitCode> {
    let QueryArgs {
        model,
        servers,
        compare,
        timeout,
        batch,
        seq,
        transport,
        generate,
        chat,
        sampling,
        out,
        texts,
    } = args;
    let Some((a, b)) = servers.split_once(',') else {
        bail!("--servers takes two addresses, ADDR0,ADDR1 (got {servers:?})");
    };
    let sec = transport.security(Role::Client)?;
    if generate {
        let prompt = chat_text(&model, &texts.join(" "), chat)?;
        let model = load_decoder(&model)?;
        return query_generate(&model, [a, b], &prompt, &sampling, timeout, &sec, &out);
    }
    let model = load_model(&model, "query it with --generate and a prompt")?;
    let expect = client::Expect {
        batch: batch.unwrap_or(texts.len()),
        seq,
    };
    let servers = client::connect(&model, [a, b], timeouts(timeout), &sec, expect)?;
    // The servers' keys fix the padded length: texts are truncated to
    // it, as `embed --max-tokens` does.
    let batch = tokenize(&model, &texts, Some(servers.seq()))?;
    let q = servers.run(&model, &batch)?;
    let mut report = Report {
        model: model.name.clone(),
        tokens: batch.iter().map(Vec::len).max().unwrap_or(0),
        batch: batch.len(),
        real_tokens: batch.iter().map(Vec::len).collect(),
        online_s: q.online_s,
        plan_hash: q.plan_hash.clone(),
        ..Report::default()
    }
    .with_parties(&q.reports, None);
    let cos = compare_float(&model, &batch, &q.embeddings, compare, &mut report)?;
    print_embeddings(&texts, &batch, &q.embeddings, cos.as_deref());
    finish_report(&report, &out)?;
    Ok(ExitCode::SUCCESS)
}

/// `suffuse generate`.
fn generate_command(args: GenerateArgs, choice: Choice) -> Result<ExitCode> {
    let GenerateArgs {
        model: spec,
        chat,
        max_new_tokens,
        seq,
        sampling,
        keys_dir,
        timeout,
        out,
        prompt,
    } = args;
    keys_folder_ready(keys_dir.as_deref())?;
    let model = load_decoder(&spec)?;
    let opts = Options {
        keys_dir,
        prompt_bucket: seq,
        progress: true,
        timeouts: timeouts(timeout),
        // `--backend` (it was ignored here, the default `auto` taken).
        backend: choice,
        ..Options::default()
    };
    let prompt = chat_text(&spec, &prompt, chat)?;
    let ids = prompt_ids(&model, &prompt, max_new_tokens)?;
    let g = session::generate(
        &model,
        &ids,
        max_new_tokens,
        sampling.get(),
        &opts,
        &mut stream_to(&model),
    )?;
    println!();
    finish_report(&g.report, &out)?;
    if g.report.bit_exact == Some(false) {
        eprintln!("generate: the secure logits do NOT equal the fixed-point reference");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// A flag that SIGTERM and SIGINT set.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing a signal handler")?;
    }
    Ok(stop)
}

/// How many key sets `dealer` puts into a pool.
#[derive(Clone, Copy, Debug)]
struct Fill {
    /// Sets dealt first.
    count: usize,
    /// Then the pool is kept at this many unspent sets until a signal.
    keep: Option<usize>,
}

/// `dealer --count N [--keep-pool M]`: fills the pool at `dir`.
fn deal_pool(
    plan: &plan::Plan,
    dir: &Path,
    fill: Fill,
    report_json: &Option<PathBuf>,
    choice: Choice,
) -> Result<ExitCode> {
    let fss = backend::resolve(choice)?;
    let stop = stop_on_signals()?;
    let swept = pool::sweep_stale_deals(dir)?;
    if swept > 0 {
        eprintln!("removed {swept} set folder(s) left half-dealt by a killed dealer");
    }
    let start = std::time::Instant::now();
    let mut sets = Vec::new();
    let deal_one = |sets: &mut Vec<serde_json::Value>| -> Result<()> {
        let r = pool::deal_set(plan, dir, fss)?;
        eprintln!(
            "dealt key set {} in {:.2} s ({} + {})",
            hex(&r.key_set),
            r.keygen_s,
            bytes(r.file_bytes[0]),
            bytes(r.file_bytes[1])
        );
        sets.push(serde_json::json!({"key_set": hex(&r.key_set), "keygen_s": r.keygen_s, "key_bytes_per_party": r.file_bytes}));
        Ok(())
    };
    for _ in 0..fill.count {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        deal_one(&mut sets)?;
    }
    let filled_s = start.elapsed().as_secs_f64();
    if let Some(keep) = fill.keep {
        keep_filled(dir, keep, &stop, || deal_one(&mut sets))?;
    }
    let wall_s = start.elapsed().as_secs_f64();
    let json = serde_json::json!({
        "model": plan.model,
        "tokens": plan.seq,
        "batch": plan.batch,
        "plan_hash": plan.hash_hex(),
        "pool": dir,
        "sets_dealt": sets.len(),
        "fill_s": filled_s,
        "wall_s": wall_s,
        "sets_per_s": sets.len() as f64 / wall_s.max(1e-9),
        "sets": sets,
    });
    write_json(report_json, &json)?;
    Ok(ExitCode::SUCCESS)
}

/// Deals a set with `deal` whenever the pool in `dir` holds fewer than
/// `keep` unspent ones, until `stop` is set.
fn keep_filled(
    dir: &Path,
    keep: usize,
    stop: &AtomicBool,
    mut deal: impl FnMut() -> Result<()>,
) -> Result<()> {
    eprintln!(
        "keeping {} at {keep} unspent key sets until SIGTERM",
        dir.display()
    );
    while !stop.load(Ordering::Relaxed) {
        if pool::unspent_sets(dir)? < keep {
            deal()?;
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// The prompt's token ids, leaving room for `max_new` positions.
fn prompt_ids(model: &Decoder, prompt: &str, max_new: usize) -> Result<Vec<u32>> {
    let room = model
        .config
        .max_positions
        .saturating_sub(max_new.max(1) - 1);
    let ids = model
        .tokenizer
        .encode(prompt, room)
        .with_context(|| format!("tokenizing {prompt:?}"))?;
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(ids)
}

/// Prints each token's text as it arrives.
fn stream_to(model: &Decoder) -> impl FnMut(u32) + '_ {
    move |t| {
        use std::io::Write as _;
        let text = model
            .tokenizer
            .decode(&[t])
            .unwrap_or_else(|_| format!("<{t}>"));
        print!("{text}");
        let _ = std::io::stdout().flush();
    }
}

fn query_generate(
    model: &Decoder,
    servers: [&str; 2],
    prompt: &str,
    sampling: &SamplingArgs,
    timeout: u64,
    sec: &Security,
    out: &Output,
) -> Result<ExitCode> {
    let ids = prompt_ids(model, prompt, 1)?;
    let o = generate::query(
        model,
        servers,
        &ids,
        sampling.get(),
        timeouts(timeout),
        sec,
        &mut stream_to(model),
    )?;
    println!();
    let bucket = o.bucket;
    let last = o.reports.last().cloned().unwrap_or_default();
    let report = Report {
        model: model.name.clone(),
        tokens: bucket,
        batch: 1,
        real_tokens: vec![ids.len()],
        online_s: o.pass_s.iter().sum(),
        plan_hash: o.plan_hash.clone(),
        generation: Some(Figures::of(&ids, bucket, model.layers.len(), &o)),
        ..Report::default()
    }
    .with_parties(&last, None);
    finish_report(&report, out)?;
    Ok(ExitCode::SUCCESS)
}

fn tokenize(model: &Model, texts: &[String], max_tokens: Option<usize>) -> Result<Vec<Vec<u32>>> {
    let limit = max_tokens.unwrap_or(model.config.max_tokens);
    if limit < 2 {
        bail!("--max-tokens must leave room for [CLS] and [SEP] (at least 2)");
    }
    let ceiling = model.config.max_tokens.max(limit).saturating_add(1);
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let whole = (model.tokenizer.encode(t, ceiling))
                .with_context(|| format!("tokenizing {t:?}"))?;
            if whole.len() > limit {
                // Said, not silent (issue 27): the keys or --max-tokens fix
                // the length, and the rest of the text is not embedded.
                eprintln!(
                    "warning: text {} has {}{} tokens; only the first {limit} are embedded",
                    i + 1,
                    if whole.len() == ceiling {
                        "more than "
                    } else {
                        ""
                    },
                    whole.len().min(ceiling - 1),
                );
            }
            model
                .tokenizer
                .encode(t, limit)
                .with_context(|| format!("tokenizing {t:?}"))
        })
        .collect()
}

fn compare_float(
    model: &Model,
    batch: &[Vec<u32>],
    secure: &[Vec<f32>],
    compare: Option<Compare>,
    report: &mut Report,
) -> Result<Option<Vec<f64>>> {
    let Some(Compare::Float) = compare else {
        return Ok(None);
    };
    let f = suffuse_host::float::embed(model, batch)?;
    let each: Vec<f64> = f.iter().zip(secure).map(|(a, b)| cosine(a, b)).collect();
    report.cosine_to_float = each.iter().copied().reduce(f64::min);
    report.cosine_to_float_each = each.clone();
    Ok(Some(each))
}

fn print_embeddings(texts: &[String], batch: &[Vec<u32>], emb: &[Vec<f32>], cos: Option<&[f64]>) {
    for (i, (t, e)) in texts.iter().zip(emb).enumerate() {
        let mut line = serde_json::json!({
            "text": t,
            "tokens": batch[i].len(),
            "embedding": e,
        });
        if let Some(c) = cos {
            line["cosine_to_float"] = serde_json::json!(c[i]);
        }
        println!("{line}");
    }
}

fn finish_report(report: &Report, out: &Output) -> Result<()> {
    write_json(&out.report_json, report)?;
    if out.json {
        eprintln!("{}", serde_json::to_string_pretty(report)?);
    } else {
        eprint!("{}", report.table());
    }
    Ok(())
}

fn demo(out: &Output, choice: Choice) -> Result<ExitCode> {
    let model = Model::demo();
    let texts: Vec<String> = [
        "Two servers compute on secret shares.",
        "Neither of them learns the sentence.",
        "Short one.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let batch = tokenize(&model, &texts, None)?;
    eprintln!(
        "demo: built-in model ({} layers, hidden {}, {} heads), {} sentences of {:?} tokens",
        model.config.layers,
        model.config.hidden,
        model.config.heads,
        batch.len(),
        batch.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let outcome = session::run(
        &model,
        &batch,
        &Options {
            progress: true,
            backend: choice,
            ..Options::default()
        },
    )?;
    let report = &outcome.report;
    if !out.json {
        print!("{}", report.table());
        print_widths(&model, &batch)?;
    }
    let decoder = demo_generate(out)?;
    // One JSON document: the encoder's report with the decoder's inside.
    let mut json = serde_json::to_value(report)?;
    json["decoder"] = serde_json::to_value(&decoder)?;
    if out.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    write_json(&out.report_json, &json)?;
    if report.bit_exact != Some(true) {
        eprintln!("demo: the secure output does NOT equal the fixed-point reference");
        return Ok(ExitCode::FAILURE);
    }
    if decoder.bit_exact != Some(true) {
        eprintln!("demo: the secure logits do NOT equal the fixed-point reference");
        return Ok(ExitCode::FAILURE);
    }
    if !out.json {
        println!("decoder: every pass bit-exact against the fixed-point reference");
    }
    Ok(ExitCode::SUCCESS)
}

/// The demo's second half: 8 greedy tokens from the built-in Llama-style
/// decoder, every pass compared with the fixed-point reference.
fn demo_generate(out: &Output) -> Result<Report> {
    let Some(model) = Decoder::builtin("tiny-llama") else {
        bail!("the built-in decoder is missing");
    };
    let ids = prompt_ids(&model, "private prompt", 8)?;
    let c = &model.config;
    eprintln!(
        "demo: built-in decoder ({} layers, hidden {}, {} query / {} key-value heads), prompt of {} tokens, 8 greedy tokens",
        c.layers,
        c.hidden,
        c.heads,
        c.kv_heads,
        ids.len()
    );
    let opts = Options::default();
    let g = session::generate(&model, &ids, 8, Sampling::default(), &opts, &mut |_| {})?;
    let fig = g.report.generation.clone().unwrap_or_default();
    if !out.json {
        println!(
            "decoder: generated token ids {:?}; prefill {:.3} s, decode {:.3} s/token (median), {} rounds/token",
            fig.generated_token_ids,
            fig.prefill_online_s,
            fig.decode_online_s_per_token,
            fig.rounds_per_token
        );
    }
    Ok(g.report)
}

fn print_widths(model: &Model, batch: &[Vec<u32>]) -> Result<()> {
    let seq = batch.iter().map(Vec::len).max().unwrap_or(0);
    let plan = bert::build(model, batch.len(), seq)?;
    let widths = plan.widths();
    let mut per: std::collections::BTreeMap<&str, (u32, u32)> = std::collections::BTreeMap::new();
    for (name, k) in &widths {
        let kind = name.rsplit('(').next().unwrap_or("").trim_end_matches(')');
        let e = per.entry(kind).or_insert((u32::MAX, 0));
        e.0 = e.0.min(*k);
        e.1 = e.1.max(*k);
    }
    let list: Vec<String> = per
        .iter()
        .map(|(k, (lo, hi))| format!("{k} {lo}–{hi}"))
        .collect();
    println!(
        "effective widths (bits, proven by range analysis): {}",
        list.join(", ")
    );
    Ok(())
}

fn embed(
    model: &str,
    max_tokens: Option<usize>,
    compare: Option<Compare>,
    keys_dir: Option<PathBuf>,
    out: &Output,
    texts: &[String],
    choice: Choice,
) -> Result<ExitCode> {
    keys_folder_ready(keys_dir.as_deref())?;
    let model = load_model(model, "generate text with `suffuse generate`")?;
    let batch = tokenize(&model, texts, max_tokens)?;
    let outcome = session::run(
        &model,
        &batch,
        &Options {
            keys_dir,
            compare_float: compare.is_some(),
            progress: true,
            backend: choice,
            ..Options::default()
        },
    )?;
    let cos = if compare.is_some() {
        Some(outcome.report.cosine_to_float_each.clone())
    } else {
        None
    };
    print_embeddings(texts, &batch, &outcome.embeddings, cos.as_deref());
    finish_report(&outcome.report, out)?;
    if outcome.report.bit_exact == Some(false) {
        eprintln!("embed: the secure output does NOT equal the fixed-point reference");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect(path: &Path, state: &State) -> Result<ExitCode> {
    use std::fmt::Write as _;
    let mut r = KeyReader::open(path)?;
    let h = r.header.clone();
    let mut out = String::new();
    let _ = writeln!(out, "file       {}", path.display());
    let _ = writeln!(out, "party      {}", h.party);
    let _ = writeln!(out, "plan       {}", hex(&h.plan_hash));
    let _ = writeln!(out, "key set    {}", hex(&h.key_set));
    let summary = &h.summary;
    let _ = writeln!(
        out,
        "model      {} ({})",
        summary.model, summary.model_digest
    );
    let _ = writeln!(
        out,
        "shape      {} sentence(s) × {} tokens",
        summary.batch, summary.seq
    );
    let _ = writeln!(out, "steps      {}", h.steps);
    let mut total = 0u64;
    let mut largest = (0u32, 0u64);
    for _ in 0..h.steps {
        let (step, len) = r.section_header()?;
        r.skip(step, len)?;
        total += len;
        if len > largest.1 {
            largest = (step, len);
        }
    }
    r.finish()?;
    let size = bytes(std::fs::metadata(path)?.len());
    let _ = writeln!(out, "key bytes  {size} ({} in sections)", bytes(total));
    let _ = writeln!(out, "largest    step {} ({})", largest.0, bytes(largest.1));
    let spent = match state.ledger()?.check_unspent(h.party, &h.key_set) {
        Err(LedgerError::Spent { .. }) => "yes (in this ledger; a server will refuse it)",
        Err(e) => return Err(e.into()),
        Ok(()) => "no (not in this ledger)",
    };
    let _ = writeln!(out, "spent      {spent}");
    print_to_stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to stdout; a reader that closed the pipe early (`| head`)
/// ends the output quietly instead of a panic (issue 27).
fn print_to_stdout(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod allocator_tests {
    /// Index 15 is the purge delay: it holds mimalloc 3's default (1000 ms)
    /// until set, and the setting reads back.
    #[test]
    #[allow(unsafe_code)]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads and sets an integer option.
        unsafe {
            assert_eq!(
                libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY),
                1000
            );
            super::keep_freed_memory();
            assert_eq!(
                libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY),
                -1
            );
        }
    }
}
