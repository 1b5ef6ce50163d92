//! `Backend` for `CudaBackend`: argument checks (the same as the CPU reference's), uploads of
//! the small host-side arrays each op takes (ids, positions, slots, block tables), and the
//! kernel launches (the cuBLAS GEMMs past the weight-streaming paths: `cublas_gemm.rs`).

use crate::cublas_gemm::Act;
use crate::graphs::StepArray;
use crate::mla::MlaArgs;
use crate::moe::{Gate, NormAfter};
use crate::{dev, CudaBackend, CudaKvPool, CudaMatrix, Fp8Weight};
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use weft_backend::{AttnRow, Backend, BackendError, ExpertWeights, HostMatrix, KvLayout, Result, RopeParams, RouterConfig, StepBatch, WeightDtype};

const BLOCK: u32 = 256;

pub(crate) fn shape(op: &'static str, reason: String) -> BackendError {
    BackendError::Shape { op, reason }
}

pub(crate) fn check_rows(op: &'static str, len: usize, width: usize) -> Result<usize> {
    if width == 0 || len % width != 0 {
        return Err(shape(op, format!("{len} elements are not rows of {width}")));
    }
    Ok(len / width)
}

/// `grid` blocks of `BLOCK` threads with `shared` bytes of dynamic shared memory.
pub(crate) fn cfg(grid: usize, shared: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.max(1) as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: shared }
}

/// The launch of `rms_norm` / `add_rms_norm` over `rows` rows of `dim`: blocks as wide as two
/// float4s a thread need (`RMS_V` in kernels/weft.cu), in whole 64-lane groups (a wavefront on
/// AMD), 64 to 1024 threads; BLOCK where the row is not a multiple of 4 or too wide for that.
pub(crate) fn norm_cfg(rows: usize, dim: usize) -> LaunchConfig {
    let threads = if dim % 4 == 0 && dim <= 8 * 1024 { dim.div_ceil(8).next_multiple_of(64).clamp(64, 1024) as u32 } else { BLOCK };
    LaunchConfig { grid_dim: (rows.max(1) as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

pub(crate) fn flat(n: usize) -> LaunchConfig {
    cfg(n.div_ceil(BLOCK as usize).clamp(1, 65535), 0)
}

/// A checkpoint matrix onto the device: bf16 stays bf16; fp8 stays fp8 with its block scales
/// (except embedding tables, which the gather kernel reads as bf16); f16/f32 become bf16.
/// Router gates (and every weight in `all_f32` mode) also get an f32 copy.
pub(crate) fn upload(be: &CudaBackend, m: &HostMatrix<'_>) -> Result<CudaMatrix> {
    m.validate()?;
    let wants_f32 = (be.all_f32 || crate::is_router(&m.name)) && m.rows * m.cols > 0;
    if let (WeightDtype::Fp8E4M3, Some(sc), false) = (m.dtype, &m.scales, m.name.contains("embed_tokens") || wants_f32) {
        let fp8 = Fp8Weight { bytes: be.stream.clone_htod(&m.bytes[..]).map_err(dev)?, scales: be.stream.clone_htod(&sc.scales).map_err(dev)?, block_rows: sc.block_rows, block_cols: sc.block_cols };
        return Ok(CudaMatrix { rows: m.rows, cols: m.cols, data: be.stream.alloc_zeros::<u16>(1).map_err(dev)?, f32_data: None, fp8: Some(fp8) });
    }
    // Dequantized once, for the f32 copy and/or the bf16 conversion.
    let f32_values = (wants_f32 || m.dtype != WeightDtype::Bf16).then(|| {
        let mut f = vec![0f32; m.rows * m.cols];
        m.to_f32_rows(0, m.rows, &mut f);
        f
    });
    let bits: Vec<u16> = match (&f32_values, m.dtype) {
        // Already bf16: the bytes are the device format.
        (_, WeightDtype::Bf16) => m.bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect(),
        (Some(f), _) => f.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect(),
        (None, _) => unreachable!("non-bf16 weights are dequantized above"),
    };
    let data = if bits.is_empty() { be.stream.alloc_zeros::<u16>(1).map_err(dev)? } else { be.stream.clone_htod(&bits).map_err(dev)? };
    let f32_data = match (wants_f32, &f32_values) {
        (true, Some(f)) => Some(be.stream.clone_htod(f).map_err(dev)?),
        _ => None,
    };
    Ok(CudaMatrix { rows: m.rows, cols: m.cols, data, f32_data, fp8: None })
}

impl CudaBackend {
    /// Device memory for an op's output or scratch (at least one element, uninitialised): from
    /// the stream's pool, or while a step graph with programmatic edges is recorded from the
    /// recording arena (`pdl`), so that the graph holds no memory nodes.
    pub(crate) fn alloc<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        #[cfg(feature = "cuda")]
        if let Some(arena) = self.arena.as_ref().filter(|_| self.capturing.load(std::sync::atomic::Ordering::Relaxed)) {
            return arena.alloc::<T>(n);
        }
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(dev)
    }

    /// An output buffer (NaN-filled when poisoning).
    pub(crate) fn out(&self, n: usize) -> Result<CudaSlice<f32>> {
        let mut b = self.alloc::<f32>(n)?;
        if self.poison {
            let (v, n64) = (f32::NAN, n as i64);
            let mut l = self.stream.launch_builder(self.func("fill_f32"));
            l.arg(&mut b).arg(&v).arg(&n64);
            unsafe { l.launch(flat(n)) }.map_err(dev)?;
        }
        Ok(b)
    }

    pub(crate) fn up_u32(&self, v: &[u32]) -> Result<CudaSlice<u32>> {
        self.no_capture("an upload")?;
        if v.is_empty() {
            return self.stream.alloc_zeros::<u32>(1).map_err(dev);
        }
        self.stream.clone_htod(v).map_err(dev)
    }

    pub(crate) fn up_f32(&self, v: &[f32]) -> Result<CudaSlice<f32>> {
        self.no_capture("an upload")?;
        self.stream.clone_htod(v).map_err(dev)
    }

    /// Whether a plain linear of `w` on `m` rows takes cuBLAS with bf16 activations (neither
    /// weight-streaming path; not f32 weights).
    fn on_cublas(&self, w: &CudaMatrix, m: usize) -> bool {
        w.f32_data.is_none() && !self.gemv_mma_fits(w, m, w.rows) && !self.gemv_fits(w, m)
    }

    pub(crate) fn len(&self, b: &CudaSlice<f32>) -> usize {
        b.len()
    }
}

/// `mla_store_kv`'s arguments: `kv_a` whole rows of the cache's width (returns how many), as
/// many positions and slots, a layer of the pool, every slot inside it.
pub(crate) fn check_store_kv(lay: KvLayout, layer: usize, kv_a: usize, positions: &[u32], slots: &[u32]) -> Result<usize> {
    let m = check_rows("mla_store_kv", kv_a, lay.width())?;
    if positions.len() != m || slots.len() != m || layer >= lay.layers {
        return Err(shape("mla_store_kv", format!("{m} rows, {} positions, {} slots, layer {layer}", positions.len(), slots.len())));
    }
    if let Some(bad) = slots.iter().find(|&&s| s as usize >= lay.num_pages * lay.page_size) {
        return Err(shape("mla_store_kv", format!("slot {bad} outside pool")));
    }
    Ok(m)
}

/// Every row's context covered by its block table, every page inside the pool.
pub(crate) fn check_mla_rows(l: KvLayout, rows: &[AttnRow<'_>]) -> Result<()> {
    if l.latent_dim > 4 * BLOCK as usize {
        return Err(shape("mla_attention", format!("latent dim {} above {}", l.latent_dim, 4 * BLOCK)));
    }
    for r in rows {
        if r.ctx_len == 0 || r.ctx_len.div_ceil(l.page_size) > r.block_table.len() {
            return Err(shape("mla_attention", format!("context {} not covered by {} pages", r.ctx_len, r.block_table.len())));
        }
        if let Some(p) = r.block_table.iter().find(|&&p| p as usize >= l.num_pages) {
            return Err(shape("mla_attention", format!("page {p} outside pool")));
        }
    }
    Ok(())
}

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;
    type Matrix = CudaMatrix;
    type KvPool = CudaKvPool;

    fn name(&self) -> &'static str {
        crate::BACKEND
    }

    fn run_step(&self, pool: &mut CudaKvPool, step: &StepBatch<'_>, out_len: usize, run: &mut dyn FnMut(&mut CudaKvPool) -> Result<CudaSlice<f32>>) -> Result<CudaSlice<f32>> {
        let _precision = self.begin_step_precision(step);
        self.run_step_graph(pool, step, out_len, run)
    }

    fn prompt_run_rows(&self) -> Option<usize> {
        self.one_part_run_rows()
    }

    fn step_recordings(&self) -> weft_backend::StepRecordings {
        let g = self.graph_stats();
        weft_backend::StepRecordings { recorded: g.recorded, replayed: g.replayed, failed: g.failed }
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.ctx.bind_to_thread().ok()?;
        cudarc::driver::result::mem_get_info().ok()
    }

    fn upload_matrix(&self, m: &HostMatrix<'_>) -> Result<CudaMatrix> {
        upload(self, m)
    }

    fn dummy_matrix(&self, spec: &weft_backend::dummy::DummySpec) -> Option<Result<CudaMatrix>> {
        Some(self.make_dummy(spec))
    }

    fn upload(&self, data: &[f32]) -> Result<CudaSlice<f32>> {
        if data.is_empty() {
            return Err(shape("upload", "an empty buffer".into()));
        }
        self.up_f32(data)
    }

    fn download(&self, buf: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.no_capture("a download")?;
        self.stream.clone_dtoh(buf).map_err(dev)
    }

    fn alloc_kv_pool(&self, layout: KvLayout) -> Result<CudaKvPool> {
        if layout.dtype != weft_backend::KvDtype::F32 && (layout.width() % 2 != 0 || layout.rope_dim == 0) {
            return Err(shape("alloc_kv_pool", format!("a {:?} cache is for MLA latents of even width, not {layout:?}", layout.dtype)));
        }
        let n = layout.num_pages * layout.bytes_per_page() / 4;
        Ok(CudaKvPool { layout, data: self.stream.alloc_zeros::<f32>(n.max(1)).map_err(dev)? })
    }

    fn copy_kv_pages(&self, pool: &mut CudaKvPool, pairs: &[(u32, u32)]) -> Result<()> {
        let l = pool.layout;
        let page = pool.page_words();
        let stride = pool.layer_words();
        for &(src, dst) in pairs {
            if src as usize >= l.num_pages || dst as usize >= l.num_pages {
                return Err(shape("copy_kv_pages", format!("page {src}->{dst} outside pool of {}", l.num_pages)));
            }
            for layer in 0..l.layers {
                let s = layer * stride + src as usize * page;
                let d = layer * stride + dst as usize * page;
                let mut tmp = unsafe { self.stream.alloc::<f32>(page) }.map_err(dev)?;
                self.stream.memcpy_dtod(&pool.data.slice(s..s + page), &mut tmp).map_err(dev)?;
                self.stream.memcpy_dtod(&tmp, &mut pool.data.slice_mut(d..d + page)).map_err(dev)?;
            }
        }
        Ok(())
    }

    fn embed(&self, table: &CudaMatrix, ids: &[u32]) -> Result<CudaSlice<f32>> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.rows) {
            return Err(shape("embed", format!("token id {bad} outside vocabulary of {}", table.rows)));
        }
        if table.fp8.is_some() {
            return Err(shape("embed", "an fp8 embedding table (kept bf16 at load)".into()));
        }
        let d = table.cols as u32;
        let idb = self.step_array(StepArray::Ids, ids)?;
        let idb = &*idb;
        let mut out = self.out(ids.len() * table.cols)?;
        let mut l = self.stream.launch_builder(self.func("embed_bf16"));
        l.arg(&table.data).arg(idb).arg(&mut out).arg(&d);
        unsafe { l.launch(cfg(ids.len(), 0)) }.map_err(dev)?;
        Ok(out)
    }

    fn gather_rows(&self, x: &CudaSlice<f32>, dim: usize, rows: &[u32]) -> Result<CudaSlice<f32>> {
        let n = check_rows("gather_rows", self.len(x), dim)?;
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= n) {
            return Err(shape("gather_rows", format!("row {r} of {n}")));
        }
        let rb = self.up_u32(rows)?;
        let d = dim as u32;
        let mut out = self.out(rows.len() * dim)?;
        let mut l = self.stream.launch_builder(self.func("gather_rows"));
        l.arg(x).arg(&rb).arg(&mut out).arg(&d);
        unsafe { l.launch(cfg(rows.len(), 0)) }.map_err(dev)?;
        Ok(out)
    }

    fn rms_norm(&self, x: &CudaSlice<f32>, dim: usize, weight: &CudaSlice<f32>, eps: f32) -> Result<CudaSlice<f32>> {
        let m = check_rows("rms_norm", self.len(x), dim)?;
        let d = dim as u32;
        let mut out = self.out(m * dim)?;
        let mut l = self.stream.launch_builder(self.func("rms_norm"));
        l.arg(x).arg(weight).arg(&mut out).arg(&d).arg(&eps);
        unsafe { l.launch(norm_cfg(m, dim)) }.map_err(dev)?;
        Ok(out)
    }

    fn add_rms_norm(&self, residual: &mut CudaSlice<f32>, delta: &CudaSlice<f32>, dim: usize, weight: &CudaSlice<f32>, eps: f32) -> Result<CudaSlice<f32>> {
        if residual.len() != delta.len() {
            return Err(shape("add_rms_norm", format!("{} vs {} elements", residual.len(), delta.len())));
        }
        let m = check_rows("add_rms_norm", residual.len(), dim)?;
        let d = dim as u32;
        let mut out = self.out(m * dim)?;
        let early = (m == 1 && self.norm_trigger & 1 != 0) as i32;
        let mut l = self.stream.launch_builder(self.func("add_rms_norm"));
        l.arg(residual).arg(delta).arg(weight).arg(&mut out).arg(&d).arg(&eps).arg(&early);
        unsafe { l.launch(norm_cfg(m, dim)) }.map_err(dev)?;
        Ok(out)
    }

    fn linear(&self, x: &CudaSlice<f32>, w: &CudaMatrix) -> Result<CudaSlice<f32>> {
        let m = check_rows("linear", self.len(x), w.cols)?;
        if self.gemv_mma_fits(w, m, w.rows) {
            return self.gemv_mma(w, x, m, 1);
        }
        if self.gemv_fits(w, m) {
            return self.gemv(w, x, m, 1);
        }
        let mut out = self.out(m * w.rows)?;
        self.gemm(w, x, &mut out, w.rows, m, w.cols, 1, w.cols, w.rows)?;
        Ok(out)
    }

    fn linear_pair(&self, x: &CudaSlice<f32>, a: &CudaMatrix, b: &CudaMatrix) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        let m = check_rows("linear", self.len(x), a.cols)?;
        if self.gemv_pair_fits(a, b, m) {
            return self.gemv_pair(a, b, x, m);
        }
        // Both on cuBLAS with split activations: x split into its parts once for the two.
        if self.gemm_split && a.cols == b.cols && self.on_cublas(a, m) && self.on_cublas(b, m) {
            let parts = self.to_bf16_parts(x, m * a.cols, !self.lo_ranges(m).is_empty())?;
            if self.halves {
                let (pa, pb) = (self.product(a, Act::Parts(&parts), m)?, self.product(b, Act::Parts(&parts), m)?);
                return self.whole_pair(pa, pb, m, a.rows, b.rows);
            }
            let (mut ya, mut yb) = (self.out(m * a.rows)?, self.out(m * b.rows)?);
            self.gemm_from(a, Act::Parts(&parts), &mut ya, [a.rows, m, a.cols, 1, a.cols, a.rows], false)?;
            self.gemm_from(b, Act::Parts(&parts), &mut yb, [b.rows, m, b.cols, 1, b.cols, b.rows], false)?;
            return Ok((ya, yb));
        }
        Ok((self.linear(x, a)?, self.linear(x, b)?))
    }

    fn linear_add_rms_norm(&self, x: &CudaSlice<f32>, w: &CudaMatrix, residual: &mut CudaSlice<f32>, dim: usize, weight: &CudaSlice<f32>, eps: f32) -> Result<CudaSlice<f32>> {
        let m = check_rows("linear", self.len(x), w.cols)?;
        if self.halves && w.rows == dim && residual.len() == m * dim && self.on_cublas(w, m) {
            // The norm adds the product's halves (`halves.rs`).
            return match self.product(w, Act::F32(x), m)? {
                crate::halves::Product::Halves(st) => {
                    let mut out = self.out(m * dim)?;
                    let (half, d) = ((m * dim) as i64, dim as u32);
                    let mut l = self.stream.launch_builder(self.func("add_rms_norm_halves"));
                    l.arg(&mut *residual).arg(&st).arg(&half).arg(weight).arg(&mut out).arg(&d).arg(&eps);
                    unsafe { l.launch(norm_cfg(m, dim)) }.map_err(dev)?;
                    Ok(out)
                }
                crate::halves::Product::Whole(delta) => self.add_rms_norm(residual, &delta, dim, weight, eps),
            };
        }
        if let Some(out) = self.gemv_add_rms_norm(x, w, residual, (dim, weight, eps), m)? {
            return Ok(out);
        }
        let delta = self.linear(x, w)?;
        self.add_rms_norm(residual, &delta, dim, weight, eps)
    }

    fn head_linear(&self, x: &CudaSlice<f32>, heads: usize, w: &CudaMatrix) -> Result<CudaSlice<f32>> {
        if heads == 0 || w.rows % heads != 0 {
            return Err(shape("head_linear", format!("{} rows do not split into {heads} heads", w.rows)));
        }
        let m = check_rows("head_linear", self.len(x), heads * w.cols)?;
        let n = w.rows / heads;
        if self.gemv_mma_heads_fits(w, m, n) {
            return self.gemv_mma(w, x, m, heads);
        }
        if self.gemv_fits(w, m) {
            return self.gemv(w, x, m, heads);
        }
        let mut out = self.out(m * heads * n)?;
        self.gemm(w, x, &mut out, n, m, w.cols, heads, heads * w.cols, heads * n)?;
        Ok(out)
    }

    fn add_inplace(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
        if x.len() != y.len() {
            return Err(shape("add_inplace", format!("{} vs {} elements", x.len(), y.len())));
        }
        let n = x.len() as i64;
        let mut l = self.stream.launch_builder(self.func("add_inplace"));
        l.arg(x).arg(y).arg(&n);
        unsafe { l.launch(flat(n as usize)) }.map_err(dev)?;
        Ok(())
    }

    fn silu_mul(&self, gate_up: &CudaSlice<f32>, inter: usize) -> Result<CudaSlice<f32>> {
        let m = check_rows("silu_mul", gate_up.len(), 2 * inter)?;
        let i = inter as u32;
        let mut out = self.out(m * inter)?;
        let mut l = self.stream.launch_builder(self.func("silu_mul"));
        l.arg(gate_up).arg(&mut out).arg(&i);
        unsafe { l.launch(cfg(m, 0)) }.map_err(dev)?;
        Ok(out)
    }

    fn gated_up(&self, x: &CudaSlice<f32>, gate_up: &CudaMatrix, inter: usize) -> Result<CudaSlice<f32>> {
        let m = check_rows("gated_up", self.len(x), gate_up.cols)?;
        if gate_up.rows != 2 * inter {
            return Err(shape("gated_up", format!("{} rows are not gate|up of {inter}", gate_up.rows)));
        }
        if self.gemv_mma_fits(gate_up, m, gate_up.rows) {
            return self.gemv_gated_mma(gate_up, x, m, inter);
        }
        if self.gemv_fits(gate_up, m) && gate_up.f32_data.is_none() {
            return self.gemv_gated(gate_up, x, m, inter);
        }
        if self.halves && self.on_cublas(gate_up, m) {
            let gu = self.product(gate_up, Act::F32(x), m)?;
            return self.silu_mul_product(&gu, m, inter);
        }
        let gu = self.linear(x, gate_up)?;
        self.silu_mul(&gu, inter)
    }

    fn mla_split_rope_q(&self, q: &CudaSlice<f32>, heads: usize, nope: usize, rope_dim: usize, positions: &[u32], rope: &RopeParams) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        let m = check_rows("mla_split_rope_q", q.len(), heads * (nope + rope_dim))?;
        if m != positions.len() {
            return Err(shape("mla_split_rope_q", format!("{} positions for {m} rows", positions.len())));
        }
        let (pb, fb) = (self.step_array(StepArray::Positions, positions)?, self.cached_f32_bits(&rope.inv_freq)?);
        let (pb, fb) = (&*pb, &*fb);
        let mut qn = self.out(m * heads * nope)?;
        let mut qp = self.out(m * heads * rope_dim)?;
        let (h, n, r, inter) = (heads as u32, nope as u32, rope_dim as u32, rope.interleaved as i32);
        let mut l = self.stream.launch_builder(self.func("split_rope_q"));
        l.arg(q).arg(&mut qn).arg(&mut qp).arg(pb).arg(fb).arg(&h).arg(&n).arg(&r).arg(&rope.attention_factor).arg(&inter);
        unsafe { l.launch(cfg(m * heads, 0)) }.map_err(dev)?;
        Ok((qn, qp))
    }

    fn mla_store_kv(&self, pool: &mut CudaKvPool, layer: usize, kv_a: &CudaSlice<f32>, norm_w: &CudaSlice<f32>, eps: f32, positions: &[u32], slots: &[u32], rope: &RopeParams) -> Result<()> {
        let m = check_store_kv(pool.layout, layer, kv_a.len(), positions, slots)?;
        self.launch_store_kv(pool, layer, kv_a, norm_w, eps, positions, slots, rope, m)
    }

    fn mla_rope_q_store_kv(
        &self,
        q: &CudaSlice<f32>,
        heads: usize,
        nope: usize,
        rope_dim: usize,
        pool: &mut CudaKvPool,
        layer: usize,
        kv_a: &CudaSlice<f32>,
        norm_w: &CudaSlice<f32>,
        eps: f32,
        positions: &[u32],
        slots: &[u32],
        rope: &RopeParams,
    ) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        let lay = pool.layout;
        let m = check_rows("mla_split_rope_q", q.len(), heads * (nope + rope_dim))?;
        let stored = check_store_kv(lay, layer, kv_a.len(), positions, slots)?;
        // One launch where the two agree (the queries' rope width is the cache's, the same
        // rows); else the two ops (whose checks say what is wrong, if anything).
        if !self.fused_rope_store || heads == 0 || rope_dim != lay.rope_dim || m != stored {
            let q = self.mla_split_rope_q(q, heads, nope, rope_dim, positions, rope)?;
            self.launch_store_kv(pool, layer, kv_a, norm_w, eps, positions, slots, rope, stored)?;
            return Ok(q);
        }
        let [pb, sb, fb] = self.store_kv_arrays(positions, slots, rope)?;
        let (pb, sb, fb) = (&*pb, &*sb, &*fb);
        let mut qn = self.out(m * heads * nope)?;
        let mut qp = self.out(m * heads * rope_dim)?;
        let (m32, h, n, lat, rd, inter) = (m as u32, heads as u32, nope as u32, lay.latent_dim as u32, rope_dim as u32, rope.interleaved as i32);
        let kernel = if pool.bf16() { "rope_q_store_kv_bf16" } else { "rope_q_store_kv" };
        let mut view = pool.layer_mut(layer);
        let mut l = self.stream.launch_builder(self.func(kernel));
        l.arg(&mut view).arg(q).arg(&mut qn).arg(&mut qp).arg(kv_a).arg(norm_w).arg(pb).arg(sb).arg(fb);
        l.arg(&m32).arg(&h).arg(&n).arg(&lat).arg(&rd).arg(&eps).arg(&rope.attention_factor).arg(&inter);
        unsafe { l.launch(cfg(m * (heads + 1), 0)) }.map_err(dev)?;
        Ok((qn, qp))
    }

    fn mla_attention_projected(
        &self,
        q: &CudaSlice<f32>,
        (heads, nope, rope_dim): (usize, usize, usize),
        pool: &mut CudaKvPool,
        layer: usize,
        kv_a: &CudaSlice<f32>,
        norm_w: &CudaSlice<f32>,
        eps: f32,
        positions: &[u32],
        slots: &[u32],
        rope: &RopeParams,
        (w_uk_t, w_uv): (&CudaMatrix, &CudaMatrix),
        rows: &[AttnRow<'_>],
        scale: f32,
    ) -> Result<CudaSlice<f32>> {
        let store = crate::mla::LatentStore { kv_a, norm_w, eps, positions, slots, rope };
        if let Some((q_lat, q_pe)) = self.rope_store_absorb(q, (heads, nope, rope_dim), pool, layer, &store, w_uk_t, rows)? {
            if let Some(o) = self.mla_uv_merged(MlaArgs { pool, layer, q_lat: &q_lat, q_pe: &q_pe, heads, rows, scale }, w_uv)? {
                return Ok(o);
            }
            let o_lat = self.mla_attention(pool, layer, &q_lat, &q_pe, heads, rows, scale)?;
            return self.head_linear(&o_lat, heads, w_uv);
        }
        let (q_nope, q_pe) = self.mla_rope_q_store_kv(q, heads, nope, rope_dim, pool, layer, kv_a, norm_w, eps, positions, slots, rope)?;
        self.mla_attention_heads(pool, layer, &q_nope, &q_pe, w_uk_t, w_uv, heads, rows, scale)
    }

    fn mla_attention(&self, pool: &CudaKvPool, layer: usize, q_lat: &CudaSlice<f32>, q_pe: &CudaSlice<f32>, heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Result<CudaSlice<f32>> {
        let l = pool.layout;
        if q_lat.len() != rows.len() * heads * l.latent_dim || q_pe.len() != rows.len() * heads * l.rope_dim || layer >= l.layers {
            return Err(shape("mla_attention", format!("{} rows x {heads} heads do not match q_lat {} / q_pe {}", rows.len(), q_lat.len(), q_pe.len())));
        }
        check_mla_rows(l, rows)?;
        let a = MlaArgs { pool, layer, q_lat, q_pe, heads, rows, scale };
        #[cfg(any(feature = "cuda", feature = "hip-mock"))]
        {
            let runs = self.mla_gemm_runs(rows);
            if !runs.is_empty() {
                return self.mla_with_runs(a, &runs);
            }
        }
        let [btb, offb, ctxb] = self.row_tables(rows)?;
        self.mla_kernels(a, [&btb.slice(..), &offb.slice(..), &ctxb.slice(..)])
    }

    fn mla_attention_heads(
        &self,
        pool: &CudaKvPool,
        layer: usize,
        q_nope: &CudaSlice<f32>,
        q_pe: &CudaSlice<f32>,
        w_uk_t: &CudaMatrix,
        w_uv: &CudaMatrix,
        heads: usize,
        rows: &[AttnRow<'_>],
        scale: f32,
    ) -> Result<CudaSlice<f32>> {
        #[cfg(any(feature = "cuda", feature = "hip-mock"))]
        {
            // The per-head path where it applies and the shapes agree (else the absorbed ops
            // below say what is wrong).
            let l = pool.layout;
            let fits = heads > 0
                && layer < l.layers
                && w_uk_t.rows == heads * l.latent_dim
                && w_uv.cols == l.latent_dim
                && w_uv.rows % heads == 0
                && q_nope.len() == rows.len() * heads * w_uk_t.cols
                && q_pe.len() == rows.len() * heads * l.rope_dim
                && check_mla_rows(l, rows).is_ok();
            if fits {
                let a = crate::mla_prefill::HeadsArgs { pool, layer, q_nope, q_pe, w_uk_t, w_uv, heads, rows, scale };
                if let Some(o) = self.mla_heads_with_runs(a)? {
                    return Ok(o);
                }
            }
        }
        let q_lat = self.head_linear(q_nope, heads, w_uk_t)?;
        if let Some(o) = self.mla_uv_merged(MlaArgs { pool, layer, q_lat: &q_lat, q_pe, heads, rows, scale }, w_uv)? {
            return Ok(o);
        }
        let o_lat = self.mla_attention(pool, layer, &q_lat, q_pe, heads, rows, scale)?;
        self.head_linear(&o_lat, heads, w_uv)
    }

    fn kv_store(&self, pool: &mut CudaKvPool, layer: usize, k: &CudaSlice<f32>, v: &CudaSlice<f32>, slots: &[u32]) -> Result<()> {
        self.gqa_store(pool, layer, k, v, slots)
    }

    fn gqa_attention(&self, pool: &CudaKvPool, layer: usize, q: &CudaSlice<f32>, heads: usize, kv_heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Result<CudaSlice<f32>> {
        self.gqa(pool, layer, q, heads, kv_heads, rows, scale)
    }

    fn concat(&self, parts: &[&CudaSlice<f32>]) -> Result<CudaSlice<f32>> {
        self.concat_bufs(parts)
    }

    fn moe(
        &self,
        x: &CudaSlice<f32>,
        gate_logits: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        experts: &[ExpertWeights<CudaMatrix>],
        shared: Option<&CudaSlice<f32>>,
    ) -> Result<CudaSlice<f32>> {
        let e = cfg_r.n_experts;
        if experts.len() != e || bias.len() != e {
            return Err(shape("moe", format!("{} experts, {} biases, config says {e}", experts.len(), bias.len())));
        }
        self.moe_held(x, gate_logits, bias, cfg_r, experts, 0, shared)
    }

    fn moe_local(
        &self,
        x: &CudaSlice<f32>,
        gate_logits: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        experts: &[ExpertWeights<CudaMatrix>],
        first: usize,
        shared: Option<&CudaSlice<f32>>,
    ) -> Result<CudaSlice<f32>> {
        weft_backend::check_local_experts(first, experts.len(), cfg_r, bias.len())?;
        self.moe_held(x, gate_logits, bias, cfg_r, experts, first, shared)
    }

    fn moe_block(
        &self,
        x: &CudaSlice<f32>,
        gate_logits: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        experts: &[ExpertWeights<CudaMatrix>],
        first: usize,
        shared: &[ExpertWeights<CudaMatrix>],
    ) -> Result<CudaSlice<f32>> {
        weft_backend::check_local_experts(first, experts.len(), cfg_r, bias.len())?;
        let m = check_rows("moe", gate_logits.len(), cfg_r.n_experts)?;
        let hidden = check_rows("moe", x.len(), m.max(1))?;
        self.moe_block_gated(x, Gate::Logits(gate_logits), bias, cfg_r, (experts, first), shared, (m, hidden), None)
    }

    fn moe_block_routed(
        &self,
        x: &CudaSlice<f32>,
        router: &CudaMatrix,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        experts: &[ExpertWeights<CudaMatrix>],
        first: usize,
        shared: &[ExpertWeights<CudaMatrix>],
    ) -> Result<CudaSlice<f32>> {
        self.moe_routed(x, router, bias, cfg_r, (experts, first), shared, None)
    }

    fn moe_block_routed_add_norm(
        &self,
        x: &CudaSlice<f32>,
        router: &CudaMatrix,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        (experts, first): (&[ExpertWeights<CudaMatrix>], usize),
        shared: &[ExpertWeights<CudaMatrix>],
        (residual, dim, weight, eps): (&mut CudaSlice<f32>, usize, &CudaSlice<f32>, f32),
    ) -> Result<CudaSlice<f32>> {
        if dim != router.cols {
            // Rows of another width: the ops apart say what is wrong.
            let delta = self.moe_routed(x, router, bias, cfg_r, (experts, first), shared, None)?;
            return self.add_rms_norm(residual, &delta, dim, weight, eps);
        }
        self.moe_routed(x, router, bias, cfg_r, (experts, first), shared, Some(NormAfter { residual, weight, eps }))
    }

    fn shared_experts(&self, x: &CudaSlice<f32>, shared: &[ExpertWeights<CudaMatrix>]) -> Result<Option<CudaSlice<f32>>> {
        // Chunks on the cuBLAS path (prefill, decode batches past 32 rows): x split into its
        // parts once for all of them, the down products accumulated into one output; else each
        // chunk's MLP, summed (a single chunk so too with `halves` off, as before it).
        let hidden = shared.first().map_or(0, |w| w.gate_up.cols);
        let m = if shared.is_empty() { 0 } else { check_rows("moe_block", self.len(x), hidden)? };
        // Every chunk shaped for x (else the ops apart say what is wrong).
        let fits = |w: &ExpertWeights<CudaMatrix>| w.gate_up.cols == hidden && w.gate_up.rows == 2 * w.inter && w.down.rows == hidden && w.down.cols == w.inter;
        if shared.is_empty() || (shared.len() < 2 && !self.halves) || !self.gemm_split || !shared.iter().all(|w| fits(w) && self.on_cublas(&w.gate_up, m) && self.on_cublas(&w.down, m)) {
            return weft_backend::shared_experts_apart(self, x, shared);
        }
        let parts = self.to_bf16_parts(x, m * hidden, !self.lo_ranges(m).is_empty())?;
        let mut out = self.out(m * hidden)?;
        for (i, w) in shared.iter().enumerate() {
            let down = [hidden, m, w.inter, 1, w.inter, hidden];
            if self.halves {
                // silu · up of the gate|up halves, written as the down product's parts.
                let gu = self.product(&w.gate_up, Act::Parts(&parts), m)?;
                let h = self.silu_mul_parts(&gu, m, w.inter, !self.lo_ranges(m).is_empty())?;
                self.gemm_from(&w.down, Act::Parts(&h), &mut out, down, i > 0)?;
                continue;
            }
            let mut gu = self.out(m * 2 * w.inter)?;
            self.gemm_from(&w.gate_up, Act::Parts(&parts), &mut gu, [2 * w.inter, m, hidden, 1, hidden, 2 * w.inter], false)?;
            let h = self.silu_mul(&gu, w.inter)?;
            self.gemm_from(&w.down, Act::F32(&h), &mut out, down, i > 0)?;
        }
        Ok(Some(out))
    }

    fn sampling_front(&self, logits: &mut CudaSlice<f32>, vocab: usize, rows: &[weft_backend::front::FrontRow]) -> Result<Vec<weft_backend::front::FrontOut>> {
        self.front(logits, vocab, rows)
    }
}

impl CudaBackend {
    /// `store_kv*` over `m` rows whose arguments `check_store_kv` has accepted (both store
    /// ops call it, so the fallback of `mla_rope_q_store_kv` does not check them twice).
    #[allow(clippy::too_many_arguments)]
    fn launch_store_kv(
        &self,
        pool: &mut CudaKvPool,
        layer: usize,
        kv_a: &CudaSlice<f32>,
        norm_w: &CudaSlice<f32>,
        eps: f32,
        positions: &[u32],
        slots: &[u32],
        rope: &RopeParams,
        m: usize,
    ) -> Result<()> {
        let lay = pool.layout;
        let [pb, sb, fb] = self.store_kv_arrays(positions, slots, rope)?;
        let (pb, sb, fb) = (&*pb, &*sb, &*fb);
        let (lat, rd, inter) = (lay.latent_dim as u32, lay.rope_dim as u32, rope.interleaved as i32);
        let kernel = if pool.bf16() { "store_kv_bf16" } else { "store_kv" };
        let mut view = pool.layer_mut(layer);
        let mut l = self.stream.launch_builder(self.func(kernel));
        l.arg(&mut view).arg(kv_a).arg(norm_w).arg(pb).arg(sb).arg(fb).arg(&lat).arg(&rd).arg(&eps).arg(&rope.attention_factor).arg(&inter);
        unsafe { l.launch(cfg(m, 0)) }.map_err(dev)?;
        Ok(())
    }

    /// The step arrays a latent store reads (positions, slots) and the rope's frequencies as
    /// bits, for `store_kv*` and `rope_q_store_kv*`.
    pub(crate) fn store_kv_arrays(&self, positions: &[u32], slots: &[u32], rope: &RopeParams) -> Result<[std::sync::Arc<CudaSlice<u32>>; 3]> {
        Ok([self.step_array(StepArray::Positions, positions)?, self.step_array(StepArray::Slots, slots)?, self.cached_f32_bits(&rope.inv_freq)?])
    }

    /// MLA attention by the decode kernels: the split kernel, or the single-pass one for shapes
    /// it does not take. `tables`: the rows' packed block tables, offsets, lengths.
    pub(crate) fn mla_kernels(&self, a: MlaArgs<'_>, tables: [&CudaView<'_, u32>; 3]) -> Result<CudaSlice<f32>> {
        let MlaArgs { pool, layer, q_lat, q_pe, heads, rows, scale } = a;
        if self.mla_split_fits(pool, heads) {
            return self.mla_split(a, tables);
        }
        let l = pool.layout;
        let view = pool.layer(layer);
        let mut out = self.out(rows.len() * heads * l.latent_dim)?;
        let (h, lat, rd, ps) = (heads as u32, l.latent_dim as u32, l.rope_dim as u32, l.page_size as u32);
        let mut b = self.stream.launch_builder(self.func(if pool.bf16() { "mla_attention_bf16" } else { "mla_attention" }));
        b.arg(&view).arg(q_lat).arg(q_pe).arg(tables[0]).arg(tables[1]).arg(tables[2]).arg(&mut out).arg(&h).arg(&lat).arg(&rd).arg(&ps).arg(&scale);
        unsafe { b.launch(cfg(rows.len() * heads, (l.width() * 4) as u32)) }.map_err(dev)?;
        Ok(out)
    }
}
