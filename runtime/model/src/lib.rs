//! DeepSeek-V3-family models (DeepSeek-V3/R1, Kimi-K2, Moonlight) as published on Hugging Face:
//! configuration, checkpoint files, tokenizer and chat template, the forward graph over a
//! [`weft_backend::Backend`], and a single-sequence reference generator.

pub mod checkpoint;
pub mod config;
pub mod dflash;
pub mod generate;
pub mod graph;
pub mod sampling;
pub mod shard;
pub mod tokenizer;
pub mod tp;
pub mod weights;

pub use config::ModelConfig;
pub use graph::{DeepseekV3, StepBatch};

use std::path::{Path, PathBuf};
use weft_backend::Backend;

/// Every way opening a model directory can fail, each naming the file or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model directory {0}: does not exist or is not a directory")]
    NoDir(String),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Load(#[from] weights::LoadError),
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    #[error(transparent)]
    Backend(#[from] weft_backend::BackendError),
    #[error("{0}")]
    Request(String),
}

/// A model directory opened and loaded onto a backend, with its tokenizer.
pub struct LoadedModel<B: Backend> {
    pub dir: PathBuf,
    pub model: DeepseekV3<B>,
    pub tokenizer: tokenizer::TextTokenizer,
    pub defaults: tokenizer::GenerationDefaults,
}

/// What to load beyond the forward pass.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// The checkpoint's multi-token-prediction layers (for the MTP drafter).
    pub mtp: bool,
    /// On a tensor-parallel group: each rank holds whole routed experts (an even range of
    /// them) instead of a slice of every expert (`weft_backend::Shard`).
    pub expert_parallel: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { mtp: true, expert_parallel: false }
    }
}

impl<B: Backend> LoadedModel<B> {
    /// Everything in the checkpoint ([`LoadOptions::default`]).
    pub fn open(dir: &Path, backend: B) -> Result<Self, ModelError> {
        Self::open_with(dir, backend, LoadOptions::default())
    }

    /// [`Self::open`], loading what `opts` asks for.
    pub fn open_with(dir: &Path, backend: B, opts: LoadOptions) -> Result<Self, ModelError> {
        Self::open_part(dir, backend, opts, None, None)
    }

    /// Rank `group.rank()` of a tensor-parallel group of `group.size()` ranks: only that rank's
    /// shard of each weight is read and uploaded (`shard.rs` says which), and the forward pass
    /// sums partial results over `group`. Every rank runs the same steps; each gets the same
    /// logits. Errors when the model's heads or intermediate sizes do not split evenly.
    pub fn open_shard(dir: &Path, backend: B, opts: LoadOptions, group: std::sync::Arc<dyn weft_backend::Collective<B>>) -> Result<Self, ModelError> {
        Self::open_part(dir, backend, opts, Some(group), None)
    }

    /// A tensor-parallel group of `size` ranks in this process (threads exchanging through
    /// host memory, `weft_backend::LocalGroup`): rank 0, on `lead`, is returned and drives the
    /// others ([`tp::Followers`]), each on a backend from `backend(rank)` — the CPU, or the
    /// same GPU for every rank on a one-GPU machine. Steps then run op by op on every rank.
    pub fn open_tensor_parallel(dir: &Path, size: usize, opts: LoadOptions, lead: B, backend: impl Fn(usize) -> Result<B, weft_backend::BackendError>) -> Result<Self, ModelError> {
        Self::open_local_group(dir, None, size, opts, lead, backend)
    }

    /// [`Self::open_tensor_parallel`] with `--load-format dummy` weights ([`Self::open_dummy`]):
    /// each rank synthesizes only its shard, the same values an unsharded dummy model holds there.
    pub fn open_dummy_tensor_parallel(
        dir: &Path,
        tokenizer_dir: &Path,
        size: usize,
        opts: LoadOptions,
        lead: B,
        backend: impl Fn(usize) -> Result<B, weft_backend::BackendError>,
    ) -> Result<Self, ModelError> {
        Self::open_local_group(dir, Some(tokenizer_dir), size, opts, lead, backend)
    }

    fn open_local_group(dir: &Path, dummy: Option<&Path>, size: usize, opts: LoadOptions, lead: B, backend: impl Fn(usize) -> Result<B, weft_backend::BackendError>) -> Result<Self, ModelError> {
        let group = weft_backend::LocalGroup::new(size.max(1));
        let mut backends = vec![lead];
        for r in 1..size {
            backends.push(backend(r)?);
        }
        let ranks = (0..size.max(1)).map(|r| -> std::sync::Arc<dyn weft_backend::Collective<B>> { std::sync::Arc::new(group.rank(r)) }).collect();
        Self::open_group(dir, dummy, opts, backends, ranks)
    }

    /// A tensor-parallel group over given ranks: `backends[r]` and `ranks[r]` (its handle of
    /// any [`weft_backend::Collective`], e.g. NCCL with one GPU per rank) for each rank, rank 0
    /// first; rank 0 is returned and drives the others as in [`Self::open_tensor_parallel`].
    /// Each rank reads (or, `--load-format dummy`, generates) only its shard, on its own backend.
    pub fn open_tensor_parallel_group(dir: &Path, opts: LoadOptions, backends: Vec<B>, ranks: Vec<std::sync::Arc<dyn weft_backend::Collective<B>>>) -> Result<Self, ModelError> {
        Self::open_group(dir, None, opts, backends, ranks)
    }

    /// [`Self::open_tensor_parallel_group`] with dummy weights ([`Self::open_dummy`]).
    pub fn open_dummy_tensor_parallel_group(
        dir: &Path,
        tokenizer_dir: &Path,
        opts: LoadOptions,
        backends: Vec<B>,
        ranks: Vec<std::sync::Arc<dyn weft_backend::Collective<B>>>,
    ) -> Result<Self, ModelError> {
        Self::open_group(dir, Some(tokenizer_dir), opts, backends, ranks)
    }

    fn open_group(dir: &Path, dummy: Option<&Path>, opts: LoadOptions, backends: Vec<B>, ranks: Vec<std::sync::Arc<dyn weft_backend::Collective<B>>>) -> Result<Self, ModelError> {
        if backends.is_empty() || backends.len() != ranks.len() || ranks.iter().enumerate().any(|(r, g)| g.rank() != r || g.size() != ranks.len()) {
            return Err(ModelError::Backend(weft_backend::BackendError::Device(format!(
                "a tensor-parallel group needs one backend per rank, ranks 0..n in order ({} backends, {} ranks)",
                backends.len(),
                ranks.len()
            ))));
        }
        // Ranks load in parallel, each onto its own backend (device uploads and dummy
        // generation overlap across GPUs).
        let mut parts = std::thread::scope(|s| {
            let loads: Vec<_> = backends.into_iter().zip(ranks).map(|(b, g)| s.spawn(move || Self::open_part(dir, b, opts, Some(g), dummy))).collect();
            loads.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(ModelError::Request("a tensor-parallel rank panicked while loading".into())))).collect::<Result<Vec<_>, _>>()
        })?;
        let mut lead = parts.remove(0);
        lead.model.set_followers(tp::Followers::start(parts).map_err(|e| ModelError::Backend(weft_backend::BackendError::Device(format!("tensor-parallel threads: {e}"))))?);
        Ok(lead)
    }

    /// One model or one rank's shard (`group`), from the checkpoint files or, with `dummy` (the
    /// tokenizer's directory when `dir` has none), synthesized weights.
    fn open_part(dir: &Path, backend: B, opts: LoadOptions, group: Option<std::sync::Arc<dyn weft_backend::Collective<B>>>, dummy: Option<&Path>) -> Result<Self, ModelError> {
        if !dir.is_dir() {
            return Err(ModelError::NoDir(dir.display().to_string()));
        }
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let tdir = match dummy {
            Some(t) if !dir.join("tokenizer.json").exists() => t,
            _ => dir,
        };
        let tokenizer = tokenizer::TextTokenizer::from_dir(tdir)?;
        let defaults = tokenizer::GenerationDefaults::from_dir(dir)?;
        let ck = match dummy {
            Some(_) => checkpoint::Checkpoint::dummy(0x5eed, cfg.fp8_block),
            None => checkpoint::Checkpoint::open(dir, cfg.fp8_block)?,
        };
        let shard = group.as_ref().map_or(weft_backend::Shard::WHOLE, |g| weft_backend::Shard::of(g.rank(), g.size(), opts.expert_parallel));
        let weights = weights::ModelWeights::load_shard(&ck, &cfg, &backend, opts.mtp, shard)?;
        let mut model = DeepseekV3::new(cfg, weights, backend);
        if let Some(g) = group {
            model.set_group(g);
        }
        Ok(LoadedModel { dir: dir.to_path_buf(), model, tokenizer, defaults })
    }

    /// `--load-format dummy`: the architecture from `dir/config.json`, synthesized weights (see
    /// [`checkpoint::Checkpoint::dummy`]); the tokenizer from `dir` when it has one, else from
    /// `tokenizer_dir` (ids beyond that tokenizer decode to nothing).
    pub fn open_dummy(dir: &Path, backend: B, tokenizer_dir: &Path) -> Result<Self, ModelError> {
        Self::open_dummy_with(dir, backend, tokenizer_dir, LoadOptions::default())
    }

    /// [`Self::open_dummy`], synthesizing what `opts` asks for.
    pub fn open_dummy_with(dir: &Path, backend: B, tokenizer_dir: &Path, opts: LoadOptions) -> Result<Self, ModelError> {
        Self::open_part(dir, backend, opts, None, Some(tokenizer_dir))
    }

    /// Stop token ids: generation_config's, else config.json's, else the tokenizer's EOS.
    pub fn eos_ids(&self) -> Vec<u32> {
        if !self.defaults.eos_token_ids.is_empty() {
            return self.defaults.eos_token_ids.clone();
        }
        if !self.model.cfg.eos_token_ids.is_empty() {
            return self.model.cfg.eos_token_ids.clone();
        }
        self.tokenizer.eos_token.as_deref().and_then(|t| self.tokenizer.token_to_id(t)).into_iter().collect()
    }
}
