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
    find_home(
        std::env::var_os("EFOPT_HOME").map(PathBuf::from),
        Path::new(env!("CARGO_MANIFEST_DIR")),
        std::env::current_exe().ok(),
    )
}

/// [`home`] from the environment's `EFOPT_HOME`, the build checkout and the binary's path.
fn find_home(explicit: Option<PathBuf>, built: &Path, exe: Option<PathBuf>) -> PathBuf {
    if let Some(h) = explicit {
        return h;
    }
    if holds_scripts(built) {
        return built.to_path_buf();
    }
    exe.and_then(|e| {
        e.ancestors()
            .skip(1)
            .find(|d| holds_scripts(d))
            .map(Path::to_path_buf)
    })
    .unwrap_or_else(|| built.to_path_buf())
}

/// The Python that runs the scripts: `explicit` (a pass option), else `$EFOPT_PYTHON`, else
/// the checkout's `.venv/bin/python`.
pub fn python(explicit: Option<String>) -> String {
    explicit
        .or_else(|| std::env::var("EFOPT_PYTHON").ok())
        .unwrap_or_else(|| home().join(".venv/bin/python").display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary copied with its checkout to a machine where the build path does not exist
    /// finds the scripts above itself; `EFOPT_HOME` wins; the build checkout comes first.
    #[test]
    fn scripts_are_found_beside_a_copied_binary() {
        let root = std::env::temp_dir().join(format!("efopt-support-{}", std::process::id()));
        let copy = root.join("copy");
        std::fs::create_dir_all(copy.join("python")).unwrap();
        std::fs::create_dir_all(copy.join("target/release")).unwrap();
        std::fs::write(copy.join("python/efopt_triton.py"), "").unwrap();
        let exe = Some(copy.join("target/release/efopt"));
        let gone = root.join("built-elsewhere");
        assert_eq!(find_home(None, &gone, exe.clone()), copy);
        assert_eq!(
            find_home(Some(root.join("h")), &gone, exe.clone()),
            root.join("h")
        );
        assert_eq!(find_home(None, &copy, Some(gone.join("efopt"))), copy);
        // Nothing anywhere: the build checkout, so the error names a real expectation.
        assert_eq!(find_home(None, &gone, Some(gone.join("efopt"))), gone);
        let _ = std::fs::remove_dir_all(&root);
    }
}
