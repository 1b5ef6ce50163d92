//! Dense f32 matrix products for the CPU backend: `x · Wᵀ` with W row-major `[n, k]`, and the
//! per-head variant used by absorbed MLA. Parallel over output rows; 4-row register tiles
//! so each weight row is read once per 4 activations.

use rayon::prelude::*;

#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[inline]
fn dot4(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    let mut acc = [[0f32; 8]; 4];
    let n8 = w.len() / 8 * 8;
    let mut i = 0;
    while i < n8 {
        let wv = &w[i..i + 8];
        for r in 0..4 {
            let xv = &x[r][i..i + 8];
            for l in 0..8 {
                acc[r][l] += xv[l] * wv[l];
            }
        }
        i += 8;
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        let a = &acc[r];
        let mut s = (a[0] + a[4]) + (a[1] + a[5]) + ((a[2] + a[6]) + (a[3] + a[7]));
        for j in n8..w.len() {
            s += x[r][j] * w[j];
        }
        out[r] = s;
    }
    out
}

/// `out[m, n] = Σ_k x[m, k] w[n, k]`.
pub(crate) fn linear(x: &[f32], w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let m = x.len() / k;
    let mut out = vec![0f32; m * n];
    if m == 1 {
        out.par_chunks_mut(64).enumerate().for_each(|(c, o)| {
            for (j, v) in o.iter_mut().enumerate() {
                let r = c * 64 + j;
                *v = dot(x, &w[r * k..(r + 1) * k]);
            }
        });
        return out;
    }
    // Blocks of 4 activation rows; parallel over (row block, column block) tiles.
    const NB: usize = 128;
    let row_blocks = m.div_ceil(4);
    let col_blocks = n.div_ceil(NB);
    let tiles: Vec<(usize, usize, Vec<f32>)> = (0..row_blocks * col_blocks)
        .into_par_iter()
        .map(|t| {
            let (rb, cb) = (t / col_blocks, t % col_blocks);
            let (m0, m1) = (rb * 4, (rb * 4 + 4).min(m));
            let (n0, n1) = (cb * NB, (cb * NB + NB).min(n));
            let mut tile = vec![0f32; (m1 - m0) * (n1 - n0)];
            let row = |i: usize| &x[(m0 + i.min(m1 - m0 - 1)) * k..(m0 + i.min(m1 - m0 - 1) + 1) * k];
            let xs = [row(0), row(1), row(2), row(3)];
            for j in n0..n1 {
                let r = dot4(xs, &w[j * k..(j + 1) * k]);
                for i in 0..m1 - m0 {
                    tile[i * (n1 - n0) + (j - n0)] = r[i];
                }
            }
            (t, n1 - n0, tile)
        })
        .collect();
    for (t, width, tile) in tiles {
        let (rb, cb) = (t / col_blocks, t % col_blocks);
        for (i, chunk) in tile.chunks(width).enumerate() {
            let r = rb * 4 + i;
            out[r * n + cb * NB..r * n + cb * NB + width].copy_from_slice(chunk);
        }
    }
    out
}

/// `out[m, h, j] = Σ_i w[h*n + j, i] x[m, h, i]`, `x` is `[m, heads, k]`.
pub(crate) fn head_linear(x: &[f32], heads: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let m = x.len() / (heads * k);
    let mut out = vec![0f32; m * heads * n];
    out.par_chunks_mut(n).enumerate().for_each(|(mh, o)| {
        let h = mh % heads;
        let xv = &x[mh * k..(mh + 1) * k];
        for (j, v) in o.iter_mut().enumerate() {
            let r = h * n + j;
            *v = dot(xv, &w[r * k..(r + 1) * k]);
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let m = x.len() / k;
        let mut o = vec![0f32; m * n];
        for a in 0..m {
            for b in 0..n {
                o[a * n + b] = (0..k).map(|i| x[a * k + i] as f64 * w[b * k + i] as f64).sum::<f64>() as f32;
            }
        }
        o
    }

    fn pseudo(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) - 0.5
            })
            .collect()
    }

    #[test]
    fn linear_matches_naive_on_odd_shapes() {
        for &(m, n, k) in &[(1, 7, 13), (3, 130, 9), (5, 129, 33), (9, 300, 64), (4, 1, 1)] {
            let x = pseudo(m * k, 1);
            let w = pseudo(n * k, 2);
            let got = linear(&x, &w, n, k);
            let want = naive(&x, &w, n, k);
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() < 1e-5, "m={m} n={n} k={k}: {g} vs {e}");
            }
        }
    }

    #[test]
    fn head_linear_matches_per_head_linear() {
        let (m, h, n, k) = (3, 4, 5, 6);
        let x = pseudo(m * h * k, 3);
        let w = pseudo(h * n * k, 4);
        let got = head_linear(&x, h, &w, n, k);
        for a in 0..m {
            for hh in 0..h {
                let xv = &x[(a * h + hh) * k..(a * h + hh + 1) * k];
                let want = naive(xv, &w[hh * n * k..(hh + 1) * n * k], n, k);
                for (g, e) in got[(a * h + hh) * n..(a * h + hh + 1) * n].iter().zip(&want) {
                    assert!((g - e).abs() < 1e-5);
                }
            }
        }
    }
}
