//! The sampling front end's math, shared by every backend: per-token edits of a logits row
//! (repetition / presence / frequency penalties, logit bias, banned tokens), temperature, then
//! the top `k` finite logits (value descending, ties by lower id) with the log-sum-exp over the
//! whole row. The host functions here are the reference; a GPU backend runs the same float
//! operations on the device (`kernels/sample.cu`), so candidates agree bit for bit and only
//! the log-sum-exp differs by summation order.

/// The most candidates a device front end extracts per row; rows that need more (or the whole
/// vocabulary) are downloaded and finished on the host.
pub const MAX_DEVICE_K: usize = 1024;

/// The `k` a front-end row asks the backend for when `wanted` candidates are wanted: more than a
/// device extracts (or 0) means the whole row, finished on the host.
pub fn device_k(wanted: usize) -> usize {
    if wanted > MAX_DEVICE_K {
        0
    } else {
        wanted
    }
}

/// One token's edit. Applied in this order, each step exactly as written:
/// `l = l > 0 ? l / repetition : l * repetition` (when `repetition != 1`), `l -= subtract`,
/// `l += bias`, then `l = -inf` when `banned`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenEdit {
    pub token: u32,
    pub repetition: f32,
    pub subtract: f32,
    pub bias: f32,
    pub banned: bool,
}

/// What the front end does to one row of the logits buffer.
#[derive(Clone, Debug, Default)]
pub struct FrontRow {
    /// Candidates wanted, `1..=MAX_DEVICE_K`; 0 asks only for the edits and the log-sum-exp
    /// (the caller downloads the row).
    pub k: usize,
    /// Sampling temperature; the row is multiplied by `1 / temperature` unless it is 0
    /// (greedy) or 1.
    pub temperature: f32,
    /// At most one edit per token.
    pub edits: Vec<TokenEdit>,
}

impl FrontRow {
    /// The factor every logit of the row is multiplied by (1 = none).
    pub fn scale(&self) -> f32 {
        if self.temperature > 0.0 && self.temperature != 1.0 {
            1.0 / self.temperature
        } else {
            1.0
        }
    }
}

/// One row's result: `ids`/`logits` highest first (logits after edits and temperature),
/// `logsumexp` over every finite logit of the row, `finite` how many there are (so the
/// candidates are the complete distribution when `ids.len() == finite`).
#[derive(Clone, Debug, PartialEq)]
pub struct FrontOut {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub logsumexp: f32,
    pub finite: usize,
}

/// Applies one token's edit to its logit.
pub fn edit(l: f32, e: &TokenEdit) -> f32 {
    let mut l = l;
    if e.repetition != 1.0 {
        l = if l > 0.0 { l / e.repetition } else { l * e.repetition };
    }
    l -= e.subtract;
    l += e.bias;
    if e.banned {
        f32::NEG_INFINITY
    } else {
        l
    }
}

/// Applies the row's token edits in place (not the temperature: that is applied as the row
/// is read, [`scaled`]).
pub fn apply_edits(row: &mut [f32], r: &FrontRow) {
    for e in &r.edits {
        if let Some(l) = row.get_mut(e.token as usize) {
            *l = edit(*l, e);
        }
    }
}

/// The row as the sampler sees it: every logit times [`FrontRow::scale`].
pub fn scaled(row: &[f32], r: &FrontRow) -> Vec<f32> {
    let s = r.scale();
    if s == 1.0 {
        row.to_vec()
    } else {
        row.iter().map(|&l| l * s).collect()
    }
}

/// The top `k` (0 = all) finite logits of an already scaled row, highest first, ties by id,
/// with the log-sum-exp (in f64) over the whole row.
pub fn top_k(row: &[f32], k: usize) -> FrontOut {
    let mut ids: Vec<u32> = (0..row.len() as u32).filter(|&i| row[i as usize].is_finite()).collect();
    let finite = ids.len();
    let k = if k == 0 { finite } else { k.min(finite) };
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < ids.len() && k > 0 {
        ids.select_nth_unstable_by(k - 1, cmp);
    }
    ids.truncate(k);
    ids.sort_by(cmp);
    let m = row.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let logsumexp = if finite == 0 {
        f32::NEG_INFINITY
    } else {
        let m = m as f64;
        (m + row.iter().filter(|l| l.is_finite()).map(|&l| (l as f64 - m).exp()).sum::<f64>().ln()) as f32
    };
    FrontOut { logits: ids.iter().map(|&i| row[i as usize]).collect(), ids, logsumexp, finite }
}

/// The whole front end on host memory: `logits [rows.len(), vocab]` is edited in place and
/// each row's candidates returned. The reference for device implementations.
pub fn run_on_host(logits: &mut [f32], vocab: usize, rows: &[FrontRow]) -> Vec<FrontOut> {
    rows.iter()
        .zip(logits.chunks_mut(vocab.max(1)))
        .map(|(r, row)| {
            apply_edits(row, r);
            let out = top_k(&scaled(row, r), r.k.max(1));
            if r.k == 0 {
                FrontOut { ids: vec![], logits: vec![], ..out }
            } else {
                out
            }
        })
        .collect()
}

/// Checks a front-end call's arguments (every backend calls this first).
pub fn check(op: &'static str, len: usize, vocab: usize, rows: &[FrontRow]) -> crate::Result<()> {
    let bad = |reason: String| Err(crate::BackendError::Shape { op, reason });
    if vocab == 0 || len != rows.len() * vocab {
        return bad(format!("{len} logits are not {} rows of {vocab}", rows.len()));
    }
    for (i, r) in rows.iter().enumerate() {
        if r.k > MAX_DEVICE_K {
            return bad(format!("row {i} asks for {} candidates (at most {MAX_DEVICE_K})", r.k));
        }
        if !(r.temperature >= 0.0 && r.temperature.is_finite()) {
            return bad(format!("row {i}: temperature {}", r.temperature));
        }
        let mut seen = std::collections::HashSet::new();
        for e in &r.edits {
            if e.token as usize >= vocab || !seen.insert(e.token) {
                return bad(format!("row {i}: edit of token {} (out of range or repeated)", e.token));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_in_order() {
        let e = TokenEdit { token: 0, repetition: 2.0, subtract: 0.5, bias: 1.0, banned: false };
        assert_eq!(edit(3.0, &e), 3.0 / 2.0 - 0.5 + 1.0);
        assert_eq!(edit(-3.0, &e), -3.0 * 2.0 - 0.5 + 1.0);
        assert_eq!(edit(3.0, &TokenEdit { banned: true, ..e }), f32::NEG_INFINITY);
    }

    #[test]
    fn top_k_ties_and_non_finite() {
        let row = [0.0f32, 3.0, f32::NEG_INFINITY, 3.0, 1.0, f32::NAN];
        let c = top_k(&row, 2);
        assert_eq!(c.ids, vec![1, 3]);
        assert_eq!(c.finite, 4);
        let lse = (1.0f64 + 2.0 * 3f64.exp() + 1f64.exp()).ln();
        assert!((c.logsumexp as f64 - lse).abs() < 1e-6);
        assert_eq!(top_k(&row, 0).ids, vec![1, 3, 4, 0]);
        assert_eq!(top_k(&row, 9).ids.len(), 4);
        let none = top_k(&[f32::NEG_INFINITY; 3], 5);
        assert!(none.ids.is_empty() && none.finite == 0 && none.logsumexp == f32::NEG_INFINITY);
    }

    #[test]
    fn host_run_edits_then_scales() {
        let mut l = vec![1.0f32, 2.0, 4.0, 0.5, 1.0, 2.0, 4.0, 0.5];
        let rows =
            [FrontRow { k: 2, temperature: 0.5, edits: vec![TokenEdit { token: 2, repetition: 1.0, subtract: 0.0, bias: 0.0, banned: true }] }, FrontRow { k: 0, temperature: 1.0, edits: vec![] }];
        let out = run_on_host(&mut l, 4, &rows);
        assert_eq!(l[2], f32::NEG_INFINITY, "edits stay in the buffer");
        assert_eq!(l[6], 4.0);
        assert_eq!(out[0].ids, vec![1, 0]);
        assert_eq!(out[0].logits, vec![4.0, 2.0], "temperature 0.5 doubles");
        assert!(out[1].ids.is_empty() && out[1].finite == 4);
        assert!(check("t", 8, 4, &rows).is_ok());
        assert!(check("t", 8, 4, &[rows[0].clone(), FrontRow { k: MAX_DEVICE_K + 1, ..rows[1].clone() }]).is_err());
        let twice = FrontRow { k: 1, temperature: 1.0, edits: vec![rows[0].edits[0]; 2] };
        assert!(check("t", 8, 4, &[twice, rows[1].clone()]).is_err());
    }
}
