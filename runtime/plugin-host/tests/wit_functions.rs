//! Every WIT function of every world, called through the real compiled default components.

mod common;
use common::*;
use weft_plugin_host::{calls, Capacity, Decision, DraftStep, FailurePolicy, PluginKind, Registry, Running, SandboxLimits, Verdict, Waiting};

fn registry() -> Registry {
    Registry::with_defaults(SandboxLimits::default()).unwrap()
}

#[test]
fn describe_of_each_default() {
    let r = registry();
    for kind in PluginKind::ALL {
        let (p, policy) = r.resolve(kind, None).unwrap();
        let info = p.describe().unwrap();
        assert_eq!(info.name, "default");
        assert_eq!(info.interface_version, weft_plugin_host::INTERFACE_VERSION);
        assert_eq!(policy, FailurePolicy::Fallback);
    }
    assert_eq!(r.list().len(), 3);
}

#[test]
fn sampler_configure_and_sample() {
    let r = registry();
    let (p, pol) = r.resolve(PluginKind::Sampler, None).unwrap();
    let mut prm = params();
    prm.vocab_size = 100;
    prm.temperature = 0.0;
    let (plan, native) = calls::configure(&p, pol, &prm).unwrap();
    assert!(!native);
    assert_eq!(plan.candidates, 1, "greedy needs one candidate");
    prm.temperature = 0.8;
    prm.top_k = 20;
    prm.logit_bias = vec![(3, 1.5)];
    prm.banned_tokens = vec![7];
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    assert_eq!(plan.candidates, 20);
    assert_eq!(plan.temperature, 0.8);
    assert_eq!(plan.logit_bias, vec![(3, 1.5)]);
    assert_eq!(plan.banned_tokens, vec![7]);
    // Invalid parameters are the client's error, named.
    prm.top_p = 1.5;
    let e = calls::configure(&p, pol, &prm).unwrap_err().to_string();
    assert!(e.contains("top_p"), "{e}");
    prm.top_p = 1.0;

    let mut rng = Rng(5);
    let logits = random_logits(&mut rng, 100, 2.0);
    let batch: Vec<_> =
        (0..3).map(|i| weft_plugin_host::Sequence { request_id: i, state: plan.state.clone(), candidates: candidates(&logits, 20), uniforms: vec![rng.uniform()], history: None }).collect();
    let out = calls::sample(&p, pol, &batch, &[&prm, &prm, &prm], 100).unwrap();
    assert_eq!(out.len(), 3);
    for d in out {
        assert!(matches!(d, Decision::Token(t) if batch[0].candidates.ids.contains(&t)));
    }
}

#[test]
fn verifier_verify() {
    let r = registry();
    let (p, pol) = r.resolve(PluginKind::Verifier, None).unwrap();
    let logits: Vec<f32> = vec![3.0, 1.0, 0.5, 0.0];
    let c = candidates(&logits, 0);
    let greedy =
        DraftStep { request_id: 1, draft_tokens: vec![0, 2], draft_probs: vec![1.0, 1.0], draft_candidates: None, target: vec![c.clone(), c.clone(), c.clone()], uniforms: vec![0.5; 4], greedy: true };
    let out = calls::verify(&p, pol, &[greedy], 4).unwrap();
    assert_eq!(out, vec![Verdict::Accept((1, 0))], "first draft matches argmax, second does not; correction is argmax");
    let sampled = DraftStep {
        request_id: 2,
        draft_tokens: vec![0, 0],
        draft_probs: vec![0.01, 0.01],
        draft_candidates: None,
        target: vec![c.clone(), c.clone(), c],
        uniforms: vec![0.5, 0.5, 0.5, 0.3],
        greedy: false,
    };
    let out = calls::verify(&p, pol, &[sampled], 4).unwrap();
    assert!(matches!(out[0], Verdict::Accept((2, _))), "q tiny vs p large: both accepted, bonus drawn: {out:?}");
}

#[test]
fn admission_configure_on_arrival_schedule() {
    let r = Registry::new(SandboxLimits::default()).unwrap();
    let id = r.load_bytes(weft_plugin_host::defaults::ADMISSION, None, Some(r#"{"policy":"fcfs","max_queue":2}"#)).unwrap();
    assert_eq!(id.kind, PluginKind::Admission);
    let (p, pol) = r.resolve(PluginKind::Admission, Some("default")).unwrap();
    let w = |id: u64, arrival: u64, prompt: u32| Waiting { id, arrival_ms: arrival, prompt_tokens: prompt, cached_prefix_tokens: 0, max_tokens: 16, priority: 0, tenant: "a".into() };
    assert_eq!(calls::on_arrival(&p, pol, &w(1, 0, 10), 0).unwrap(), None);
    let rej = calls::on_arrival(&p, pol, &w(9, 0, 10), 2).unwrap().unwrap();
    assert!(rej.retry && rej.reason.contains("queue full"), "{rej:?}");
    let cap = Capacity { free_pages: 3, total_pages: 10, page_size: 16, token_budget: 256, max_sequences: 8 };
    // Arrival order 2, 1, 3: request 2 (2 pages) fits, 1 (2 pages) does not -> FCFS stops; 3 waits.
    let d = calls::schedule(&p, pol, &[w(1, 5, 20), w(2, 1, 20), w(3, 9, 1)], &[], cap).unwrap();
    assert_eq!(d.admit, vec![2]);
    assert!(d.preempt.is_empty());
    // A prompt that can never fit is rejected with a reason, not queued forever.
    let d = calls::schedule(&p, pol, &[w(4, 0, 16 * 11)], &[], cap).unwrap();
    assert_eq!(d.reject.len(), 1);
    assert!(!d.reject[0].retry);

    // The fair-share policy preempts lower-priority work for a higher-priority arrival.
    let r2 = Registry::new(SandboxLimits::default()).unwrap();
    r2.load_bytes(weft_plugin_host::defaults::ADMISSION, None, Some(r#"{"policy":"fair-share"}"#)).unwrap();
    let (p2, pol2) = r2.resolve(PluginKind::Admission, None).unwrap();
    let mut hi = w(10, 50, 20);
    hi.priority = 5;
    let running = [Running { id: 77, tenant: "b".into(), priority: 0, context_tokens: 40, pages: 3 }];
    let d = calls::schedule(&p2, pol2, &[hi], &running, Capacity { free_pages: 0, total_pages: 3, page_size: 16, token_budget: 256, max_sequences: 8 }).unwrap();
    assert_eq!(d.preempt, vec![77]);
    assert_eq!(d.admit, vec![10]);
    // Bad options never activate.
    let e = r2.load_bytes(weft_plugin_host::defaults::ADMISSION, None, Some(r#"{"policy":"lottery"}"#));
    assert!(e.is_err());
}

#[test]
fn custom_example_sampler_loads_and_samples() {
    let r = registry();
    let id = r.load_bytes(&plugin_bytes("weft_example_top_a"), None, None).unwrap();
    assert_eq!(id.name, "top-a");
    let (p, pol) = r.resolve(PluginKind::Sampler, Some("top-a")).unwrap();
    let mut prm = params();
    prm.vocab_size = 50;
    prm.extra = r#"{"top_a": 0.5}"#.into();
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    let logits: Vec<f32> = (0..50).map(|i| -(i as f32)).collect();
    let s = weft_plugin_host::Sequence { request_id: 1, state: plan.state, candidates: candidates(&logits, 64), uniforms: vec![0.99], history: None };
    // p0 ~ 0.63; threshold 0.5 * 0.63^2 ~ 0.2 keeps tokens 0 and 1 (p1 ~ 0.23).
    let d = calls::sample(&p, pol, &[s], &[&prm], 50).unwrap();
    assert_eq!(d, vec![Decision::Token(1)]);
}
