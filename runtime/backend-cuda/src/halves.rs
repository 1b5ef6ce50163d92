//! Products left as the stacked halves of a two-part GEMM and added by the kernel that consumes
//! them. A plain linear of up to `gemm_stack_max_m` rows on cuBLAS multiplies its activations'
//! hi and lo bf16 parts as one GEMM of 2m rows, whose two halves `add_halves` then sums
//! (`ops.rs` `gemm_core`); at batch 33–64 that is a launch after every such GEMM. Here a gated
//! MLP's silu · up adds the gate|up halves itself — and, for the down product, writes its result
//! straight as that product's bf16 parts (no cast launch) —, a query / latent pair's two
//! outputs are added in one launch, and the attention's output projection's in the
//! post-attention norm (`ops.rs` `linear_add_rms_norm`, kernel `add_rms_norm_halves`). Each is
//! the same arithmetic in the same order as the ops one after the other: the same bits.
//! `WEFT_CUDA_HALVES=0` runs the ops apart, for comparisons.

use crate::cublas_gemm::Act;
use crate::ops::{cfg, flat};
use crate::{dev, CudaBackend, CudaMatrix};
use cudarc::driver::{CudaSlice, PushKernelArg};
use weft_backend::Result;

/// A product's output: whole (`[m, n]`), or the two halves of a stacked GEMM (`[2m, n]`, hi
/// rows then lo rows) that its consumer adds.
pub(crate) enum Product {
    Whole(CudaSlice<f32>),
    Halves(CudaSlice<f32>),
}

impl CudaBackend {
    /// `x · wᵀ` over `m` rows on cuBLAS (x f32, or already split into its parts), left as halves
    /// where the GEMM stacks the parts and `halves` is on.
    pub(crate) fn product(&self, w: &CudaMatrix, x: Act<'_>, m: usize) -> Result<Product> {
        let dims = [w.rows, m, w.cols, 1, w.cols, w.rows];
        if self.halves && self.stacks(w, dims, false) {
            let mut st = self.out(2 * m * w.rows)?;
            self.gemm_core(w, x, &mut st, dims, false, true)?;
            return Ok(Product::Halves(st));
        }
        let mut out = self.out(m * w.rows)?;
        self.gemm_from(w, x, &mut out, dims, false)?;
        Ok(Product::Whole(out))
    }

    /// silu(gate) · up of an `m`-row gate|up product (`[m, 2 · inter]` whole or as halves).
    pub(crate) fn silu_mul_product(&self, gu: &Product, m: usize, inter: usize) -> Result<CudaSlice<f32>> {
        let (buf, half) = halves_of(gu, m * 2 * inter);
        let mut out = self.out(m * inter)?;
        let i = inter as u32;
        let mut l = self.stream.launch_builder(self.func("silu_mul_halves"));
        l.arg(buf).arg(&half).arg(&mut out).arg(&i);
        unsafe { l.launch(cfg(m, 0)) }.map_err(dev)?;
        Ok(out)
    }

    /// [`Self::silu_mul_product`] as the bf16 parts of the next product's activations, laid out
    /// as `to_bf16_parts` lays them (hi, then lo when `two`, `m · inter` values each).
    pub(crate) fn silu_mul_parts(&self, gu: &Product, m: usize, inter: usize, two: bool) -> Result<CudaSlice<u16>> {
        let (buf, half) = halves_of(gu, m * 2 * inter);
        let n = (m * inter).max(1);
        let mut parts = self.alloc::<u16>(2 * n)?;
        {
            let (mut hi, mut lo) = parts.split_at_mut(n);
            let (i, two) = (inter as u32, two as i32);
            let mut l = self.stream.launch_builder(self.func("silu_mul_split"));
            l.arg(buf).arg(&half).arg(&mut hi).arg(&mut lo).arg(&i).arg(&two);
            unsafe { l.launch(cfg(m, 0)) }.map_err(dev)?;
        }
        Ok(parts)
    }

    /// Two products of the same rows as whole outputs (`[m, na]`, `[m, nb]`): the halves of both
    /// added in one launch.
    pub(crate) fn whole_pair(&self, a: Product, b: Product, m: usize, na: usize, nb: usize) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        match (a, b) {
            (Product::Halves(sa), Product::Halves(sb)) => {
                let (mut oa, mut ob) = (self.out(m * na)?, self.out(m * nb)?);
                let (na64, nb64) = ((m * na) as i64, (m * nb) as i64);
                let mut l = self.stream.launch_builder(self.func("add_halves2"));
                l.arg(&sa).arg(&mut oa).arg(&na64).arg(&sb).arg(&mut ob).arg(&nb64);
                unsafe { l.launch(flat(m * (na + nb))) }.map_err(dev)?;
                Ok((oa, ob))
            }
            (a, b) => Ok((self.whole(a, m * na)?, self.whole(b, m * nb)?)),
        }
    }

    /// A product's `n` output values whole.
    fn whole(&self, p: Product, n: usize) -> Result<CudaSlice<f32>> {
        match p {
            Product::Whole(y) => Ok(y),
            Product::Halves(st) => {
                let mut out = self.out(n)?;
                self.add_halves(&st, &mut out, n)?;
                Ok(out)
            }
        }
    }

    /// `out` (`n` values) = the two halves of the stacked product `st` added (`add_halves`).
    pub(crate) fn add_halves(&self, st: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: usize) -> Result<()> {
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.func("add_halves"));
        l.arg(st).arg(out).arg(&n64);
        unsafe { l.launch(flat(n)) }.map_err(dev)?;
        Ok(())
    }
}

/// A product's buffer and the distance of its lo half (0 when whole) for a product of `n`
/// values.
fn halves_of(p: &Product, n: usize) -> (&CudaSlice<f32>, i64) {
    match p {
        Product::Whole(y) => (y, 0),
        Product::Halves(st) => (st, n as i64),
    }
}
