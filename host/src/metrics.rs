//! `serve --metrics ADDR`: what an operator watches, in Prometheus'
//! exposition format (`prometheus-client`), with liveness and readiness.
//!
//! Every figure here is one the server already has of every query it
//! serves: that a query came and how it ended, its online time, its rounds
//! and the bytes it sent its peer (all fixed by the plan, which the
//! servers know), and the key sets left in its own pool. None depends on
//! a query's content or its length within the padded shape, so the metrics
//! tell a scraper nothing the server does not already learn
//! (docs/GATEWAY.md). The endpoint listens on loopback unless told
//! otherwise, since whoever reads it learns the server's load.
//!
//! The endpoint is axum on a one-thread tokio runtime of its own; the
//! protocol threads never wait on it.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::party::PartyReport;
use crate::plan::hex;
use crate::pool::Pool;

/// A reason label: why a query failed or a client was turned away.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

/// A plan label: the key sets of one plan.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanLabel {
    plan: String,
}

/// One server's metrics.
pub struct ServerMetrics {
    registry: Registry,
    served: Counter,
    failed: Family<Reason, Counter>,
    refused: Family<Reason, Counter>,
    dropped: Counter,
    pool_sets: Family<PlanLabel, Gauge>,
    round_latency: Histogram,
    online: Histogram,
    bytes_sent: Counter,
    ready_gauge: Gauge,
    accepting: AtomicBool,
    planned: AtomicBool,
    pool: Mutex<Option<(PathBuf, u8)>>,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerMetrics")
    }
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerMetrics {
    /// The metrics, registered, all zero.
    pub fn new() -> ServerMetrics {
        let mut registry = Registry::with_prefix("suffuse");
        let m = ServerMetrics {
            served: Counter::default(),
            failed: Family::default(),
            refused: Family::default(),
            dropped: Counter::default(),
            pool_sets: Family::default(),
            // 1 ms to about 33 s per round; 10 ms to about 330 s online.
            round_latency: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            online: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            bytes_sent: Counter::default(),
            ready_gauge: Gauge::default(),
            accepting: AtomicBool::new(false),
            planned: AtomicBool::new(false),
            pool: Mutex::new(None),
            registry: Registry::default(),
        };
        m.register(&mut registry);
        ServerMetrics { registry, ..m }
    }

    /// Registers every metric in `r`.
    fn register(&self, r: &mut Registry) {
        let m = self;
        r.register("queries_served", "Queries answered", m.served.clone());
        r.register(
            "queries_failed",
            "Queries that failed after admission, by reason",
            m.failed.clone(),
        );
        r.register(
            "clients_refused",
            "Clients turned away before any work, by reason",
            m.refused.clone(),
        );
        r.register(
            "connections_dropped",
            "Connections refused before admission (handshake, hello, too many)",
            m.dropped.clone(),
        );
        r.register(
            "pool_key_sets",
            "Key sets in this server's pool, by plan",
            m.pool_sets.clone(),
        );
        r.register(
            "round_latency_seconds",
            "Mean round latency of each served query",
            m.round_latency.clone(),
        );
        r.register(
            "online_seconds",
            "Online time of each served query",
            m.online.clone(),
        );
        r.register(
            "sent_bytes",
            "Bytes sent to the peer by served queries",
            m.bytes_sent.clone(),
        );
        r.register(
            "ready",
            "1 when the server admits queries and holds a key set",
            m.ready_gauge.clone(),
        );
    }

    /// Counts key sets in `pool` (this party's files) at each scrape.
    pub fn watch_pool(&self, pool: &Pool, party: u8) {
        *self.pool.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((pool.dir().to_path_buf(), party));
    }

    /// A query served.
    pub fn served(&self, r: &PartyReport) {
        self.served.inc();
        self.online.observe(r.online_s);
        if r.rounds > 0 {
            self.round_latency.observe(r.online_s / r.rounds as f64);
        }
        self.bytes_sent.inc_by(r.comm_bytes);
    }

    /// A query failed after admission.
    pub fn failed(&self, reason: &'static str) {
        self.failed.get_or_create(&Reason { reason }).inc();
    }

    /// A client turned away.
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&Reason { reason }).inc();
    }

    /// A connection dropped before admission.
    pub fn dropped(&self) {
        self.dropped.inc();
    }

    /// Whether the accept loop admits queries.
    pub fn set_accepting(&self, on: bool) {
        self.accepting.store(on, Ordering::Relaxed);
    }

    /// The server has planned the shapes its pool held when it started.
    pub fn planned(&self) {
        self.planned.store(true, Ordering::Relaxed);
    }

    /// Ready: admitting, with the pool's shapes planned and at least one
    /// key set in the pool.
    pub fn ready(&self) -> bool {
        self.refresh_pool() > 0
            && self.accepting.load(Ordering::Relaxed)
            && self.planned.load(Ordering::Relaxed)
    }

    /// Recounts the pool's key sets by plan; returns them all.
    fn refresh_pool(&self) -> usize {
        let pool = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some((dir, party)) = pool else {
            return 0;
        };
        let counts = count_by_plan(&dir, party);
        self.pool_sets.clear();
        for (plan, n) in &counts {
            let n = i64::try_from(*n).unwrap_or(i64::MAX);
            self.pool_sets
                .get_or_create(&PlanLabel { plan: plan.clone() })
                .set(n);
        }
        counts.values().sum()
    }

    /// The exposition text, with the pool and readiness as of now.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        self.ready_gauge.set(i64::from(self.ready()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// This party's unspent key files in the pool at `dir`, by the plan their
/// header names (files whose header cannot be read count as `unreadable`).
fn count_by_plan(dir: &std::path::Path, party: u8) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for header in crate::pool::headers(dir, party) {
        let plan = header.map_or_else(|| "unreadable".to_string(), |h| hex(&h.plan_hash));
        *counts.entry(plan).or_default() += 1;
    }
    counts
}

/// Serves `/metrics`, `/livez` and `/readyz` on `addr` from a thread of
/// its own; returns the address bound.
pub fn serve(addr: &str, metrics: Arc<ServerMetrics>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(metrics);
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => {
                        if let Err(e) = axum::serve(l, app).await {
                            eprintln!("metrics endpoint stopped: {e}");
                        }
                    }
                    Err(e) => eprintln!("metrics endpoint: {e}"),
                }
            });
        })?;
    Ok(bound)
}

async fn scrape(State(m): State<Arc<ServerMetrics>>) -> Response {
    let content = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    match tokio::task::spawn_blocking(move || m.render()).await {
        Ok(Ok(text)) => ([(header::CONTENT_TYPE, content)], text).into_response(),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed\n",
        )
            .into_response(),
    }
}

async fn readyz(State(m): State<Arc<ServerMetrics>>) -> Response {
    match tokio::task::spawn_blocking(move || m.ready()).await {
        Ok(true) => (StatusCode::OK, "ready\n").into_response(),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn counters_and_histograms_appear_in_the_exposition() {
        let m = ServerMetrics::new();
        let r = PartyReport {
            online_s: 0.5,
            rounds: 10,
            comm_bytes: 1000,
            ..PartyReport::default()
        };
        m.served(&r);
        m.failed("timeout");
        m.refused("pool_empty");
        let text = m.render().unwrap();
        for line in [
            "suffuse_queries_served_total 1",
            "suffuse_queries_failed_total{reason=\"timeout\"} 1",
            "suffuse_clients_refused_total{reason=\"pool_empty\"} 1",
            "suffuse_sent_bytes_total 1000",
            "suffuse_online_seconds_count 1",
            "suffuse_ready 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
