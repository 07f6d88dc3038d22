//! The GPU [`Measure`], with `cudarc` (the driver API, loaded at run time).
//!
//! Per workload (a source function) the inputs are the reference interpreter's seeded values,
//! uploaded once, and the expected outputs are the interpreter's, computed once. A
//! configuration's launch plan comes from the compile helper ([`super::launch`]); its cubins
//! are loaded once each (dynamic shared memory above 48 KB opted in), its buffers allocated,
//! and its kernels launched with Triton's ABI: the non-constexpr arguments, then the scratch
//! pointers the kernel's metadata names.
//!
//! **Validation**: the first measurement of a configuration runs it once and compares every
//! output with the reference (relative L2 ≤ 0.01); a difference makes the candidate wrong.
//!
//! **Timing**: one CUDA graph holds the program launched once per copy of the inputs, over
//! enough copies that together they exceed twice the L2 cache (weights come from DRAM, as
//! in a model whose layers evict each other), and at least eight launches; CUDA events around
//! each replay of the graph give a time per program, and the result is the median over the
//! repeats.

use super::launch::{dtype_bytes, Arg, Helper, LaunchPlan};
use super::{Config, Measure, Outcome};
use crate::interp::Tensor;
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Whether the CUDA driver library can be loaded (checked before anything calls into it).
pub fn driver_present() -> bool {
    unsafe { sys::is_culib_present() }
}

/// The compile target of GPU `ordinal` (`sm_90` for compute capability 9.0).
pub fn compute_target(ordinal: usize) -> Result<String, String> {
    if !driver_present() {
        return Err("no CUDA driver (libcuda) on this machine".into());
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
    let major = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| e.to_string())?;
    let minor = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .map_err(|e| e.to_string())?;
    Ok(format!("sm_{major}{minor}"))
}

/// Inputs and expected outputs of one source function.
pub struct Workload {
    /// Each input's values (as f32) and dtype name (`bfloat16`, …).
    pub inputs: Vec<(Tensor, String)>,
    pub expected: Vec<Tensor>,
}

/// Where a candidate's host function is and which workload it computes.
pub struct CandidateSpec {
    pub module: PathBuf,
    pub host: String,
    /// The schedule axes, in the rank model's order.
    pub axes: Vec<String>,
    pub workload: usize,
}

/// Device memory, freed on drop.
struct Buffer {
    ptr: sys::CUdeviceptr,
}

impl Buffer {
    fn zeroed(bytes: u64) -> Result<Buffer, String> {
        let bytes = bytes.max(1) as usize;
        unsafe {
            let ptr = result::malloc_sync(bytes).map_err(|e| format!("cuMemAlloc: {e}"))?;
            result::memset_d8_sync(ptr, 0, bytes).map_err(|e| format!("cuMemset: {e}"))?;
            Ok(Buffer { ptr })
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    helper: Helper,
    dir: PathBuf,
    candidates: Vec<CandidateSpec>,
    workloads: Vec<Workload>,
    /// Per workload: copies of its inputs (copy 0 validates; all rotate when timing).
    uploaded: BTreeMap<usize, Vec<Vec<Buffer>>>,
    modules: BTreeMap<PathBuf, sys::CUmodule>,
    functions: BTreeMap<(PathBuf, String), sys::CUfunction>,
    plans: BTreeMap<Config, Result<LaunchPlan, String>>,
    validated: BTreeSet<Config>,
    /// Compile requests made so far (each writes its own directory).
    requests: usize,
    l2_bytes: u64,
    name: String,
    start: Instant,
}

impl CudaDevice {
    /// The GPU `ordinal`, or why there is none: no CUDA driver on this machine, or no such
    /// device.
    pub fn open(
        ordinal: usize,
        helper: Helper,
        dir: PathBuf,
        candidates: Vec<CandidateSpec>,
        workloads: Vec<Workload>,
    ) -> Result<CudaDevice, String> {
        if !driver_present() {
            return Err("no CUDA driver (libcuda) on this machine".into());
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
        let stream = ctx.new_stream().map_err(|e| format!("CUDA stream: {e}"))?;
        let l2_bytes = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .map_or(50 << 20, |v| v.max(0) as u64);
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        Ok(CudaDevice {
            ctx,
            stream,
            helper,
            dir,
            candidates,
            workloads,
            uploaded: BTreeMap::new(),
            modules: BTreeMap::new(),
            functions: BTreeMap::new(),
            plans: BTreeMap::new(),
            validated: BTreeSet::new(),
            requests: 0,
            l2_bytes,
            name,
            start: Instant::now(),
        })
    }

    /// What the compile helper is asked for `c`: the candidate, its inputs' shapes and
    /// dtypes, and the schedule.
    fn request(&self, c: &Config) -> (&CandidateSpec, Vec<(Vec<u64>, String)>, serde_json::Value) {
        let spec = &self.candidates[c.candidate];
        let inputs = self.workloads[spec.workload]
            .inputs
            .iter()
            .map(|(t, d)| (t.shape.iter().map(|s| *s as u64).collect(), d.clone()))
            .collect();
        (spec, inputs, super::launch::schedule_json(&spec.axes, c))
    }

    fn plan(&mut self, c: &Config) -> Result<LaunchPlan, String> {
        if let Some(p) = self.plans.get(c) {
            return p.clone();
        }
        let (spec, inputs, schedule) = self.request(c);
        let p = self
            .helper
            .plan(&spec.module, &spec.host, &schedule, &inputs, &self.dir);
        self.plans.insert(c.clone(), p.clone());
        p
    }

    fn function(
        &mut self,
        cubin: &PathBuf,
        name: &str,
        shared: u32,
    ) -> Result<sys::CUfunction, String> {
        let key = (cubin.clone(), name.to_string());
        if let Some(f) = self.functions.get(&key) {
            return Ok(*f);
        }
        let module = match self.modules.get(cubin) {
            Some(m) => *m,
            None => {
                let image =
                    std::fs::read(cubin).map_err(|e| format!("{}: {e}", cubin.display()))?;
                let m = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
                    .map_err(|e| format!("loading {}: {e}", cubin.display()))?;
                self.modules.insert(cubin.clone(), m);
                m
            }
        };
        let cname = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
        let f = unsafe { result::module::get_function(module, cname) }
            .map_err(|e| format!("{name}: {e}"))?;
        if shared > 48 * 1024 {
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )
            }
            .map_err(|e| format!("{name}: {shared} bytes of shared memory: {e}"))?;
        }
        self.functions.insert(key, f);
        Ok(f)
    }

    /// The workload's input copies, uploaded on first use: enough that together they are
    /// twice the L2 (at most 32, at most 4 GiB).
    fn inputs(&mut self, w: usize) -> Result<usize, String> {
        if let Some(c) = self.uploaded.get(&w) {
            return Ok(c.len());
        }
        let wl = &self.workloads[w];
        let bytes: u64 = wl
            .inputs
            .iter()
            .map(|(t, d)| t.data.len() as u64 * dtype_bytes(d))
            .sum::<u64>()
            .max(1);
        let copies = (2 * self.l2_bytes)
            .div_ceil(bytes)
            .clamp(1, 32)
            .min((4u64 << 30) / bytes)
            .max(1) as usize;
        let mut all = Vec::new();
        for _ in 0..copies {
            let mut one = Vec::new();
            for (t, d) in &wl.inputs {
                let host = encode(&t.data, d);
                let b = Buffer::zeroed(host.len() as u64)?;
                unsafe { result::memcpy_htod_sync(b.ptr, &host) }
                    .map_err(|e| format!("upload: {e}"))?;
                one.push(b);
            }
            all.push(one);
        }
        self.uploaded.insert(w, all);
        Ok(copies)
    }

    /// Launches every kernel of `plan` once on the stream, reading input copy `copy`.
    fn launch(
        &mut self,
        plan: &LaunchPlan,
        w: usize,
        copy: usize,
        buffers: &BTreeMap<usize, Buffer>,
        scratch: &[(Option<Buffer>, Option<Buffer>)],
    ) -> Result<(), String> {
        let mut funcs = Vec::new();
        for l in &plan.launches {
            funcs.push(self.function(&l.cubin, &l.function, l.shared)?);
        }
        let inputs = &self.uploaded[&w][copy];
        for (i, (l, f)) in plan.launches.iter().zip(funcs).enumerate() {
            // One 8-byte slot per parameter (a 32-bit value in its low half: little endian).
            let mut slots: Vec<u64> = Vec::new();
            for a in &l.args {
                slots.push(match a {
                    Arg::Buffer(id) => {
                        let spec = plan.buffers.get(*id).ok_or("a launch names no buffer")?;
                        match spec.input {
                            Some(k) => inputs.get(k).ok_or("a missing input")?.ptr,
                            None => buffers.get(id).ok_or("an unallocated buffer")?.ptr,
                        }
                    }
                    Arg::I32(v) => u64::from(*v as i32 as u32),
                    Arg::F32(v) => u64::from((*v as f32).to_bits()),
                });
            }
            for (k, _) in l.scratch.iter().enumerate() {
                let b = if k == 0 { &scratch[i].0 } else { &scratch[i].1 };
                slots.push(b.as_ref().map_or(0, |b| b.ptr));
            }
            let mut params: Vec<*mut c_void> = slots
                .iter_mut()
                .map(|s| s as *mut u64 as *mut c_void)
                .collect();
            unsafe {
                result::launch_kernel(
                    f,
                    (l.grid[0] * l.num_ctas, l.grid[1], l.grid[2]),
                    (l.block_threads(), 1, 1),
                    l.shared,
                    self.stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(|e| format!("launching {}: {e}", l.kernel))?;
        }
        Ok(())
    }

    fn run(&mut self, c: &Config, repeats: u32) -> Result<Outcome, String> {
        self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
        let plan = match self.plan(c) {
            Ok(p) => p,
            Err(e) => return Ok(Outcome::Failed(e)),
        };
        let w = self.candidates[c.candidate].workload;
        let copies = self.inputs(w)?;
        let mut buffers = BTreeMap::new();
        for b in plan.buffers.iter().filter(|b| b.input.is_none()) {
            buffers.insert(b.id, Buffer::zeroed(b.bytes())?);
        }
        let mut scratch = Vec::new();
        for l in &plan.launches {
            let alloc = |size: u64| -> Result<Option<Buffer>, String> {
                (size > 0)
                    .then(|| Buffer::zeroed(size * l.programs()))
                    .transpose()
            };
            scratch.push((
                alloc(l.global_scratch_size)?,
                alloc(l.profile_scratch_size)?,
            ));
        }
        let sync = |s: &CudaStream| s.synchronize().map_err(|e| format!("running: {e}"));
        if !self.validated.contains(c) {
            if let Err(e) = self.launch(&plan, w, 0, &buffers, &scratch) {
                return Ok(Outcome::Failed(e));
            }
            if let Err(e) = sync(&self.stream) {
                return Ok(Outcome::Failed(e));
            }
            let expected = &self.workloads[w].expected;
            for (i, (id, want)) in plan.outputs.iter().zip(expected).enumerate() {
                let spec = &plan.buffers[*id];
                let ptr = match spec.input {
                    Some(k) => self.uploaded[&w][0][k].ptr,
                    None => buffers[id].ptr,
                };
                let mut host = vec![0u8; spec.bytes() as usize];
                unsafe { result::memcpy_dtoh_sync(&mut host, ptr) }
                    .map_err(|e| format!("download: {e}"))?;
                let got = Tensor {
                    shape: want.shape.clone(),
                    data: decode(&host, &spec.dtype),
                };
                let err = crate::interp::reference_error(&got, want);
                // NaN fails too.
                if err.is_nan() || err > 0.01 {
                    return Ok(Outcome::Wrong(format!(
                        "output {i}: relative L2 error {err:.3e} against the reference interpreter (at most 0.01)"
                    )));
                }
            }
            self.validated.insert(c.clone());
        }
        // One graph: the program once per input copy, at least eight times.
        let per_graph = copies.max(8);
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| format!("capture: {e}"))?;
        let mut launched = Ok(());
        for i in 0..per_graph {
            launched = self.launch(&plan, w, i % copies, &buffers, &scratch);
            if launched.is_err() {
                break;
            }
        }
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| format!("capture: {e}"))?;
        launched?;
        let graph = graph.ok_or("an empty graph")?;
        graph.launch().map_err(|e| format!("graph: {e}"))?;
        sync(&self.stream)?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = (
            self.ctx.new_event(flags).map_err(|e| e.to_string())?,
            self.ctx.new_event(flags).map_err(|e| e.to_string())?,
        );
        let mut times = Vec::new();
        for _ in 0..repeats.max(1) {
            a.record(&self.stream).map_err(|e| e.to_string())?;
            graph.launch().map_err(|e| format!("graph: {e}"))?;
            b.record(&self.stream).map_err(|e| e.to_string())?;
            let ms = a.elapsed_ms(&b).map_err(|e| e.to_string())?;
            times.push(f64::from(ms) * 1000.0 / per_graph as f64);
        }
        times.sort_by(f64::total_cmp);
        Ok(Outcome::Time(times[times.len() / 2]))
    }
}

impl Measure for CudaDevice {
    /// Compiles the configurations not planned yet, one helper process per core.
    fn prepare(&mut self, configs: &[Config]) {
        let todo: Vec<&Config> = configs
            .iter()
            .filter(|c| !self.plans.contains_key(c))
            .collect();
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        for chunk in todo.chunks(threads.max(1)) {
            let done: Vec<(Config, Result<LaunchPlan, String>)> = std::thread::scope(|scope| {
                let handles: Vec<_> = chunk
                    .iter()
                    .enumerate()
                    .map(|(k, c)| {
                        let (spec, inputs, schedule) = self.request(c);
                        let (helper, dir) = (&self.helper, &self.dir);
                        // Each request its own directory.
                        let unique = dir.join(format!("req{}", self.requests + k));
                        let key = (*c).clone();
                        scope.spawn(move || {
                            let _ = std::fs::create_dir_all(&unique);
                            let r =
                                helper.plan(&spec.module, &spec.host, &schedule, &inputs, &unique);
                            (key, r)
                        })
                    })
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            });
            self.requests += chunk.len();
            for (c, r) in done {
                self.plans.insert(c, r);
            }
        }
    }

    fn measure(&mut self, c: &Config, repeats: u32) -> Outcome {
        match self.run(c, repeats) {
            Ok(o) => o,
            Err(e) => Outcome::Failed(e),
        }
    }

    fn spent(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn describe(&self) -> String {
        format!("{} (CUDA events around CUDA graphs)", self.name)
    }
}

/// Values as a buffer of `dtype` holds them (bf16 rounded to nearest even).
pub fn encode(values: &[f32], dtype: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype_bytes(dtype) as usize);
    for &x in values {
        match dtype {
            "bfloat16" => {
                // The interpreter's rounding (nearest even; NaN stays NaN), upper half kept.
                let r = (crate::interp::tensor::round_bf16(x).to_bits() >> 16) as u16;
                out.extend_from_slice(&r.to_le_bytes());
            }
            "float16" => out.extend_from_slice(&f32_to_f16(x).to_le_bytes()),
            "int32" => out.extend_from_slice(&(x as i32).to_le_bytes()),
            "bool" => out.push(u8::from(x != 0.0)),
            _ => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
    out
}

/// The values of a buffer of `dtype`, as f32.
pub fn decode(bytes: &[u8], dtype: &str) -> Vec<f32> {
    match dtype {
        "bfloat16" => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        "float16" => bytes
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        "int32" => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
        "bool" => bytes.iter().map(|b| f32::from(u8::from(*b != 0))).collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// IEEE half from single, rounded to nearest even (subnormals flushed to zero; inputs are
/// normal values).
fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let man = b & 0x7f_ffff;
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    if exp >= 31 {
        return sign | 0x7c00;
    }
    if exp <= 0 {
        return sign;
    }
    let mut h = (exp as u32) << 10 | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e as u32) << 23 | (m & 0x3ff) << 13
        }
        31 => sign | 0x7f80_0000 | man << 13,
        _ => sign | (exp + 127 - 15) << 23 | man << 13,
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_round_trip_their_dtypes() {
        let v = [0.0f32, 1.0, -2.5, 3.140625, 65504.0, -0.000061035156];
        for d in ["float32", "bfloat16", "float16", "int32", "bool"] {
            let back = decode(&encode(&v, d), d);
            for (x, y) in v.iter().zip(&back) {
                let want = match d {
                    "int32" => (*x as i32) as f32,
                    "bool" => f32::from(u8::from(*x != 0.0)),
                    "bfloat16" => f32::from_bits(
                        (x.to_bits() + 0x7fff + ((x.to_bits() >> 16) & 1)) & 0xffff_0000,
                    ),
                    _ => *x,
                };
                assert_eq!(*y, want, "{d}: {x}");
            }
        }
    }

    /// On a machine without CUDA, opening the device is an error, not a panic.
    #[test]
    fn no_driver_is_an_error() {
        if unsafe { sys::is_culib_present() } {
            return;
        }
        let r = CudaDevice::open(
            0,
            Helper::new(None, "sm_90"),
            std::env::temp_dir(),
            Vec::new(),
            Vec::new(),
        );
        assert!(matches!(r, Err(e) if e.contains("no CUDA driver")));
    }
}
