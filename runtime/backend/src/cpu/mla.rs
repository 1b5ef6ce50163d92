//! Multi-head Latent Attention on the CPU: RoPE (interleaved or not, YaRN-scaled), storing
//! normalized latents and roped keys into the paged pool, and absorbed attention over it.

use super::{gemm::dot, rms_norm_row};
use crate::{AttnRow, KvLayout, RopeParams};
use rayon::prelude::*;

/// Applies rotary embedding to `x` (`rope_dim` wide) at `pos`, writing the de-interleaved
/// result (first half / second half) into `out`, as the reference implementation does.
pub(crate) fn rope_into(x: &[f32], pos: u32, rope: &RopeParams, out: &mut [f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (x1, x2) = if rope.interleaved { (x[2 * i], x[2 * i + 1]) } else { (x[i], x[i + half]) };
        // Same arithmetic as the reference: f32 angle, f32 cos/sin, then the attention factor.
        let theta = pos as f32 * rope.inv_freq[i];
        let c = theta.cos() * rope.attention_factor;
        let s = theta.sin() * rope.attention_factor;
        out[i] = x1 * c - x2 * s;
        out[i + half] = x2 * c + x1 * s;
    }
}

pub(crate) fn split_rope_q(q: &[f32], heads: usize, nope: usize, rd: usize, positions: &[u32], rope: &RopeParams) -> (Vec<f32>, Vec<f32>) {
    let m = positions.len();
    let mut q_nope = vec![0f32; m * heads * nope];
    let mut q_pe = vec![0f32; m * heads * rd];
    if nope == 0 {
        // Rope over whole heads (ordinary attention: DFlash draft layers).
        q_pe.par_chunks_mut(rd.max(1)).enumerate().for_each(|(mh, qp)| rope_into(&q[mh * rd..(mh + 1) * rd], positions[mh / heads], rope, qp));
        return (q_nope, q_pe);
    }
    q_nope.par_chunks_mut(nope).zip(q_pe.par_chunks_mut(rd)).enumerate().for_each(|(mh, (qn, qp))| {
        let src = &q[mh * (nope + rd)..(mh + 1) * (nope + rd)];
        qn.copy_from_slice(&src[..nope]);
        rope_into(&src[nope..], positions[mh / heads], rope, qp);
    });
    (q_nope, q_pe)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn store_kv(layer: &mut [f32], l: KvLayout, kv_a: &[f32], norm_w: &[f32], eps: f32, positions: &[u32], slots: &[u32], rope: &RopeParams) {
    let w = l.width();
    for (i, row) in kv_a.chunks(w).enumerate() {
        let s = slots[i] as usize;
        let dst = &mut layer[s * w..(s + 1) * w];
        let (lat, pe) = dst.split_at_mut(l.latent_dim);
        rms_norm_row(&row[..l.latent_dim], norm_w, eps, lat);
        rope_into(&row[l.latent_dim..], positions[i], rope, pe);
        if l.dtype != crate::KvDtype::F32 {
            dst.iter_mut().for_each(|v| *v = l.dtype.round(*v));
        }
    }
}

pub(crate) fn attention(layer: &[f32], l: KvLayout, q_lat: &[f32], q_pe: &[f32], heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Vec<f32> {
    let (ld, rd, w, ps) = (l.latent_dim, l.rope_dim, l.width(), l.page_size);
    let mut out = vec![0f32; rows.len() * heads * ld];
    out.par_chunks_mut(ld).enumerate().for_each(|(mh, o)| {
        let row = &rows[mh / heads];
        let ql = &q_lat[mh * ld..(mh + 1) * ld];
        let qp = &q_pe[mh * rd..(mh + 1) * rd];
        let entry = |t: usize| {
            let s = row.block_table[t / ps] as usize * ps + t % ps;
            &layer[s * w..(s + 1) * w]
        };
        let mut scores = Vec::with_capacity(row.ctx_len);
        let mut max = f32::NEG_INFINITY;
        for t in 0..row.ctx_len {
            let e = entry(t);
            let sc = (dot(ql, &e[..ld]) + dot(qp, &e[ld..])) * scale;
            max = max.max(sc);
            scores.push(sc);
        }
        let mut sum = 0f32;
        for sc in scores.iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        let inv = 1.0 / sum;
        for (t, p) in scores.iter().enumerate() {
            let e = &entry(t)[..ld];
            let p = p * inv;
            for (a, &v) in o.iter_mut().zip(e) {
                *a += p * v;
            }
        }
    });
    out
}
