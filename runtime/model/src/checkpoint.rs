//! A checkpoint's tensors: safetensors files (single or sharded via
//! `model.safetensors.index.json`), memory-mapped, looked up by published tensor name, checked
//! for shape and dtype, and handed out as [`HostMatrix`]/vectors with fp8 block scales attached.

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use weft_backend::{BlockScales, HostMatrix, WeightDtype};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("tensor `{name}` not found in the checkpoint ({where_})")]
    MissingTensor { name: String, where_: String },
    #[error("tensor `{name}` in {file}: shape {got:?}, expected {want:?}")]
    Shape { name: String, file: String, got: Vec<usize>, want: Vec<usize> },
    #[error("tensor `{name}` in {file}: dtype {got:?} is not supported here ({want})")]
    Dtype { name: String, file: String, got: String, want: String },
}

type Result<T> = std::result::Result<T, CheckpointError>;

struct View<'a> {
    dtype: Dtype,
    shape: &'a [usize],
    data: &'a [u8],
}

impl<'a> View<'a> {
    fn shape(&self) -> &'a [usize] {
        self.shape
    }
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn data(&self) -> &'a [u8] {
        self.data
    }
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Start of the data section (8 + header length).
    data_start: usize,
}

/// Where one tensor lives, parsed once from its shard's header.
struct TensorEntry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    range: (usize, usize),
}

/// All safetensors shards of a checkpoint directory, memory-mapped — or, for
/// `--load-format dummy`, no files at all: every tensor asked for is synthesized.
pub struct Checkpoint {
    shards: Vec<Shard>,
    index: HashMap<String, TensorEntry>,
    fp8_block: Option<(usize, usize)>,
    /// Seed of the synthesized tensors (dummy format).
    dummy: Option<u64>,
}

/// Deterministic pseudo-random values for a dummy tensor, from its name and the seed.
fn dummy_values(name: &str, seed: u64, n: usize, scale: f32) -> impl Iterator<Item = f32> {
    let h = weft_backend::dummy::name_hash(name, seed);
    (0..n as u64).map(move |i| weft_backend::dummy::value(h, i) * scale)
}

/// Whether a real block-fp8 checkpoint stores this tensor in fp8: the decoder layers' linear
/// projections (attention, dense MLP, experts); not embeddings, lm_head, norms or the router.
pub fn fp8_in_checkpoints(name: &str) -> bool {
    name.starts_with("model.layers.") && name.ends_with("_proj.weight")
}

fn file_err(path: &Path, reason: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::File { path: path.display().to_string(), reason: reason.to_string() }
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards named by `model.safetensors.index.json`, or
    /// every `*.safetensors` file in `dir` (in name order) when neither exists.
    pub fn open(dir: &Path, fp8_block: Option<(usize, usize)>) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(|e| file_err(&index_path, e))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| file_err(&index_path, format!("not valid JSON: {e}")))?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| file_err(&index_path, "no `weight_map` object"))?;
            let mut names: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else if dir.join("model.safetensors").exists() {
            vec![dir.join("model.safetensors")]
        } else {
            let mut v: Vec<PathBuf> =
                std::fs::read_dir(dir).map_err(|e| file_err(dir, e))?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "safetensors")).collect();
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(file_err(dir, "no *.safetensors weights in this directory"));
        }
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for (i, path) in files.into_iter().enumerate() {
            let f = std::fs::File::open(&path).map_err(|e| file_err(&path, format!("cannot open shard: {e}")))?;
            // SAFETY: read-only map of a file we do not modify; a concurrent truncation by
            // another process is outside what a serving engine can defend against.
            let mmap = unsafe { Mmap::map(&f) }.map_err(|e| file_err(&path, format!("cannot map: {e}")))?;
            // read_metadata checks the header and that the data section covers every tensor.
            let (n, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| file_err(&path, format!("corrupt or truncated safetensors file: {e}")))?;
            for (name, info) in meta.tensors() {
                let entry = TensorEntry { shard: i, dtype: info.dtype, shape: info.shape.clone(), range: info.data_offsets };
                if index.insert(name.clone(), entry).is_some() {
                    return Err(file_err(&path, format!("tensor `{name}` appears in more than one shard")));
                }
            }
            shards.push(Shard { path, mmap, data_start: 8 + n });
        }
        Ok(Checkpoint { shards, index, fp8_block, dummy: None })
    }

    /// vLLM's `--load-format dummy`: no weight files; every matrix is uniform noise scaled
    /// by 1/sqrt(cols) (activations stay bounded through the layers), norms are 1, routing
    /// biases 0. Real shapes can be run and benchmarked from a `config.json` alone. With an fp8
    /// block size (the config's `quantization_config`), the tensors a block-fp8 checkpoint
    /// quantizes are fp8 e4m3 with block scales, as in the real checkpoint.
    pub fn dummy(seed: u64, fp8_block: Option<(usize, usize)>) -> Self {
        Checkpoint { shards: vec![], index: HashMap::new(), fp8_block, dummy: Some(seed) }
    }

    /// The recipe of a dummy matrix stacking the named `(tensor, rows)` parts, `None` for a
    /// checkpoint with files.
    pub fn dummy_spec(&self, name: &str, parts: &[(&str, usize)], cols: usize) -> Option<weft_backend::dummy::DummySpec> {
        let seed = self.dummy?;
        let fp8 = parts.iter().all(|p| fp8_in_checkpoints(p.0));
        Some(weft_backend::dummy::DummySpec::new(
            name,
            parts.iter().map(|&(n, r)| (weft_backend::dummy::name_hash(n, seed), r)).collect(),
            cols,
            1.0 / (cols.max(1) as f32).sqrt(),
            if fp8 { self.fp8_block } else { None },
        ))
    }

    /// The fp8 block (rows, columns) tensor `name` is stored in, `None` when it is not fp8 (or
    /// absent).
    pub fn fp8_block(&self, name: &str) -> Option<(usize, usize)> {
        let fp8 = if self.dummy.is_some() { fp8_in_checkpoints(name) } else { self.index.get(name).is_some_and(|e| e.dtype == Dtype::F8_E4M3) };
        if fp8 {
            self.fp8_block
        } else {
            None
        }
    }

    pub fn is_dummy(&self) -> bool {
        self.dummy.is_some()
    }

    /// Whether the checkpoint has `name` (a dummy checkpoint has no optional tensors: no MTP).
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(|s| s.as_str())
    }

    fn view(&self, name: &str) -> Result<(View<'_>, &Path)> {
        let e = self
            .index
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor { name: name.into(), where_: format!("{} shard(s) searched, e.g. {}", self.shards.len(), self.shards[0].path.display()) })?;
        let shard = &self.shards[e.shard];
        let data = &shard.mmap[shard.data_start + e.range.0..shard.data_start + e.range.1];
        Ok((View { dtype: e.dtype, shape: &e.shape, data }, &shard.path))
    }

    fn float_dtype(name: &str, path: &Path, d: Dtype) -> Result<WeightDtype> {
        match d {
            Dtype::F32 => Ok(WeightDtype::F32),
            Dtype::BF16 => Ok(WeightDtype::Bf16),
            Dtype::F16 => Ok(WeightDtype::F16),
            Dtype::F8_E4M3 => Ok(WeightDtype::Fp8E4M3),
            other => Err(CheckpointError::Dtype { name: name.into(), file: path.display().to_string(), got: format!("{other:?}"), want: "expected bf16, f16, f32 or fp8 e4m3".into() }),
        }
    }

    /// A 2-D weight `[rows, cols]`; fp8 weights come with their `<name>_scale_inv` block scales.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<HostMatrix<'_>> {
        if let Some(spec) = self.dummy_spec(name, &[(name, rows)], cols) {
            return Ok(spec.host());
        }
        let (v, path) = self.view(name)?;
        if v.shape() != [rows, cols] {
            return Err(CheckpointError::Shape { name: name.into(), file: path.display().to_string(), got: v.shape().to_vec(), want: vec![rows, cols] });
        }
        let dtype = Self::float_dtype(name, path, v.dtype())?;
        let scales = if dtype == WeightDtype::Fp8E4M3 {
            let (br, bc) = self.fp8_block.ok_or_else(|| CheckpointError::Dtype {
                name: name.into(),
                file: path.display().to_string(),
                got: "F8_E4M3".into(),
                want: "config.json has no quantization_config.weight_block_size for fp8 weights".into(),
            })?;
            let sname = format!("{}_scale_inv", name);
            let grid = vec![rows.div_ceil(br), cols.div_ceil(bc)];
            let scales = self.vector_shaped(&sname, &grid)?;
            Some(BlockScales { block_rows: br, block_cols: bc, scales })
        } else {
            None
        };
        Ok(HostMatrix { name: name.into(), rows, cols, dtype, bytes: std::borrow::Cow::Borrowed(v.data()), scales })
    }

    /// A 1-D float tensor of `len` elements, as f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vector_shaped(name, &[len])
    }

    fn vector_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        if let Some(seed) = self.dummy {
            let n = shape.iter().product();
            return Ok(if name.ends_with("norm.weight") {
                vec![1.0; n]
            } else if name.ends_with("e_score_correction_bias") {
                vec![0.0; n]
            } else {
                dummy_values(name, seed, n, 0.1).collect()
            });
        }
        let (v, path) = self.view(name)?;
        if v.shape() != shape {
            return Err(CheckpointError::Shape { name: name.into(), file: path.display().to_string(), got: v.shape().to_vec(), want: shape.to_vec() });
        }
        let dtype = Self::float_dtype(name, path, v.dtype())?;
        if dtype == WeightDtype::Fp8E4M3 {
            return Err(CheckpointError::Dtype { name: name.into(), file: path.display().to_string(), got: "F8_E4M3".into(), want: "norms, biases and scales must be bf16/f16/f32".into() });
        }
        Ok(weft_backend::dtype::vector_to_f32(dtype, v.data()))
    }
}
