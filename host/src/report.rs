//! The report of a secure run: online time, communication and rounds per
//! party, key generation time and key bytes, and the same figures per layer
//! kind (the columns of seeds/001 Tables 1, 5 and 6), as a table and as
//! JSON. The JSON field names are read by other tools: keep them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::dealer::DealReport;
use crate::party::PartyReport;
use crate::plan::Category;

/// Figures of one layer kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Breakdown {
    /// Online seconds (the slower party).
    pub online_s: f64,
    /// Bytes sent by P0 and by P1.
    pub comm_bytes_per_party: [u64; 2],
    /// Rounds.
    pub rounds: u64,
    /// Key bytes of P0 and of P1.
    pub key_bytes_per_party: [u64; 2],
}

/// A run's report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The model.
    pub model: String,
    /// Tokens per sentence (the padded length the keys were dealt for).
    pub tokens: usize,
    /// Sentences.
    pub batch: usize,
    /// Real tokens of each sentence.
    pub real_tokens: Vec<usize>,
    /// Online wall time seen by the client, inputs sent to output held.
    pub online_s: f64,
    /// Bytes each server sent to the other.
    pub comm_bytes_per_party: [u64; 2],
    /// Rounds between the servers.
    pub rounds: u64,
    /// Dealer wall time (0 when the keys came from a separate dealer run).
    pub keygen_s: f64,
    /// Key file sizes.
    pub key_bytes_per_party: [u64; 2],
    /// Whether the secure output equals the fixed-point reference bit for
    /// bit (when the reference ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_exact: Option<bool>,
    /// The smallest cosine between a secure embedding and the float
    /// model's (when compared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cosine_to_float: Option<f64>,
    /// Per sentence (when compared).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cosine_to_float_each: Vec<f64>,
    /// Generation figures (decoders).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub generation: Option<Figures>,
    /// The plan's hash.
    pub plan_hash: String,
    /// The backend the servers ran on (`--backend`), as P0 reports it.
    pub backend: String,
    /// Its AES path: `vaes512`, `vaes256`, `aesni` or `portable` on CPUs.
    pub aes_path: String,
    /// The device the servers ran on (empty on CPUs), as P0 reports it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub device: String,
    /// The most device memory either server had held, in bytes (0 on CPUs).
    #[serde(skip_serializing_if = "is_zero")]
    pub device_peak_bytes: u64,
    /// Seconds per phase of the device work, as each server's backend and
    /// the dealer's counted them when they finished (`BatchEval::
    /// device_phases`). The totals are the backend's over its life: where
    /// the dealer and both servers share one process (`embed`), they share
    /// one evaluator and each snapshot holds the others' work done so far.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub device_phases: BTreeMap<&'static str, BTreeMap<String, f64>>,
    /// Per layer kind.
    pub breakdown: BTreeMap<&'static str, Breakdown>,
    /// Key bytes per gate (`Kind::key_label`: a truncation by the bits it
    /// drops), with the elements those gates output.
    pub keys_by_gate: BTreeMap<String, GateBreakdown>,
    /// Rounds and bytes sent per kind of step (`Kind::round_label`, else
    /// the category), over every pass that ran: where a case's rounds go.
    pub rounds_by_gate: BTreeMap<String, GateRounds>,
}

/// The key bytes of one kind of gate.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GateBreakdown {
    /// Output elements (the same on both parties).
    pub elements: u64,
    /// Key bytes of P0 and of P1.
    pub key_bytes_per_party: [u64; 2],
}

/// The generation fields of the report (made by `generate`'s `Figures::of`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// The prompt's token ids (before padding).
    pub prompt_token_ids: Vec<u32>,
    /// The generated token ids.
    pub generated_token_ids: Vec<u32>,
    /// The prompt bucket the keys were dealt for.
    pub prompt_bucket: usize,
    /// Online seconds of the prefill (client's view).
    pub prefill_online_s: f64,
    /// Median online seconds of a decode pass.
    pub decode_online_s_per_token: f64,
    /// Mean bytes a server sent its peer per decode pass (the larger of
    /// the two).
    pub comm_bytes_per_token_per_party: f64,
    /// Mean rounds per decode pass.
    pub rounds_per_token: f64,
    /// Mean rounds per decode pass over the decoder's blocks: what
    /// dominates over a real network.
    pub rounds_per_layer_per_token: f64,
    /// Mean key bytes per decode pass (the larger party's).
    pub key_bytes_per_token_per_party: f64,
    /// Mean rounds and bytes sent per decode pass, per kind of step.
    pub rounds_by_gate_per_token: BTreeMap<String, GateRounds>,
}

/// The rounds and bytes sent of one kind of step, over some passes and
/// divided by a count of them (1 for a whole run; the decode passes for a
/// generation's per-token figures).
#[derive(Clone, Debug, Default, Serialize)]
pub struct GateRounds {
    /// Steps of this kind.
    pub steps: f64,
    /// Rounds counted under them (the larger party's count). A round that
    /// lanes share is counted once, under the first lane's step, so the
    /// kinds add up to the run's rounds.
    pub rounds: f64,
    /// Bytes P0 and P1 sent for them.
    pub comm_bytes_per_party: [f64; 2],
}

/// One line of rounds per kind of step, most first (a mean to two
/// decimals); nothing where no kind has a round.
pub fn rounds_line(s: &mut String, title: &str, kinds: &BTreeMap<String, GateRounds>) {
    let mut kinds: Vec<_> = kinds.iter().filter(|(_, g)| g.rounds > 0.0).collect();
    if kinds.is_empty() {
        return;
    }
    kinds.sort_by(|a, b| b.1.rounds.total_cmp(&a.1.rounds));
    let list: Vec<String> = kinds
        .iter()
        .map(|(k, g)| format!("{k} {}", (g.rounds * 100.0).round() / 100.0))
        .collect();
    let _ = writeln!(s, "{title}: {}", list.join(", "));
}

/// The parties' traffic per kind of step over `passes`, divided by `per`
/// (1 for the sums).
pub fn rounds_by_gate(
    parties: &[PartyReport; 2],
    passes: std::ops::Range<usize>,
    per: usize,
) -> BTreeMap<String, GateRounds> {
    // Per kind: steps, and each party's rounds and bytes sent.
    let mut sums: BTreeMap<&str, (u64, [u64; 2], [u64; 2])> = BTreeMap::new();
    for (p, r) in parties.iter().enumerate() {
        let maps = r.traffic_by_pass.get(passes.clone()).unwrap_or_default();
        for (label, t) in maps.iter().flatten() {
            let (steps, rounds, sent) = sums.entry(label).or_default();
            if p == 0 {
                *steps += t.steps;
            }
            rounds[p] += t.rounds;
            sent[p] += t.sent;
        }
    }
    let per = per.max(1) as f64;
    sums.into_iter()
        .map(|(label, (steps, rounds, sent))| {
            let g = GateRounds {
                steps: steps as f64 / per,
                rounds: rounds[0].max(rounds[1]) as f64 / per,
                comm_bytes_per_party: sent.map(|b| b as f64 / per),
            };
            (label.to_owned(), g)
        })
        .collect()
}

impl Report {
    /// Fills the protocol figures from the parties' and dealer's reports.
    pub fn with_parties(
        mut self,
        parties: &[PartyReport; 2],
        dealer: Option<&DealReport>,
    ) -> Report {
        self.comm_bytes_per_party = [parties[0].comm_bytes, parties[1].comm_bytes];
        self.backend.clone_from(&parties[0].backend);
        self.aes_path.clone_from(&parties[0].aes_path);
        self.device.clone_from(&parties[0].device);
        self.device_peak_bytes = parties[0]
            .device_peak_bytes
            .max(parties[1].device_peak_bytes);
        self.rounds = parties[0].rounds.max(parties[1].rounds);
        for (who, r) in ["p0", "p1"].into_iter().zip(parties) {
            if !r.device_phases.is_empty() {
                self.device_phases.insert(who, r.device_phases.clone());
            }
        }
        for c in Category::ALL {
            let mut b = Breakdown::default();
            for (p, r) in parties.iter().enumerate() {
                if let Some(f) = r.breakdown.get(&c) {
                    b.online_s = b.online_s.max(f.online_s);
                    b.comm_bytes_per_party[p] = f.comm_bytes;
                    b.rounds = b.rounds.max(f.rounds);
                    b.key_bytes_per_party[p] = f.key_bytes;
                }
            }
            self.breakdown.insert(c.name(), b);
        }
        for (p, r) in parties.iter().enumerate() {
            for (label, g) in &r.by_gate {
                let b = self.keys_by_gate.entry(label.clone()).or_default();
                b.elements = g.elements;
                b.key_bytes_per_party[p] = g.key_bytes;
            }
        }
        let passes = parties[0].traffic_by_pass.len();
        self.rounds_by_gate = rounds_by_gate(parties, 0..passes, 1);
        match dealer {
            Some(d) => {
                self.keygen_s = d.keygen_s;
                if !d.device_phases.is_empty() {
                    self.device_phases.insert("dealer", d.device_phases.clone());
                }
                self.key_bytes_per_party = d.file_bytes;
            }
            None => {
                self.key_bytes_per_party = [parties[0].key_bytes, parties[1].key_bytes];
            }
        }
        self
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "model {}  ·  {} sentence(s) × {} tokens (real: {:?})  ·  plan {}",
            self.model,
            self.batch,
            self.tokens,
            self.real_tokens,
            &self.plan_hash[..self.plan_hash.len().min(16)]
        );
        let _ = writeln!(
            s,
            "{:<18} {:>10} {:>12} {:>12} {:>8} {:>12} {:>12}",
            "layer kind", "online s", "comm P0", "comm P1", "rounds", "keys P0", "keys P1"
        );
        for c in Category::ALL {
            if let Some(b) = self.breakdown.get(c.name()) {
                let (comm, keys) = (b.comm_bytes_per_party, b.key_bytes_per_party);
                table_row(&mut s, c.name(), b.online_s, comm, b.rounds, keys);
            }
        }
        let (comm, keys) = (self.comm_bytes_per_party, self.key_bytes_per_party);
        table_row(&mut s, "total", self.online_s, comm, self.rounds, keys);
        rounds_line(&mut s, "rounds by kind of step", &self.rounds_by_gate);
        if let Some(g) = &self.generation {
            let title = "rounds per decode pass by kind of step";
            rounds_line(&mut s, title, &g.rounds_by_gate_per_token);
        }
        self.table_notes(&mut s);
        s
    }

    /// The table's lines after the rows: backend, device, dealing time,
    /// the bit-exact check and the cosine, where the report has them.
    fn table_notes(&self, s: &mut String) {
        if !self.backend.is_empty() {
            let _ = writeln!(s, "backend {} (AES: {})", self.backend, self.aes_path);
        }
        if !self.device.is_empty() {
            let _ = writeln!(
                s,
                "device {}, peak device memory {}",
                self.device,
                bytes(self.device_peak_bytes)
            );
        }
        for (who, phases) in &self.device_phases {
            let list: Vec<String> = phases.iter().map(|(n, t)| format!("{n} {t:.3}")).collect();
            let _ = writeln!(s, "device seconds by phase ({who}): {}", list.join(", "));
        }
        // Zero when the keys came from a separate `suffuse dealer` run.
        if self.keygen_s > 0.0 {
            let _ = writeln!(s, "key generation {:.3} s", self.keygen_s);
        }
        if let Some(b) = self.bit_exact {
            let _ = writeln!(
                s,
                "secure output {} the fixed-point reference bit for bit",
                if b { "EQUALS" } else { "DIFFERS FROM" }
            );
        }
        if let Some(c) = self.cosine_to_float {
            let _ = writeln!(
                s,
                "cosine to the float model: {c:.6} (lowest over the batch)"
            );
        }
    }
}

/// One row of [`Report::table`]: a layer kind's (or the total's) time,
/// communication, rounds and keys per party.
fn table_row(
    s: &mut String,
    name: &str,
    online_s: f64,
    comm: [u64; 2],
    rounds: u64,
    keys: [u64; 2],
) {
    let _ = writeln!(
        s,
        "{:<18} {:>10.3} {:>12} {:>12} {:>8} {:>12} {:>12}",
        name,
        online_s,
        bytes(comm[0]),
        bytes(comm[1]),
        rounds,
        bytes(keys[0]),
        bytes(keys[1]),
    );
}

/// Bytes in binary units.
pub fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Cosine similarity.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    let nb: f64 = b
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// For `skip_serializing_if`: CPU runs hold no device memory.
fn is_zero(v: &u64) -> bool {
    *v == 0
}
