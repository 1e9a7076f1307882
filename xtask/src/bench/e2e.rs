//! Secure inference end to end through the `suffuse` binary itself (release
//! build, its allocator, loopback TCP, both servers and the dealer on this
//! machine), beside the published figures of other systems on the same
//! shape. Each case is one `suffuse embed --report-json` run; the record is
//! that report plus the case's name, all online times measured, and the
//! anchor it is compared with.
//!
//! all-MiniLM-L6-v2 runs when `models/all-MiniLM-L6-v2` is present (`cargo
//! xtask fetch-model minilm`); BERT-base runs on `generated-bert-base`, a
//! model with BERT-base's shape and random weights, since no BERT-base
//! checkpoint ships with the repository. GPT-2 runs on `generated-gpt2`
//! (GPT-2-small's shape, random weights) through `suffuse generate`: the
//! prefill of a 128-token bucket alone, one forward pass, which is what
//! FuseFSS and SIGMA time.
//!
//! SmolLM2-135M-Instruct runs when `models/SmolLM2-135M-Instruct` is
//! present (`cargo xtask fetch-model smollm2`): a prompt in the 64- and
//! the 128-token bucket, each prefilled and then decoded for three passes,
//! so each case gives the prefill at its bucket and the decode pass at
//! that context. Context 512 is not a case: its prefill alone needs keys
//! this machine's disk and memory cannot hold (see docs/DECODERS.md).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::Value;

use crate::command;

/// A paragraph long enough for 128 WordPiece tokens with MiniLM's
/// tokenizer (and 128 characters with the generated models' one).
pub(super) const PARAGRAPH: &str = "Function secret sharing lets two servers that do not collude run a \
    transformer on a secret-shared prompt: each holds keys from a dealer and a share of every \
    activation, and neither learns the sentence, the intermediate values or the embedding. \
    Every non-linearity, from truncation to GeLU, softmax and LayerNorm, is compiled from a \
    structured description into a fixed number of comparisons on the masked wire, so the \
    online phase is a short sequence of rounds whose cost depends only on the model's shape, \
    never on the text, the weights or the masks. The client receives two output shares and \
    adds them to obtain the sentence embedding, which equals the fixed-point reference bit for \
    bit and stays within a small angle of the floating-point model.";

/// Seventeen MiniLM tokens, the shorter shape SecretFlow SPU was timed on.
const SHORT: &str = "Two servers compute a private sentence embedding together; neither sees it.";

/// A published figure to compare with.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Anchor {
    pub(super) system: &'static str,
    setting: &'static str,
    pub(super) online_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    comm_bytes: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_bytes: Option<f64>,
    source: &'static str,
}

/// A case's rounds before issue 28's round work: `bench e2e` on
/// 2026-11-27 (docs/PLAN.md, "Rounds per layer, before issue 28's round
/// work"), recorded beside each run's own figures.
#[derive(Clone, Copy, Debug, Serialize)]
struct Before {
    rounds: f64,
    rounds_per_layer: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds_per_token: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds_per_layer_per_token: Option<f64>,
    source: &'static str,
}

const BEFORE_28: &str = "bench e2e 2026-11-27, before issue 28 (docs/PLAN.md)";

struct Case {
    name: &'static str,
    model: &'static str,
    text: &'static str,
    tokens: usize,
    runs: usize,
    anchors: &'static [Anchor],
    /// A decoder: `suffuse generate` with the prompt bucket `tokens` and
    /// this many new tokens (1: the prefill alone, one forward pass).
    generate: Option<usize>,
    /// Transformer layers, for rounds per layer.
    layers: usize,
    /// Its rounds before issue 28, where measured.
    before: Option<Before>,
}

/// 119 characters: with `[CLS]` and `[SEP]`, a prompt that fits a 128-token
/// bucket of the generated models' character tokenizer.
const PROMPT_120: &str = "Two servers run a decoder on secret shares of a prompt; neither \
    learns the text, the logits or the tokens picked next!!";

/// 40 SmolLM2 tokens: a prompt for the 64-token bucket.
pub(super) const PROMPT_64: &str = "Function secret sharing lets two servers that do not collude run a \
    transformer on a secret-shared prompt: each holds keys from a dealer and a share of every \
    activation, and neither learns the sentence.";

/// Between 65 and 128 SmolLM2 tokens: a prompt for the 128-token bucket.
const PROMPT_128: &str = "Function secret sharing lets two servers that do not collude run a \
    transformer on a secret-shared prompt: each holds keys from a dealer and a share of every \
    activation, and neither learns the sentence, the intermediate values or the embedding. \
    Every non-linearity, from truncation to GeLU, softmax and LayerNorm, is compiled from a \
    structured description into a fixed number of comparisons on the masked wire.";

/// New tokens of the SmolLM2 cases: the prefill, then three decode passes
/// whose median is the per-token figure at that context.
const SMOLLM2_NEW: usize = 4;

const SPU_MINILM_128: Anchor = Anchor {
    system: "SecretFlow SPU SEMI2K",
    setting: "2 parties simulated in one process, same 2-core machine",
    online_s: 82.0,
    comm_bytes: None,
    key_bytes: None,
    source: "ANCHORS.md / issue #4",
};

const SPU_MINILM_17: Anchor = Anchor {
    online_s: 16.0,
    ..SPU_MINILM_128
};

pub(super) const FUSEFSS_BERT_BASE: Anchor = Anchor {
    system: "FuseFSS",
    setting: "GPUs, BERT-base, 128 tokens",
    online_s: 1.15,
    comm_bytes: Some(0.89e9),
    key_bytes: Some(13.7e9),
    source: "seeds/001 Table 1",
};

pub(super) const SIGMA_BERT_BASE: Anchor = Anchor {
    system: "SIGMA",
    online_s: 1.61,
    comm_bytes: Some(1.06e9),
    key_bytes: Some(18.1e9),
    ..FUSEFSS_BERT_BASE
};

const FUSEFSS_GPT2: Anchor = Anchor {
    system: "FuseFSS",
    setting: "GPUs, GPT-2, 128 tokens",
    online_s: 1.073,
    comm_bytes: Some(0.777e9),
    key_bytes: Some(11.92e9),
    source: "seeds/001 Table 1",
};

const SIGMA_GPT2: Anchor = Anchor {
    system: "SIGMA",
    online_s: 1.424,
    comm_bytes: Some(0.885e9),
    key_bytes: Some(15.35e9),
    ..FUSEFSS_GPT2
};

const CASES: &[Case] = &[
    Case {
        name: "minilm-17",
        model: "models/all-MiniLM-L6-v2",
        text: SHORT,
        tokens: 17,
        runs: 1,
        anchors: &[SPU_MINILM_17],
        generate: None,
        layers: 6,
        before: None,
    },
    Case {
        name: "minilm-128",
        model: "models/all-MiniLM-L6-v2",
        text: PARAGRAPH,
        tokens: 128,
        runs: 3,
        anchors: &[SPU_MINILM_128],
        generate: None,
        layers: 6,
        before: Some(Before {
            rounds: 445.0,
            rounds_per_layer: 445.0 / 6.0,
            rounds_per_token: None,
            rounds_per_layer_per_token: None,
            source: "ANCHORS.md, bench e2e 2026-11-27",
        }),
    },
    Case {
        name: "bert-base-shape-128",
        model: "generated-bert-base",
        text: PARAGRAPH,
        tokens: 128,
        runs: 1,
        anchors: &[FUSEFSS_BERT_BASE, SIGMA_BERT_BASE],
        generate: None,
        layers: 12,
        before: Some(Before {
            rounds: 889.0,
            rounds_per_layer: 889.0 / 12.0,
            rounds_per_token: None,
            rounds_per_layer_per_token: None,
            source: BEFORE_28,
        }),
    },
    Case {
        name: "gpt2-shape-128",
        model: "generated-gpt2",
        text: PROMPT_120,
        tokens: 128,
        runs: 1,
        anchors: &[FUSEFSS_GPT2, SIGMA_GPT2],
        generate: Some(1),
        layers: 12,
        before: Some(Before {
            rounds: 941.0,
            rounds_per_layer: 941.0 / 12.0,
            rounds_per_token: None,
            rounds_per_layer_per_token: None,
            source: BEFORE_28,
        }),
    },
    Case {
        name: "smollm2-64",
        model: "models/SmolLM2-135M-Instruct",
        text: PROMPT_64,
        tokens: 64,
        runs: 1,
        anchors: &[],
        generate: Some(SMOLLM2_NEW),
        layers: 30,
        before: Some(Before {
            rounds: 2174.0,
            rounds_per_layer: 2174.0 / 30.0,
            rounds_per_token: Some(2236.0),
            rounds_per_layer_per_token: Some(2236.0 / 30.0),
            source: BEFORE_28,
        }),
    },
    Case {
        name: "smollm2-128",
        model: "models/SmolLM2-135M-Instruct",
        text: PROMPT_128,
        tokens: 128,
        runs: 1,
        anchors: &[],
        generate: Some(SMOLLM2_NEW),
        layers: 30,
        before: None,
    },
];

/// A `suffuse --report-json` object, kept as JSON: the bench reads the
/// same fields other tools read.
type Report = serde_json::Map<String, Value>;

#[derive(Serialize)]
struct Record {
    name: &'static str,
    /// The report of the run with the median online time.
    #[serde(flatten)]
    report: Report,
    online_s_runs: Vec<f64>,
    /// All rounds of the run over the layers (the prefill's, for a
    /// decoder; its decode passes have `rounds_per_layer_per_token`).
    rounds_per_layer: f64,
    /// Rounds per layer by kind of step: the whole run's for an encoder or
    /// a prefill alone, a decode pass's for a decoder that decoded (its
    /// `rounds_by_gate_per_token`); kinds with no round of their own are
    /// left out.
    rounds_per_layer_by_gate: BTreeMap<String, f64>,
    /// The same case's rounds before issue 28 (for "before and after").
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds_before: Option<Before>,
    /// The same keys dealt by `suffuse dealer` (issue 29 item 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    dealer: Option<Dealer>,
    anchors: &'static [Anchor],
}

/// One `suffuse dealer` run of a case's plan: the deployment's dealer,
/// which writes its files around the page cache for a later query, timed
/// beside the case's online phase on the same machine (issue 29 item 5:
/// key generation at least as fast as the online phase). The in-process
/// `keygen_s` of the report is not that figure: `embed` and `generate`
/// write their keys through the page cache for servers that read them at
/// once, and on a machine with less free memory than keys the kernel's
/// write-back sets its pace.
#[derive(Clone, Copy, Debug, Serialize)]
struct Dealer {
    /// Its wall time from the first step to both files whole.
    keygen_s: f64,
    /// `keygen_s` over the case's online time (median run): at most 1
    /// when the dealer keeps up.
    over_online: f64,
}

pub fn run() -> Result<String> {
    let bin = super::release_suffuse()?;
    let scratch = command::target_dir()?.join("bench/e2e-reports");
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let mut records = Vec::new();
    // `SUFFUSE_E2E_CASES=gpt2-shape-128,minilm-17` runs only those cases.
    for case in CASES
        .iter()
        .filter(|c| super::chosen("SUFFUSE_E2E_CASES", c.name))
    {
        let Some(model) = super::model_arg(case.name, case.model) else {
            continue;
        };
        let mut reports = Vec::new();
        for run in 0..case.runs {
            println!("{} run {}/{}", case.name, run + 1, case.runs);
            let path = scratch.join(format!("{}-{run}.json", case.name));
            reports.push(embed(&bin, &model, case, &path)?);
        }
        let online = |r: &Report| number(r, "online_s");
        let mut runs: Vec<f64> = reports.iter().map(online).collect();
        reports.sort_by(|a, b| online(a).total_cmp(&online(b)));
        let report = reports.swap_remove(reports.len() / 2);
        runs.sort_by(f64::total_cmp);
        let rounds_per_layer = prefill_rounds(&report) / case.layers as f64;
        let rounds_per_layer_by_gate = per_layer_by_gate(&report, case.layers);
        let dealer = if super::chosen("SUFFUSE_E2E_DEALER", "1") {
            let keygen_s = deal(&bin, &model, case, &scratch, &report)?;
            let over_online = keygen_s / number(&report, "online_s");
            Some(Dealer {
                keygen_s,
                over_online,
            })
        } else {
            None
        };
        records.push(Record {
            name: case.name,
            report,
            online_s_runs: runs,
            rounds_per_layer,
            rounds_per_layer_by_gate,
            rounds_before: case.before,
            dealer,
            anchors: case.anchors,
        });
    }
    print_table(&records);
    Ok(serde_json::to_string_pretty(&records)?)
}

fn embed(bin: &Path, model: &str, case: &Case, report: &Path) -> Result<Report> {
    let tokens = case.tokens.to_string();
    let path = report.to_string_lossy();
    let mut cmd = std::process::Command::new(bin);
    match case.generate {
        Some(new) => cmd.args([
            "generate",
            "--model",
            model,
            "--seq",
            &tokens,
            "--max-new-tokens",
            &new.to_string(),
            "--report-json",
            &path,
            case.text,
        ]),
        None => cmd.args([
            "embed",
            "--model",
            model,
            "--max-tokens",
            &tokens,
            "--compare",
            "float",
            "--report-json",
            &path,
            case.text,
        ]),
    };
    succeeded(case.name, &command::capture(&mut cmd)?)?;
    let map = read_report(report)?;
    let got = map.get("tokens").and_then(Value::as_u64);
    if got != Some(case.tokens as u64) {
        bail!("{}: ran {got:?} tokens, wanted {}", case.name, case.tokens);
    }
    if map.get("bit_exact") != Some(&Value::Bool(true)) {
        bail!("{}: the secure output is not bit-exact", case.name);
    }
    Ok(map)
}

/// Fails, with the command's own error output, unless it succeeded.
fn succeeded(what: &str, out: &std::process::Output) -> Result<()> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A `--report-json` file, which must hold a JSON object.
fn read_report(path: &Path) -> Result<Report> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let Value::Object(map) = serde_json::from_slice(&text)? else {
        bail!("{}: the report is not a JSON object", path.display());
    };
    Ok(map)
}

/// Deals `case`'s keys with `suffuse dealer` into a folder under
/// `scratch`, removed afterwards, and returns its key generation time; the
/// plan must be the one `run` ran.
fn deal(bin: &Path, model: &str, case: &Case, scratch: &Path, run: &Report) -> Result<f64> {
    let out = scratch.join(format!("{}-dealt", case.name));
    let report = scratch.join(format!("{}-dealer.json", case.name));
    // A folder left by an interrupted run holds one-time keys nobody will
    // spend; the dealer refuses to write over them.
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let tokens = case.tokens.to_string();
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["dealer", "--model", model, "--seq", &tokens]);
    if let Some(new) = case.generate {
        cmd.args(["--max-new-tokens", &new.to_string()]);
    }
    cmd.arg("--out").arg(&out).arg("--report-json").arg(&report);
    println!("{} dealer", case.name);
    let ran = command::capture(&mut cmd);
    let removed = std::fs::remove_dir_all(&out);
    succeeded(&format!("{}'s dealer", case.name), &ran?)?;
    removed.with_context(|| format!("removing {}", out.display()))?;
    let dealt = read_report(&report)?;
    if dealt.get("plan_hash") != run.get("plan_hash") {
        bail!("{}: the dealer's plan is not the run's", case.name);
    }
    Ok(number(&dealt, "keygen_s"))
}

/// The rounds of an encoder run, or of a decoder's prefill: a generation's
/// `rounds` counts every pass, and each decode pass costs
/// `rounds_per_token`.
fn prefill_rounds(r: &Report) -> f64 {
    let all = number(r, "rounds");
    let per_token = number(r, "rounds_per_token");
    let passes = r
        .get("generated_token_ids")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    match per_token.is_finite() && passes > 1 {
        true => all - per_token * (passes - 1) as f64,
        false => all,
    }
}

/// Rounds per layer by kind of step ([`Record::rounds_per_layer_by_gate`]).
fn per_layer_by_gate(r: &Report, layers: usize) -> BTreeMap<String, f64> {
    let kinds = |field: &str| r.get(field).and_then(Value::as_object);
    let decode = kinds("rounds_by_gate_per_token").filter(|k| !k.is_empty());
    let Some(kinds) = decode.or_else(|| kinds("rounds_by_gate")) else {
        return BTreeMap::new();
    };
    kinds
        .iter()
        .filter_map(|(kind, v)| {
            let rounds = v.get("rounds")?.as_f64()?;
            (rounds > 0.0).then(|| (kind.clone(), rounds / layers.max(1) as f64))
        })
        .collect()
}

/// A number field of a report (NaN if absent).
fn number(r: &Report, key: &str) -> f64 {
    r.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// Party `p`'s entry of a per-party field (NaN if absent).
fn of_party(r: &Report, key: &str, p: usize) -> f64 {
    r.get(key)
        .and_then(|v| v.get(p))
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN)
}

fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}

fn mb(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}

fn print_table(records: &[Record]) {
    println!(
        "\n{:<20} {:>6} {:>9} {:>9} {:>10} {:>7} {:>8} {:>10} {:>10} {:>8}",
        "case",
        "tokens",
        "online s",
        "keygen s",
        "comm/party",
        "rounds",
        "rounds/l",
        "keys P0",
        "keys P1",
        "cosine"
    );
    for rec in records {
        let r = &rec.report;
        println!(
            "{:<20} {:>6} {:>9.2} {:>9.2} {:>10} {:>7} {:>8.1} {:>10} {:>10} {:>8.5}",
            rec.name,
            number(r, "tokens"),
            number(r, "online_s"),
            number(r, "keygen_s"),
            gb(of_party(r, "comm_bytes_per_party", 0)),
            number(r, "rounds"),
            rec.rounds_per_layer,
            gb(of_party(r, "key_bytes_per_party", 0)),
            gb(of_party(r, "key_bytes_per_party", 1)),
            number(r, "cosine_to_float"),
        );
        if let Some(d) = rec.dealer {
            println!(
                "  suffuse dealer             {:.2} s, {:.2}× the online time",
                d.keygen_s, d.over_online
            );
        }
        let mut kinds: Vec<_> = rec.rounds_per_layer_by_gate.iter().collect();
        kinds.sort_by(|a, b| b.1.total_cmp(a.1));
        let kinds: Vec<String> = kinds.iter().map(|(k, r)| format!("{k} {r:.1}")).collect();
        println!("  rounds per layer by step   {}", kinds.join(", "));
        if let Some(b) = rec.rounds_before {
            println!(
                "  before issue 28            {:.0} rounds, {:.1} per layer  [{}]",
                b.rounds, b.rounds_per_layer, b.source
            );
        }
        for a in rec.anchors {
            let ours = number(r, "online_s");
            // Table 1 does not say whether its figures are per party; the
            // goal reads them as per party, ours are per party.
            if let (Some(c), Some(k)) = (a.comm_bytes, a.key_bytes) {
                let keys = of_party(r, "key_bytes_per_party", 0).max(of_party(
                    r,
                    "key_bytes_per_party",
                    1,
                ));
                println!(
                    "  vs {:<22} per party: comm {:.2}×, larger key file {:.2}× theirs",
                    a.system,
                    of_party(r, "comm_bytes_per_party", 0) / c,
                    keys / k
                );
            }
            println!(
                "  vs {:<22} online {:>7.2} s ({:.2}× ours){}{}  [{}; {}]",
                a.system,
                a.online_s,
                a.online_s / ours,
                a.comm_bytes
                    .map_or(String::new(), |c| format!(", comm {}", gb(c))),
                a.key_bytes
                    .map_or(String::new(), |k| format!(", keys {}", gb(k))),
                a.setting,
                a.source
            );
        }
    }
    print_generation(records);
    println!(
        "\nonline s: the client's wall time from sending shares to holding the output, \
         median of the runs in online_s_runs; both servers and the client share this \
         machine's cores. keygen s: the same run's dealing, through the page cache; \
         `suffuse dealer` is the deployment's dealer, around it (SUFFUSE_E2E_DEALER=0 \
         skips it). comm/party: bytes one server sent the other. Anchors are other \
         systems' published figures, on other hardware where stated."
    );
}

/// The decoder cases that ran decode passes: the prefill, then the
/// median decode pass at the bucket's context (a prefill-only case is in
/// the table above).
fn print_generation(records: &[Record]) {
    let generated: Vec<&Record> = records
        .iter()
        .filter(|r| number(&r.report, "rounds_per_token") > 0.0)
        .collect();
    if generated.is_empty() {
        return;
    }
    println!(
        "\n{:<20} {:>6} {:>10} {:>11} {:>9} {:>11} {:>11} {:>11}",
        "decoder case",
        "ctx",
        "prefill s",
        "decode s/t",
        "rounds/t",
        "rounds/l/t",
        "comm/t/party",
        "keys/t/party"
    );
    for rec in generated {
        let r = &rec.report;
        println!(
            "{:<20} {:>6} {:>10.2} {:>11.3} {:>9.0} {:>11.1} {:>11} {:>11}",
            rec.name,
            number(r, "prompt_bucket"),
            number(r, "prefill_online_s"),
            number(r, "decode_online_s_per_token"),
            number(r, "rounds_per_token"),
            number(r, "rounds_per_layer_per_token"),
            mb(number(r, "comm_bytes_per_token_per_party")),
            mb(number(r, "key_bytes_per_token_per_party")),
        );
    }
}
