//! Launch plans: how one host function of a generated module runs at one schedule, with its
//! kernels compiled for the GPU — asked of `python/efopt_cuda.py`, which runs the host
//! function on placeholder tensors, records each launch and compiles each kernel with
//! `triton.compile` (cached on disk by a hash of source, signature, constants, options and
//! target). The GPU side ([`super::cuda`]) only loads and launches what a plan says.

use super::Config;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize)]
pub struct LaunchPlan {
    pub triton: String,
    pub buffers: Vec<BufferSpec>,
    /// Buffer ids of the results, in order.
    pub outputs: Vec<usize>,
    pub launches: Vec<Launch>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct BufferSpec {
    pub id: usize,
    pub shape: Vec<u64>,
    /// `bfloat16`, `float16`, `float32`, `int32` or `bool`.
    pub dtype: String,
    /// The function argument it is, if an input.
    pub input: Option<usize>,
}

impl BufferSpec {
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * dtype_bytes(&self.dtype)
    }
}

pub fn dtype_bytes(dtype: &str) -> u64 {
    match dtype {
        "float32" | "int32" => 4,
        "bfloat16" | "float16" => 2,
        _ => 1,
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct Launch {
    pub kernel: String,
    /// The entry's name in the cubin.
    pub function: String,
    pub cubin: PathBuf,
    pub grid: [u32; 3],
    pub num_warps: u32,
    #[serde(default = "one")]
    pub num_ctas: u32,
    /// Dynamic shared memory (bytes).
    pub shared: u32,
    #[serde(default)]
    pub global_scratch_size: u64,
    #[serde(default)]
    pub profile_scratch_size: u64,
    /// The non-constexpr arguments, in order.
    pub args: Vec<Arg>,
    /// The compiled entry's PTX parameter types.
    pub params: Vec<String>,
    /// The scratch pointers Triton's ABI appends after the arguments.
    #[serde(default)]
    pub scratch: Vec<String>,
    #[serde(default)]
    pub cached: bool,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub enum Arg {
    #[serde(rename = "buffer")]
    Buffer(usize),
    #[serde(rename = "i32")]
    I32(i64),
    #[serde(rename = "f32")]
    F32(f64),
}

impl Launch {
    /// The PTX types of the parameters efopt passes: each argument's, then a pointer per
    /// scratch buffer. A launch whose list differs from the compiled entry's would read its
    /// arguments from the wrong places.
    pub fn passed_params(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self
            .args
            .iter()
            .map(|a| match a {
                Arg::Buffer(_) => "u64",
                Arg::I32(_) => "u32",
                Arg::F32(_) => "f32",
            })
            .collect();
        v.extend(self.scratch.iter().map(|_| "u64"));
        v
    }

    /// Threads per block.
    pub fn block_threads(&self) -> u32 {
        32 * self.num_warps
    }

    pub fn programs(&self) -> u64 {
        self.grid.iter().map(|g| u64::from(*g)).product::<u64>() * u64::from(self.num_ctas)
    }
}

/// The schedule a host function takes (`schedule=`): block sizes by axis, warps and stages,
/// and per-kernel warps and stages as `k<i>`.
pub fn schedule_json(axes: &[String], c: &Config) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (a, l) in axes.iter().zip(&c.point.log_blocks) {
        m.insert(format!("BLOCK_{a}"), (1u64 << l).into());
    }
    m.insert("num_warps".into(), c.point.num_warps.into());
    m.insert("num_stages".into(), c.point.num_stages.into());
    for (k, (w, s)) in c.kernels.iter().enumerate() {
        m.insert(
            format!("k{k}"),
            serde_json::json!({"num_warps": w, "num_stages": s}),
        );
    }
    serde_json::Value::Object(m)
}

/// The compile helper: a Python with Triton, the script, the cache and the target.
#[derive(Clone, Debug)]
pub struct Helper {
    pub python: String,
    pub script: PathBuf,
    pub cache: PathBuf,
    /// `sm_90`, …
    pub target: String,
    /// A request that runs longer is stopped and fails (Triton takes minutes on some tile
    /// shapes: a reshaped 3-D load of 16 × 256 tiles took 8 minutes).
    pub time_limit: std::time::Duration,
}

/// The compile helper's time limit by default.
pub const COMPILE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Helper {
    /// The Python of `triton-check` ([`crate::support::python`]); the cache `$EFOPT_CACHE`,
    /// else `~/.cache/efopt/triton`.
    pub fn new(python: Option<String>, target: &str) -> Helper {
        let python = crate::support::python(python);
        let cache = std::env::var_os("EFOPT_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/efopt/triton"))
            })
            .unwrap_or_else(|| std::env::temp_dir().join("efopt-cache"));
        Helper {
            python,
            script: crate::support::home().join("python/efopt_cuda.py"),
            cache,
            target: target.to_string(),
            time_limit: COMPILE_TIME_LIMIT,
        }
    }

    /// The plan of host function `function` of `module` at `schedule`, for inputs of these
    /// shapes and dtypes.
    pub fn plan(
        &self,
        module: &Path,
        function: &str,
        schedule: &serde_json::Value,
        inputs: &[(Vec<u64>, String)],
        scratch_dir: &Path,
    ) -> Result<LaunchPlan, String> {
        let request = serde_json::json!({
            "module": module,
            "function": function,
            "schedule": schedule,
            "inputs": inputs.iter().map(|(s, d)| serde_json::json!({"shape": s, "dtype": d})).collect::<Vec<_>>(),
            "target": self.target,
            "cache": self.cache,
        });
        let path = scratch_dir.join(format!("request-{function}.json"));
        std::fs::write(&path, request.to_string())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let out = self.run(&path)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().last().unwrap_or("");
        let v: serde_json::Value = serde_json::from_str(line).map_err(|_| {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(6).collect();
            format!(
                "the compile helper failed: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
        })?;
        if let Some(e) = v.get("error") {
            return Err(format!(
                "compiling `{function}`: {}",
                e.as_str().unwrap_or("?")
            ));
        }
        serde_json::from_value(v).map_err(|e| format!("a malformed launch plan: {e}"))
    }

    /// Runs the helper on the request at `path`, stopping it at the time limit. Its output
    /// goes to files beside the request (pipes could fill up while it is waited for).
    fn run(&self, path: &Path) -> Result<std::process::Output, String> {
        let (out_path, err_path) = (path.with_extension("out"), path.with_extension("err"));
        let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        let mut child = std::process::Command::new(&self.python)
            .arg(&self.script)
            .arg(path)
            .stdin(std::process::Stdio::null())
            .stdout(file(&out_path)?)
            .stderr(file(&err_path)?)
            .spawn()
            .map_err(|e| format!("cannot run `{}`: {e}", self.python))?;
        let start = std::time::Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if start.elapsed() >= self.time_limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "the compile helper took longer than {} s (the time limit of a compilation) and was stopped",
                        self.time_limit.as_secs_f64()
                    ));
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(e) => return Err(format!("waiting for the compile helper: {e}")),
            }
        };
        let read = |p: &Path| std::fs::read(p).unwrap_or_default();
        Ok(std::process::Output {
            status,
            stdout: read(&out_path),
            stderr: read(&err_path),
        })
    }
}
