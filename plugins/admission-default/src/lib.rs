//! weft's default admission policies. `fcfs` (default): admit in arrival order while the KV
//! pages and sequence slots last, never jumping the queue. `fair-share` (options
//! `{"policy":"fair-share"}`): higher priority first, then the tenant with the fewest running
//! requests; a waiting request of higher priority may preempt the lowest-priority running one.
//! Both reject at arrival when the queue is full (`max_queue`, default 4096) and reject requests
//! that could never fit in the pool.

use std::cell::RefCell;
use weft_plugin_sdk::admission::exports::weft::plugin::admission::{Capacity, Guest, Rejection, Running, ScheduleDecision, Waiting};
use weft_plugin_sdk::admission::weft::plugin::types::{PluginInfo, PluginKind};

#[derive(Clone, Copy, PartialEq)]
enum Policy {
    Fcfs,
    FairShare,
}

struct Options {
    policy: Policy,
    max_queue: u32,
}

thread_local! {
    static OPTIONS: RefCell<Options> = const { RefCell::new(Options { policy: Policy::Fcfs, max_queue: 4096 }) };
}

struct DefaultAdmission;

fn pages_for(tokens: u32, page: u32) -> u32 {
    tokens.div_ceil(page.max(1))
}

/// Pages a waiting request needs for its prompt plus its first generated token, minus what the
/// prefix cache already holds.
fn need(w: &Waiting, cap: &Capacity) -> u32 {
    pages_for(w.prompt_tokens + 1, cap.page_size).saturating_sub(w.cached_prefix_tokens / cap.page_size.max(1))
}

/// Minimal parser for the two options this plugin takes (no JSON dependency in the guest).
fn parse_options(s: &str) -> Result<Options, String> {
    let mut o = Options { policy: Policy::Fcfs, max_queue: 4096 };
    let t = s.trim();
    if t.is_empty() || t == "{}" {
        return Ok(o);
    }
    if t.contains("\"fair-share\"") {
        o.policy = Policy::FairShare;
    } else if t.contains("\"policy\"") && !t.contains("\"fcfs\"") {
        return Err(format!("unknown policy in options {t}: expected \"fcfs\" or \"fair-share\""));
    }
    if let Some(i) = t.find("\"max_queue\"") {
        let rest = &t[i + 11..];
        let digits: String = rest.chars().skip_while(|c| !c.is_ascii_digit()).take_while(|c| c.is_ascii_digit()).collect();
        o.max_queue = digits.parse().map_err(|_| format!("max_queue in {t} is not a number"))?;
    }
    Ok(o)
}

impl Guest for DefaultAdmission {
    fn describe() -> PluginInfo {
        PluginInfo { name: "default".into(), version: env!("CARGO_PKG_VERSION").into(), interface_version: weft_plugin_sdk::INTERFACE_VERSION.into(), kind: PluginKind::Admission }
    }

    fn configure(options: String) -> Result<(), String> {
        let o = parse_options(&options)?;
        OPTIONS.with(|x| *x.borrow_mut() = o);
        Ok(())
    }

    fn on_arrival(_request: Waiting, queue_length: u32) -> Option<Rejection> {
        let max = OPTIONS.with(|o| o.borrow().max_queue);
        (queue_length >= max).then(|| Rejection { id: _request.id, reason: format!("queue full ({queue_length} waiting, limit {max})"), retry: true })
    }

    fn schedule(waiting: Vec<Waiting>, running: Vec<Running>, cap: Capacity) -> ScheduleDecision {
        let policy = OPTIONS.with(|o| o.borrow().policy);
        let mut d = ScheduleDecision { admit: vec![], preempt: vec![], reject: vec![] };
        let mut free = cap.free_pages;
        let mut slots = cap.max_sequences.saturating_sub(running.len() as u32);
        let mut budget = cap.token_budget;
        let mut order: Vec<&Waiting> = waiting.iter().collect();
        let mut per_tenant: Vec<(String, u32)> = vec![];
        for r in &running {
            match per_tenant.iter_mut().find(|(t, _)| *t == r.tenant) {
                Some(e) => e.1 += 1,
                None => per_tenant.push((r.tenant.clone(), 1)),
            }
        }
        let count = |pt: &Vec<(String, u32)>, t: &str| pt.iter().find(|(x, _)| x == t).map(|e| e.1).unwrap_or(0);
        match policy {
            Policy::Fcfs => order.sort_by_key(|w| (w.arrival_ms, w.id)),
            Policy::FairShare => order.sort_by(|a, b| b.priority.cmp(&a.priority).then(count(&per_tenant, &a.tenant).cmp(&count(&per_tenant, &b.tenant))).then(a.arrival_ms.cmp(&b.arrival_ms))),
        }
        let mut victims: Vec<&Running> = running.iter().collect();
        victims.sort_by_key(|r| (r.priority, std::cmp::Reverse(r.id)));
        for w in order {
            let pages = need(w, &cap);
            if pages_for(w.prompt_tokens + 1, cap.page_size) > cap.total_pages {
                d.reject.push(Rejection { id: w.id, reason: format!("prompt of {} tokens needs more KV pages than the pool holds ({})", w.prompt_tokens, cap.total_pages), retry: false });
                continue;
            }
            let prefill = w.prompt_tokens.saturating_sub(w.cached_prefix_tokens).max(1);
            // Chunked prefill: any request may start with a partial budget, but not with none.
            let fits = |free: u32, slots: u32, budget: u32| pages <= free && slots > 0 && budget > 0;
            if !fits(free, slots, budget) && policy == Policy::FairShare {
                while !fits(free, slots, budget) {
                    match victims.first() {
                        Some(v) if v.priority < w.priority && !d.preempt.contains(&v.id) => {
                            free += v.pages;
                            slots += 1;
                            d.preempt.push(v.id);
                            victims.remove(0);
                        }
                        _ => break,
                    }
                }
            }
            if fits(free, slots, budget) {
                d.admit.push(w.id);
                free -= pages;
                slots -= 1;
                budget = budget.saturating_sub(prefill);
                let t = w.tenant.clone();
                match per_tenant.iter_mut().find(|(x, _)| *x == t) {
                    Some(e) => e.1 += 1,
                    None => per_tenant.push((t, 1)),
                }
            } else if policy == Policy::Fcfs {
                break; // no queue jumping
            }
        }
        d
    }
}

weft_plugin_sdk::admission::export_admission!(DefaultAdmission);
