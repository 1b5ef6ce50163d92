//! Speculative decoding: which sequences draft, the drafters (the draft model's own cache
//! lives in `draft_model`, the MTP module's in `mtp`, the DFlash draft's in `dflash`), and the per-sequence bookkeeping
//! of a verify step. The engine appends a sequence's drafts to its decode token so the target
//! scores `[last, d1..dk]` in the same forward pass as everything else; the verifier plugin
//! (lossless default: greedy prefix match, or chain rejection sampling on complete
//! distributions) decides the accepted prefix and the correction or bonus token; the KV entries
//! of rejected drafts are dropped by moving the sequence's computed length back and releasing
//! pages past it.
//!
//! A request speculates when the server has a drafter, it asks for no log-probabilities, and it
//! samples through the default sampler, greedy or not: the verifier sees its exact target
//! distribution — the front end's, truncated by top-k/typical-p/top-p/min-p and renormalised as
//! the sampler does (`top_k_renorm_prob` semantics). A custom sampler's distribution is its own,
//! so those requests decode one token per step as before.

use crate::frontend;
use crate::step_logits::StepLogits;
use weft_backend::front::{FrontOut, FrontRow};
use weft_backend::Backend;
use weft_model::sampling::uniform;
use weft_plugin_host::{calls, native, Candidates, DraftStep, PluginKind, Registry, SamplingParams, Verdict};

/// How drafts are made.
#[derive(Clone, Debug, PartialEq)]
pub enum DrafterKind {
    /// Prompt lookup: the longest recent n-gram (`max_n` down to `min_n` tokens) ending the
    /// sequence is found earlier in the sequence, and the tokens that followed it are proposed.
    Ngram { min_n: usize, max_n: usize },
    /// A benchmark instrument, not a drafter: it drafts the last token repeated, and its
    /// verify step accepts each draft with probability `acceptance` (a coin per draft from the
    /// request's seed and position) instead of asking the verifier, then appends the target's
    /// best token at the first refused position. The forward pass, KV rollback and commit are
    /// the real ones, so it shows the speed a drafter of that acceptance rate would give at no
    /// drafting cost; the text it produces is not the model's output.
    Oracle { acceptance: f64 },
    /// A small model of the same family drafts greedily (`crate::draft_model`); the engine is
    /// started with it (`Engine::start_with_draft`).
    Model,
    /// The checkpoint's multi-token-prediction module drafts greedily from the target's hidden
    /// states (`crate::mtp`).
    Mtp,
    /// A DFlash block-diffusion draft drafts a block greedily in one pass from outputs of
    /// several target layers (`crate::dflash`); the engine is started with it
    /// (`Engine::start_with_dflash`).
    DFlash,
}

impl DrafterKind {
    pub fn name(&self) -> &'static str {
        match self {
            DrafterKind::Ngram { .. } => "ngram",
            DrafterKind::Oracle { .. } => "oracle",
            DrafterKind::Model => "draft-model",
            DrafterKind::Mtp => "mtp",
            DrafterKind::DFlash => "dflash",
        }
    }
}

/// How many of `k` drafts the oracle instrument accepts at `position`: the leading run of
/// coins (one per draft) that came up below `acceptance`.
pub fn oracle_accepts(seed: u64, position: usize, k: usize, acceptance: f64) -> usize {
    (0..k).take_while(|&j| uniform(seed, (position + j) as u64, 0x0AC1E) < acceptance).count()
}

/// The server's speculative decoding settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecConfig {
    pub drafter: DrafterKind,
    /// Drafts per verify step, at most.
    pub num_draft_tokens: usize,
    /// Shrink the draft length with low acceptance and pause drafting when it stays low.
    pub adaptive: bool,
    /// No drafts in a step where more sequences than this are decoding (0: no limit); vLLM's
    /// `speculative_disable_by_batch_size`. Large batches pay for the extra rows.
    pub max_batch: usize,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig { drafter: DrafterKind::Ngram { min_n: 1, max_n: 4 }, num_draft_tokens: 4, adaptive: true, max_batch: 0 }
    }
}

/// Whether a request's target distribution is known to the verifier: the default sampler's
/// (the front end's distribution, truncated by top-k/typical-p/top-p/min-p as the sampler does
/// — see [`truncates`]), and no log-probabilities (they are reported per sampled position).
pub fn eligible(logprobs: Option<usize>, default_sampler: bool) -> bool {
    logprobs.is_none() && default_sampler
}

/// Whether a sampled request's target distribution is truncated (the verifier then gets the
/// renormalised kept set, `native::truncate_candidates`).
pub fn truncates(params: &SamplingParams) -> bool {
    params.temperature != 0.0 && (params.top_p < 1.0 || params.top_k > 0 || params.min_p > 0.0 || params.typical_p < 1.0)
}

/// Proposes up to `k` tokens to follow `tokens` by prompt lookup (see [`DrafterKind::Ngram`]).
/// The most recent earlier match wins; fewer than `k` tokens when the match is near the end.
pub fn ngram_draft(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return vec![];
    }
    for n in (min_n.max(1)..=max_n).rev() {
        if len <= n {
            continue;
        }
        let tail = &tokens[len - n..];
        // Latest start first; the match must end before the tail starts being compared to itself.
        for start in (0..len - n).rev() {
            if &tokens[start..start + n] == tail {
                let from = start + n;
                let to = (from + k).min(len);
                if from < to {
                    return tokens[from..to].to_vec();
                }
            }
        }
    }
    vec![]
}

/// Per-sequence speculation state: the drafts of the step being planned and the acceptance
/// history that sets the next draft length.
#[derive(Clone, Debug, Default)]
pub struct SpecState {
    pub drafts: Vec<u32>,
    /// Exponential moving average of accepted / drafted.
    pub acceptance: f64,
    /// Verify steps so far.
    pub rounds: u64,
    /// Steps left without drafting (adaptive pause after low acceptance).
    pub pause: u32,
}

const EMA: f64 = 0.3;
const LOW: f64 = 0.2;
const PAUSE_STEPS: u32 = 8;

impl SpecState {
    /// Draft length for the next step.
    pub fn draft_len(&mut self, cfg: &SpecConfig) -> usize {
        if !cfg.adaptive || self.rounds == 0 {
            return cfg.num_draft_tokens;
        }
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        // Expected accepted length under acceptance a, plus one of look-ahead.
        ((self.acceptance * cfg.num_draft_tokens as f64).round() as usize + 1).clamp(1, cfg.num_draft_tokens)
    }

    /// Records a verify step: `accepted` of `drafted` drafts kept.
    pub fn record(&mut self, cfg: &SpecConfig, drafted: usize, accepted: usize) {
        let a = if drafted == 0 { 0.0 } else { accepted as f64 / drafted as f64 };
        self.acceptance = if self.rounds == 0 { a } else { (1.0 - EMA) * self.acceptance + EMA * a };
        self.rounds += 1;
        if cfg.adaptive && self.acceptance < LOW {
            self.pause = PAUSE_STEPS;
            // Start again from a neutral estimate after the pause.
            self.acceptance = LOW;
        }
    }
}

/// One sequence's verify step in this forward pass.
pub struct VerifyJob {
    /// The sequence's index in the running set.
    pub si: usize,
    pub request_id: u64,
    pub drafts: Vec<u32>,
    pub greedy: bool,
    pub seed: u64,
    /// The sequence's length before this step (position of the first draft).
    pub position: usize,
    /// Its first logits row / front row; `drafts.len() + 1` rows in all.
    pub first: usize,
    /// The oracle instrument's acceptance probability (its verdicts are synthetic).
    pub oracle: Option<f64>,
    /// Sampling parameters whose truncation the target distribution carries.
    pub truncate: Option<SamplingParams>,
}

/// Uniforms of a verify step: `k + 2` per sequence (one per draft, one for the final draw, as
/// the verifier interface promises), from the request seed and position, apart from the
/// sampler's stream.
fn uniforms(job: &VerifyJob) -> Vec<f64> {
    (0..job.drafts.len() as u64 + 2).map(|i| uniform(job.seed, job.position as u64, 1 + i)).collect()
}

/// The target distribution at each position of `job`, from the front end's output or, for rows
/// it was asked to leave whole (k = 0) or when `complete`, from the edited row on the host.
fn targets<B: Backend>(logits: &mut StepLogits<B>, job: &VerifyJob, fronts: &[FrontRow], outs: &mut [Option<FrontOut>], base: usize, complete: bool) -> Result<Vec<Candidates>, String> {
    let rows: Vec<usize> = (job.first..=job.first + job.drafts.len()).collect();
    let whole: Vec<usize> = rows.iter().copied().filter(|&r| complete || fronts[r].k == 0).collect();
    logits.fetch_edited(&whole)?;
    Ok(rows
        .iter()
        .map(|&r| {
            let c = match outs[r - base].take() {
                Some(o) if !complete && fronts[r].k != 0 => frontend::candidates(o),
                _ => frontend::extract(logits.edited(r), &fronts[r], 0),
            };
            match &job.truncate {
                Some(p) if c.complete => native::truncate_candidates(p, &c),
                _ => c,
            }
        })
        .collect())
}

/// Verifies every job through the active verifier plugin (one call for the batch; a second with
/// complete distributions for the sequences that ask for them; the native verifier when the
/// plugin cannot decide). `outs[r - base]` is the front end's output for row `r`. Each result
/// is `(accepted drafts, next token)`.
pub fn verify<B: Backend>(logits: &mut StepLogits<B>, registry: &Registry, jobs: &[VerifyJob], fronts: &[FrontRow], outs: Vec<FrontOut>, vocab: usize) -> Vec<Result<(usize, u32), String>> {
    let base = jobs.first().map_or(0, |j| j.first);
    let mut outs: Vec<Option<FrontOut>> = outs.into_iter().map(Some).collect();
    let step = |job: &VerifyJob, target: Vec<Candidates>| DraftStep {
        request_id: job.request_id,
        draft_tokens: job.drafts.clone(),
        // Drafters here propose one token with certainty (prompt lookup).
        draft_probs: vec![1.0; job.drafts.len()],
        draft_candidates: None,
        target,
        uniforms: uniforms(job),
        greedy: job.greedy,
    };
    // Every entry is set below: a target error, an oracle verdict, or the verifier's answer.
    let mut result: Vec<Result<(usize, u32), String>> = vec![Err(String::new()); jobs.len()];
    // Round 1: targets from the step's candidates. Oracle jobs are decided here; the rest go to
    // the verifier plugin in one batch call.
    let mut pending: Vec<(usize, DraftStep)> = vec![];
    for (i, job) in jobs.iter().enumerate() {
        match targets(logits, job, fronts, &mut outs, base, false) {
            Err(e) => result[i] = Err(e),
            Ok(t) => match job.oracle {
                Some(a) => {
                    let n = oracle_accepts(job.seed, job.position, job.drafts.len(), a);
                    result[i] = t[n].ids.first().map(|&t| (n, t)).ok_or_else(|| "no target candidate".to_string());
                }
                None => pending.push((i, step(job, t))),
            },
        }
    }
    let resolved = registry.resolve(PluginKind::Verifier, None);
    let call = |batch: &[DraftStep]| -> Vec<Verdict> {
        match &resolved {
            Ok((p, policy)) => calls::verify(p, *policy, batch, vocab as u32).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "verifier plugin failed; native verification this step");
                batch.iter().map(native::verify).collect()
            }),
            Err(_) => batch.iter().map(native::verify).collect(),
        }
    };
    let (idx, batch): (Vec<usize>, Vec<DraftStep>) = pending.into_iter().unzip();
    let mut again = vec![];
    if !batch.is_empty() {
        for (i, v) in idx.into_iter().zip(call(&batch)) {
            match v {
                Verdict::Accept((n, t)) => result[i] = Ok((n as usize, t)),
                Verdict::FullVocabulary => again.push(i),
            }
        }
    }
    // Round 2: complete distributions for the jobs the verifier asked them for; a verifier that
    // asks again gets the native (lossless) verification.
    let mut pending: Vec<(usize, DraftStep)> = vec![];
    for i in again {
        match targets(logits, &jobs[i], fronts, &mut outs, base, true) {
            Ok(t) => pending.push((i, step(&jobs[i], t))),
            Err(e) => result[i] = Err(e),
        }
    }
    let (idx, batch): (Vec<usize>, Vec<DraftStep>) = pending.into_iter().unzip();
    if !batch.is_empty() {
        for ((i, s), v) in idx.into_iter().zip(&batch).zip(call(&batch)) {
            let v = match v {
                Verdict::FullVocabulary => native::verify(s),
                v => v,
            };
            result[i] = match v {
                Verdict::Accept((n, t)) => Ok((n as usize, t)),
                Verdict::FullVocabulary => Err("the verifier could not decide on complete distributions".into()),
            };
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_finds_the_latest_longest_match() {
        // "a b c d a b c" → after the tail "a b c" came "d a b c".
        let t = [1, 2, 3, 4, 1, 2, 3];
        assert_eq!(ngram_draft(&t, 1, 3, 3), vec![4, 1, 2]);
        assert_eq!(ngram_draft(&t, 1, 3, 10), vec![4, 1, 2, 3]);
        // The latest occurrence of the 1-gram "9" wins.
        let t = [9, 5, 9, 6, 7, 9];
        assert_eq!(ngram_draft(&t, 1, 1, 2), vec![6, 7]);
        // No earlier occurrence: no draft.
        assert!(ngram_draft(&[1, 2, 3], 1, 3, 4).is_empty());
        assert!(ngram_draft(&[1], 1, 3, 4).is_empty());
        assert!(ngram_draft(&[1, 1], 1, 3, 0).is_empty());
        // A repeated token proposes itself.
        assert_eq!(ngram_draft(&[7, 7, 7], 1, 2, 3), vec![7]);
    }

    #[test]
    fn oracle_accepts_each_draft_with_the_given_probability() {
        assert_eq!(oracle_accepts(1, 20, 4, 1.0), 4);
        assert_eq!(oracle_accepts(1, 20, 4, 0.0), 0);
        // Per-draft agreement over many positions is close to the acceptance asked for.
        let n = 4000;
        let kept: usize = (0..n).map(|pos| oracle_accepts(5, pos, 1, 0.7)).sum();
        let rate = kept as f64 / n as f64;
        assert!((rate - 0.7).abs() < 0.03, "{rate}");
        // Accepted lengths are a leading run: the mean of min(geometric, k).
        let mean = (0..n).map(|pos| oracle_accepts(9, pos * 8, 4, 0.5)).sum::<usize>() as f64 / n as f64;
        assert!((mean - (0.5 + 0.25 + 0.125 + 0.0625)).abs() < 0.06, "{mean}");
    }

    #[test]
    fn adaptive_length_shrinks_then_pauses_then_recovers() {
        let cfg = SpecConfig { num_draft_tokens: 5, ..Default::default() };
        let mut s = SpecState::default();
        assert_eq!(s.draft_len(&cfg), 5);
        s.record(&cfg, 5, 5);
        assert_eq!(s.draft_len(&cfg), 5);
        s.record(&cfg, 5, 0);
        s.record(&cfg, 5, 0);
        let l = s.draft_len(&cfg);
        assert!((1..5).contains(&l), "acceptance {:.2} should shorten the drafts: {l}", s.acceptance);
        for _ in 0..6 {
            s.record(&cfg, 5, 0);
        }
        assert_eq!(s.pause, PAUSE_STEPS);
        for _ in 0..PAUSE_STEPS {
            assert_eq!(s.draft_len(&cfg), 0);
        }
        assert!(s.draft_len(&cfg) >= 1, "drafting resumes after the pause");
        let fixed = SpecConfig { adaptive: false, ..cfg };
        let mut s = SpecState::default();
        s.record(&fixed, 5, 0);
        assert_eq!(s.draft_len(&fixed), 5);
    }

    #[test]
    fn which_requests_speculate_and_which_carry_a_truncation() {
        assert!(eligible(None, true));
        assert!(!eligible(Some(2), true), "log-probabilities");
        assert!(!eligible(None, false), "a custom sampler");
        let p = weft_plugin_host::neutral_params(100);
        assert!(!truncates(&p));
        assert!(!truncates(&SamplingParams { temperature: 0.0, top_p: 0.5, ..p.clone() }), "greedy ignores truncation");
        for t in [SamplingParams { top_p: 0.9, ..p.clone() }, SamplingParams { top_k: 40, ..p.clone() }, SamplingParams { min_p: 0.1, ..p.clone() }, SamplingParams { typical_p: 0.8, ..p }] {
            assert!(truncates(&t));
        }
    }
}
