//! The kernels' CUDA C source, as NVRTC compiles it, and the checked-in PTX
//! made from it.

/// The files of `kernels/`, in the order they are put together: the shared
/// prelude first.
pub const FILES: [(&str, &str); 3] = [
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("fss.cu", include_str!("../kernels/fss.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
];

/// The virtual architecture of the checked-in PTX: Ampere (sm_80) and
/// later JIT-compile it.
pub const PTX_ARCH: &str = "compute_80";

/// The checked-in PTX (`kernels/ptx/suffuse.ptx`): what a device loads
/// when NVRTC is missing. It begins with [`ptx_header`], the line naming
/// the source it was compiled from; `cargo xtask cuda-check` fails when
/// that is not [`source`] today.
pub const PTX: &str = include_str!("../kernels/ptx/suffuse.ptx");

/// The first line of the checked-in PTX: a PTX comment naming the
/// [`source_hash`] it was compiled from.
///
/// The file is matched by this line rather than byte for byte against a
/// fresh compilation, because NVRTC 12.9 does not always make the same PTX
/// of the same source: since the pair-key kernels (forty-second session)
/// repeated compilations differ in where a few shared-memory loads of AES
/// round keys are placed (docs/BACKENDS.md, "Pair keys … in the kernels").
pub fn ptx_header() -> String {
    format!("// suffuse kernel source {}\n", source_hash())
}

/// Whether the checked-in PTX was compiled from today's [`source`].
pub fn ptx_is_current() -> bool {
    PTX.starts_with(&ptx_header())
}

/// The whole program: every file of [`FILES`] behind a line naming it.
pub fn source() -> String {
    let mut text = String::new();
    for (name, body) in FILES {
        text.push_str("// ---- kernels/");
        text.push_str(name);
        text.push('\n');
        text.push_str(body);
        text.push('\n');
    }
    text
}

/// A short hex digest of [`source`], which names cached compilations.
pub fn source_hash() -> String {
    let digest = blake3::hash(source().as_bytes());
    digest.to_hex()[..16].to_owned()
}
