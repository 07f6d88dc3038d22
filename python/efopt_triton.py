"""Runs efopt-generated Triton modules without torch or a GPU.

`python efopt_triton.py MANIFEST.json` reads a manifest written by efopt's `triton-check` pass:

    {"module": "cands.py", "tol": 0.01, "compile": ["sm_90"],
     "functions": [{"name": "f_c0", "schedules": [{"BLOCK_m": 16}, ...],
                    "inputs": [{"file": "in0.f32", "shape": [..], "dtype": "bfloat16"}],
                    "outputs": [{"file": "out0.f32", "shape": [..]}]}]}

Each function runs under the Triton interpreter (TRITON_INTERPRET=1, set before triton is
imported) once per schedule, on numpy-backed tensors, and its outputs are compared with the
expected ones (relative L2 error). With "compile", every kernel launch is also compiled for the
named GPU targets with `triton.compile`, which needs no GPU. One JSON line per result goes to
standard output.
"""

import gc
import importlib.util
import json
import os
import sys
import traceback

COMPILE_ONLY = len(sys.argv) > 2 and sys.argv[1] == "--compile"
# Interpreting patches triton.language for good, so compilation runs in its own process.
os.environ["TRITON_INTERPRET"] = "0" if COMPILE_ONLY else "1"

import numpy as np  # noqa: E402


class DTypeName:
    """Triton reads a tensor's dtype as str(dtype).split(".")[-1], like torch.bfloat16."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "efopt." + self.name


class NumpyTensor:
    """The part of the torch.Tensor API the Triton interpreter uses."""

    def __init__(self, array, dtype_name):
        self.array = np.ascontiguousarray(array)
        self.dtype_name = dtype_name
        self.dtype = DTypeName(dtype_name)
        self.shape = self.array.shape
        self.device = "cpu"

    def data_ptr(self):
        return self.array.ctypes.data

    def cpu(self):
        return self

    def to(self, _device):
        return self

    @property
    def data(self):
        return self

    def copy_(self, other):
        if other is not self:
            self.array[...] = other.array

    # Triton 3.6's interpreter copies each argument's storage to the host and back: these
    # tensors live on the host already, so the copy is the tensor itself.
    def untyped_storage(self):
        return self

    def new_empty(self, *_args, **_kwargs):
        return self

    def set_(self, *_args):
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return self.shape

    def stride(self, i=None):
        s = [x // self.array.itemsize for x in self.array.strides]
        return s if i is None else s[i]

    def reshape(self, shape):
        # A result that is a reshape view: the same contiguous buffer (numpy gives a view).
        return NumpyTensor(self.array.reshape(tuple(int(d) for d in shape)), self.dtype_name)

    def numpy_f32(self):
        if self.dtype_name == "bfloat16":
            return (self.array.astype(np.uint32) << 16).view(np.float32)
        return self.array.astype(np.float32)


def round_to_bf16_bits(values):
    """f32 values as bf16 bit patterns, rounded to nearest even (as a GPU's cvt.rn.bf16 and
    the reference interpreter round); NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), rounded)


def round_casts_to_nearest_even():
    """Triton's interpreter casts f32 to bf16 by truncating the mantissa (its `cast_impl`
    passes no rounding mode), where the GPU rounds to nearest even: a bf16 result or a bf16
    intermediate then differs from the compiled kernel's by up to an ulp (a one-row SwiGLU
    layer read 1.4 % relative L2 off the reference). Casts to bf16 are rounded here as the
    GPU rounds them."""
    from triton.runtime import interpreter as interp
    import triton.language as tl

    builder = interp.InterpreterBuilder
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = round_to_bf16_bits(src.data.view(np.float32)).reshape(src.data.shape)
            return interp.TensorHandle(data, dst_type.scalar)
        return original(self, src, dst_type)

    # `create_fp_trunc` and the other cast builders call `self.cast_impl`.
    builder.cast_impl = cast_impl


def from_f32(values, dtype_name):
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype_name == "bfloat16":
        # Inputs are already bf16 values, so this is exact for them.
        return NumpyTensor(round_to_bf16_bits(values), "bfloat16")
    if dtype_name == "float16":
        return NumpyTensor(values.astype(np.float16), "float16")
    if dtype_name == "int32":
        return NumpyTensor(values.astype(np.int32), "int32")
    if dtype_name == "bool":
        return NumpyTensor(values != 0, "bool")
    return NumpyTensor(values, "float32")


def empty(shape, dtype_name, _like=None):
    storage = {"bfloat16": np.uint16, "float16": np.float16, "float32": np.float32,
               "int32": np.int32, "bool": np.bool_}[dtype_name]
    return NumpyTensor(np.full(tuple(int(s) for s in shape), 0, dtype=storage), dtype_name)


def relative_l2(got, want):
    """The reference interpreter's `reference_error`: relative L2 over the elements where the
    reference is finite (where it overflowed or is NaN, nothing is required); infinite where
    the result is not finite at such an element. An infinite error is written as 1e308 (JSON
    has no infinity)."""
    keep = np.isfinite(want)
    got = got.astype(np.float64)[keep]
    want = want.astype(np.float64)[keep]
    if not np.all(np.isfinite(got)):
        return 1e308
    num = float(np.sqrt(np.sum((got - want) ** 2)))
    den = float(np.sqrt(np.sum(want ** 2)))
    return num / den if den > 0 else num


# `@triton.jit` functions the generated module defines for its kernels to call, never to
# launch (`PRODUCT_COMBINE` in src/backend/triton.rs).
KERNEL_HELPERS = {"efopt_product"}


class CompileRecorder:
    """Wraps the module's kernels: each launch also compiles the kernel for GPU targets."""

    def __init__(self, targets, skip=()):
        from triton.backends.compiler import GPUTarget
        self.targets = [GPUTarget("cuda", int(t.removeprefix("sm_")), 32) for t in targets]
        self.compiled = 0
        self.failures = []
        self.seen = set()
        # Kernels an earlier attempt crashed the compiler on.
        self.skip = set(skip)

    def wrap(self, kernel):
        recorder = self
        original_getitem = type(kernel).__getitem__

        class Launch:
            def __init__(self, grid):
                self.grid = grid

            def __call__(self, *args, **kwargs):
                recorder.compile(kernel, args, kwargs)
                if not COMPILE_ONLY:
                    return original_getitem(kernel, self.grid)(*args, **kwargs)

        class Wrapped:
            def __getitem__(self, grid):
                return Launch(grid)

        return Wrapped()

    def compile(self, kernel, args, kwargs):
        import triton
        from triton.compiler import ASTSource
        names = kernel.arg_names
        signature, constants = {}, {}
        values = dict(zip(names, args))
        values.update({k: v for k, v in kwargs.items() if k in names})
        for i, name in enumerate(names):
            value = values[name]
            if kernel.params[i].is_constexpr:
                signature[name] = "constexpr"
                constants[name] = value
            elif hasattr(value, "data_ptr"):
                signature[name] = "*" + {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                                         "int32": "i32", "bool": "i1"}[value.dtype_name]
            else:
                signature[name] = "i32"
        key = (kernel.__name__, tuple(sorted(signature.items())), tuple(sorted(constants.items())))
        if key in self.seen or kernel.__name__ in self.skip:
            return
        self.seen.add(key)
        for target in self.targets:
            # Announced first: if the compiler aborts the process, the parent knows the kernel.
            print(json.dumps({"compiling": kernel.__name__, "target": f"sm_{target.arch}"}),
                  flush=True)
            # Fault injection for tests: a compiler crash on this kernel.
            if os.environ.get("EFOPT_TRITON_ABORT_ON") == kernel.__name__:
                os.abort()
            try:
                triton.compile(ASTSource(kernel, signature, constants), target=target)
                self.compiled += 1
            except Exception as e:  # report, keep going
                self.failures.append({"kernel": kernel.__name__, "target": f"sm_{target.arch}",
                                      "error": str(e).strip().splitlines()[-12:]})


def load_module(path):
    spec = importlib.util.spec_from_file_location("efopt_generated", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_all(manifest, base):
    """Runs every host function once with launches replaced by compilation."""
    module = load_module(os.path.join(base, manifest["module"]))
    recorder = CompileRecorder(manifest["compile"], manifest.get("skip", ()))
    for name in dir(module):
        obj = getattr(module, name)
        # Helpers that kernels call (a combine function) stay JIT functions: only what a host
        # function launches is wrapped.
        if type(obj).__name__ == "JITFunction" and name not in KERNEL_HELPERS:
            setattr(module, name, recorder.wrap(obj))
    for fn in manifest["functions"]:
        host = getattr(module, fn["name"])
        args = [empty(spec["shape"], spec["dtype"]) for spec in fn["inputs"]]
        for schedule in fn["schedules"][:1]:
            try:
                host(*args, schedule=schedule, empty=empty)
            except Exception:
                recorder.failures.append({"kernel": fn["name"], "target": "host",
                                          "error": traceback.format_exc().strip().splitlines()[-6:]})
    print(json.dumps({"compiled": recorder.compiled, "compile_failures": recorder.failures}))
    return 0 if not recorder.failures else 1


def main(manifest_path):
    # Triton 3.6's interpreter, on these numpy-backed tensors, reads stale memory once the
    # cyclic garbage collector has run (wrong outputs that change from run to run, and
    # segfaults): the collector stays off in this short-lived process.
    gc.disable()
    round_casts_to_nearest_even()
    with open(manifest_path) as f:
        manifest = json.load(f)
    base = os.path.dirname(os.path.abspath(manifest_path))
    if COMPILE_ONLY:
        return compile_all(manifest, base)
    module = load_module(os.path.join(base, manifest["module"]))
    tol = manifest.get("tol", 0.01)
    ok = True
    for fn in manifest["functions"]:
        host = getattr(module, fn["name"])
        inputs = []
        for spec in fn["inputs"]:
            data = np.fromfile(os.path.join(base, spec["file"]), dtype=np.float32)
            inputs.append((data.reshape(spec["shape"]), spec["dtype"]))
        wants = [np.fromfile(os.path.join(base, o["file"]), dtype=np.float32).reshape(o["shape"])
                 for o in fn["outputs"]]
        for schedule in fn["schedules"]:
            result = {"function": fn["name"], "schedule": schedule}
            try:
                args = [from_f32(d, t) for d, t in inputs]
                outs = host(*args, schedule=schedule, empty=empty)
                errors = [relative_l2(o.numpy_f32(), w) for o, w in zip(outs, wants)]
                result["errors"] = errors
                tols = [o.get("tol", tol) for o in fn["outputs"]]
                result["ok"] = all(e <= t for e, t in zip(errors, tols))
                if any(t != tol for t in tols):
                    result["tols"] = tols
            except Exception:
                result["ok"] = False
                result["exception"] = traceback.format_exc().strip().splitlines()[-6:]
            ok &= result["ok"]
            print(json.dumps(result), flush=True)
    if manifest.get("compile"):
        ok &= compile_in_subprocesses(manifest, manifest_path)
    return 0 if ok else 1


def compile_in_subprocesses(manifest, manifest_path):
    """Compiles in a child process (interpreting patched triton.language for good). When the
    compiler aborts the child (an assertion in Triton's C++), the kernel it announced last is
    reported as failed and a new child goes on without it."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    compiled, failures, skip = 0, [], []
    while True:
        attempt = dict(manifest, skip=skip)
        path = manifest_path + ".compile.json"
        with open(path, "w") as f:
            json.dump(attempt, f)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--compile", path],
                              env=env, capture_output=True, text=True)
        last, summary = None, None
        for line in done.stdout.splitlines():
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if "compiling" in v:
                last = v
            elif "compiled" in v:
                summary = v
        if summary is not None:
            compiled += summary["compiled"]
            failures += summary["compile_failures"]
            break
        error = done.stderr.strip().splitlines()[-8:]
        if last is None or last["compiling"] in skip:
            failures.append({"kernel": "*", "target": "*", "error": error})
            break
        failures.append({"kernel": last["compiling"], "target": last["target"],
                         "error": ["the compiler aborted:"] + error})
        skip.append(last["compiling"])
    print(json.dumps({"compiled": compiled, "compile_failures": failures}))
    return not failures


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
