//! Host-side weight formats as they appear in checkpoints (bf16, f16, f32, fp8 e4m3 with
//! 128×128 block scales) and their exact conversion to f32.

use crate::BackendError;

/// Element type of a checkpoint tensor that weft can compute with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    Bf16,
    F16,
    /// OCP fp8 e4m3 ("e4m3fn": no infinities, 0x7f/0xff are NaN, max 448).
    Fp8E4M3,
}

impl WeightDtype {
    pub fn size(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Bf16 | WeightDtype::F16 => 2,
            WeightDtype::Fp8E4M3 => 1,
        }
    }
}

/// Per-block fp32 inverse scales of a block-quantized fp8 matrix
/// (`weight_scale_inv`, shape `[ceil(rows/br), ceil(cols/bc)]`); dequantized = fp8 × scale.
#[derive(Clone, Debug)]
pub struct BlockScales {
    pub block_rows: usize,
    pub block_cols: usize,
    pub scales: Vec<f32>,
}

impl BlockScales {
    pub fn grid(&self, rows: usize, cols: usize) -> (usize, usize) {
        (rows.div_ceil(self.block_rows), cols.div_ceil(self.block_cols))
    }
}

/// A weight matrix `[rows, cols]` (row-major, `cols` contiguous) still in checkpoint format,
/// borrowed from the memory-mapped file where possible.
#[derive(Clone, Debug)]
pub struct HostMatrix<'a> {
    /// Tensor name, for error messages.
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub dtype: WeightDtype,
    /// Little-endian element bytes, `rows * cols * dtype.size()` long.
    pub bytes: std::borrow::Cow<'a, [u8]>,
    /// Present exactly when `dtype` is fp8.
    pub scales: Option<BlockScales>,
}

impl<'a> HostMatrix<'a> {
    /// A matrix that already holds f32 values (after a host-side transform).
    pub fn from_f32(name: impl Into<String>, rows: usize, cols: usize, values: &[f32]) -> HostMatrix<'static> {
        assert_eq!(values.len(), rows * cols);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        HostMatrix { name: name.into(), rows, cols, dtype: WeightDtype::F32, bytes: std::borrow::Cow::Owned(bytes), scales: None }
    }

    /// Checks that the byte length and scale grid agree with the declared shape.
    pub fn validate(&self) -> Result<(), BackendError> {
        let want = self.rows * self.cols * self.dtype.size();
        if self.bytes.len() != want {
            return Err(BackendError::BadWeight { name: self.name.clone(), reason: format!("{} bytes for a {}x{} {:?} matrix, expected {want}", self.bytes.len(), self.rows, self.cols, self.dtype) });
        }
        match (&self.scales, self.dtype) {
            (Some(s), WeightDtype::Fp8E4M3) => {
                let (gr, gc) = s.grid(self.rows, self.cols);
                if s.scales.len() != gr * gc {
                    return Err(BackendError::BadWeight {
                        name: self.name.clone(),
                        reason: format!("scale grid has {} entries, expected {gr}x{gc} for {}x{} blocks", s.scales.len(), s.block_rows, s.block_cols),
                    });
                }
                Ok(())
            }
            (None, WeightDtype::Fp8E4M3) => Err(BackendError::BadWeight { name: self.name.clone(), reason: "fp8 weight without block scales (weight_scale_inv)".into() }),
            (Some(_), _) => Err(BackendError::BadWeight { name: self.name.clone(), reason: "block scales given for a non-fp8 weight".into() }),
            (None, _) => Ok(()),
        }
    }

    /// Dequantizes the whole matrix to f32, row-major.
    pub fn to_f32(&self) -> Result<Vec<f32>, BackendError> {
        self.validate()?;
        let mut out = vec![0f32; self.rows * self.cols];
        self.to_f32_rows(0, self.rows, &mut out);
        Ok(out)
    }

    /// Dequantizes rows `[r0, r1)` into `out` (`(r1-r0) * cols` long). Assumes `validate` passed.
    pub fn to_f32_rows(&self, r0: usize, r1: usize, out: &mut [f32]) {
        let c = self.cols;
        let b = &self.bytes[r0 * c * self.dtype.size()..r1 * c * self.dtype.size()];
        match self.dtype {
            WeightDtype::F32 => {
                for (o, ch) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
                }
            }
            WeightDtype::Bf16 => {
                for (o, ch) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([ch[0], ch[1]]));
                }
            }
            WeightDtype::F16 => {
                for (o, ch) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = half::f16::from_bits(u16::from_le_bytes([ch[0], ch[1]])).to_f32();
                }
            }
            WeightDtype::Fp8E4M3 => {
                let s = self.scales.as_ref().expect("validated");
                let (_, gc) = s.grid(self.rows, self.cols);
                for r in r0..r1 {
                    let srow = &s.scales[(r / s.block_rows) * gc..(r / s.block_rows + 1) * gc];
                    let src = &b[(r - r0) * c..(r - r0 + 1) * c];
                    let dst = &mut out[(r - r0) * c..(r - r0 + 1) * c];
                    for (j, (o, &x)) in dst.iter_mut().zip(src).enumerate() {
                        *o = fp8_e4m3_to_f32(x) * srow[j / s.block_cols];
                    }
                }
            }
        }
    }
}

/// Reads a little-endian vector of any supported float dtype (no scales) into f32.
pub fn vector_to_f32(dtype: WeightDtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        WeightDtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        WeightDtype::Bf16 => bytes.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        WeightDtype::F16 => bytes.chunks_exact(2).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect(),
        WeightDtype::Fp8E4M3 => bytes.iter().map(|&b| fp8_e4m3_to_f32(b)).collect(),
    }
}

#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Exact decoding of OCP fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
/// subnormals at exponent 0; `S.1111.111` is NaN; there are no infinities.
#[inline]
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    FP8_TABLE[b as usize]
}

static FP8_TABLE: [f32; 256] = build_fp8_table();

const fn build_fp8_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u32;
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0f32 };
        let exp = (b >> 3) & 0xf;
        let man = b & 0x7;
        let v = if exp == 0xf && man == 0x7 {
            f32::NAN
        } else if exp == 0 {
            // subnormal: man/8 * 2^-6
            (man as f32) * (1.0 / 8.0) * (1.0 / 64.0)
        } else {
            let m = 1.0 + (man as f32) / 8.0;
            // 2^(exp-7) built by repeated multiplication (const context)
            let mut p = 1.0f32;
            let mut e = exp as i32 - 7;
            while e > 0 {
                p *= 2.0;
                e -= 1;
            }
            while e < 0 {
                p *= 0.5;
                e += 1;
            }
            m * p
        };
        t[i] = sign * v;
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_known_values() {
        assert_eq!(fp8_e4m3_to_f32(0x00), 0.0);
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0); // exp 7, man 0
        assert_eq!(fp8_e4m3_to_f32(0x7e), 448.0); // max finite
        assert_eq!(fp8_e4m3_to_f32(0xfe), -448.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(fp8_e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(fp8_e4m3_to_f32(0x3c), 1.5);
        assert!(fp8_e4m3_to_f32(0x7f).is_nan());
        assert!(fp8_e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn fp8_block_dequant_with_partial_edge_blocks() {
        // 3x5 matrix, 2x2 blocks: grid 2x3, last block row/col partial.
        let rows = 3;
        let cols = 5;
        let bytes = vec![0x38u8; rows * cols]; // all 1.0
        let scales: Vec<f32> = (0..6).map(|i| i as f32 + 1.0).collect();
        let m = HostMatrix { name: "w".into(), rows, cols, dtype: WeightDtype::Fp8E4M3, bytes: bytes.into(), scales: Some(BlockScales { block_rows: 2, block_cols: 2, scales }) };
        let f = m.to_f32().unwrap();
        assert_eq!(&f[0..5], &[1.0, 1.0, 2.0, 2.0, 3.0]);
        assert_eq!(&f[5..10], &[1.0, 1.0, 2.0, 2.0, 3.0]);
        assert_eq!(&f[10..15], &[4.0, 4.0, 5.0, 5.0, 6.0]);
    }

    #[test]
    fn wrong_scale_grid_is_an_error() {
        let m = HostMatrix {
            name: "layers.0.w".into(),
            rows: 3,
            cols: 5,
            dtype: WeightDtype::Fp8E4M3,
            bytes: vec![0u8; 15].into(),
            scales: Some(BlockScales { block_rows: 2, block_cols: 2, scales: vec![1.0; 4] }),
        };
        let e = m.to_f32().unwrap_err().to_string();
        assert!(e.contains("layers.0.w") && e.contains("scale grid"), "{e}");
    }
}
