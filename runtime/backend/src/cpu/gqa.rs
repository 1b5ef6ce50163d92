//! Grouped-query attention on the CPU, for draft models with ordinary attention (DFlash):
//! K and V rows stored side by side in a paged pool, and softmax attention of every query
//! head over its key/value group's entries.

use super::gemm::dot;
use crate::{AttnRow, KvLayout};
use rayon::prelude::*;

/// Writes `k` and `v` rows (`kw` wide each) at `slots`: entry = K then V.
pub(crate) fn store(layer: &mut [f32], l: KvLayout, k: &[f32], v: &[f32], slots: &[u32]) {
    let (w, kw) = (l.width(), l.width() / 2);
    for (i, &s) in slots.iter().enumerate() {
        let dst = &mut layer[s as usize * w..(s as usize + 1) * w];
        dst[..kw].copy_from_slice(&k[i * kw..(i + 1) * kw]);
        dst[kw..].copy_from_slice(&v[i * kw..(i + 1) * kw]);
    }
}

/// `q [m, heads, d]` over the entries `0..ctx_len` of each row's pages; head h reads group
/// `h / (heads / kv_heads)`.
pub(crate) fn attention(layer: &[f32], l: KvLayout, q: &[f32], heads: usize, kv_heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Vec<f32> {
    let (w, ps) = (l.width(), l.page_size);
    let d = w / 2 / kv_heads;
    let group = heads / kv_heads;
    let mut out = vec![0f32; rows.len() * heads * d];
    out.par_chunks_mut(d).enumerate().for_each(|(mh, o)| {
        let row = &rows[mh / heads];
        let g = (mh % heads) / group;
        let qh = &q[mh * d..(mh + 1) * d];
        let entry = |t: usize| {
            let s = row.block_table[t / ps] as usize * ps + t % ps;
            &layer[s * w..(s + 1) * w]
        };
        let mut scores: Vec<f32> = (0..row.ctx_len).map(|t| dot(qh, &entry(t)[g * d..(g + 1) * d]) * scale).collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for sc in scores.iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        let inv = 1.0 / sum;
        for (t, p) in scores.iter().enumerate() {
            let v = &entry(t)[w / 2 + g * d..w / 2 + (g + 1) * d];
            let p = p * inv;
            for (a, &x) in o.iter_mut().zip(v) {
                *a += p * x;
            }
        }
    });
    out
}
