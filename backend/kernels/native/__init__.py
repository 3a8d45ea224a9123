"""PagedLab's compiled CPU operator: paged decode attention read through the block tables.

The torch path (backend.kernels.torch_path) gathers each sequence's blocks into a
contiguous buffer for torch's SDPA: on a CPU that copy costs about as much again as the
attention, and a small model's step pays fixed per-call costs several times over. The
operator in paged_decode.cpp computes a decode batch (one new token per sequence) in one
call, loading each K and V row once through the table, with no copy; the torch path uses
it for every decode row on a CPU when it is built, and gathers otherwise.

It is compiled ahead of time, never at run time: `make run` and `make test` build it
(`python -m backend.kernels.native`, torch's C++ extension builder with ninja, about
15 s) into build/native/, with a stamp naming the source, flags, torch and CPU features
it was built for. Loading checks the stamp, so a library from another source, torch or
kind of CPU is not used.
Without a C++ compiler, or with PAGEDLAB_NATIVE=0 set, nothing is loaded and the torch
path gathers as before; `status()` says which and why.

The operator keeps no state: concurrent calls from any number of sessions are safe.
Loading happens once per process, under a lock.

May import: torch only (none of the backend). Entry points: `decode_op`, `status`,
`build` (`python -m backend.kernels.native`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("paged_decode.cpp")
BUILD_DIR = Path(__file__).resolve().parents[3] / "build" / "native"
NAME = "pagedlab_native"
LIBRARY = BUILD_DIR / f"{NAME}.so"
STAMP = BUILD_DIR / "stamp.txt"
# Built on the machine that runs it, so for its own CPU (-march=native). The operator's
# loops vectorize only with floor() free of FP-exception semantics (-fno-trapping-math)
# and the `omp simd` reductions honoured (-fopenmp-simd: no OpenMP runtime involved).
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp-simd")
ENV_SWITCH = "PAGEDLAB_NATIVE"


@dataclass(frozen=True, slots=True)
class NativeStatus:
    """Whether the operator is loaded in this process, and if not, why."""

    loaded: bool
    reason: str  # "loaded from <path>", or what to do about it


_lock = threading.Lock()
_status: NativeStatus | None = None
_op: Callable[..., None] | None = None  # the operator's overload, once loaded
_thread = threading.local()  # .off: turned_off() is active on this thread


def fingerprint() -> str:
    """What a build must match to be loaded: the source, the flags, torch's version and
    this CPU's instruction sets (-march=native code run on a CPU without them would
    die of an illegal instruction, so a build copied from another machine is refused)."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join(FLAGS).encode())
    h.update(torch.__version__.encode())
    h.update(_cpu_features().encode())
    return h.hexdigest()


def _cpu_features() -> str:
    """The CPU's feature flags as Linux lists them, else the platform's processor name."""
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() + " " + platform.processor()


def status() -> NativeStatus:
    """Load the operator on first call (once per process) and say whether it is loaded."""
    global _status, _op
    if _status is None:
        with _lock:
            if _status is None:
                loaded = _load()
                if loaded.loaded:
                    _op = torch.ops.pagedlab.paged_decode.default
                _status = loaded
    return _status


def decode_op() -> Callable[..., None] | None:
    """torch.ops.pagedlab.paged_decode if it is loaded (and not turned off on this
    thread), else None. Called on every attention call: two attribute reads once loaded."""
    if _status is None:
        status()
    return None if _op is None or getattr(_thread, "off", False) else _op


@contextmanager
def turned_off() -> Iterator[None]:
    """Within: decode_op() is None on this thread only, so the torch path gathers (what
    the benchmarks and tests compare the operator with); other sessions are unaffected."""
    before = getattr(_thread, "off", False)
    _thread.off = True
    try:
        yield
    finally:
        _thread.off = before


def built() -> bool | None:
    """Whether the library in BUILD_DIR was built from this source, flags, torch and CPU:
    True, False (built from others), or None (not built, or not stamped)."""
    if not LIBRARY.exists() or not STAMP.exists():
        return None
    return STAMP.read_text().strip() == fingerprint()


def _load() -> NativeStatus:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return NativeStatus(False, f"turned off ({ENV_SWITCH}=0)")
    current = built()
    if current is None:
        return NativeStatus(False, "not built (run `make native`)")
    if not current:
        return NativeStatus(False, "built from another source, torch or CPU (run `make native`)")
    try:
        torch.ops.load_library(str(LIBRARY))
    except (OSError, RuntimeError) as exc:  # a library this process cannot load
        return NativeStatus(False, f"could not be loaded: {exc}")
    return NativeStatus(True, f"loaded from {LIBRARY}")


def build(verbose: bool = False) -> Path:
    """Compile the operator into BUILD_DIR and stamp it; returns the library's path.

    Raises whatever torch's builder raises (no compiler, a compile error). Ninja comes
    with PagedLab's requirements, beside this interpreter: its directory goes first on
    PATH so that the builder finds it without the virtual environment being activated.
    """
    from torch.utils import cpp_extension  # only for building: it imports setuptools

    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    STAMP.unlink(missing_ok=True)
    cpp_extension.load(name=NAME, sources=[str(SOURCE)], extra_cflags=list(FLAGS),
                       build_directory=str(BUILD_DIR), is_python_module=False,
                       verbose=verbose)
    STAMP.write_text(fingerprint() + "\n")
    return LIBRARY
