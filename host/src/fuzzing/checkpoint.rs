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

/// The shard index's name and the one shard the genuine folder is split
/// into by [`load_sharded`].
pub const SHARD_INDEX: &str = "model.safetensors.index.json";
/// The shard holding the genuine tensors.
pub const SHARD: &str = "model-00001-of-00001.safetensors";

/// Loads the genuine folder saved as one shard (`SHARD`) with `index`
/// as its `model.safetensors.index.json`, so the index is what is read.
pub fn load_sharded(index: &[u8]) -> Result<Transformer, ModelError> {
    let f = folder();
    let _one = f.lock.lock().unwrap_or_else(|e| e.into_inner());
    let put = |name: &str, bytes: &[u8]| {
        let path = f.dir.join(name);
        std::fs::write(&path, bytes).map_err(|error| ModelError::Io { path, error })
    };
    put("config.json", &f.config)?;
    put(SHARD, &f.safetensors)?;
    put(SHARD_INDEX, index)?;
    let single = f.dir.join("model.safetensors");
    let _ = std::fs::remove_file(&single);
    let loaded = Transformer::load(&f.dir);
    put("model.safetensors", &f.safetensors)?;
    loaded
}

/// A genuine index: every tensor of the genuine file in `SHARD`.
pub fn genuine_index() -> Vec<u8> {
    let names = safetensors::SafeTensors::deserialize(&folder().safetensors)
        .map(|t| t.names().into_iter().map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_default();
    let map: serde_json::Map<String, serde_json::Value> = names
        .into_iter()
        .map(|n| (n, serde_json::Value::String(SHARD.into())))
        .collect();
    serde_json::to_vec(&serde_json::json!({ "weight_map": map })).unwrap_or_default()
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

    #[test]
    fn the_genuine_index_loads_and_a_path_outside_is_refused() {
        let genuine = load_sharded(&genuine_index()).expect("the genuine index loads");
        assert!(matches!(genuine, Transformer::Encoder(_)));
        let outside = String::from_utf8(genuine_index())
            .unwrap()
            .replace(SHARD, "../x.safetensors");
        assert!(matches!(
            load_sharded(outside.as_bytes()),
            Err(ModelError::Json { .. })
        ));
        assert!(
            load_checkpoint(None, None).is_ok(),
            "the single file is back"
        );
    }
}
