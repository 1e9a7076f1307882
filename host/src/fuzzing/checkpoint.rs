//! A Hugging Face folder whose `config.json` or `model.safetensors` is the
//! fuzzer's: a tiny generated encoder's folder is written once per process,
//! then each input replaces one file and the folder is loaded through
//! [`Transformer::load`], the loader `suffuse` runs. Going through files
//! keeps the loader unchanged; it costs a write and a read per input.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::model::{ModelError, Transformer};

/// The genuine folder and its two files, as written.
struct Folder {
    dir: PathBuf,
    config: Vec<u8>,
    safetensors: Vec<u8>,
    /// One input at a time: the folder is shared by the process.
    lock: Mutex<()>,
}

fn folder() -> &'static Folder {
    static FOLDER: OnceLock<Folder> = OnceLock::new();
    FOLDER.get_or_init(|| write().unwrap_or_else(|e| panic!("the checkpoint fixture: {e}")))
}

fn write() -> Result<Folder, String> {
    let dir = std::env::temp_dir().join(format!("suffuse-fuzz-checkpoint-{}", std::process::id()));
    super::tiny_model()
        .write_dir(&dir)
        .map_err(|e| e.to_string())?;
    let read = |name: &str| std::fs::read(dir.join(name)).map_err(|e| format!("{name}: {e}"));
    Ok(Folder {
        config: read("config.json")?,
        safetensors: read("model.safetensors")?,
        dir,
        lock: Mutex::new(()),
    })
}

/// The genuine folder's `config.json`.
pub fn genuine_config() -> &'static [u8] {
    &folder().config
}

/// The genuine folder's `model.safetensors`.
pub fn genuine_safetensors() -> &'static [u8] {
    &folder().safetensors
}

/// Loads the folder with `config.json` and `model.safetensors` replaced by
/// the given bytes (`None`: the genuine file).
pub fn load_checkpoint(
    config: Option<&[u8]>,
    safetensors: Option<&[u8]>,
) -> Result<Transformer, ModelError> {
    let f = folder();
    let _one = f.lock.lock().unwrap_or_else(|e| e.into_inner());
    let put = |name: &str, bytes: &[u8]| {
        let path = f.dir.join(name);
        std::fs::write(&path, bytes).map_err(|error| ModelError::Io { path, error })
    };
    put("config.json", config.unwrap_or(&f.config))?;
    put("model.safetensors", safetensors.unwrap_or(&f.safetensors))?;
    Transformer::load(&f.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_genuine_folder_loads_and_a_cut_header_is_refused() {
        let genuine = load_checkpoint(None, None).expect("the genuine folder loads");
        assert!(matches!(genuine, Transformer::Encoder(_)));
        let cut = &genuine_safetensors()[..12];
        assert!(matches!(
            load_checkpoint(None, Some(cut)),
            Err(ModelError::Safetensors { .. })
        ));
        assert!(load_checkpoint(Some(b"{}"), None).is_err());
        assert!(load_checkpoint(None, None).is_ok());
    }
}
