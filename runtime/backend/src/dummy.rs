//! `--load-format dummy` weights: deterministic pseudo-random values from a tensor's name and a
//! seed, the same on every backend (the CUDA backend generates them on the device with the
//! same arithmetic, `kernels/dummy.cu`), as bf16 or as fp8 e4m3 with block scales.

use crate::{BlockScales, HostMatrix, WeightDtype};
use std::borrow::Cow;

/// FNV-1a of the name, mixed with the seed: the stream a tensor's values come from.
pub fn name_hash(name: &str, seed: u64) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Element `i` of stream `h`: uniform in [-1, 1) (splitmix64 finaliser, 24 bits).
pub fn value(h: u64, i: u64) -> f32 {
    let z = crate::rng::mix64(h.wrapping_add(i.wrapping_mul(crate::rng::GOLDEN_GAMMA)));
    (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
}

/// f32 → fp8 e4m3 (round to nearest even, saturating at ±448), the arithmetic of
/// `f32_to_fp8` in `kernels/weft_port.h`.
pub fn e4m3(x: f32) -> u8 {
    let s = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a.is_nan() || a >= 448.0 {
        return s | 0x7e;
    }
    let mut e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    if e < -6 {
        return s | (a * 512.0).round_ties_even() as u8;
    }
    let mut q = ((a / f32::from_bits(((e + 127) as u32) << 23) - 1.0) * 8.0).round_ties_even();
    if q >= 8.0 {
        e += 1;
        q = 0.0;
    }
    let code = (((e + 7) as u32) << 3) | q as u32;
    s | code.min(0x7e) as u8
}

/// One dummy matrix: row blocks (each its own named stream, stacked: gate and up projections
/// in one matrix) of `cols` columns, values scaled by `scale`, stored as bf16 or as fp8 with
/// uniform block scales `scale / 448`. A tensor-parallel rank's shard is a window of the
/// whole weight's streams ([`Self::rows_window`], [`Self::cols_window`]): element `(r, c)` of
/// a part is element `(row0 + r) * stream_cols + col0 + c` of its stream, so every rank
/// generates exactly its part of what an unsharded model holds.
#[derive(Clone, Debug)]
pub struct DummySpec {
    pub name: String,
    /// `(name_hash, rows)` of each stacked part.
    pub parts: Vec<(u64, usize)>,
    pub cols: usize,
    pub scale: f32,
    /// `Some((block_rows, block_cols))`: fp8 e4m3 with that scale grid.
    pub fp8_block: Option<(usize, usize)>,
    /// First row and column of the window, and the whole weight's width.
    pub row0: usize,
    pub col0: usize,
    pub stream_cols: usize,
}

impl DummySpec {
    /// The whole matrix: `parts` stacked, `cols` wide.
    pub fn new(name: impl Into<String>, parts: Vec<(u64, usize)>, cols: usize, scale: f32, fp8_block: Option<(usize, usize)>) -> Self {
        DummySpec { name: name.into(), parts, cols, scale, fp8_block, row0: 0, col0: 0, stream_cols: cols }
    }

    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.1).sum()
    }

    /// Rows `r` of every part (`None` when a part is shorter than `r.end`).
    pub fn rows_window(mut self, r: std::ops::Range<usize>) -> Option<Self> {
        if r.start > r.end || self.parts.iter().any(|p| p.1 < r.end) {
            return None;
        }
        self.row0 += r.start;
        self.parts.iter_mut().for_each(|p| p.1 = r.len());
        self.name = format!("{}[rows {}..{}]", self.name, r.start, r.end);
        Some(self)
    }

    /// Columns `c` (`None` past the matrix's width).
    pub fn cols_window(mut self, c: std::ops::Range<usize>) -> Option<Self> {
        if c.start > c.end || c.end > self.cols {
            return None;
        }
        self.col0 += c.start;
        self.cols = c.len();
        self.name = format!("{}[cols {}..{}]", self.name, c.start, c.end);
        Some(self)
    }

    /// Stream index of element `i` (row-major) of a part of this window.
    pub fn stream_index(&self, i: u64) -> u64 {
        let cols = self.cols.max(1) as u64;
        (self.row0 as u64 + i / cols) * self.stream_cols as u64 + self.col0 as u64 + i % cols
    }

    /// The matrix generated on the host.
    pub fn host(&self) -> HostMatrix<'static> {
        let (rows, cols) = (self.rows(), self.cols);
        let mut bytes = Vec::with_capacity(rows * cols * if self.fp8_block.is_some() { 1 } else { 2 });
        for &(h, r) in &self.parts {
            let n = (r * cols) as u64;
            match self.fp8_block {
                Some(_) => bytes.extend((0..n).map(|i| e4m3(value(h, self.stream_index(i)) * 448.0))),
                None => bytes.extend((0..n).flat_map(|i| half::bf16::from_f32(value(h, self.stream_index(i)) * self.scale).to_bits().to_le_bytes())),
            }
        }
        let (dtype, scales) = match self.fp8_block {
            Some((br, bc)) => (WeightDtype::Fp8E4M3, Some(BlockScales { block_rows: br, block_cols: bc, scales: vec![self.scale / 448.0; rows.div_ceil(br) * cols.div_ceil(bc)] })),
            None => (WeightDtype::Bf16, None),
        };
        HostMatrix { name: self.name.clone(), rows, cols, dtype, bytes: Cow::Owned(bytes), scales }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_round_trips_every_finite_code() {
        for b in 0u8..=255 {
            if b & 0x7f == 0x7f {
                continue; // NaN
            }
            let v = crate::dtype::fp8_e4m3_to_f32(b);
            let back = e4m3(v);
            // ±0 both encode to their own sign
            assert_eq!(back, b, "code {b:#04x} = {v} re-encoded as {back:#04x}");
        }
    }

    #[test]
    fn e4m3_rounds_to_nearest_and_saturates() {
        assert_eq!(crate::dtype::fp8_e4m3_to_f32(e4m3(1.0 + 1.0 / 32.0)), 1.0); // tie to even
        assert_eq!(crate::dtype::fp8_e4m3_to_f32(e4m3(1.0 + 3.0 / 32.0)), 1.125);
        assert_eq!(crate::dtype::fp8_e4m3_to_f32(e4m3(1e6)), 448.0);
        assert_eq!(crate::dtype::fp8_e4m3_to_f32(e4m3(-1e6)), -448.0);
        assert_eq!(crate::dtype::fp8_e4m3_to_f32(e4m3(0.0009765625 * 1.4)), 0.001953125 * 1.0);
    }

    #[test]
    fn fp8_dummy_dequantizes_near_bf16_dummy() {
        let spec = DummySpec::new("w", vec![(name_hash("a", 1), 3), (name_hash("b", 1), 2)], 256, 0.1, None);
        let fp8 = DummySpec { fp8_block: Some((128, 128)), ..spec.clone() };
        let (a, b) = (spec.host().to_f32().unwrap(), fp8.host().to_f32().unwrap());
        assert_eq!(a.len(), 5 * 256);
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 0.1 / 16.0, "fp8 and bf16 dummies differ by {worst}");
    }

    /// A window holds what the same rows and columns of the whole matrix hold, part by part.
    #[test]
    fn windows_hold_the_whole_matrix_values() {
        for fp8 in [None, Some((2, 2))] {
            let whole = DummySpec::new("w", vec![(name_hash("g", 3), 6), (name_hash("u", 3), 6)], 10, 0.1, fp8);
            let all = whole.host().to_f32().unwrap();
            let rows = whole.clone().rows_window(2..5).unwrap();
            let win = rows.clone().cols_window(3..7).unwrap();
            let (got_rows, got) = (rows.host().to_f32().unwrap(), win.host().to_f32().unwrap());
            assert_eq!((win.rows(), win.cols), (6, 4));
            for p in 0..2 {
                for r in 0..3 {
                    let src = &all[(p * 6 + 2 + r) * 10..(p * 6 + 3 + r) * 10];
                    assert_eq!(&got_rows[(p * 3 + r) * 10..(p * 3 + r + 1) * 10], src, "part {p} row {r}");
                    assert_eq!(&got[(p * 3 + r) * 4..(p * 3 + r + 1) * 4], &src[3..7], "part {p} row {r} columns");
                }
            }
            assert!(whole.clone().rows_window(4..7).is_none() && whole.cols_window(8..11).is_none());
        }
    }
}
