//! Helpers shared by the engine tests: draining a request's events and waiting for the step
//! loop to go idle.

#![allow(dead_code)]

use std::time::{Duration, Instant};
use weft_engine::{Engine, Event};

pub fn collect(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<u32>, String, Option<Event>) {
    let (mut ids, mut text) = (vec![], String::new());
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            fin @ (Event::Finished { .. } | Event::Error { .. }) => {
                if let Event::Finished { text_tail, .. } = &fin {
                    text.push_str(text_tail);
                }
                return (ids, text, Some(fin));
            }
        }
    }
    (ids, text, None)
}

pub fn wait_idle(engine: &Engine) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let s = engine.stats();
        if s.running == 0 && s.waiting == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("engine did not go idle: {:?}", engine.stats());
}
