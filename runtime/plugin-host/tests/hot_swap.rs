//! Hot swap while other threads are calling: no failed call, no call answered by a mix of
//! versions, requests stay on the version they resolved; rollback; drain; unload rules.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_plugin_host::{calls, Decision, PluginKind, Registry, SandboxLimits, Sequence};

/// Emulates one request: resolves "swap" once, then makes several batch calls on that version.
fn one_request(r: &Registry) -> Result<String, String> {
    let (p, pol) = r.resolve(PluginKind::Sampler, Some("swap")).map_err(|e| e.to_string())?;
    let expect = if p.id.version.starts_with('1') { 10 } else { 20 };
    let mut prm = params();
    prm.vocab_size = 32;
    let (plan, _) = calls::configure(&p, pol, &prm).map_err(|e| e.to_string())?;
    let logits: Vec<f32> = (0..32)
        .map(|i| {
            if i == 10 {
                5.0
            } else if i == 20 {
                4.0
            } else {
                -(i as f32)
            }
        })
        .collect();
    for _ in 0..5 {
        let batch: Vec<Sequence> = (0..8).map(|i| Sequence { request_id: i, state: plan.state.clone(), candidates: candidates(&logits, 2), uniforms: vec![0.5], history: None }).collect();
        let prms: Vec<_> = (0..8).map(|_| &prm).collect();
        let out = calls::sample(&p, pol, &batch, &prms, 32).map_err(|e| e.to_string())?;
        if out.iter().any(|d| *d != Decision::Token(expect)) {
            let st = &p.stats;
            let (f, d, t) = (st.fallbacks.load(Ordering::Relaxed), st.deadlines.load(Ordering::Relaxed), st.traps.load(Ordering::Relaxed));
            return Err(format!("version {} answered {out:?} (so far: {f} fallbacks, {d} deadlines, {t} traps)", p.id.version));
        }
    }
    Ok(p.id.version.clone())
}

#[test]
fn swap_under_concurrent_load_and_rollback() {
    // The per-call deadline is wall-clock: on a loaded CI machine (4 callers here, other tests
    // and rustc beside) a call can be descheduled past the default 50 ms, fault, and be answered
    // by the native fallback, which is not the plugin's answer. Deadlines have their own tests
    // (faults.rs); this one is about versions, so it gives calls a budget scheduling can't reach.
    let limits = SandboxLimits { deadline: Duration::from_secs(30), ..SandboxLimits::default() };
    let r = Arc::new(Registry::with_defaults(limits).unwrap());
    let v1 = plugin_bytes("weft_test_swap_v1");
    let v2 = plugin_bytes("weft_test_swap_v2");
    r.load_bytes(&v1, None, None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (n1, n2, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (r, stop, n1, n2, failures) = (r.clone(), stop.clone(), n1.clone(), n2.clone(), failures.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match one_request(&r) {
                        Ok(v) if v.starts_with('1') => n1.fetch_add(1, Ordering::Relaxed),
                        Ok(_) => n2.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("{e}");
                            failures.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    let wait_for = |c: &AtomicUsize, n: usize| {
        let t0 = Instant::now();
        let start = c.load(Ordering::Relaxed);
        while c.load(Ordering::Relaxed) < start + n && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_for(&n1, 50);
    let id2 = r.load_bytes(&v2, None, None).unwrap(); // activates 2.0.0
    assert_eq!(id2.version, "2.0.0");
    wait_for(&n2, 50);
    assert_eq!(r.rollback(PluginKind::Sampler, "swap").unwrap(), "1.0.0");
    let after_rollback = n1.load(Ordering::Relaxed);
    wait_for(&n1, 50);
    r.activate(PluginKind::Sampler, "swap", "2.0.0").unwrap();
    wait_for(&n2, 50);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(failures.load(Ordering::Relaxed), 0, "no failed or mixed-version call");
    assert!(n1.load(Ordering::Relaxed) >= after_rollback + 50);
    assert!(n2.load(Ordering::Relaxed) >= 100);
}

#[test]
fn running_requests_drain_on_their_version() {
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    r.load_bytes(&plugin_bytes("weft_test_swap_v1"), None, None).unwrap();
    let (held, _) = r.resolve(PluginKind::Sampler, Some("swap")).unwrap();
    r.load_bytes(&plugin_bytes("weft_test_swap_v2"), None, None).unwrap();
    let (new, _) = r.resolve(PluginKind::Sampler, Some("swap")).unwrap();
    assert_eq!(held.id.version, "1.0.0");
    assert_eq!(new.id.version, "2.0.0");
    let swap = r.list().into_iter().find(|p| p.name == "swap").unwrap();
    let v1 = swap.versions.iter().find(|v| v.version == "1.0.0").unwrap();
    assert!(!v1.active && v1.in_use == 1, "{v1:?}");
    // Unloading the old version while a request holds it: the request keeps working.
    r.unload(PluginKind::Sampler, "swap", "1.0.0").unwrap();
    assert_eq!(held.describe().unwrap().version, "1.0.0");
    drop(held);
    assert!(r.list().into_iter().find(|p| p.name == "swap").unwrap().versions.iter().all(|v| v.version != "1.0.0"));
    // The active version cannot be unloaded while another exists... here it is the last one,
    // and not the default sampler, so it can.
    drop(new);
    r.unload(PluginKind::Sampler, "swap", "2.0.0").unwrap();
    assert!(r.resolve(PluginKind::Sampler, Some("swap")).is_err());
    // The default sampler cannot be unloaded out from under the server.
    assert!(r.unload(PluginKind::Sampler, "default", "0.1.0").is_err());
    assert!(r.rollback(PluginKind::Sampler, "default").is_err(), "nothing to roll back to");
}

#[test]
fn same_version_different_bytes_is_refused() {
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    r.load_bytes(&plugin_bytes("weft_test_swap_v1"), None, None).unwrap();
    // Reloading identical bytes is idempotent.
    r.load_bytes(&plugin_bytes("weft_test_swap_v1"), None, None).unwrap();
    // The default sampler also calls itself 0.1.0 under another name, so no conflict there.
    assert_eq!(r.list().iter().filter(|p| p.name == "swap").count(), 1);
}

#[test]
fn watched_directory_loads_new_files_and_refuses_bad_ones() {
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    let dir = std::env::temp_dir().join(format!("weft-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = Default::default();
    assert!(r.scan_dir(&dir, &mut seen).is_empty());
    std::fs::write(dir.join("swap.wasm"), plugin_bytes("weft_test_swap_v1")).unwrap();
    std::fs::write(dir.join("broken.wasm"), b"nope").unwrap();
    let failed = r.scan_dir(&dir, &mut seen);
    assert_eq!(failed.len(), 1);
    assert!(failed[0].0.ends_with("broken.wasm"));
    assert_eq!(r.resolve(PluginKind::Sampler, Some("swap")).unwrap().0.id.version, "1.0.0");
    // Unchanged files are not reloaded; a changed file is.
    assert!(r.scan_dir(&dir, &mut seen).is_empty());
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(dir.join("swap.wasm"), plugin_bytes("weft_test_swap_v2")).unwrap();
    r.scan_dir(&dir, &mut seen);
    assert_eq!(r.resolve(PluginKind::Sampler, Some("swap")).unwrap().0.id.version, "2.0.0");
    std::fs::remove_dir_all(&dir).unwrap();
}
