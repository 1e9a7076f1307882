//! The race check of the CUDA kernels: the small cases of the conformance
//! harness on the emulated kernels. `cargo xtask cuda-tsan` runs it twice
//! under ThreadSanitizer, with the emulator library built with
//! `-fsanitize=thread` (`SUFFUSE_EMU_LIBRARY`): the clean kernels must run
//! without a report, and the kernels with the planted missing
//! `__syncthreads` must be reported.

use std::process::ExitCode;

use suffuse_accel_cuda::CudaEval;
use suffuse_tests::conformance::{self, Scope};

fn main() -> ExitCode {
    let eval = CudaEval::emulated().with_device_hash_min(0);
    eprintln!("emulator: {}", eval.launcher().origin());
    let report = conformance::run_in(&eval, Scope::Small);
    eprintln!(
        "cuda-emu, small cases: {} calls, {} outputs compared, {} failure(s)",
        report.calls,
        report.outputs,
        report.failures.len()
    );
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        eprintln!("{}", report.failure_summary());
        ExitCode::FAILURE
    }
}
