//! The cluster file's model configs read from disk: `cluster::spec` resolves a cluster YAML
//! without I/O and asks this reader for a pool's `model_config` file and for
//! `--model-dir`'s `<normalised model>/config.json`.

use std::path::{Path, PathBuf};

use crate::cluster::spec::ModelFiles;

/// Model configs from the file system, with an optional model directory.
#[derive(Clone, Debug, Default)]
pub struct FsModelFiles {
    model_dir: Option<PathBuf>,
}

impl FsModelFiles {
    /// A reader of `model_config` files and of `model_dir` (if any).
    pub fn new(model_dir: Option<&Path>) -> Self {
        Self {
            model_dir: model_dir.map(Path::to_path_buf),
        }
    }
}

impl ModelFiles for FsModelFiles {
    fn read(&self, file: &str) -> Result<String, String> {
        std::fs::read_to_string(file).map_err(|err| err.to_string())
    }

    fn in_model_dir(&self, model: &str) -> Result<Option<String>, String> {
        let Some(dir) = &self.model_dir else {
            return Ok(None);
        };
        let file = dir.join(model).join("config.json");
        match std::fs::read_to_string(&file) {
            Ok(text) => Ok(Some(text)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(format!("{}: {err}", file.display())),
        }
    }
}
