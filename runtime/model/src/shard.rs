//! Tensor-parallel slices of checkpoint matrices: which part of each weight a rank holds
//! (Megatron-style: column-parallel products split their output rows, row-parallel ones their
//! input columns and end in an all-reduce) and the host-side cutting, kept in checkpoint format
//! (bf16 bytes, fp8 bytes with their block scales) when the cut falls on a scale block, in f32
//! otherwise.
//!
//! What each rank holds of DeepSeek-V3 (`weights.rs` applies it): its `heads / size` attention
//! heads — rows of `q_proj`/`q_b_proj`, those heads' W_UK/W_UV out of `kv_b_proj`, the matching
//! columns of `o_proj`; a `1 / size` slice of every MLP's intermediate dimension — rows of
//! gate and up, columns of down — for the dense layers, the shared experts and every routed
//! expert (the router and its bias are whole on every rank, so every rank routes every token
//! the same way and sums its slice of each chosen expert). The latent projection
//! (`kv_a_proj_with_mqa`), its norm, the latent cache, embeddings, norms and lm_head are whole
//! on every rank.

use crate::config::ModelConfig;
use std::borrow::Cow;
use std::ops::Range;
use weft_backend::{BackendError, BlockScales, HostMatrix, Shard};

type Result<T> = std::result::Result<T, BackendError>;

/// Why `shard` cannot split `cfg` evenly, if it cannot.
pub fn check(cfg: &ModelConfig, shard: Shard) -> std::result::Result<(), String> {
    if shard.size == 0 || shard.rank >= shard.size {
        return Err(format!("rank {} of a group of {}", shard.rank, shard.size));
    }
    let n = shard.size;
    let moe = cfg.n_routed_experts > 0;
    let dims = [
        ("num_attention_heads", cfg.num_attention_heads),
        ("intermediate_size", cfg.intermediate_size),
        // Expert parallelism splits the routed experts and still slices the shared ones.
        ("moe_intermediate_size", if moe && !shard.expert_parallel { cfg.moe_intermediate_size } else { n }),
        ("n_routed_experts", if moe && shard.expert_parallel { cfg.n_routed_experts } else { n }),
        ("moe_intermediate_size × n_shared_experts", if moe && shard.expert_parallel && cfg.n_shared_experts > 0 { cfg.moe_intermediate_size * cfg.n_shared_experts } else { n }),
    ];
    match dims.iter().find(|(_, d)| !d.is_multiple_of(n)) {
        Some((name, d)) => Err(format!("{name} = {d} does not split across {n} ranks")),
        None => Ok(()),
    }
}

fn bad(name: &str, reason: String) -> BackendError {
    BackendError::BadWeight { name: name.into(), reason }
}

/// Whether the cut `r` of a dimension of `len` lies on a scale grid of `block`: it starts on a
/// block boundary and ends on one or at the end (fp8 cuts that do keep their format).
pub(crate) fn on_grid(r: &Range<usize>, block: usize, len: usize) -> bool {
    r.start.is_multiple_of(block) && (r.end.is_multiple_of(block) || r.end == len)
}

/// Rows `r` of `m`.
pub(crate) fn rows(m: &HostMatrix<'_>, r: Range<usize>) -> Result<HostMatrix<'static>> {
    m.validate()?;
    if r.start > r.end || r.end > m.rows {
        return Err(bad(&m.name, format!("rows {r:?} of {}", m.rows)));
    }
    let name = format!("{}[rows {}..{}]", m.name, r.start, r.end);
    if m.scales.as_ref().is_none_or(|s| on_grid(&r, s.block_rows, m.rows)) {
        let es = m.dtype.size();
        let bytes = m.bytes[r.start * m.cols * es..r.end * m.cols * es].to_vec();
        let scales = m.scales.as_ref().map(|s| {
            let (_, gc) = s.grid(m.rows, m.cols);
            let (b0, b1) = (r.start / s.block_rows, r.end.div_ceil(s.block_rows));
            BlockScales { block_rows: s.block_rows, block_cols: s.block_cols, scales: s.scales[b0 * gc..b1 * gc].to_vec() }
        });
        return Ok(HostMatrix { name, rows: r.len(), cols: m.cols, dtype: m.dtype, bytes: Cow::Owned(bytes), scales });
    }
    let v = m.to_f32()?;
    Ok(HostMatrix::from_f32(name, r.len(), m.cols, &v[r.start * m.cols..r.end * m.cols]))
}

/// Columns `c` of `m`.
pub(crate) fn cols(m: &HostMatrix<'_>, c: Range<usize>, name: String) -> Result<HostMatrix<'static>> {
    m.validate()?;
    if c.start > c.end || c.end > m.cols {
        return Err(bad(&m.name, format!("columns {c:?} of {}", m.cols)));
    }
    let (rows, width) = (m.rows, m.cols);
    if m.scales.as_ref().is_none_or(|s| on_grid(&c, s.block_cols, width)) {
        let es = m.dtype.size();
        let mut bytes = Vec::with_capacity(rows * c.len() * es);
        for r in 0..rows {
            bytes.extend_from_slice(&m.bytes[(r * width + c.start) * es..(r * width + c.end) * es]);
        }
        let scales = m.scales.as_ref().map(|s| {
            let (gr, gc) = s.grid(rows, width);
            let (b0, b1) = (c.start / s.block_cols, c.end.div_ceil(s.block_cols));
            BlockScales { block_rows: s.block_rows, block_cols: s.block_cols, scales: (0..gr).flat_map(|i| s.scales[i * gc + b0..i * gc + b1].iter().copied()).collect() }
        });
        return Ok(HostMatrix { name, rows, cols: c.len(), dtype: m.dtype, bytes: Cow::Owned(bytes), scales });
    }
    let v = m.to_f32()?;
    let vals: Vec<f32> = (0..rows).flat_map(|r| v[r * width + c.start..r * width + c.end].iter().copied()).collect();
    Ok(HostMatrix::from_f32(name, rows, c.len(), &vals))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_backend::WeightDtype;

    fn fp8(rows: usize, cols: usize) -> HostMatrix<'static> {
        let bytes: Vec<u8> = (0..rows * cols).map(|i| (i % 120) as u8).collect();
        let (gr, gc) = (rows.div_ceil(2), cols.div_ceil(2));
        let scales = (0..gr * gc).map(|i| 1.0 + i as f32).collect();
        HostMatrix { name: "w".into(), rows, cols, dtype: WeightDtype::Fp8E4M3, bytes: Cow::Owned(bytes), scales: Some(BlockScales { block_rows: 2, block_cols: 2, scales }) }
    }

    /// Every cut, aligned (kept as fp8) or not (f32), holds the same values as the whole.
    #[test]
    fn slices_hold_the_values_of_the_whole() {
        let m = fp8(6, 5);
        let whole = m.to_f32().unwrap();
        for r in [0..6, 2..4, 1..4, 4..6, 3..6] {
            let s = rows(&m, r.clone()).unwrap();
            assert_eq!(s.to_f32().unwrap(), whole[r.start * 5..r.end * 5].to_vec(), "rows {r:?}");
            assert_eq!(s.dtype == WeightDtype::Fp8E4M3, r.start % 2 == 0 && (r.end % 2 == 0 || r.end == 6), "rows {r:?} format");
        }
        for c in [0..5, 2..4, 1..3, 4..5, 3..5] {
            let s = cols(&m, c.clone(), "w".into()).unwrap();
            let want: Vec<f32> = (0..6).flat_map(|r| whole[r * 5 + c.start..r * 5 + c.end].to_vec()).collect();
            assert_eq!(s.to_f32().unwrap(), want, "cols {c:?}");
        }
        assert!(rows(&m, 4..7).is_err());
        assert!(cols(&m, 0..6, "w".into()).is_err());
    }
}
