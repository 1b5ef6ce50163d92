//! Tensor-parallel collectives over NCCL (RCCL in the HIP build, through `weft_hip_driver::nccl`,
//! which also has a host-memory group for the mock runtime): one communicator per rank, each bound to its rank's
//! backend stream, so an all-reduce is ordered with the kernels around it and can be recorded
//! into the rank's step graphs ([`Collective::recordable`]). One process, one thread per GPU
//! (`weft_model::tp::Followers`); communicators come from `ncclCommInitAll` over the ranks'
//! devices, which must be distinct (NCCL refuses two ranks on one GPU — a one-GPU machine
//! checks the sharded math with `LocalGroup` instead). NCCL is loaded at run time
//! (`libnccl.so` on the loader path; the pip wheel `nvidia-nccl-cu13` ships `libnccl.so.2`,
//! which needs a `libnccl.so` link): without it, building a group is `Unavailable`.
//! Keep NVLink SHARP multicast off on shared machines (`NCCL_NVLS_ENABLE=0`).

use crate::{CudaBackend, BACKEND};
use cudarc::driver::CudaSlice;
use cudarc::nccl::safe::{Comm, ReduceOp};
use std::sync::{Arc, Mutex};
use weft_backend::{BackendError, Collective, Result};

/// Rank `rank` of an NCCL group.
pub struct NcclRank {
    comm: Mutex<Comm>,
    rank: usize,
    size: usize,
    /// Shared by the group's ranks: the first failure, after which every rank's collectives
    /// error.
    failed: Arc<Mutex<Option<String>>>,
}

// SAFETY: the communicator is a handle NCCL allows any thread to use one call at a time; the
// mutex serialises the calls (each rank's forward pass runs on one thread anyway).
unsafe impl Send for NcclRank {}
unsafe impl Sync for NcclRank {}

/// Whether the NCCL library can be loaded here.
pub fn nccl_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// An NCCL group over `ranks` (rank order = slice order), one backend per device.
pub fn nccl_group(ranks: &[&CudaBackend]) -> Result<Vec<Arc<NcclRank>>> {
    if !nccl_available() {
        let lib = if cfg!(feature = "cuda") { "NCCL library (libnccl.so)" } else { "RCCL library (librccl.so)" };
        return Err(BackendError::Unavailable { backend: BACKEND, reason: format!("the {lib} is not on the loader path") });
    }
    let mut ordinals: Vec<usize> = ranks.iter().map(|b| b.stream.context().ordinal()).collect();
    ordinals.sort_unstable();
    if ordinals.windows(2).any(|w| w[0] == w[1]) {
        return Err(BackendError::Device(format!("NCCL needs one GPU per rank; devices {ordinals:?} repeat one (use the host-memory group on one GPU)")));
    }
    let comms = Comm::from_devices(ranks.iter().map(|b| b.stream.clone()).collect()).map_err(|e| BackendError::Device(format!("NCCL communicators for {} ranks: {e:?}", ranks.len())))?;
    let (size, failed) = (comms.len(), Arc::new(Mutex::new(None)));
    Ok(comms.into_iter().enumerate().map(|(rank, comm)| Arc::new(NcclRank { comm: Mutex::new(comm), rank, size, failed: failed.clone() })).collect())
}

impl Collective<CudaBackend> for NcclRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, _be: &CudaBackend, x: &mut CudaSlice<f32>) -> Result<()> {
        if let Some(why) = self.failed.lock().unwrap().as_ref() {
            return Err(BackendError::Device(format!("tensor-parallel group failed: {why}")));
        }
        self.comm.lock().unwrap().all_reduce_in_place(x, &ReduceOp::Sum).map_err(|e| BackendError::Device(format!("NCCL all-reduce of {} floats on rank {}: {e:?}", x.len(), self.rank)))?;
        Ok(())
    }

    fn recordable(&self) -> bool {
        true
    }

    /// Marks the whole group failed: every rank's later collectives error. A collective a peer
    /// has already enqueued still waits for this rank's part (NCCL cancels only by destroying
    /// the communicator); the tensor-parallel driver stops every rank at the same step.
    fn abort(&self, reason: &str) {
        self.failed.lock().unwrap().get_or_insert_with(|| reason.to_string());
    }
}
