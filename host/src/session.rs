//! A whole secure run in one process: dealer, both servers and the client,
//! talking over loopback TCP exactly as separate processes do (the servers
//! are threads running [`crate::server::serve`], the client is
//! [`crate::client::query`]). `suffuse demo` and `suffuse embed` use it;
//! tests compare it with the three-process path.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;

use crate::backend::{self, BackendError, Choice};
use crate::client::{self, ClientError, QueryOutcome};
use crate::dealer::{self, DealReport, DealerError};
use crate::float;
use crate::generate::{self, GenerateError};
use crate::ledger::Ledger;
use crate::model::{Decoder, Model, ModelError, ModelRef};
use crate::net::{Listener, NetError, Security, Timeouts};
use crate::party::PartyReport;
use crate::plan::{self, PlanError, Shape, bert};
use crate::reference::{self, ReferenceError};
use crate::report::{Figures, Report, cosine};
use crate::server::{self, ServeError, ServeOptions};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the key files go (a fresh temporary folder when `None`; it is
    /// removed afterwards).
    pub keys_dir: Option<PathBuf>,
    /// Run the fixed-point reference and compare bit for bit.
    pub reference: bool,
    /// Run the float model and report cosines.
    pub compare_float: bool,
    /// Show the dealer's progress bar.
    pub progress: bool,
    /// Network timeouts.
    pub timeouts: Timeouts,
    /// Generation: the prompt bucket to deal for (default: the next power
    /// of two from 8 on, see [`crate::plan::decoder::bucket`]).
    pub prompt_bucket: Option<usize>,
    /// The backend of the dealer, both servers and the reference.
    pub backend: Choice,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            keys_dir: None,
            reference: true,
            compare_float: true,
            progress: false,
            timeouts: Timeouts::default(),
            prompt_bucket: None,
            backend: Choice::Auto,
        }
    }
}

/// A finished run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// One embedding per sentence.
    pub embeddings: Vec<Vec<f32>>,
    /// The float model's, when compared.
    pub float: Option<Vec<Vec<f32>>>,
    /// The report.
    pub report: Report,
    /// The query's details.
    pub query: QueryOutcome,
    /// The dealer's.
    pub deal: DealReport,
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The dealer.
    #[error(transparent)]
    Dealer(#[from] DealerError),
    /// A server.
    #[error("server P{party}: {error}")]
    Server {
        /// Which.
        party: u8,
        /// The error.
        error: ServeError,
    },
    /// The client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The reference.
    #[error("fixed-point reference: {0}")]
    Reference(ReferenceError),
    /// Setting up sockets.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The generation.
    #[error(transparent)]
    Generate(#[from] GenerateError),
    /// The backend.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A thread died.
    #[error("a server thread panicked")]
    Panicked,
    /// The spent-key ledger.
    #[error(transparent)]
    Ledger(crate::ledger::LedgerError),
    /// Temporary files.
    #[error("{path}: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

// By hand, not `#[from]`: the message already quotes the cause, so it is not
// also reported as the source (an error chain would print it twice).
impl From<ReferenceError> for SessionError {
    fn from(e: ReferenceError) -> SessionError {
        SessionError::Reference(e)
    }
}

/// Runs `batch` (token ids, one sequence per sentence) through dealer,
/// servers and client, padded to the longest sentence.
pub fn run(model: &Model, batch: &[Vec<u32>], opts: &Options) -> Result<Outcome, SessionError> {
    run_on(model, batch, opts, backend::resolve(opts.backend)?)
}

/// [`run`] with the heavy operations of the dealer, both servers and the
/// reference on `fss` instead of `opts.backend` (tests run the emulated CUDA
/// kernels this way; no user can choose that backend).
pub fn run_on(
    model: &Model,
    batch: &[Vec<u32>],
    opts: &Options,
    fss: &dyn BatchEval,
) -> Result<Outcome, SessionError> {
    let seq = batch.iter().map(Vec::len).max().unwrap_or(0);
    let plan = bert::build(model, batch.len(), seq)?;
    let temp;
    let dir: &Path = match &opts.keys_dir {
        Some(d) => d,
        None => {
            temp = TempDir::new()?;
            &temp.0
        }
    };
    let deal = dealer::deal(&plan, dir, (opts.progress, dealer::KeysFor::Now), fss)?;
    let serve = local_serve(dir, opts.timeouts)?;
    let (served, query) = query_pair(model, &deal.files, batch, &serve, fss)?;
    let query = first_cause(served, query)?;
    let mut report = Report {
        model: model.name.clone(),
        tokens: seq,
        batch: batch.len(),
        real_tokens: batch.iter().map(Vec::len).collect(),
        online_s: query.online_s,
        plan_hash: query.plan_hash.clone(),
        ..Report::default()
    }
    .with_parties(&query.reports, Some(&deal));
    if opts.reference {
        let inputs = client::clear_inputs(model, &client::ClientView::of(&plan), batch)?;
        let want = reference::run(&plan, &inputs, fss)?;
        report.bit_exact = Some(want == query.output);
    }
    let float = if opts.compare_float {
        let f = float::embed(model, batch)?;
        let each: Vec<f64> = f
            .iter()
            .zip(&query.embeddings)
            .map(|(a, b)| cosine(a, b))
            .collect();
        report.cosine_to_float = each.iter().copied().reduce(f64::min);
        report.cosine_to_float_each = each;
        Some(f)
    } else {
        None
    };
    Ok(Outcome {
        embeddings: query.embeddings.clone(),
        float,
        report,
        query,
        deal,
    })
}

/// What each server and the client of one query returned.
pub type PairOutcome = (
    [Result<PartyReport, ServeError>; 2],
    Result<QueryOutcome, ClientError>,
);

/// Runs both servers on `keys` (threads, loopback TCP, heavy operations on
/// `fss`) and a client that asks them for `batch`: one query, each side's
/// result kept.
pub fn query_pair(
    model: &Model,
    keys: &[PathBuf; 2],
    batch: &[Vec<u32>],
    opts: &ServeOptions,
    fss: &dyn BatchEval,
) -> Result<PairOutcome, SessionError> {
    serve_pair(model, keys, opts, fss, |addrs| {
        client::query(model, addrs, batch, opts.timeouts, &opts.security)
    })
}

/// The error that explains a failed local session. A server's own error
/// explains more than the client's view of it, except where all a server
/// saw was its peer or the client going away: then the error of whoever
/// went away is the cause (a client that timed out, say).
fn first_cause<T, E>(
    served: [Result<PartyReport, ServeError>; 2],
    client: Result<T, E>,
) -> Result<T, SessionError>
where
    SessionError: From<E>,
{
    let client = client.map_err(SessionError::from);
    let mut left = None;
    for (i, r) in served.into_iter().enumerate() {
        match r {
            Err(
                error @ ServeError::Net {
                    error: NetError::Disconnected,
                    ..
                },
            ) => {
                left.get_or_insert((i, error));
            }
            Err(error) => {
                return Err(SessionError::Server {
                    party: i as u8,
                    error,
                });
            }
            Ok(_) => {}
        }
    }
    match (client, left) {
        (Ok(_), Some((i, error))) => Err(SessionError::Server {
            party: i as u8,
            error,
        }),
        (client, _) => client,
    }
}

/// How servers run inside one process: a ledger beside the keys, and plain
/// TCP, because the links never leave loopback.
fn local_serve(dir: &Path, timeouts: Timeouts) -> Result<ServeOptions, SessionError> {
    Ok(ServeOptions {
        timeouts,
        ledger: Ledger::open(&dir.join("spent")).map_err(SessionError::Ledger)?,
        keep_spent: false,
        security: Security::Insecure,
    })
}

/// A finished generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// What the client saw.
    pub outcome: generate::Outcome,
    /// The report, generation figures included.
    pub report: Report,
}

/// Generates up to `max_new` tokens after `prompt` through dealer, servers
/// and client: keys for the prompt's bucket and `max_new − 1` decode
/// passes. With `opts.reference`, the fixed-point reference runs the same
/// generation and every pass's logits are compared bit for bit.
pub fn generate(
    model: &Decoder,
    prompt: &[u32],
    max_new: usize,
    sampling: generate::Sampling,
    opts: &Options,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation, SessionError> {
    let fss = backend::resolve(opts.backend)?;
    generate_on(model, (prompt, max_new), sampling, opts, fss, on_token)
}

/// The plan's shape for `max_new` tokens after a prompt of `tokens`: the
/// prompt padded to `bucket` (or the smallest bucket that leaves room for
/// the new tokens), one decode pass per new token after the first.
/// Refused before any key is dealt, rather than by the client after.
fn generation_shape(
    model: &Decoder,
    tokens: usize,
    max_new: usize,
    bucket: Option<usize>,
) -> Result<Shape, SessionError> {
    let steps = max_new.max(1) - 1;
    let room = model.config.max_positions.saturating_sub(steps);
    let bucket = bucket.unwrap_or_else(|| crate::plan::decoder::bucket(tokens, room));
    if tokens == 0 || tokens > bucket {
        return Err(GenerateError::PromptTooLong { tokens, bucket }.into());
    }
    Ok(Shape {
        batch: 1,
        seq: bucket,
        decode_steps: steps,
    })
}

/// [`generate()`] of `max_new` tokens after `prompt` with the heavy operations
/// on `fss` instead of `opts.backend`, as [`run_on`].
pub fn generate_on(
    model: &Decoder,
    (prompt, max_new): (&[u32], usize),
    sampling: generate::Sampling,
    opts: &Options,
    fss: &dyn BatchEval,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation, SessionError> {
    let shape = generation_shape(model, prompt.len(), max_new, opts.prompt_bucket)?;
    let bucket = shape.seq;
    let plan = plan::build(model, shape)?;
    let temp;
    let dir: &Path = match &opts.keys_dir {
        Some(d) => d,
        None => {
            temp = TempDir::new()?;
            &temp.0
        }
    };
    let deal = dealer::deal(&plan, dir, (opts.progress, dealer::KeysFor::Now), fss)?;
    let serve = local_serve(dir, opts.timeouts)?;
    let (served, outcome) = serve_pair(model, &deal.files, &serve, fss, |addrs| {
        generate::query(
            model,
            addrs,
            prompt,
            sampling,
            opts.timeouts,
            &serve.security,
            on_token,
        )
    })?;
    let outcome = first_cause(served, outcome)?;
    let last = outcome.reports.last().cloned().unwrap_or_default();
    let mut report = Report {
        model: model.name.clone(),
        tokens: bucket,
        batch: 1,
        real_tokens: vec![prompt.len()],
        online_s: outcome.pass_s.iter().sum(),
        plan_hash: outcome.plan_hash.clone(),
        generation: Some(Figures::of(prompt, bucket, model.layers.len(), &outcome)),
        ..Report::default()
    }
    .with_parties(&last, Some(&deal));
    if opts.reference {
        let want = generate::reference(model, &plan, prompt, sampling, fss)?;
        report.bit_exact = Some(want.logits == outcome.generated.logits);
    }
    Ok(Generation { outcome, report })
}

/// Runs both servers on `keys` (threads, loopback TCP) and `client` with
/// their addresses; each side's result kept.
fn serve_pair<'a, T>(
    model: impl Into<ModelRef<'a>>,
    keys: &[PathBuf; 2],
    opts: &ServeOptions,
    fss: &dyn BatchEval,
    client: impl FnOnce([&str; 2]) -> T,
) -> Result<([Result<PartyReport, ServeError>; 2], T), SessionError> {
    let model = model.into();
    let listeners = [
        Listener::bind("127.0.0.1:0")?,
        Listener::bind("127.0.0.1:0")?,
    ];
    let addrs = [
        listeners[0].local_addr()?.to_string(),
        listeners[1].local_addr()?.to_string(),
    ];
    std::thread::scope(|s| {
        let servers = [Party::P0, Party::P1].map(|party| {
            let i = usize::from(party == Party::P1);
            let (listener, keys, peer) = (&listeners[i], &keys[i], &addrs[0]);
            s.spawn(move || server::serve(model, party, keys, listener, peer, opts, fss))
        });
        let out = client([&addrs[0], &addrs[1]]);
        let [a, b] = servers.map(|h| h.join().map_err(|_| SessionError::Panicked));
        Ok(([a?, b?], out))
    })
}

/// A temporary folder removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, SessionError> {
        let id: [u8; 8] = dealer::random()?;
        let p = std::env::temp_dir().join(format!("suffuse-keys-{}", crate::plan::hex(&id)));
        // Private from the start: the dealer writes secrets into it.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .map_err(|source| SessionError::Io {
                path: p.clone(),
                error: source,
            })?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn left() -> Result<PartyReport, ServeError> {
        Err(ServeError::Net {
            during: "receiving the client's input",
            error: NetError::Disconnected,
        })
    }

    fn timed_out() -> Result<(), ClientError> {
        Err(ClientError::Net {
            server: 0,
            error: NetError::Timeout {
                during: "waiting for the peer's next frame",
            },
        })
    }

    #[test]
    fn a_client_that_gave_up_is_the_cause_not_the_server_it_left() {
        let e = first_cause([left(), Ok(PartyReport::default())], timed_out()).unwrap_err();
        assert!(
            matches!(e, SessionError::Client(ClientError::Net { .. })),
            "{e}"
        );
    }

    #[test]
    fn a_servers_own_error_explains_more_than_the_clients_view() {
        let own = Err(ServeError::Mismatch("plans differ".into()));
        let e = first_cause([left(), own], timed_out()).unwrap_err();
        assert!(matches!(e, SessionError::Server { party: 1, .. }), "{e}");
        let e = first_cause(
            [left(), Ok(PartyReport::default())],
            Ok::<(), ClientError>(()),
        );
        assert!(matches!(e, Err(SessionError::Server { party: 0, .. })));
    }
}
