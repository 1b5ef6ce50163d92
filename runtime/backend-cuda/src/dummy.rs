//! `--load-format dummy` weights generated on the device (`kernels/dummy.cu`), value for value
//! what the host generator (`weft_backend::dummy`) makes, without a host copy: a 100 GB model
//! shape is ready in seconds.

use crate::ops::flat;
use crate::{dev, CudaBackend, CudaMatrix, Fp8Weight};
use cudarc::driver::PushKernelArg;
use weft_backend::dummy::DummySpec;
use weft_backend::Result;

impl CudaBackend {
    pub(crate) fn make_dummy(&self, spec: &DummySpec) -> Result<CudaMatrix> {
        let (rows, cols) = (spec.rows(), spec.cols);
        if self.all_f32 || crate::is_router(&spec.name) || rows * cols == 0 {
            // f32 copies are made from the host matrix.
            return crate::ops::upload(self, &spec.host());
        }
        // The window's place in each part's stream (`DummySpec::stream_index`).
        let (cols64, base, stride) = (cols as i64, (spec.row0 * spec.stream_cols + spec.col0) as i64, spec.stream_cols as i64);
        match spec.fp8_block {
            None => {
                let mut data = unsafe { self.stream.alloc::<u16>(rows * cols) }.map_err(dev)?;
                let mut at = 0;
                for &(h, r) in &spec.parts {
                    let n = r * cols;
                    let mut view = data.slice_mut(at..at + n);
                    let n64 = n as i64;
                    let mut l = self.stream.launch_builder(self.func("dummy_bf16"));
                    l.arg(&mut view).arg(&n64).arg(&cols64).arg(&base).arg(&stride).arg(&h).arg(&spec.scale);
                    unsafe { l.launch(flat(n)) }.map_err(dev)?;
                    at += n;
                }
                Ok(CudaMatrix { rows, cols, data, f32_data: None, fp8: None })
            }
            Some((br, bc)) => {
                let mut bytes = unsafe { self.stream.alloc::<u8>(rows * cols) }.map_err(dev)?;
                let mut at = 0;
                for &(h, r) in &spec.parts {
                    let n = r * cols;
                    let mut view = bytes.slice_mut(at..at + n);
                    let n64 = n as i64;
                    let mut l = self.stream.launch_builder(self.func("dummy_fp8"));
                    l.arg(&mut view).arg(&n64).arg(&cols64).arg(&base).arg(&stride).arg(&h);
                    unsafe { l.launch(flat(n)) }.map_err(dev)?;
                    at += n;
                }
                let scales = self.stream.clone_htod(&vec![spec.scale / 448.0; rows.div_ceil(br) * cols.div_ceil(bc)]).map_err(dev)?;
                let data = self.stream.alloc_zeros::<u16>(1).map_err(dev)?;
                Ok(CudaMatrix { rows, cols, data, f32_data: None, fp8: Some(Fp8Weight { bytes, scales, block_rows: br, block_cols: bc }) })
            }
        }
    }
}
