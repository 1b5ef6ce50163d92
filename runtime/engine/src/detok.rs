//! Incremental detokenization that never splits a UTF-8 character, and stop strings matched
//! across token boundaries (text that might begin a stop string is held back until decided).

use weft_model::tokenizer::TextTokenizer;

#[derive(Default)]
pub struct Detokenizer {
    prefix_offset: usize,
    read_offset: usize,
}

impl Detokenizer {
    /// New text produced by the last token(s) of `generated`, or "" while a character is
    /// incomplete.
    pub fn step(&mut self, tok: &TextTokenizer, generated: &[u32]) -> String {
        let prefix = tok.decode(&generated[self.prefix_offset..self.read_offset], true).unwrap_or_default();
        let full = tok.decode(&generated[self.prefix_offset..], true).unwrap_or_default();
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) && full.starts_with(&prefix) {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = generated.len();
            delta
        } else if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            // The tokenizer re-spaced the window: emit the difference conservatively.
            let delta: String = full.chars().skip(prefix.chars().count()).collect();
            self.prefix_offset = self.read_offset;
            self.read_offset = generated.len();
            delta
        } else {
            String::new()
        }
    }
}

/// Holds back output that could be the start of a stop string.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

pub enum StopOutcome {
    /// Text safe to emit now.
    Emit(String),
    /// A stop string matched: emit this text (before it) and finish.
    Stopped(String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: String::new() }
    }

    pub fn push(&mut self, delta: &str) -> StopOutcome {
        self.pending.push_str(delta);
        if self.stops.is_empty() {
            return StopOutcome::Emit(std::mem::take(&mut self.pending));
        }
        if let Some(pos) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..pos].to_string();
            self.pending.clear();
            return StopOutcome::Stopped(out);
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.pending.ends_with(&s[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopOutcome::Emit(out)
    }

    /// Text still held back when the request ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_across_deltas() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        let mut out = String::new();
        for d in ["Hello E", "N", "D world"] {
            match m.push(d) {
                StopOutcome::Emit(t) => out.push_str(&t),
                StopOutcome::Stopped(t) => {
                    out.push_str(&t);
                    assert_eq!(out, "Hello ");
                    return;
                }
            }
        }
        panic!("stop string not found");
    }

    #[test]
    fn held_back_text_is_released_when_it_cannot_match() {
        let mut m = StopMatcher::new(vec!["xyz".into()]);
        assert!(matches!(m.push("abx"), StopOutcome::Emit(t) if t == "ab"));
        assert!(matches!(m.push("q"), StopOutcome::Emit(t) if t == "xq"));
        assert_eq!(m.flush(), "");
    }
}
