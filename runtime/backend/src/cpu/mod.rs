//! The CPU reference backend: f32 compute on host memory, multi-threaded with rayon.
//! Correct first; every GPU kernel is checked against it.

mod gemm;
mod gqa;
mod mla;
mod moe;

pub use moe::{route, route_all};

use crate::{front, AttnRow, Backend, BackendError, ExpertWeights, HostMatrix, KvLayout, Result, RopeParams, RouterConfig};
use rayon::prelude::*;

/// A dense f32 weight matrix `[rows, cols]`, row-major.
pub struct CpuMatrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// The latent KV pool in host memory: `[layer][page * page_size + offset][latent + rope]`.
pub struct CpuKvPool {
    pub layout: KvLayout,
    pub data: Vec<f32>,
}

impl CpuKvPool {
    fn layer_stride(&self) -> usize {
        self.layout.num_pages * self.layout.page_size * self.layout.width()
    }
    /// The stored vector of `slot` in `layer`.
    pub fn entry(&self, layer: usize, slot: usize) -> &[f32] {
        let w = self.layout.width();
        let base = layer * self.layer_stride() + slot * w;
        &self.data[base..base + w]
    }
}

#[derive(Default, Clone, Copy)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

fn shape_err(op: &'static str, reason: String) -> BackendError {
    BackendError::Shape { op, reason }
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Matrix = CpuMatrix;
    type KvPool = CpuKvPool;

    fn name(&self) -> &'static str {
        "cpu"
    }

    /// MemAvailable and MemTotal from /proc/meminfo (Linux).
    fn memory_info(&self) -> Option<(usize, usize)> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let field = |k: &str| -> Option<usize> { text.lines().find(|l| l.starts_with(k))?.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kb| kb * 1024) };
        Some((field("MemAvailable:")?, field("MemTotal:")?))
    }

    fn upload_matrix(&self, m: &HostMatrix<'_>) -> Result<CpuMatrix> {
        m.validate()?;
        let mut data = vec![0f32; m.rows * m.cols];
        const CHUNK: usize = 64;
        let cols = m.cols.max(1);
        data.par_chunks_mut(CHUNK * cols).enumerate().for_each(|(i, out)| {
            let r0 = i * CHUNK;
            let r1 = r0 + out.len() / cols;
            m.to_f32_rows(r0, r1, out);
        });
        Ok(CpuMatrix { rows: m.rows, cols: m.cols, data })
    }

    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn download(&self, buf: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(buf.clone())
    }

    fn alloc_kv_pool(&self, layout: KvLayout) -> Result<CpuKvPool> {
        let len = layout.layers * layout.num_pages * layout.page_size * layout.width();
        Ok(CpuKvPool { layout, data: vec![0f32; len] })
    }

    fn copy_kv_pages(&self, pool: &mut CpuKvPool, pairs: &[(u32, u32)]) -> Result<()> {
        let l = pool.layout;
        let page = l.page_size * l.width();
        let stride = pool.layer_stride();
        for &(src, dst) in pairs {
            if src as usize >= l.num_pages || dst as usize >= l.num_pages {
                return Err(shape_err("copy_kv_pages", format!("page {src}->{dst} outside pool of {}", l.num_pages)));
            }
            for layer in 0..l.layers {
                let s = layer * stride + src as usize * page;
                let d = layer * stride + dst as usize * page;
                pool.data.copy_within(s..s + page, d);
            }
        }
        Ok(())
    }

    fn embed(&self, table: &CpuMatrix, ids: &[u32]) -> Result<Vec<f32>> {
        let d = table.cols;
        let mut out = vec![0f32; ids.len() * d];
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= table.rows {
                return Err(shape_err("embed", format!("token id {id} outside vocabulary of {}", table.rows)));
            }
            out[i * d..(i + 1) * d].copy_from_slice(&table.data[id * d..(id + 1) * d]);
        }
        Ok(out)
    }

    fn gather_rows(&self, x: &Vec<f32>, dim: usize, rows: &[u32]) -> Result<Vec<f32>> {
        check_rows("gather_rows", x.len(), dim)?;
        let n = x.len() / dim;
        let mut out = Vec::with_capacity(rows.len() * dim);
        for &r in rows {
            let r = r as usize;
            if r >= n {
                return Err(shape_err("gather_rows", format!("row {r} of {n}")));
            }
            out.extend_from_slice(&x[r * dim..(r + 1) * dim]);
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &Vec<f32>, dim: usize, weight: &Vec<f32>, eps: f32) -> Result<Vec<f32>> {
        check_rows("rms_norm", x.len(), dim)?;
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(dim).zip(x.par_chunks(dim)).for_each(|(o, r)| rms_norm_row(r, weight, eps, o));
        Ok(out)
    }

    fn add_rms_norm(&self, residual: &mut Vec<f32>, delta: &Vec<f32>, dim: usize, weight: &Vec<f32>, eps: f32) -> Result<Vec<f32>> {
        if residual.len() != delta.len() {
            return Err(shape_err("add_rms_norm", format!("{} vs {} elements", residual.len(), delta.len())));
        }
        self.add_inplace(residual, delta)?;
        self.rms_norm(residual, dim, weight, eps)
    }

    fn linear(&self, x: &Vec<f32>, w: &CpuMatrix) -> Result<Vec<f32>> {
        check_rows("linear", x.len(), w.cols)?;
        Ok(gemm::linear(x, &w.data, w.rows, w.cols))
    }

    fn head_linear(&self, x: &Vec<f32>, heads: usize, w: &CpuMatrix) -> Result<Vec<f32>> {
        if heads == 0 || w.rows % heads != 0 {
            return Err(shape_err("head_linear", format!("{} rows do not split into {heads} heads", w.rows)));
        }
        check_rows("head_linear", x.len(), heads * w.cols)?;
        Ok(gemm::head_linear(x, heads, &w.data, w.rows / heads, w.cols))
    }

    fn add_inplace(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        if x.len() != y.len() {
            return Err(shape_err("add_inplace", format!("{} vs {} elements", x.len(), y.len())));
        }
        x.par_iter_mut().zip(y.par_iter()).for_each(|(a, b)| *a += *b);
        Ok(())
    }

    fn silu_mul(&self, gate_up: &Vec<f32>, inter: usize) -> Result<Vec<f32>> {
        check_rows("silu_mul", gate_up.len(), 2 * inter)?;
        let m = gate_up.len() / (2 * inter);
        let mut out = vec![0f32; m * inter];
        out.par_chunks_mut(inter).zip(gate_up.par_chunks(2 * inter)).for_each(|(o, gu)| {
            let (g, u) = gu.split_at(inter);
            for i in 0..inter {
                o[i] = silu(g[i]) * u[i];
            }
        });
        Ok(out)
    }

    fn mla_split_rope_q(&self, q: &Vec<f32>, heads: usize, nope: usize, rope_dim: usize, positions: &[u32], rope: &RopeParams) -> Result<(Vec<f32>, Vec<f32>)> {
        check_rows("mla_split_rope_q", q.len(), heads * (nope + rope_dim))?;
        if q.len() / (heads * (nope + rope_dim)) != positions.len() {
            return Err(shape_err("mla_split_rope_q", format!("{} positions for {} rows", positions.len(), q.len() / (heads * (nope + rope_dim)))));
        }
        Ok(mla::split_rope_q(q, heads, nope, rope_dim, positions, rope))
    }

    fn mla_store_kv(&self, pool: &mut CpuKvPool, layer: usize, kv_a: &Vec<f32>, norm_w: &Vec<f32>, eps: f32, positions: &[u32], slots: &[u32], rope: &RopeParams) -> Result<()> {
        let l = pool.layout;
        check_rows("mla_store_kv", kv_a.len(), l.width())?;
        let m = kv_a.len() / l.width();
        if positions.len() != m || slots.len() != m || layer >= l.layers {
            return Err(shape_err("mla_store_kv", format!("{m} rows, {} positions, {} slots, layer {layer}", positions.len(), slots.len())));
        }
        if let Some(bad) = slots.iter().find(|&&s| s as usize >= l.num_pages * l.page_size) {
            return Err(shape_err("mla_store_kv", format!("slot {bad} outside pool")));
        }
        let stride = pool.layer_stride();
        mla::store_kv(&mut pool.data[layer * stride..(layer + 1) * stride], l, kv_a, norm_w, eps, positions, slots, rope);
        Ok(())
    }

    fn mla_attention(&self, pool: &CpuKvPool, layer: usize, q_lat: &Vec<f32>, q_pe: &Vec<f32>, heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Result<Vec<f32>> {
        let l = pool.layout;
        if q_lat.len() != rows.len() * heads * l.latent_dim || q_pe.len() != rows.len() * heads * l.rope_dim || layer >= l.layers {
            return Err(shape_err("mla_attention", format!("{} rows x {heads} heads do not match q_lat {} / q_pe {}", rows.len(), q_lat.len(), q_pe.len())));
        }
        for r in rows {
            if r.ctx_len == 0 || r.ctx_len.div_ceil(l.page_size) > r.block_table.len() {
                return Err(shape_err("mla_attention", format!("context {} not covered by {} pages", r.ctx_len, r.block_table.len())));
            }
            if let Some(p) = r.block_table.iter().find(|&&p| p as usize >= l.num_pages) {
                return Err(shape_err("mla_attention", format!("page {p} outside pool")));
            }
        }
        let stride = pool.layer_stride();
        Ok(mla::attention(&pool.data[layer * stride..(layer + 1) * stride], l, q_lat, q_pe, heads, rows, scale))
    }

    fn kv_store(&self, pool: &mut CpuKvPool, layer: usize, k: &Vec<f32>, v: &Vec<f32>, slots: &[u32]) -> Result<()> {
        crate::check_kv_store(pool.layout, layer, k.len(), v.len(), slots)?;
        let stride = pool.layer_stride();
        gqa::store(&mut pool.data[layer * stride..(layer + 1) * stride], pool.layout, k, v, slots);
        Ok(())
    }

    fn gqa_attention(&self, pool: &CpuKvPool, layer: usize, q: &Vec<f32>, heads: usize, kv_heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Result<Vec<f32>> {
        crate::check_gqa(pool.layout, layer, q.len(), heads, kv_heads, rows)?;
        let stride = pool.layer_stride();
        Ok(gqa::attention(&pool.data[layer * stride..(layer + 1) * stride], pool.layout, q, heads, kv_heads, rows, scale))
    }

    fn concat(&self, parts: &[&Vec<f32>]) -> Result<Vec<f32>> {
        Ok(parts.iter().flat_map(|p| p.iter().copied()).collect())
    }

    fn moe(&self, x: &Vec<f32>, gate_logits: &Vec<f32>, bias: &Vec<f32>, cfg: &RouterConfig, experts: &[ExpertWeights<CpuMatrix>], shared: Option<&Vec<f32>>) -> Result<Vec<f32>> {
        if experts.len() != cfg.n_experts || bias.len() != cfg.n_experts {
            return Err(shape_err("moe", format!("{} experts, {} biases, config says {}", experts.len(), bias.len(), cfg.n_experts)));
        }
        check_rows("moe", gate_logits.len(), cfg.n_experts)?;
        crate::check_moe_shared(shared.map(Vec::len), x.len())?;
        let mut out = moe::experts(self, x, gate_logits, bias, cfg, experts, 0)?;
        if let Some(s) = shared {
            self.add_inplace(&mut out, s)?;
        }
        Ok(out)
    }

    fn moe_local(&self, x: &Vec<f32>, gate_logits: &Vec<f32>, bias: &Vec<f32>, cfg: &RouterConfig, experts: &[ExpertWeights<CpuMatrix>], first: usize, shared: Option<&Vec<f32>>) -> Result<Vec<f32>> {
        crate::check_local_experts(first, experts.len(), cfg, bias.len())?;
        check_rows("moe", gate_logits.len(), cfg.n_experts)?;
        crate::check_moe_shared(shared.map(Vec::len), x.len())?;
        let mut out = moe::experts(self, x, gate_logits, bias, cfg, experts, first)?;
        if let Some(s) = shared {
            self.add_inplace(&mut out, s)?;
        }
        Ok(out)
    }

    fn sampling_front(&self, logits: &mut Vec<f32>, vocab: usize, rows: &[front::FrontRow]) -> Result<Vec<front::FrontOut>> {
        front::check("sampling_front", logits.len(), vocab, rows)?;
        Ok(front::run_on_host(logits, vocab, rows))
    }
}

fn check_rows(op: &'static str, len: usize, width: usize) -> Result<()> {
    if width == 0 || len % width != 0 {
        return Err(shape_err(op, format!("{len} elements are not rows of {width}")));
    }
    Ok(())
}

#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = g * (v * r);
    }
}
