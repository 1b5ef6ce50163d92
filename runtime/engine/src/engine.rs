//! The step loop. Each step: drop aborted requests, ask the admission plugin what to admit,
//! preempt or reject, plan the batch under the token budget (decodes first, then prefill
//! chunks), make sure every token has a KV slot (preempting by recompute when the pool runs
//! out), run one forward pass, sample every sequence that reached the end of its input through
//! its sampler plugin version (one call per version), then stream tokens, publish full pages
//! for prefix reuse and finish what stopped.

mod commit;
mod draft;

use crate::detok::{Detokenizer, StopMatcher};
use crate::dflash::DFlashDrafter;
use crate::draft_model::DraftModel;
use crate::frontend;
use crate::kv_pool::PagePool;
use crate::mtp::{LastHidden, MtpDrafter};
use crate::request::{ErrorKind, Event, GenerationRequest};
use crate::spec::{self, SpecConfig, SpecState};
use crate::step_logits::StepLogits;
use commit::{set_pick, Pick};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use weft_backend::front::{self, FrontRow};
use weft_backend::{AttnRow, Backend};
use weft_model::dflash::DFlashModel;
use weft_model::sampling::{top_logprobs, uniform};
use weft_model::{LoadedModel, StepBatch};
use weft_plugin_host::{calls, native, Capacity, Decision, FailurePolicy, LoadedPlugin, PluginError, PluginKind, Registry, Running, SamplingPlan, Sequence, Waiting};

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub num_pages: usize,
    pub page_size: usize,
    /// Tokens per forward pass (decode tokens + prefill chunks).
    pub token_budget: usize,
    pub max_sequences: usize,
    /// Speculative decoding (None: off).
    pub spec: Option<SpecConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { num_pages: 512, page_size: 64, token_budget: 512, max_sequences: 64, spec: None }
    }
}

/// A snapshot of the engine's state, refreshed every step (for /metrics and tests).
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub free_pages: usize,
    pub total_pages: usize,
    pub cached_pages: usize,
    pub prefix_hit_tokens: u64,
    pub prefix_query_tokens: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub steps: u64,
    pub preemptions: u64,
    pub finished: u64,
    pub aborted: u64,
    pub failed: u64,
    /// Speculative decoding: verify steps, drafts proposed, drafts accepted.
    pub spec_rounds: u64,
    pub spec_drafted: u64,
    pub spec_accepted: u64,
    /// The drafter's name ("" when speculative decoding is off).
    pub spec_drafter: &'static str,
    /// Pages of the draft model's own cache in use (draft-model speculation only).
    pub draft_pages_held: usize,
    /// Forward steps the backend recorded as graphs, replayed, or could not record.
    pub steps_recorded: u64,
    pub steps_replayed: u64,
    pub steps_record_failed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The request itself is wrong (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// Admission refused it at arrival (HTTP 429 when `retry`, else 503).
    #[error("{reason}")]
    Rejected { reason: String, retry: bool },
    #[error("{0}")]
    Unavailable(String),
}

struct Seq {
    id: u64,
    req: GenerationRequest,
    tx: UnboundedSender<Event>,
    tokens: Vec<u32>,
    prompt_len: usize,
    computed: usize,
    pages: Vec<u32>,
    page_hashes: Vec<u64>,
    plan: SamplingPlan,
    native: bool,
    plugin: Arc<LoadedPlugin>,
    policy: FailurePolicy,
    detok: Detokenizer,
    stop: StopMatcher,
    cached_tokens: usize,
    arrival_ms: u64,
    /// Whether this request may speculate (see `spec::eligible`), and its drafting state.
    speculates: bool,
    spec: SpecState,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

enum Command {
    Submit(Box<Seq>),
    Shutdown,
}

/// A running engine. Dropping it (or `shutdown`) stops the step loop after in-flight requests.
pub struct Engine {
    tx: mpsc::Sender<Command>,
    stats: Arc<Mutex<EngineStats>>,
    next_id: AtomicU64,
    registry: Arc<Registry>,
    vocab: usize,
    max_context: usize,
    eos: Vec<u32>,
    speculative: bool,
    start: Instant,
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Engine {
    pub fn start<B: Backend>(model: LoadedModel<B>, registry: Arc<Registry>, cfg: EngineConfig) -> Result<Engine, PluginError> {
        Self::start_with_draft(model, None, registry, cfg)
    }

    /// [`Engine::start`] with a draft model for `DrafterKind::Model` (same vocabulary as the
    /// target; its KV pool gets as many pages as the target's).
    pub fn start_with_draft<B: Backend>(model: LoadedModel<B>, draft: Option<LoadedModel<B>>, registry: Arc<Registry>, cfg: EngineConfig) -> Result<Engine, PluginError> {
        let wants = matches!(cfg.spec, Some(SpecConfig { drafter: spec::DrafterKind::Model, .. }));
        match &draft {
            Some(d) if d.model.cfg.vocab_size != model.model.cfg.vocab_size => {
                return Err(PluginError::Host(format!("the draft model's vocabulary ({}) differs from the target's ({})", d.model.cfg.vocab_size, model.model.cfg.vocab_size)));
            }
            Some(_) if !wants => return Err(PluginError::Host("a draft model was given but the drafter is not `draft-model`".into())),
            None if wants => return Err(PluginError::Host("the `draft-model` drafter needs a draft model".into())),
            _ => {}
        }
        if matches!(cfg.spec, Some(SpecConfig { drafter: spec::DrafterKind::DFlash, .. })) {
            return Err(PluginError::Host("the `dflash` drafter needs a DFlash draft (Engine::start_with_dflash)".into()));
        }
        let draft = match draft {
            Some(d) => Some(DraftModel::new(d, cfg.num_pages, cfg.page_size).map_err(PluginError::Host)?),
            None => None,
        };
        // The MTP module's cache: one layer, as many pages as the target's.
        let mtp = match cfg.spec {
            Some(SpecConfig { drafter: spec::DrafterKind::Mtp, .. }) => Some(MtpDrafter::new(&model.model, cfg.num_pages, cfg.page_size).map_err(PluginError::Host)?),
            _ => None,
        };
        Self::launch(model, Drafters { model: draft, mtp, dflash: None }, registry, cfg)
    }

    /// [`Engine::start`] with a DFlash block-diffusion draft for `DrafterKind::DFlash`: the
    /// target captures the layers the draft reads, the draft's cache gets as many pages as the
    /// target's.
    pub fn start_with_dflash<B: Backend>(mut model: LoadedModel<B>, dflash: DFlashModel<B>, registry: Arc<Registry>, cfg: EngineConfig) -> Result<Engine, PluginError> {
        if !matches!(cfg.spec, Some(SpecConfig { drafter: spec::DrafterKind::DFlash, .. })) {
            return Err(PluginError::Host("a DFlash draft was given but the drafter is not `dflash`".into()));
        }
        model.model.set_capture(&dflash.cfg.target_layer_ids).map_err(|e| PluginError::Host(format!("the DFlash draft's target_layer_ids: {e}")))?;
        let d = DFlashDrafter::new(&model.model, dflash, cfg.num_pages, cfg.page_size).map_err(PluginError::Host)?;
        Self::launch(model, Drafters { model: None, mtp: None, dflash: Some(d) }, registry, cfg)
    }

    fn launch<B: Backend>(model: LoadedModel<B>, drafters: Drafters<B>, registry: Arc<Registry>, cfg: EngineConfig) -> Result<Engine, PluginError> {
        // Device memory is claimed here, so a pool that does not fit is an error, not a dead loop.
        let kv = model.model.alloc_kv_pool(cfg.num_pages, cfg.page_size).map_err(|e| PluginError::Host(format!("allocating the KV pool ({} pages): {e}", cfg.num_pages)))?;
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(EngineStats { total_pages: cfg.num_pages, free_pages: cfg.num_pages, spec_drafter: cfg.spec.as_ref().map_or("", |c| c.drafter.name()), ..Default::default() }));
        let vocab = model.model.cfg.vocab_size;
        let max_context = model.model.cfg.max_position_embeddings;
        let eos = model.eos_ids();
        let start = Instant::now();
        let speculative = cfg.spec.is_some();
        let (s2, r2) = (stats.clone(), registry.clone());
        let handle = std::thread::Builder::new()
            .name("weft-step-loop".into())
            .spawn(move || StepLoop::new(model, kv, drafters, r2, cfg, s2).run(rx))
            .map_err(|e| PluginError::Host(format!("step loop thread: {e}")))?;
        Ok(Engine { tx, stats, next_id: AtomicU64::new(1), registry, vocab, max_context, eos, speculative, start, handle: Mutex::new(Some(handle)) })
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.lock().unwrap().clone()
    }

    /// Whether the step loop is alive (false after shutdown or if it died).
    pub fn is_running(&self) -> bool {
        self.handle.lock().unwrap().as_ref().is_some_and(|h| !h.is_finished())
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Validates and plans a request, checks admission at arrival, and queues it. Events
    /// arrive on the returned receiver; dropping it aborts the request and frees its pages.
    pub fn submit(&self, req: GenerationRequest) -> Result<(u64, UnboundedReceiver<Event>), SubmitError> {
        let n = req.prompt.len();
        if n == 0 {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if let Some(bad) = req.prompt.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(SubmitError::Invalid(format!("prompt token id {bad} is outside the vocabulary (size {})", self.vocab)));
        }
        if n + req.max_tokens > self.max_context {
            return Err(SubmitError::Invalid(format!("prompt ({n} tokens) + max_tokens ({}) exceeds the model's context length {}", req.max_tokens, self.max_context)));
        }
        let (plugin, policy) = self.registry.resolve(PluginKind::Sampler, req.sampler.as_deref()).map_err(|e| SubmitError::Invalid(e.to_string()))?;
        let mut params = req.params.clone();
        params.vocab_size = self.vocab as u32;
        params.eos_tokens = self.eos.clone();
        let (plan, native) = calls::configure(&plugin, policy, &params).map_err(|e| match e {
            PluginError::Rejected(m) => SubmitError::Invalid(m),
            other => SubmitError::Unavailable(other.to_string()),
        })?;
        let speculates = self.speculative && req.speculative && spec::eligible(req.logprobs, native || plugin.id.name == "default");
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let arrival_ms = self.start.elapsed().as_millis() as u64;
        let (adm, apol) = self.registry.resolve(PluginKind::Admission, None).map_err(|e| SubmitError::Unavailable(e.to_string()))?;
        let w = Waiting { id, arrival_ms, prompt_tokens: n as u32, cached_prefix_tokens: 0, max_tokens: req.max_tokens as u32, priority: req.priority, tenant: req.tenant.clone() };
        let queue = self.stats.lock().unwrap().waiting as u32;
        if let Some(r) = calls::on_arrival(&adm, apol, &w, queue).map_err(|e| SubmitError::Unavailable(e.to_string()))? {
            return Err(SubmitError::Rejected { reason: r.reason, retry: r.retry });
        }
        let (tx, rx) = unbounded_channel();
        let seq = Seq {
            id,
            tokens: req.prompt.clone(),
            prompt_len: n,
            computed: 0,
            pages: vec![],
            page_hashes: vec![],
            plan,
            native,
            plugin,
            policy,
            detok: Detokenizer::default(),
            stop: StopMatcher::new(req.stop.clone()),
            cached_tokens: 0,
            arrival_ms,
            speculates,
            spec: SpecState::default(),
            req,
            tx,
        };
        self.tx.send(Command::Submit(Box::new(seq))).map_err(|_| SubmitError::Unavailable("the engine has shut down".into()))?;
        Ok((id, rx))
    }

    /// Stops accepting work, lets queued and running requests finish, and joins the loop.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(h) = self.handle.lock().unwrap().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct StepLoop<B: Backend> {
    lm: LoadedModel<B>,
    registry: Arc<Registry>,
    cfg: EngineConfig,
    kv: B::KvPool,
    pool: PagePool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    stats: Arc<Mutex<EngineStats>>,
    counters: EngineStats,
    eos: Vec<u32>,
    draft_model: Option<DraftModel<B>>,
    mtp: Option<MtpDrafter<B>>,
    dflash: Option<DFlashDrafter<B>>,
    /// The last forward pass's hidden states (kept for the MTP and DFlash drafters only).
    last_hidden: Option<LastHidden<B>>,
}

/// The drafters that own state of their own (caches), given to the step loop.
struct Drafters<B: Backend> {
    model: Option<DraftModel<B>>,
    mtp: Option<MtpDrafter<B>>,
    dflash: Option<DFlashDrafter<B>>,
}

struct Work {
    seq: usize,
    start: usize,
    n: usize,
}

impl<B: Backend> StepLoop<B> {
    fn new(lm: LoadedModel<B>, kv: B::KvPool, drafters: Drafters<B>, registry: Arc<Registry>, cfg: EngineConfig, stats: Arc<Mutex<EngineStats>>) -> Self {
        let eos = lm.eos_ids();
        let pool = PagePool::new(cfg.num_pages, cfg.page_size);
        let Drafters { model: draft_model, mtp, dflash } = drafters;
        StepLoop { pool, lm, registry, cfg, kv, waiting: VecDeque::new(), running: vec![], stats, counters: EngineStats::default(), eos, draft_model, mtp, dflash, last_hidden: None }
    }

    fn run(mut self, rx: mpsc::Receiver<Command>) {
        let mut shutting_down = false;
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                if shutting_down {
                    return;
                }
                match rx.recv() {
                    Ok(Command::Submit(s)) => self.waiting.push_back(*s),
                    Ok(Command::Shutdown) | Err(_) => return,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                match cmd {
                    Command::Submit(s) => self.waiting.push_back(*s),
                    Command::Shutdown => shutting_down = true,
                }
            }
            self.step();
            self.publish_stats();
        }
    }

    fn publish_stats(&mut self) {
        let rec = self.lm.model.backend.step_recordings();
        let mut s = self.stats.lock().unwrap();
        *s = EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            free_pages: self.pool.free_pages(),
            total_pages: self.pool.capacity(),
            cached_pages: self.pool.cached_pages(),
            prefix_hit_tokens: self.pool.prefix_hit_tokens,
            prefix_query_tokens: self.pool.prefix_query_tokens,
            spec_drafter: self.cfg.spec.as_ref().map_or("", |c| c.drafter.name()),
            draft_pages_held: self.draft_model.as_ref().map_or(0, |d| d.pages_held()) + self.mtp.as_ref().map_or(0, |d| d.pages_held()) + self.dflash.as_ref().map_or(0, |d| d.pages_held()),
            steps_recorded: rec.recorded,
            steps_replayed: rec.replayed,
            steps_record_failed: rec.failed,
            ..self.counters.clone()
        };
    }

    /// A drafter's copy of a sequence goes wherever the engine frees the sequence's pages.
    fn forget_draft(&mut self, id: u64) {
        if let Some(dm) = &mut self.draft_model {
            dm.forget(id);
        }
        if let Some(m) = &mut self.mtp {
            m.forget(id);
        }
        if let Some(d) = &mut self.dflash {
            d.forget(id);
        }
    }

    fn fail(&mut self, seq: Seq, message: String, kind: ErrorKind) {
        self.pool.release_all(&seq.pages);
        self.forget_draft(seq.id);
        self.counters.failed += 1;
        let _ = seq.tx.send(Event::Error { message, kind });
    }

    fn preempt(&mut self, i: usize) {
        let mut s = self.running.remove(i);
        self.pool.release_all(&s.pages);
        self.forget_draft(s.id);
        s.pages.clear();
        s.page_hashes.clear();
        s.computed = 0;
        self.counters.preemptions += 1;
        tracing::debug!(request = s.id, "preempted (recompute)");
        self.waiting.push_front(s);
    }

    fn step(&mut self) {
        // 1. Aborted requests (client gone) free their pages at once.
        let before = self.running.len() + self.waiting.len();
        let (mut dropped, mut dropped_ids) = (vec![], vec![]);
        self.running.retain(|s| {
            let keep = !s.tx.is_closed();
            if !keep {
                dropped.extend(s.pages.iter().copied());
                dropped_ids.push(s.id);
            }
            keep
        });
        self.waiting.retain(|s| {
            let keep = !s.tx.is_closed();
            if !keep {
                dropped.extend(s.pages.iter().copied());
            }
            keep
        });
        self.pool.release_all(&dropped);
        for id in dropped_ids {
            self.forget_draft(id);
        }
        self.counters.aborted += (before - self.running.len() - self.waiting.len()) as u64;

        self.admit();
        self.draft();
        let work = self.plan_work();
        if work.is_empty() {
            if self.running.is_empty() && !self.waiting.is_empty() {
                // Nothing runs and nothing can be admitted: the head request can never fit.
                let s = self.waiting.pop_front().unwrap();
                let msg = format!("the request needs more KV cache than the whole pool holds ({} pages of {} tokens)", self.pool.capacity(), self.cfg.page_size);
                self.fail(s, msg, ErrorKind::TooLarge);
            }
            return;
        }
        if let Err(e) = self.forward_and_sample(&work) {
            let msg = format!("engine step failed: {e}");
            tracing::error!("{msg}");
            for s in std::mem::take(&mut self.running) {
                self.fail(s, msg.clone(), ErrorKind::Internal);
            }
        }
        self.counters.steps += 1;
    }

    fn admit(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let ps = self.cfg.page_size;
        let waiting: Vec<Waiting> = self
            .waiting
            .iter()
            .map(|s| Waiting {
                id: s.id,
                arrival_ms: s.arrival_ms,
                prompt_tokens: s.tokens.len() as u32,
                cached_prefix_tokens: 0,
                max_tokens: s.req.max_tokens as u32,
                priority: s.req.priority,
                tenant: s.req.tenant.clone(),
            })
            .collect();
        let running: Vec<Running> =
            self.running.iter().map(|s| Running { id: s.id, tenant: s.req.tenant.clone(), priority: s.req.priority, context_tokens: s.tokens.len() as u32, pages: s.pages.len() as u32 }).collect();
        let cap = Capacity {
            free_pages: self.pool.free_pages() as u32,
            total_pages: self.pool.capacity() as u32,
            page_size: ps as u32,
            token_budget: self.cfg.token_budget as u32,
            max_sequences: self.cfg.max_sequences as u32,
        };
        let decision = match self.registry.resolve(PluginKind::Admission, None) {
            Ok((p, pol)) => calls::schedule(&p, pol, &waiting, &running, cap).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "admission plugin failed; first-come-first-served this step");
                native::schedule(&waiting, &running, &cap)
            }),
            Err(_) => native::schedule(&waiting, &running, &cap),
        };
        for id in &decision.preempt {
            if let Some(i) = self.running.iter().position(|s| s.id == *id) {
                self.preempt(i);
            }
        }
        for r in decision.reject {
            if let Some(i) = self.waiting.iter().position(|s| s.id == r.id) {
                let s = self.waiting.remove(i).unwrap();
                self.fail(s, r.reason, if r.retry { ErrorKind::Overloaded } else { ErrorKind::Unavailable });
            }
        }
        for id in decision.admit {
            let Some(i) = self.waiting.iter().position(|s| s.id == id) else { continue };
            let mut s = self.waiting.remove(i).unwrap();
            // Reuse cached full pages, always leaving at least the last token to compute.
            let max_pages = (s.tokens.len() - 1) / ps;
            let (pages, hashes) = self.pool.lookup_prefix(&s.tokens, max_pages);
            s.computed = pages.len() * ps;
            if s.generated() == 0 {
                s.cached_tokens = s.computed;
                self.counters.prompt_tokens += s.prompt_len as u64;
            }
            s.pages = pages;
            s.page_hashes = hashes;
            self.running.push(s);
        }
    }

    fn plan_work(&mut self) -> Vec<Work> {
        let ps = self.cfg.page_size;
        let mut budget = self.cfg.token_budget;
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        // Decodes first (latency), then prefill chunks in admission order.
        order.sort_by_key(|&i| (self.running[i].tokens.len() - self.running[i].computed > 1) as u8);
        let mut work: Vec<Work> = vec![];
        let mut ids: Vec<u64> = order.iter().map(|&i| self.running[i].id).collect();
        let mut k = 0;
        while k < ids.len() && budget > 0 {
            let Some(i) = self.running.iter().position(|s| s.id == ids[k]) else {
                k += 1;
                continue;
            };
            let s = &mut self.running[i];
            // The end of the input with drafts scores them too, budget permitting; a chunk that
            // stops short of the end has none.
            let input = s.tokens.len() - s.computed;
            s.spec.drafts.truncate(budget.saturating_sub(input));
            let n = (input + s.spec.drafts.len()).min(budget);
            let need = (s.computed + n).div_ceil(ps).saturating_sub(s.pages.len());
            let mut got = vec![];
            while got.len() < need {
                match self.pool.alloc() {
                    Some(p) => got.push(p),
                    None => break,
                }
            }
            if got.len() < need && !self.running[i].spec.drafts.is_empty() {
                // Short of pages: decode without drafts before preempting anyone.
                self.pool.release_all(&got);
                self.running[i].spec.drafts.clear();
                continue;
            }
            if got.len() < need {
                self.pool.release_all(&got);
                // Preempt the newest running request not already scheduled this step.
                let scheduled: Vec<u64> = work.iter().map(|w| self.running[w.seq].id).collect();
                let victim = (0..self.running.len()).rev().find(|&j| j != i && !scheduled.contains(&self.running[j].id));
                match victim {
                    Some(j) => {
                        let vid = self.running[j].id;
                        // Indices in `work` shift when an earlier entry is removed.
                        for w in work.iter_mut() {
                            if w.seq > j {
                                w.seq -= 1;
                            }
                        }
                        self.preempt(j);
                        ids.retain(|&x| x != vid);
                        continue; // retry the same request
                    }
                    None => {
                        k += 1;
                        continue;
                    }
                }
            }
            let s = &mut self.running[i];
            s.pages.extend(got);
            work.push(Work { seq: i, start: s.computed, n });
            budget -= n;
            k += 1;
        }
        work
    }

    fn forward_and_sample(&mut self, work: &[Work]) -> Result<(), String> {
        self.last_hidden = None;
        let ps = self.cfg.page_size;
        let total: usize = work.iter().map(|w| w.n).sum();
        let (mut tokens, mut positions, mut slots) = (Vec::with_capacity(total), Vec::with_capacity(total), Vec::with_capacity(total));
        let mut row_of: Vec<(usize, usize)> = vec![]; // (work index, row) of rows that yield a token
        let mut spec_of: Vec<(usize, usize)> = vec![]; // (work index, first row) of verify steps
        for (wi, w) in work.iter().enumerate() {
            let s = &self.running[w.seq];
            let len = s.tokens.len();
            for p in w.start..w.start + w.n {
                tokens.push(if p < len { s.tokens[p] } else { s.spec.drafts[p - len] });
                positions.push(p as u32);
                slots.push(s.pages[p / ps] * ps as u32 + (p % ps) as u32);
            }
            let drafts = s.spec.drafts.len();
            if drafts > 0 && w.start + w.n == len + drafts {
                // Scores for the last token and every draft: rows len-1 ..= len-1+drafts.
                spec_of.push((wi, tokens.len() - 1 - drafts));
            } else if w.start + w.n == len {
                row_of.push((wi, tokens.len() - 1));
            }
        }
        let attn: Vec<AttnRow> = work
            .iter()
            .flat_map(|w| {
                let s = &self.running[w.seq];
                (w.start..w.start + w.n).map(move |p| AttnRow { block_table: &s.pages, ctx_len: p + 1 })
            })
            .collect();
        let model = &self.lm.model;
        // Drafts compute as decode rows would, also when scored in a prompt chunk's pass.
        let exact: Vec<(u32, u32)> = spec_of.iter().map(|&(wi, first)| ((first + 1) as u32, (first + 1 + self.running[work[wi].seq].spec.drafts.len()) as u32)).collect();
        let batch = StepBatch { tokens: &tokens, positions: &positions, slots: &slots, attn: &attn, exact_rows: &exact };
        let hidden = model.forward_hidden(&mut self.kv, &batch).map_err(|e| e.to_string())?;
        let mut rows: Vec<u32> = row_of.iter().map(|&(_, r)| r as u32).collect();
        for &(wi, first) in &spec_of {
            rows.extend((first..=first + self.running[work[wi].seq].spec.drafts.len()).map(|r| r as u32));
        }
        let logits = if rows.is_empty() {
            None
        } else {
            let h = model.backend.gather_rows(&hidden, model.cfg.hidden_size, &rows).map_err(|e| e.to_string())?;
            Some(model.logits(&h).map_err(|e| e.to_string())?)
        };
        self.last_hidden = (self.mtp.is_some() || self.dflash.is_some()).then(|| {
            let mut row = 0;
            let spans = work
                .iter()
                .map(|w| {
                    row += w.n;
                    (self.running[w.seq].id, (w.start, row - w.n, w.n))
                })
                .collect();
            LastHidden { buf: hidden, rows: total, spans }
        });
        drop(attn);
        for w in work {
            self.running[w.seq].computed = w.start + w.n;
        }
        let Some(logits) = logits else {
            self.commit(vec![]);
            return Ok(());
        };
        let vocab = model.cfg.vocab_size;
        let mut logits = StepLogits::new(&model.backend, logits, vocab);
        let seqs: Vec<usize> = row_of.iter().map(|&(wi, _)| work[wi].seq).collect();
        // Log-probabilities are reported under the model's raw distribution (vLLM's default):
        // those rows are fetched before the front end edits the buffer.
        let lp_rows: Vec<usize> = (0..seqs.len()).filter(|&k| self.running[seqs[k]].req.logprobs.is_some()).collect();
        let mut raw = logits.raw_rows(&lp_rows)?;
        let mut fronts: Vec<FrontRow> = seqs
            .iter()
            .map(|&si| {
                let s = &self.running[si];
                let k = if s.native { frontend::native_k(&s.req.params) } else { s.plan.candidates as usize };
                frontend::front_row(&s.plan, &s.tokens, s.generated(), if s.req.ignore_eos { &[] } else { &self.eos }, k, vocab)
            })
            .collect();
        // Verify steps: a row per position, each edited with the history up to its draft.
        let spec_jobs: Vec<spec::VerifyJob> = spec_of
            .iter()
            .map(|&(wi, _)| {
                let s = &self.running[work[wi].seq];
                let first = fronts.len();
                let greedy = s.req.params.temperature == 0.0;
                let mut history = s.tokens.clone();
                for j in 0..=s.spec.drafts.len() {
                    // Greedy needs the best candidate only; sampling the whole distribution.
                    fronts.push(frontend::front_row(&s.plan, &history, s.generated() + j, if s.req.ignore_eos { &[] } else { &self.eos }, if greedy { 1 } else { 0 }, vocab));
                    if let Some(&d) = s.spec.drafts.get(j) {
                        history.push(d);
                    }
                }
                let oracle = match self.cfg.spec.as_ref().map(|c| &c.drafter) {
                    Some(spec::DrafterKind::Oracle { acceptance }) => Some(*acceptance),
                    _ => None,
                };
                let truncate = spec::truncates(&s.req.params).then(|| s.req.params.clone());
                spec::VerifyJob { si: work[wi].seq, request_id: s.id, drafts: s.spec.drafts.clone(), greedy, seed: s.req.seed, position: s.tokens.len(), first, oracle, truncate }
            })
            .collect();
        let mut outs = logits.front(&fronts)?;
        let spec_outs = outs.split_off(seqs.len());
        // Rows whose sampler wants the whole vocabulary (or more than the backend extracts).
        let whole: Vec<usize> = (0..fronts.len()).filter(|&k| fronts[k].k == 0).collect();
        logits.fetch_edited(&whole)?;
        // Sample every sequence that reached the end of its input.
        let mut picks: Vec<Pick> = vec![];
        let mut groups: Vec<(Arc<LoadedPlugin>, FailurePolicy, Vec<(usize, usize, Sequence)>)> = vec![];
        for (k, out) in outs.into_iter().enumerate() {
            let si = seqs[k];
            let s = &self.running[si];
            let lp = s.req.logprobs.and_then(|n| {
                raw.remove(&k).map(|row| {
                    let top = top_logprobs(&row, n, None);
                    (row, top)
                })
            });
            let cands = if fronts[k].k == 0 { frontend::extract(logits.edited(k), &fronts[k], 0) } else { frontend::candidates(out) };
            let u = uniform(s.req.seed, s.tokens.len() as u64, 0);
            if s.native {
                let tok = match native::sample_candidates(&s.req.params, &cands, u) {
                    Decision::Token(t) => Ok(vec![t]),
                    _ => logits.fetch_edited(&[k]).and_then(|()| match native::sample_candidates(&s.req.params, &frontend::extract(logits.edited(k), &fronts[k], 0), u) {
                        Decision::Token(t) => Ok(vec![t]),
                        _ => Err("native sampler could not decide".to_string()),
                    }),
                };
                picks.push(Pick { si, toks: tok, lp, drafted: 0 });
                continue;
            }
            let seq = Sequence { request_id: s.id, state: s.plan.state.clone(), candidates: cands, uniforms: vec![u], history: s.plan.wants_history.then(|| s.tokens[s.prompt_len..].to_vec()) };
            match groups.iter_mut().find(|g| Arc::ptr_eq(&g.0, &s.plugin)) {
                Some(g) => g.2.push((si, k, seq)),
                None => groups.push((s.plugin.clone(), s.policy, vec![(si, k, seq)])),
            }
            picks.push(Pick { si, toks: Err(String::new()), lp, drafted: 0 }); // placeholder, filled below
        }
        if !spec_jobs.is_empty() {
            let verdicts = spec::verify(&mut logits, &self.registry, &spec_jobs, &fronts, spec_outs, vocab);
            for (job, v) in spec_jobs.iter().zip(verdicts) {
                let toks = v.map(|(n, next)| job.drafts[..n].iter().copied().chain([next]).collect());
                picks.push(Pick { si: job.si, toks, lp: None, drafted: job.drafts.len() });
            }
        }
        for (plugin, policy, mut members) in groups {
            for _round in 0..4 {
                if members.is_empty() {
                    break;
                }
                let batch: Vec<Sequence> = members.iter().map(|m| m.2.clone()).collect();
                let params: Vec<_> = members.iter().map(|m| &self.running[m.0].req.params).collect();
                match calls::sample(&plugin, policy, &batch, &params, vocab as u32) {
                    Ok(decisions) => {
                        let mut again = vec![];
                        for (m, d) in members.into_iter().zip(decisions) {
                            match d {
                                Decision::Token(t) => set_pick(&mut picks, m.0, Ok(vec![t])),
                                Decision::MoreCandidates(n) => again.push((m, n as usize)),
                                Decision::FullVocabulary => again.push((m, 0)),
                            }
                        }
                        // Up to MAX_DEVICE_K more candidates come from the backend's front
                        // end; the whole vocabulary (or more than that) from a host row.
                        let on_device = |n: usize| front::device_k(n) > 0;
                        let wanted: Vec<(usize, usize)> = again.iter().filter(|a| on_device(a.1)).map(|(m, n)| (m.1, *n)).collect();
                        let ks: Vec<usize> = again.iter().filter(|a| !on_device(a.1)).map(|(m, _)| m.1).collect();
                        members = match logits.more(&wanted, &fronts).and_then(|more| logits.fetch_edited(&ks).map(|()| more)) {
                            Ok(mut more) => again
                                .into_iter()
                                .map(|(m, n)| {
                                    let candidates = match more.remove(&m.1) {
                                        Some(out) => frontend::candidates(out),
                                        None => frontend::extract(logits.edited(m.1), &fronts[m.1], n),
                                    };
                                    (m.0, m.1, Sequence { candidates, ..m.2 })
                                })
                                .collect(),
                            Err(e) => {
                                for (m, _) in again {
                                    set_pick(&mut picks, m.0, Err(e.clone()));
                                }
                                vec![]
                            }
                        };
                    }
                    Err(e) => {
                        for m in members.drain(..) {
                            set_pick(&mut picks, m.0, Err(e.to_string()));
                        }
                    }
                }
            }
            for m in members {
                set_pick(&mut picks, m.0, Err("the sampler kept asking for more candidates".into()));
            }
        }
        drop(logits);
        self.commit(picks);
        Ok(())
    }
}
