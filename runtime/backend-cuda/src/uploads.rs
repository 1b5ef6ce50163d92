//! Content-keyed cache of the small host arrays ops take (positions, cache slots, block tables,
//! RoPE frequencies). A forward step passes the same arrays to every layer; with the cache they
//! cross to the device once per step instead of once per layer. Entries are immutable device
//! copies, compared by content on every hit (never by address), so a reused host buffer with
//! new contents is a miss, not a stale hit.

use crate::{dev, CudaBackend};
use cudarc::driver::CudaSlice;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use weft_backend::Result;

/// Entries kept before the cache is emptied (a step uses a handful; many distinct steps
/// between clears only cost re-uploads).
const MAX_ENTRIES: usize = 256;

#[derive(Default)]
pub struct UploadCache {
    map: Mutex<HashMap<u64, Vec<(Vec<u32>, Arc<CudaSlice<u32>>)>>>,
}

fn hash(v: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

impl CudaBackend {
    /// A device copy of `v` (at least one element long), shared with earlier identical uploads.
    pub(crate) fn cached_u32(&self, v: &[u32]) -> Result<Arc<CudaSlice<u32>>> {
        let key = hash(v);
        let mut map = self.uploads.map.lock().unwrap();
        if let Some(hit) = map.get(&key).and_then(|b| b.iter().find(|e| e.0 == v)).map(|e| e.1.clone()) {
            drop(map);
            // A step being recorded reads this buffer on every replay: keep it alive as long
            // as the recording, whatever the cache does.
            if let Some(rec) = self.recording.lock().unwrap().as_mut() {
                rec.keep.push(hit.clone());
            }
            return Ok(hit);
        }
        self.no_capture("an upload-cache miss")?;
        if map.values().map(Vec::len).sum::<usize>() >= MAX_ENTRIES {
            // Freed in stream order: kernels already queued with these buffers still see them.
            map.clear();
        }
        let dev_copy = Arc::new(if v.is_empty() { self.stream.alloc_zeros::<u32>(1).map_err(dev)? } else { self.stream.clone_htod(v).map_err(dev)? });
        map.entry(key).or_default().push((v.to_vec(), dev_copy.clone()));
        Ok(dev_copy)
    }

    /// f32 values through the same cache, as their bit patterns (kernels take them as
    /// `const float*`; a device pointer does not carry its element type).
    pub(crate) fn cached_f32_bits(&self, v: &[f32]) -> Result<Arc<CudaSlice<u32>>> {
        let bits: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
        self.cached_u32(&bits)
    }
}
