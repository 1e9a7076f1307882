//! `write_vectors ROOT`: rewrites the known-answer vectors of the current
//! version under the vectors root `ROOT` (so `ROOT/v1/...`) through
//! [`suffuse_tests::vectors::write_all`]. `cargo xtask vectors` runs it with
//! `tests/vectors` from the workspace root.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: write_vectors VECTORS_ROOT");
        return ExitCode::from(2);
    };
    match suffuse_tests::vectors::write_all(Path::new(&dir)) {
        Ok(()) => {
            println!(
                "wrote {}",
                suffuse_tests::vectors::file_path(Path::new(&dir)).display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("write_vectors: writing {dir}: {e}");
            ExitCode::FAILURE
        }
    }
}
