//! `hip-mock` only: the mock HIP runtime's kernel launcher — every kernel of `kernels/` run on
//! the CPU emulator (`kernels/emu/launch.cpp`, linked by build.rs) with 64-lane sub-groups, as
//! on AMD Instinct wavefronts.

use std::ffi::{c_char, c_int, c_void, CString};
use weft_hip_driver::{DriverError, Launch, Res};

extern "C" {
    fn weft_emu_has(name: *const c_char) -> c_int;
    fn weft_emu_set_warp(lanes: u32);
    #[allow(clippy::too_many_arguments)]
    fn weft_emu_launch(name: *const c_char, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, args: *mut *mut c_void) -> c_int;
}

struct Emulator;

impl weft_hip_driver::mock::Launcher for Emulator {
    fn has(&self, kernel: &str) -> bool {
        let c = CString::new(kernel).unwrap_or_default();
        // SAFETY: a NUL-terminated name.
        unsafe { weft_emu_has(c.as_ptr()) != 0 }
    }

    unsafe fn launch(&self, kernel: &str, l: Launch, args: &mut [*mut c_void]) -> Res<()> {
        let c = CString::new(kernel).unwrap_or_default();
        match weft_emu_launch(c.as_ptr(), l.grid.0, l.grid.1, l.grid.2, l.block.0, l.block.1, l.block.2, l.shared, args.as_mut_ptr()) {
            0 => Ok(()),
            1 => Err(DriverError(format!("emulator: no kernel {kernel}"))),
            _ => Err(DriverError(format!("emulator: {kernel} launched with {l:?}: only 1-D blocks and 256 KB of dynamic shared memory are emulated"))),
        }
    }
}

/// Installs the emulator as the mock runtime's launcher, with `lanes`-wide sub-groups.
pub fn install(lanes: u32) {
    // SAFETY: sets a global read by launches, which the mock runs one at a time.
    unsafe { weft_emu_set_warp(lanes) };
    weft_hip_driver::mock::install(Box::new(Emulator));
}
