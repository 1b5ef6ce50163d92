//! Speculative decoding: which sequences draft, the drafters, and the per-sequence bookkeeping
//! of a verify step. The engine appends a sequence's drafts to its decode token so the target
//! scores `[last, d1..dk]` in the same forward pass as everything else; the verifier plugin
//! (lossless default: greedy prefix match, or chain rejection sampling on complete
//! distributions) decides the accepted prefix and the correction or bonus token; the KV entries
//! of rejected drafts are dropped by moving the sequence's computed length back and releasing
//! pages past it.
//!
//! A request speculates when the server has a drafter, it asks for no log-probabilities, and
//! its target distribution is the one the front end produces (greedy, or temperature sampling
//! with top-p/top-k/min-p/typical-p off, through the default sampler): those are the requests
//! whose distribution the verifier sees exactly. Others decode one token per step as before.

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
    /// A benchmark instrument, not a drafter: replays the continuation an earlier request with
    /// the same prompt produced (the engine records every finished one) and corrupts each draft
    /// with probability `1 - acceptance`, so greedy verification accepts a draft with
    /// probability `acceptance`. It costs nothing to run, so it shows the speedup an ideal
    /// drafter of that acceptance rate would give. Send each prompt once to record it first.
    Oracle { acceptance: f64 },
}

impl DrafterKind {
    pub fn name(&self) -> &'static str {
        match self {
            DrafterKind::Ngram { .. } => "ngram",
            DrafterKind::Oracle { .. } => "oracle",
        }
    }
}

/// The oracle's drafts: `recorded[generated..]`, each kept with probability `acceptance` (by
/// the request's seed and position) and otherwise replaced by another token, after which
/// drafting stops (verification rejects there).
pub fn oracle_draft(recorded: &[u32], generated: usize, acceptance: f64, seed: u64, position: usize, vocab: usize, k: usize) -> Vec<u32> {
    let mut out = vec![];
    for (j, &t) in recorded.iter().skip(generated).take(k).enumerate() {
        if uniform(seed, (position + j) as u64, 0x0AC1E) < acceptance {
            out.push(t);
        } else {
            out.push(((t as usize + 1) % vocab.max(2)) as u32);
            break;
        }
    }
    out
}

/// The server's speculative decoding settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecConfig {
    pub drafter: DrafterKind,
    /// Drafts per verify step, at most.
    pub num_draft_tokens: usize,
    /// Shrink the draft length with low acceptance and pause drafting when it stays low.
    pub adaptive: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig { drafter: DrafterKind::Ngram { min_n: 1, max_n: 4 }, num_draft_tokens: 4, adaptive: true }
    }
}

/// Whether a request's target distribution is fully known to the verifier.
pub fn eligible(params: &SamplingParams, logprobs: Option<usize>, default_sampler: bool) -> bool {
    let plain = params.top_p >= 1.0 && (params.top_k == 0 || params.temperature == 0.0) && params.min_p <= 0.0 && params.typical_p >= 1.0;
    logprobs.is_none() && default_sampler && (params.temperature == 0.0 || plain)
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
        .map(|&r| match outs[r - base].take() {
            Some(o) if !complete && fronts[r].k != 0 => frontend::candidates(o),
            _ => frontend::extract(logits.edited(r), &fronts[r], 0),
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
    let mut steps = vec![];
    for job in jobs {
        match targets(logits, job, fronts, &mut outs, base, false) {
            Ok(t) => steps.push(Ok(step(job, t))),
            Err(e) => steps.push(Err(e)),
        }
    }
    let ready: Vec<usize> = (0..jobs.len()).filter(|&i| steps[i].is_ok()).collect();
    let batch: Vec<DraftStep> = ready.iter().map(|&i| steps[i].as_ref().unwrap().clone()).collect();
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
    let verdicts = call(&batch);
    let mut result: Vec<Result<(usize, u32), String>> = steps.iter().map(|s| Err(s.as_ref().err().cloned().unwrap_or_default())).collect();
    let mut again = vec![];
    for (&i, v) in ready.iter().zip(verdicts) {
        match v {
            Verdict::Accept((n, t)) => result[i] = Ok((n as usize, t)),
            Verdict::FullVocabulary => again.push(i),
        }
    }
    if !again.is_empty() {
        let mut batch = vec![];
        for &i in &again {
            match targets(logits, &jobs[i], fronts, &mut outs, base, true) {
                Ok(t) => batch.push(step(&jobs[i], t)),
                Err(e) => result[i] = Err(e),
            }
        }
        let ok: Vec<usize> = again.iter().copied().filter(|&i| result[i].as_ref().is_err_and(|e| e.is_empty())).collect();
        for (&i, (s, v)) in ok.iter().zip(batch.iter().zip(call(&batch))) {
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
    fn oracle_keeps_each_draft_with_the_given_probability() {
        let rec: Vec<u32> = (0..64).collect();
        assert_eq!(oracle_draft(&rec, 10, 1.0, 1, 20, 100, 4), vec![10, 11, 12, 13]);
        assert_eq!(oracle_draft(&rec, 62, 1.0, 1, 20, 100, 4), vec![62, 63]);
        let d = oracle_draft(&rec, 0, 0.0, 1, 20, 100, 4);
        assert_eq!(d, vec![1], "the first draft is corrupted and drafting stops");
        // Per-token agreement over many positions is close to the acceptance asked for.
        let (mut kept, mut n) = (0, 0);
        for pos in 0..4000 {
            let d = oracle_draft(&rec, 0, 0.7, 5, pos, 100, 1);
            kept += (d[0] == 0) as usize;
            n += 1;
        }
        let rate = kept as f64 / n as f64;
        assert!((rate - 0.7).abs() < 0.03, "{rate}");
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
    fn only_requests_whose_distribution_the_verifier_sees_speculate() {
        let p = weft_plugin_host::neutral_params(100);
        let greedy = SamplingParams { temperature: 0.0, top_p: 0.5, ..p.clone() };
        assert!(eligible(&greedy, None, true));
        assert!(!eligible(&greedy, Some(2), true), "log-probabilities");
        assert!(!eligible(&greedy, None, false), "a custom sampler");
        let warm = SamplingParams { temperature: 0.8, ..p.clone() };
        assert!(eligible(&warm, None, true));
        assert!(!eligible(&SamplingParams { top_p: 0.9, ..warm.clone() }, None, true));
        assert!(!eligible(&SamplingParams { top_k: 40, ..warm.clone() }, None, true));
        assert!(!eligible(&SamplingParams { min_p: 0.1, ..warm }, None, true));
    }
}
