//! One step's logits, left on the backend, and the host copies of the rows the step needed:
//! raw rows for log-probabilities (fetched before the front end edits the buffer) and edited
//! rows for samplers that want more candidates than the backend extracted. On a GPU backend a
//! step whose samplers are content with their top-K downloads no logits row at all.

use std::collections::HashMap;
use weft_backend::front::{FrontOut, FrontRow};
use weft_backend::Backend;

pub struct StepLogits<'a, B: Backend> {
    backend: &'a B,
    buf: B::Buf,
    vocab: usize,
    edited: HashMap<usize, Vec<f32>>,
}

impl<'a, B: Backend> StepLogits<'a, B> {
    /// `buf` is `[rows, vocab]`.
    pub fn new(backend: &'a B, buf: B::Buf, vocab: usize) -> Self {
        StepLogits { backend, buf, vocab, edited: HashMap::new() }
    }

    fn download(&self, ks: &[usize]) -> Result<HashMap<usize, Vec<f32>>, String> {
        if ks.is_empty() {
            return Ok(HashMap::new());
        }
        let idx: Vec<u32> = ks.iter().map(|&k| k as u32).collect();
        let flat = self.backend.download_rows(&self.buf, self.vocab, &idx).map_err(|e| e.to_string())?;
        Ok(ks.iter().copied().zip(flat.chunks(self.vocab).map(<[f32]>::to_vec)).collect())
    }

    /// Rows `ks` as the model produced them. Call before [`Self::front`], which edits them.
    pub fn raw_rows(&self, ks: &[usize]) -> Result<HashMap<usize, Vec<f32>>, String> {
        self.download(ks)
    }

    /// Runs the sampling front end over every row (one [`FrontRow`] per row).
    pub fn front(&mut self, rows: &[FrontRow]) -> Result<Vec<FrontOut>, String> {
        self.backend.sampling_front(&mut self.buf, self.vocab, rows).map_err(|e| e.to_string())
    }

    /// More candidates for some rows (`(row, k)`, `k <= MAX_DEVICE_K`) from the already edited
    /// buffer: the rows are gathered and run through the front end again (no edits, the same
    /// temperature), so a GPU backend still ships only candidates.
    pub fn more(&mut self, wanted: &[(usize, usize)], fronts: &[FrontRow]) -> Result<HashMap<usize, FrontOut>, String> {
        if wanted.is_empty() {
            return Ok(HashMap::new());
        }
        let idx: Vec<u32> = wanted.iter().map(|&(k, _)| k as u32).collect();
        let mut sub = self.backend.gather_rows(&self.buf, self.vocab, &idx).map_err(|e| e.to_string())?;
        let rows: Vec<FrontRow> = wanted.iter().map(|&(k, n)| FrontRow { k: n, temperature: fronts[k].temperature, edits: vec![] }).collect();
        let outs = self.backend.sampling_front(&mut sub, self.vocab, &rows).map_err(|e| e.to_string())?;
        Ok(wanted.iter().map(|&(k, _)| k).zip(outs).collect())
    }

    /// Makes the edited rows `ks` available to [`Self::edited`] (one download for all missing).
    pub fn fetch_edited(&mut self, ks: &[usize]) -> Result<(), String> {
        let mut missing: Vec<usize> = ks.iter().copied().filter(|k| !self.edited.contains_key(k)).collect();
        missing.sort_unstable();
        missing.dedup();
        let got = self.download(&missing)?;
        self.edited.extend(got);
        Ok(())
    }

    /// An edited row fetched by [`Self::fetch_edited`].
    pub fn edited(&self, k: usize) -> &[f32] {
        &self.edited[&k]
    }
}
