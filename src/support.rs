//! Where efopt's support files live: the Python scripts `triton-check` and `tune` run
//! (`python/efopt_triton.py`, `python/efopt_cuda.py`) and the checkout's `.venv`.
//!
//! A binary copied away from the checkout it was built in (onto a GPU machine, say) still
//! finds them: `$EFOPT_HOME` first, then the checkout the binary was built from, then the
//! nearest folder above the binary that holds `python/efopt_triton.py` (a checkout's
//! `target/release/efopt` finds its own checkout).

use std::path::{Path, PathBuf};

fn holds_scripts(dir: &Path) -> bool {
    dir.join("python/efopt_triton.py").is_file()
}

/// The folder that holds `python/` (and `.venv/`, where `scripts/setup-venv.sh` made one).
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("EFOPT_HOME") {
        return PathBuf::from(h);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR"));
    if holds_scripts(built) {
        return built.to_path_buf();
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.ancestors().skip(1).find(|d| holds_scripts(d)) {
            return dir.to_path_buf();
        }
    }
    built.to_path_buf()
}

/// The Python that runs the scripts: `explicit` (a pass option), else `$EFOPT_PYTHON`, else
/// the checkout's `.venv/bin/python`.
pub fn python(explicit: Option<String>) -> String {
    explicit
        .or_else(|| std::env::var("EFOPT_PYTHON").ok())
        .unwrap_or_else(|| home().join(".venv/bin/python").display().to_string())
}
