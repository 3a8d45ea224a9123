"""Launch plumbing shared by the kernels: interpreted variants, resolved launches,
offline GPU compilation, and the device facts the heuristics need (SM count, and how
many programs of a compiled kernel an SM keeps resident)."""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

_VARIANTS: dict[int, Any] = {}
_VARIANTS_LOCK = threading.Lock()


def _compile_under_lock() -> threading.RLock:
    """The interpreter's lock, with Triton's compile made to take it: for the JIT's first
    launch of a shape (which reads `triton.compiler.compile` when it first binds a
    kernel, after this module's import), for `compile_for_gpu`, and for callers of the
    `triton.compile` alias alike.

    A second import of this module (a reload) finds the wrapper in place and takes its
    lock, so that compiles and interpreted launches still share one.
    """
    import triton.compiler

    installed: threading.RLock | None = getattr(triton.compiler.compile, "pagedlab_lock",
                                                 None)
    if installed is not None:
        return installed
    lock = threading.RLock()
    compile_ = triton.compiler.compile

    @functools.wraps(compile_)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return compile_(*args, **kwargs)

    locked.pagedlab_lock = lock  # type: ignore[attr-defined]
    triton.compiler.compile = locked
    triton.compile = locked
    return lock


# Triton's interpreter keeps the launch it is running in process-wide state (the
# grid, the semantic object its patched builtins call), so two interpreted
# launches in two threads (two browser sessions stepping at once) corrupt each
# other: "x >= grid_dim[0]" or "Did you forget to add @triton.jit?". Every
# interpreted launch holds this lock, and so does every compile: for the length of
# a launch the interpreter swaps its own functions into triton.language, so a GPU
# session compiling a new kernel shape beside a session on Device cpu would build
# with them ("'block_argument' object has no attribute 'dtype'"). A compiled kernel
# already built, and torch, need no lock.
INTERPRETER_LOCK = _compile_under_lock()


def kernel_variant(kernel: Any, interpret: bool) -> Any:
    """Return `kernel` to launch compiled (`interpret=False`) or in Triton's interpreter.

    Kernels are decorated once, at import: interpreted when TRITON_INTERPRET=1 was set
    then (no GPU), compiled otherwise. On a GPU machine a CPU run needs the interpreter,
    so the same Python source is wrapped in an `InterpretedFunction`. The reverse
    (compiling a kernel that was decorated for the interpreter) is not offered: a run that
    set TRITON_INTERPRET=1 asked for the interpreter, and gets it.
    """
    if not interpret or isinstance(kernel, InterpretedFunction):
        return kernel
    key = id(kernel)
    with _VARIANTS_LOCK:
        if key not in _VARIANTS:
            _VARIANTS[key] = InterpretedFunction(kernel.fn)
        return _VARIANTS[key]


def is_interpreted(kernel: Any) -> bool:
    """Whether launching `kernel` runs Triton's interpreter rather than compiled code."""
    return isinstance(kernel, InterpretedFunction)


@dataclass(frozen=True)
class Launch:
    """One fully resolved kernel launch: `run()` executes it, `compile_for_gpu` compiles it.

    Keeping the resolved arguments lets a machine without a GPU compile exactly the
    signature a GPU run would launch (see tests/test_kernels.py), and lets a benchmark
    time the launches alone, without validation.
    """

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 1

    def run(self) -> None:
        """Launch the kernel (the interpreter ignores num_warps / num_stages).

        Interpreted launches are serialised by INTERPRETER_LOCK (see there).
        """
        if is_interpreted(self.kernel):
            with INTERPRETER_LOCK:
                self._launch()
        else:
            self._launch()

    def _launch(self) -> None:
        self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps,
                               num_stages=self.num_stages)


_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                 torch.int32: "i32", torch.int64: "i64"}
_DIVISIBLE = [["tt.divisibility", 16]]


def compile_for_gpu(launch: Launch, *, arch: int = 90) -> Any:
    """Compile `launch` for an NVIDIA GPU of compute capability `arch` (90: Hopper).

    Needs no GPU: Triton lowers to PTX and runs its bundled ptxas. Arguments are
    specialised as the runtime does (16-byte aligned pointers and ints divisible by 16
    marked so, an int equal to 1 made constant), so the result matches what a GPU run
    compiles. Returns Triton's CompiledKernel (asm["ptx"], asm["cubin"], metadata.shared).
    Triton's own helpers are decorated for the interpreter or the compiler when
    triton.language is imported, so this works only where TRITON_INTERPRET was 0 then.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if isinstance(tl.standard._elementwise_max, InterpretedFunction):
        raise RuntimeError("compile_for_gpu needs a process where triton.language was imported "
                           "without TRITON_INTERPRET=1 (run it in a child process with "
                           "TRITON_INTERPRET=0)")
    fn = JITFunction(launch.kernel.fn)
    values = dict(zip(fn.arg_names, launch.args, strict=False))
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(fn.arg_names):
        value = launch.constexprs.get(name, values.get(name))
        if name in launch.constexprs or (type(value) is int and value == 1):
            signature[name] = "constexpr"
            constants[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(i,)] = _DIVISIBLE
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = _DIVISIBLE
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"cannot specialise argument {name}={value!r}")
    source = ASTSource(fn, signature, constants, attrs)
    options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
    return triton.compiler.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


@lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA device (None for any other device)."""
    if device.type != "cuda":
        return None
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


# ----------------------------------------------------------------------------- occupancy


@dataclass(frozen=True)
class KernelResources:
    """What one program of a compiled kernel holds on an SM."""

    registers: int      # per thread
    spill_bytes: int    # local memory per thread (register spills)
    shared_bytes: int   # per program, static and dynamic
    num_warps: int


@dataclass(frozen=True)
class SMLimits:
    """Per-SM limits; the defaults are Hopper's (H100 / H200, compute capability 9.0)."""

    registers: int = 65536
    shared_bytes: int = 228 * 1024
    threads: int = 2048
    programs: int = 32


def programs_per_sm(res: KernelResources, limits: SMLimits = SMLimits()) -> int:
    """Programs of a kernel one SM keeps resident: the tightest of threads, registers and
    shared memory (registers are allocated per warp in units of 256, i.e. 8 per thread;
    every resident program also takes 1 KiB of shared memory for the system)."""
    threads = 32 * res.num_warps
    regs = -(-max(res.registers, 1) // 8) * 8
    return max(0, min(limits.threads // threads,
                      limits.registers // (regs * threads),
                      limits.shared_bytes // (res.shared_bytes + 1024),
                      limits.programs))


def offline_resources(compiled: Any, num_warps: int) -> KernelResources:
    """Registers, spills and shared memory of a `compile_for_gpu` result, read from its
    cubin with the cuobjdump Triton ships (no GPU needed)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage!r}")
    regs, _, static_shared, local = (int(x) for x in found.groups())
    return KernelResources(regs, local, static_shared + int(compiled.metadata.shared),
                           num_warps)


_CAPACITY: dict[tuple[Any, ...], int] = {}


def resident_capacity(launch: Launch, device: torch.device) -> int | None:
    """Programs of `launch`'s kernel the whole GPU keeps resident (programs per SM x SMs).

    Compiles the launch through Triton's own cache (the run that follows reuses it) and
    reads the compiled kernel's registers and shared memory; cached per signature. None
    for a device other than CUDA. Should the compiled kernel not say, falls back to two
    programs per SM.
    """
    sms = sm_count(device)
    if sms is None:
        return None
    key = (id(launch.kernel), device.index, launch.num_warps, launch.num_stages,
           tuple(sorted(launch.constexprs.items())),
           tuple(str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
                 for a in launch.args))
    if key not in _CAPACITY:
        per_sm = 2
        try:
            compiled = launch.kernel.warmup(*launch.args, grid=launch.grid,
                                            **launch.constexprs, num_warps=launch.num_warps,
                                            num_stages=launch.num_stages)
            getattr(compiled, "_init_handles", lambda: None)()
            props = torch.cuda.get_device_properties(device)
            limits = SMLimits(
                registers=getattr(props, "regs_per_multiprocessor", SMLimits.registers),
                shared_bytes=getattr(props, "shared_memory_per_multiprocessor",
                                     SMLimits.shared_bytes),
                threads=getattr(props, "max_threads_per_multi_processor", SMLimits.threads))
            res = KernelResources(int(compiled.n_regs), int(compiled.n_spills),
                                  int(compiled.metadata.shared), launch.num_warps)
            per_sm = max(1, programs_per_sm(res, limits))
        except Exception:
            pass
        _CAPACITY[key] = per_sm * sms
    return _CAPACITY[key]
