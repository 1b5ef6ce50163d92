//! Prometheus metrics. Latency histograms (time to first token, inter-token latency,
//! end-to-end) and request outcomes are recorded as requests run; engine and plugin state
//! (running/waiting, KV pages, prefix-cache hits, token counters, per-plugin calls, latency,
//! faults, fallbacks) is read from their snapshots at scrape time.

use prometheus::{Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounterVec, Opts, Registry, TextEncoder};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use weft_engine::{EngineStats, FinishReason};
use weft_plugin_host::PluginSummary;

pub struct Metrics {
    registry: Registry,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    outcomes: IntCounterVec,
    engine_gauges: GaugeVec,
    engine_counters: IntCounterVec,
    speculative: GaugeVec,
    hit_rate: Gauge,
    tokens_per_s: Gauge,
    plugin_counters: IntCounterVec,
    plugin_seconds: prometheus::CounterVec,
    plugin_gauges: GaugeVec,
    /// (time, generated tokens) samples for the tokens/s gauge, newest last.
    window: Mutex<VecDeque<(Instant, u64)>>,
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid histogram")
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let lat = vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
        let ttft = histogram("weft_time_to_first_token_seconds", "Time from request arrival to its first generated token.", lat.clone());
        let itl = histogram("weft_inter_token_latency_seconds", "Time between consecutive generated tokens of one request.", lat.clone());
        let e2e = histogram("weft_e2e_request_latency_seconds", "Time from request arrival to its last token.", vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]);
        let outcomes = IntCounterVec::new(Opts::new("weft_requests_total", "Finished choices by outcome (stop, length, error, aborted)."), &["outcome"]).unwrap();
        let engine_gauges = GaugeVec::new(Opts::new("weft_engine", "Engine state: requests running/waiting, KV pages used/free/total/cached."), &["state"]).unwrap();
        let engine_counters = IntCounterVec::new(
            Opts::new(
                "weft_engine_events_total",
                "Engine counters: prompt and generated tokens, prefix-cache hit and queried tokens, steps, preemptions, steps recorded as GPU graphs / replayed / not recordable.",
            ),
            &["event"],
        )
        .unwrap();
        let speculative = GaugeVec::new(
            Opts::new(
                "weft_speculative",
                "Speculative decoding since start, per drafter: acceptance_rate (accepted / drafted tokens) and mean_accepted_length (tokens per verify step, the correction or bonus token included).",
            ),
            &["drafter", "stat"],
        )
        .unwrap();
        let hit_rate = Gauge::new("weft_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens looked up, since start.").unwrap();
        let tokens_per_s = Gauge::new("weft_generation_tokens_per_second", "Generated tokens per second over the last 10 seconds.").unwrap();
        let labels = &["kind", "name", "version", "what"];
        let plugin_counters = IntCounterVec::new(Opts::new("weft_plugin_events_total", "Per plugin version: calls, faults, fallbacks."), labels).unwrap();
        let plugin_seconds = prometheus::CounterVec::new(Opts::new("weft_plugin_call_seconds_total", "Per plugin version: total seconds inside calls."), &["kind", "name", "version"]).unwrap();
        let plugin_gauges = GaugeVec::new(Opts::new("weft_plugin_version", "Per plugin version: active (1/0), in_use (requests bound to it), mean_call_us."), labels).unwrap();
        for c in [
            Box::new(ttft.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(itl.clone()),
            Box::new(e2e.clone()),
            Box::new(outcomes.clone()),
            Box::new(engine_gauges.clone()),
            Box::new(engine_counters.clone()),
            Box::new(speculative.clone()),
            Box::new(hit_rate.clone()),
            Box::new(tokens_per_s.clone()),
            Box::new(plugin_counters.clone()),
            Box::new(plugin_seconds.clone()),
            Box::new(plugin_gauges.clone()),
        ] {
            registry.register(c).expect("unique metric names");
        }
        Metrics {
            registry,
            ttft,
            itl,
            e2e,
            outcomes,
            engine_gauges,
            engine_counters,
            speculative,
            hit_rate,
            tokens_per_s,
            plugin_counters,
            plugin_seconds,
            plugin_gauges,
            window: Mutex::new(VecDeque::new()),
        }
    }

    pub fn request_failed(&self) {
        self.outcomes.with_label_values(&["error"]).inc();
    }

    /// Records a generated-token sample for the tokens/s gauge (called every second).
    pub fn sample_tokens(&self, generated: u64) {
        let now = Instant::now();
        let mut w = self.window.lock().unwrap();
        w.push_back((now, generated));
        while w.len() > 2 && now.duration_since(w[0].0).as_secs_f64() > 10.0 {
            w.pop_front();
        }
    }

    fn tokens_per_second(&self) -> f64 {
        let w = self.window.lock().unwrap();
        match (w.front(), w.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => (b.1.saturating_sub(a.1)) as f64 / b.0.duration_since(a.0).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// The Prometheus text exposition, with engine and plugin snapshots folded in.
    pub fn render(&self, e: &EngineStats, plugins: &[PluginSummary]) -> String {
        let g = &self.engine_gauges;
        g.with_label_values(&["running"]).set(e.running as f64);
        g.with_label_values(&["waiting"]).set(e.waiting as f64);
        g.with_label_values(&["kv_pages_used"]).set((e.total_pages - e.free_pages) as f64);
        g.with_label_values(&["kv_pages_free"]).set(e.free_pages as f64);
        g.with_label_values(&["kv_pages_total"]).set(e.total_pages as f64);
        g.with_label_values(&["kv_pages_cached"]).set(e.cached_pages as f64);
        // Counters mirror the engine's own monotone counters.
        self.engine_counters.reset();
        for (k, v) in [
            ("prompt_tokens", e.prompt_tokens),
            ("generated_tokens", e.generated_tokens),
            ("prefix_cache_hit_tokens", e.prefix_hit_tokens),
            ("prefix_cache_query_tokens", e.prefix_query_tokens),
            ("steps", e.steps),
            ("preemptions", e.preemptions),
            ("aborted", e.aborted),
            ("spec_verify_steps", e.spec_rounds),
            ("spec_draft_tokens", e.spec_drafted),
            ("spec_accepted_tokens", e.spec_accepted),
            ("steps_recorded", e.steps_recorded),
            ("steps_replayed", e.steps_replayed),
            ("steps_record_failed", e.steps_record_failed),
        ] {
            self.engine_counters.with_label_values(&[k]).inc_by(v);
        }
        self.speculative.reset();
        if !e.spec_drafter.is_empty() {
            let rate = if e.spec_drafted == 0 { 0.0 } else { e.spec_accepted as f64 / e.spec_drafted as f64 };
            // Tokens a verify step yields: the accepted drafts plus the correction or bonus token.
            let len = if e.spec_rounds == 0 { 0.0 } else { (e.spec_accepted + e.spec_rounds) as f64 / e.spec_rounds as f64 };
            self.speculative.with_label_values(&[e.spec_drafter, "acceptance_rate"]).set(rate);
            self.speculative.with_label_values(&[e.spec_drafter, "mean_accepted_length"]).set(len);
        }
        self.hit_rate.set(if e.prefix_query_tokens == 0 { 0.0 } else { e.prefix_hit_tokens as f64 / e.prefix_query_tokens as f64 });
        self.tokens_per_s.set(self.tokens_per_second());
        self.plugin_counters.reset();
        self.plugin_seconds.reset();
        self.plugin_gauges.reset();
        for p in plugins {
            for v in &p.versions {
                let l = |what: &'static str| [p.kind, p.name.as_str(), v.version.as_str(), what];
                self.plugin_counters.with_label_values(&l("calls")).inc_by(v.calls);
                self.plugin_counters.with_label_values(&l("faults")).inc_by(v.faults);
                self.plugin_counters.with_label_values(&l("fallbacks")).inc_by(v.fallbacks);
                self.plugin_seconds.with_label_values(&[p.kind, p.name.as_str(), v.version.as_str()]).inc_by(v.calls as f64 * v.mean_call_us * 1e-6);
                self.plugin_gauges.with_label_values(&l("active")).set(v.active as u8 as f64);
                self.plugin_gauges.with_label_values(&l("in_use")).set(v.in_use as f64);
                self.plugin_gauges.with_label_values(&l("mean_call_us")).set(v.mean_call_us);
            }
        }
        let mut buf = vec![];
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

/// Times one choice: first token, gaps between tokens, end to end.
pub struct RequestTimer {
    m: Arc<Metrics>,
    start: Instant,
    last: Option<Instant>,
    done: bool,
}

impl RequestTimer {
    pub fn start(m: Arc<Metrics>) -> Self {
        RequestTimer { m, start: Instant::now(), last: None, done: false }
    }

    pub fn token(&mut self) {
        let now = Instant::now();
        match self.last {
            None => self.m.ttft.observe(now.duration_since(self.start).as_secs_f64()),
            Some(l) => self.m.itl.observe(now.duration_since(l).as_secs_f64()),
        }
        self.last = Some(now);
    }

    pub fn finish(&mut self, reason: FinishReason) {
        self.m.e2e.observe(self.start.elapsed().as_secs_f64());
        self.m.outcomes.with_label_values(&[reason.as_str()]).inc();
        self.done = true;
    }

    pub fn fail(&mut self) {
        self.m.outcomes.with_label_values(&["error"]).inc();
        self.done = true;
    }
}

impl Drop for RequestTimer {
    /// A timer dropped before its choice ended: the client went away.
    fn drop(&mut self) {
        if !self.done {
            self.m.outcomes.with_label_values(&["aborted"]).inc();
        }
    }
}
