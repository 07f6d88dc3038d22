"""Compiles efopt-generated Triton kernels for a GPU and says how to launch them (`tune`).

`python efopt_cuda.py REQUEST.json` prints one JSON object: the *launch plan* of one host
function of a generated module at one schedule, with every kernel it launches compiled for
the target (no GPU needed: `triton.compile(ASTSource(...), target=GPUTarget(...))`).

    request = {"module": "/abs/cands.py", "function": "f_c0",
               "schedule": {"BLOCK_m": 64, "num_warps": 4, "num_stages": 3,
                            "k1": {"num_warps": 8}},
               "inputs": [{"shape": [16, 4096], "dtype": "bfloat16"}],
               "target": "sm_90", "cache": "/abs/cache/dir"}

    plan = {"triton": "3.6.0",
            "buffers": [{"id": 0, "shape": [...], "dtype": "bfloat16", "input": 0}, ...],
            "outputs": [3],
            "launches": [{"kernel": "f_c0_k0", "function": "f_c0_k0", "cubin": "/abs/..cubin",
                          "grid": [x, y, z], "num_warps": 4, "num_ctas": 1, "shared": 0,
                          "global_scratch_size": 0, "global_scratch_align": 1,
                          "profile_scratch_size": 0, "profile_scratch_align": 1,
                          "args": [{"buffer": 0}, {"i32": 4096}, ...],
                          "params": ["u64", "u32", ...], "scratch": ["global_scratch", "profile_scratch"],
                          "cached": false}]}

The host function runs with placeholder tensors: `empty` hands out buffer ids, and each
kernel launch is recorded (its grid, its non-constexpr arguments in order) instead of run.
`params` is the parameter list of the compiled kernel's PTX entry: Triton's launch ABI is the
non-constexpr arguments, then the scratch pointers `scratch` names (Triton 3.6, the pinned
one: a global and a profile scratch pointer).

Compiled kernels are cached in `cache` by a hash of the kernel's source, signature,
constants, attributes, options, target and Triton version: a schedule compiles once per
machine. Errors go to the JSON as {"error": ...} (exit code 1).
"""

import hashlib
import inspect
import json
import os
import re
import sys
import traceback

os.environ.pop("TRITON_INTERPRET", None)

# JIT functions that kernels call (not launched by a host function): as in efopt_triton.py,
# which is not imported as it switches Triton to its interpreter.
KERNEL_HELPERS = {"efopt_product"}

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "int32": "i32", "bool": "i1"}


class Placeholder:
    """A buffer the host function allocates or receives: only its id, shape and dtype."""

    def __init__(self, ident, shape, dtype_name):
        self.id = ident
        self.shape = tuple(shape)
        self.dtype_name = dtype_name
        self.device = "cuda"

    def data_ptr(self):
        return 0

    def stride(self, i=None):
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.append(acc)
            acc *= d
        strides = tuple(reversed(strides))
        return strides if i is None else strides[i]

    def reshape(self, shape):
        # A result that is a reshape view: the same buffer (its id), read with another shape.
        return Placeholder(self.id, shape, self.dtype_name)


class Recorder:
    def __init__(self, target, cache):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", int(target.removeprefix("sm_")), 32)
        self.cache = cache
        self.launches = []

    def wrap(self, kernel):
        recorder = self

        class Launch:
            def __init__(self, grid):
                self.grid = grid

            def __call__(self, *args, **kwargs):
                recorder.record(kernel, self.grid, args, kwargs)

        class Wrapped:
            def __getitem__(self, grid):
                return Launch(grid)

        return Wrapped()

    def record(self, kernel, grid, args, kwargs):
        names = kernel.arg_names
        values = dict(zip(names, args))
        values.update({k: v for k, v in kwargs.items() if k in names})
        options = {"num_warps": int(kwargs.get("num_warps", 4)),
                   "num_stages": int(kwargs.get("num_stages", 3))}
        signature, constants, attrs, launch_args = {}, {}, {}, []
        for i, name in enumerate(names):
            value = values[name]
            if kernel.params[i].is_constexpr:
                signature[name] = "constexpr"
                constants[name] = value
            elif isinstance(value, Placeholder):
                signature[name] = "*" + DTYPES[value.dtype_name]
                # Allocations are 256-byte aligned.
                attrs[(i,)] = [["tt.divisibility", 16]]
                launch_args.append({"buffer": value.id})
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{kernel.__name__}: argument {name} = {value!r}")
            elif isinstance(value, int):
                signature[name] = "i32"
                if value % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
                launch_args.append({"i32": value})
            else:
                signature[name] = "fp32"
                launch_args.append({"f32": value})
        grid = list(grid) + [1] * (3 - len(grid))
        entry = self.compile(kernel, signature, constants, attrs, options)
        entry.update(kernel=kernel.__name__, grid=[int(g) for g in grid], args=launch_args)
        self.launches.append(entry)

    def compile(self, kernel, signature, constants, attrs, options):
        import triton
        from triton.compiler import ASTSource
        source = inspect.getsource(kernel.fn)
        key = json.dumps([source, sorted(signature.items()), sorted(constants.items()),
                          sorted((list(k), v) for k, v in attrs.items()), sorted(options.items()),
                          self.target.arch, triton.__version__], default=str)
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        cubin_path = os.path.join(self.cache, digest + ".cubin")
        meta_path = os.path.join(self.cache, digest + ".json")
        if os.path.exists(cubin_path) and os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            meta.update(cubin=cubin_path, cached=True)
            return meta
        compiled = triton.compile(ASTSource(kernel, signature, constants, attrs),
                                  target=self.target, options=options)
        md = compiled.metadata
        meta = {
            "function": md.name,
            "num_warps": md.num_warps,
            "num_ctas": getattr(md, "num_ctas", 1),
            "shared": md.shared,
            "global_scratch_size": getattr(md, "global_scratch_size", 0) or 0,
            "global_scratch_align": getattr(md, "global_scratch_align", 1) or 1,
            "profile_scratch_size": getattr(md, "profile_scratch_size", 0) or 0,
            "profile_scratch_align": getattr(md, "profile_scratch_align", 1) or 1,
            "params": ptx_params(compiled.asm["ptx"], md.name),
            # The pointers Triton's launcher appends after the arguments, in order.
            "scratch": [n for n in ("global_scratch", "profile_scratch")
                        if hasattr(md, n + "_size")],
        }
        os.makedirs(self.cache, exist_ok=True)
        # Written under a temporary name, then renamed: concurrent tuners never read half a file.
        for path, data, mode in ((cubin_path, compiled.asm["cubin"], "wb"),
                                 (meta_path, json.dumps(meta), "w")):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, mode) as f:
                f.write(data)
            os.replace(tmp, path)
        meta.update(cubin=cubin_path, cached=False)
        return meta


def ptx_params(ptx, name):
    """The parameter types of the PTX entry `name`, in order (`u64` for a pointer)."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        return []
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


def plan(request):
    import importlib.util
    spec = importlib.util.spec_from_file_location("efopt_generated", request["module"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    recorder = Recorder(request.get("target", "sm_90"), request["cache"])
    for name in dir(module):
        obj = getattr(module, name)
        if type(obj).__name__ == "JITFunction" and name not in KERNEL_HELPERS:
            setattr(module, name, recorder.wrap(obj))
    buffers = []

    def new_buffer(shape, dtype_name, **extra):
        b = Placeholder(len(buffers), shape, dtype_name)
        buffers.append(dict(id=b.id, shape=list(b.shape), dtype=dtype_name, **extra))
        return b

    inputs = [new_buffer(s["shape"], s["dtype"], input=i) for i, s in enumerate(request["inputs"])]

    def empty(shape, dtype_name, _like=None):
        return new_buffer(shape, dtype_name)

    host = getattr(module, request["function"])
    outs = host(*inputs, schedule=request.get("schedule") or {}, empty=empty)
    if isinstance(outs, Placeholder):
        outs = (outs,)
    import triton
    return {"triton": triton.__version__, "buffers": buffers,
            "outputs": [o.id for o in outs], "launches": recorder.launches}


def main(path):
    with open(path) as f:
        request = json.load(f)
    try:
        result = plan(request)
    except Exception as e:  # reported to efopt, which names the candidate
        lines = traceback.format_exc().strip().splitlines()
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "traceback": lines[-8:]}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
