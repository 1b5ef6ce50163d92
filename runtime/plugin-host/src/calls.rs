//! Calls as the engine makes them: one batch call per step per plugin kind, every answer
//! validated against what was asked, and faults handled by the slot's failure policy
//! (native fallback, fail the affected requests, or reload and retry once).

use crate::bindings::{Candidates, Capacity, Decision, DraftStep, Rejection, Running, SamplingParams, SamplingPlan, ScheduleDecision, Sequence, Verdict, Waiting};
use crate::{native, FailurePolicy, Fault, LoadedPlugin, PluginError};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

const MAX_STATE_BYTES: usize = 4096;

fn faulted(p: &LoadedPlugin, fault: Fault) -> PluginError {
    PluginError::Faulted { plugin: p.id.to_string(), fault }
}

/// Runs `call`; on a fault applies `policy`: `Reload` retries once on a fresh instance,
/// `Fallback` answers with `native`, `Fail` returns the fault.
fn with_policy<R>(p: &LoadedPlugin, policy: FailurePolicy, mut call: impl FnMut() -> Result<R, Fault>, native: impl FnOnce() -> R) -> Result<R, PluginError> {
    match call() {
        Ok(r) => Ok(r),
        Err(f) => match policy {
            FailurePolicy::Fallback => {
                p.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                Ok(native())
            }
            FailurePolicy::Fail => Err(faulted(p, f)),
            FailurePolicy::Reload => {
                p.stats.reloads.fetch_add(1, Ordering::Relaxed);
                call().map_err(|f2| faulted(p, f2))
            }
        },
    }
}

fn validate_plan(plan: &SamplingPlan, vocab: u32) -> Result<(), Fault> {
    let bad = |m: String| Err(Fault::Invalid(m));
    if !(plan.temperature.is_finite() && plan.temperature >= 0.0) {
        return bad(format!("plan temperature {}", plan.temperature));
    }
    for (n, v) in [("repetition_penalty", plan.repetition_penalty), ("presence_penalty", plan.presence_penalty), ("frequency_penalty", plan.frequency_penalty)] {
        if !v.is_finite() {
            return bad(format!("plan {n} {v}"));
        }
    }
    if let Some((t, _)) = plan.logit_bias.iter().find(|(t, b)| *t >= vocab || !b.is_finite()) {
        return bad(format!("logit bias for token {t}"));
    }
    if let Some(t) = plan.banned_tokens.iter().find(|&&t| t >= vocab) {
        return bad(format!("banned token {t} outside the vocabulary"));
    }
    if plan.state.len() > MAX_STATE_BYTES {
        return bad(format!("{} bytes of state (limit {MAX_STATE_BYTES})", plan.state.len()));
    }
    Ok(())
}

/// A request's sampling plan. `native` is true when the native policy serves this request
/// (its plugin faulted in `configure` under the fallback policy).
pub fn configure(p: &LoadedPlugin, policy: FailurePolicy, params: &SamplingParams) -> Result<(SamplingPlan, bool), PluginError> {
    let mut rejected = None;
    let r = with_policy(
        p,
        policy,
        || match p.sampler_configure(params)? {
            Ok(mut plan) => {
                if let Err(f) = validate_plan(&plan, params.vocab_size) {
                    p.stats.count(&f);
                    return Err(f);
                }
                // More candidates than the vocabulary holds is the whole vocabulary.
                if plan.candidates >= params.vocab_size {
                    plan.candidates = 0;
                }
                Ok((plan, false))
            }
            Err(msg) => {
                rejected = Some(msg);
                Ok((native::plan(params), true))
            }
        },
        || (native::plan(params), true),
    )?;
    match rejected {
        Some(msg) => Err(PluginError::Rejected(msg)),
        None => Ok(r),
    }
}

fn validate_decisions(batch: &[Sequence], out: &[Decision], vocab: u32) -> Result<(), Fault> {
    if out.len() != batch.len() {
        return Err(Fault::Invalid(format!("{} decisions for {} sequences", out.len(), batch.len())));
    }
    for (s, d) in batch.iter().zip(out) {
        let c = &s.candidates;
        match d {
            Decision::Token(t) => {
                if *t >= vocab || !c.ids.contains(t) {
                    return Err(Fault::Invalid(format!("request {}: token {t} is not one of its candidates", s.request_id)));
                }
            }
            Decision::MoreCandidates(n) => {
                if c.complete || *n as usize <= c.ids.len() {
                    return Err(Fault::Invalid(format!("request {}: asked for {n} candidates with {} already given", s.request_id, c.ids.len())));
                }
            }
            Decision::FullVocabulary => {
                if c.complete {
                    return Err(Fault::Invalid(format!("request {}: asked for the full vocabulary, already given", s.request_id)));
                }
            }
        }
    }
    Ok(())
}

/// One sampling step for a batch. `params[i]` are sequence i's request parameters (used by the
/// native fallback).
pub fn sample(p: &LoadedPlugin, policy: FailurePolicy, batch: &[Sequence], params: &[&SamplingParams], vocab: u32) -> Result<Vec<Decision>, PluginError> {
    with_policy(
        p,
        policy,
        || {
            let out = p.sampler_sample(batch)?;
            validate_decisions(batch, &out, vocab).inspect_err(|f| p.stats.count(f))?;
            Ok(out)
        },
        || batch.iter().zip(params).map(|(s, pr)| native::sample_candidates(pr, &s.candidates, s.uniforms.first().copied().unwrap_or(0.0))).collect(),
    )
}

fn in_candidates(c: &Candidates, t: u32) -> bool {
    c.ids.contains(&t)
}

/// One verification step for a batch of speculative sequences.
pub fn verify(p: &LoadedPlugin, policy: FailurePolicy, batch: &[DraftStep], vocab: u32) -> Result<Vec<Verdict>, PluginError> {
    with_policy(
        p,
        policy,
        || {
            let out = p.verifier_verify(batch)?;
            let check = || -> Result<(), Fault> {
                if out.len() != batch.len() {
                    return Err(Fault::Invalid(format!("{} verdicts for {} sequences", out.len(), batch.len())));
                }
                for (s, v) in batch.iter().zip(&out) {
                    match v {
                        Verdict::Accept((n, t)) => {
                            let n = *n as usize;
                            if n > s.draft_tokens.len() {
                                return Err(Fault::Invalid(format!("request {}: accepted {n} of {} drafts", s.request_id, s.draft_tokens.len())));
                            }
                            if *t >= vocab || !s.target.get(n).is_some_and(|c| in_candidates(c, *t)) {
                                return Err(Fault::Invalid(format!("request {}: next token {t} is not a target candidate", s.request_id)));
                            }
                        }
                        Verdict::FullVocabulary => {
                            if s.target.iter().all(|c| c.complete) && s.draft_candidates.as_ref().is_none_or(|d| d.iter().all(|c| c.complete)) {
                                return Err(Fault::Invalid(format!("request {}: asked for the full vocabulary, already given", s.request_id)));
                            }
                        }
                    }
                }
                Ok(())
            };
            check().inspect_err(|f| p.stats.count(f))?;
            Ok(out)
        },
        || batch.iter().map(native::verify).collect(),
    )
}

/// Checks an admission decision against the queue, the running set and the capacity.
pub fn validate_schedule(d: &ScheduleDecision, waiting: &[Waiting], running: &[Running], cap: &Capacity) -> Result<(), Fault> {
    let wait_ids: HashSet<u64> = waiting.iter().map(|w| w.id).collect();
    let run_ids: HashSet<u64> = running.iter().map(|r| r.id).collect();
    let mut seen = HashSet::new();
    for id in d.admit.iter().chain(d.reject.iter().map(|r| &r.id)) {
        if !wait_ids.contains(id) {
            return Err(Fault::Invalid(format!("admitted or rejected unknown request {id}")));
        }
        if !seen.insert(*id) {
            return Err(Fault::Invalid(format!("request {id} decided twice")));
        }
    }
    let mut pre = HashSet::new();
    for id in &d.preempt {
        if !run_ids.contains(id) || !pre.insert(*id) {
            return Err(Fault::Invalid(format!("preempted {id}, which is not running (or twice)")));
        }
    }
    let ps = cap.page_size.max(1);
    let freed: u32 = running.iter().filter(|r| pre.contains(&r.id)).map(|r| r.pages).sum();
    let need: u32 = waiting.iter().filter(|w| d.admit.contains(&w.id)).map(|w| (w.prompt_tokens + 1).div_ceil(ps).saturating_sub(w.cached_prefix_tokens / ps)).sum();
    if need > cap.free_pages + freed {
        return Err(Fault::Invalid(format!("admissions need {need} pages, {} free", cap.free_pages + freed)));
    }
    if running.len() - pre.len() + d.admit.len() > cap.max_sequences as usize {
        return Err(Fault::Invalid(format!("{} sequences would run, limit {}", running.len() - pre.len() + d.admit.len(), cap.max_sequences)));
    }
    Ok(())
}

pub fn schedule(p: &LoadedPlugin, policy: FailurePolicy, waiting: &[Waiting], running: &[Running], cap: Capacity) -> Result<ScheduleDecision, PluginError> {
    with_policy(
        p,
        policy,
        || {
            let d = p.admission_schedule(waiting, running, cap)?;
            validate_schedule(&d, waiting, running, &cap).inspect_err(|f| p.stats.count(f))?;
            Ok(d)
        },
        || native::schedule(waiting, running, &cap),
    )
}

pub fn on_arrival(p: &LoadedPlugin, policy: FailurePolicy, w: &Waiting, queue: u32) -> Result<Option<Rejection>, PluginError> {
    with_policy(
        p,
        policy,
        || {
            let r = p.admission_on_arrival(w, queue)?;
            if let Some(rej) = &r {
                if rej.id != w.id {
                    let f = Fault::Invalid(format!("rejection names request {} for arrival {}", rej.id, w.id));
                    p.stats.count(&f);
                    return Err(f);
                }
            }
            Ok(r)
        },
        || None,
    )
}
