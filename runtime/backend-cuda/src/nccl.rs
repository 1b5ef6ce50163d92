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

/// The communicators of one group, one per rank; `None` once the group is aborted.
type Comms = Arc<Vec<Mutex<Option<Comm>>>>;

/// Rank `rank` of an NCCL group.
pub struct NcclRank {
    comms: Comms,
    rank: usize,
    size: usize,
    /// Shared by the group's ranks: the first failure, after which every rank's collectives
    /// error.
    failed: Arc<Mutex<Option<String>>>,
}

// SAFETY: a communicator is a handle NCCL allows any thread to use one call at a time; each
// sits behind its mutex (each rank's forward pass runs on one thread anyway).
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
    let size = comms.len();
    let comms: Comms = Arc::new(comms.into_iter().map(|c| Mutex::new(Some(c))).collect());
    let failed = Arc::new(Mutex::new(None));
    Ok((0..size).map(|rank| Arc::new(NcclRank { comms: comms.clone(), rank, size, failed: failed.clone() })).collect())
}

impl Collective<CudaBackend> for NcclRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, _be: &CudaBackend, x: &mut CudaSlice<f32>) -> Result<()> {
        if let Some(why) = self.failure() {
            return Err(BackendError::Device(format!("tensor-parallel group failed: {why}")));
        }
        let comm = self.comms[self.rank].lock().unwrap();
        let Some(comm) = comm.as_ref() else {
            return Err(BackendError::Device("tensor-parallel group failed: its communicators were aborted".into()));
        };
        comm.all_reduce_in_place(x, &ReduceOp::Sum).map_err(|e| BackendError::Device(format!("NCCL all-reduce of {} floats on rank {}: {e:?}", x.len(), self.rank)))?;
        Ok(())
    }

    fn recordable(&self) -> bool {
        true
    }

    /// Marks the whole group failed (every rank's later collectives and steps error) and
    /// aborts every rank's communicator (`ncclCommAbort`, through dropping it): a collective
    /// a peer has already enqueued — which would wait on its GPU for this rank's part forever —
    /// exits, so no rank's stream hangs. A communicator whose rank is inside an NCCL call for
    /// more than two seconds is left alone (that rank errors on its next collective instead).
    fn abort(&self, reason: &str) {
        {
            let mut failed = self.failed.lock().unwrap();
            if failed.is_some() {
                return; // already failed, and aborted by whoever failed it first
            }
            *failed = Some(reason.to_string());
        }
        for (r, slot) in self.comms.iter().enumerate() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let comm = loop {
                match slot.try_lock() {
                    Ok(mut c) => break c.take(),
                    Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(1)),
                    Err(_) => {
                        tracing::warn!(rank = r, "NCCL communicator busy for 2 s: not aborted");
                        break None;
                    }
                }
            };
            // cudarc's Drop aborts the communicator and panics if NCCL reports an error there.
            if let Some(c) = comm {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(c))).is_err() {
                    tracing::warn!(rank = r, "ncclCommAbort reported an error");
                }
            }
        }
    }

    fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap().clone()
    }
}
