"""Where the Triton kernels of `bertkit.kernels` (norm, gelu, cross_entropy) can run, how they are defined, and
how a test compiles one for a GPU it does not have.

Design decision: Triton is imported lazily and each module defines its kernels in a function called at first
use (`define_kernels`), never at import: bertkit imports without Triton, and TRITON_INTERPRET (the tests set it
to run the kernels on CPU tensors, in numpy) is read when Triton is first imported, which is also when Triton
builds its own library kernels (tl.sum, tl.rand) for one mode or the other, so a process is in one mode only.
`compile_for_gpu` compiles a kernel ahead of time for a target such as the H100/H200's sm_90 on a machine
without a GPU (Triton ships ptxas), in a process that is not interpreting, so a test proves the kernels
compile there and reads the resources ptxas gave them (registers, spills to local memory).

References: Triton's tutorials (layer norm, fused softmax, low-memory dropout); `triton.compile` with an
`ASTSource` and a `GPUTarget`, as Triton's `tools/compile.py` does.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import tempfile
import types
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")

MIN_CAPABILITY = (8, 0)
"""bf16 loads, stores and conversions in Triton need Ampere (sm_80) or newer; older GPUs use the reference."""


def installed() -> bool:
    """Triton can be imported (without importing it); sys.modules["triton"] = None blocks it, as for any module."""
    try:
        return importlib.util.find_spec("triton") is not None
    except ValueError:  # blocked: in sys.modules as None
        return False


def interpreting() -> bool:
    """TRITON_INTERPRET is on: `triton.jit` kernels run on the CPU, in numpy, on CPU tensors (tests)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "on", "yes"}


def reason_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device`, in one line for a user; None when they can."""
    if not installed():
        return "Triton is not installed (pip install triton); the PyTorch reference path runs instead"
    if device.type == "cpu" and interpreting():
        return None
    if device.type != "cuda":
        return (f"the Triton kernels run on CUDA devices, not {device.type} (TRITON_INTERPRET=1 runs them on the "
                "CPU interpreter, for tests)")
    if not torch.cuda.is_available():
        return "no CUDA device is available"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"the Triton kernels need compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer for "
                f"bf16; this GPU has {capability[0]}.{capability[1]}")
    return None


def available(device: torch.device) -> bool:
    """The Triton kernels can run on `device` (see `reason_unavailable`)."""
    return reason_unavailable(device) is None


def modules() -> tuple[Any, Any]:
    """(triton, triton.language), imported now; untyped, hence Any."""
    return importlib.import_module("triton"), importlib.import_module("triton.language")


def define_kernels(define: Callable[[Any, Any], T]) -> T:
    """`define(jit, tl)`: the kernels of a module, defined at first use with `jit` = `triton.jit`, which builds
    interpreted (CPU) or compiled kernels as TRITON_INTERPRET said when Triton was imported.

    `define` holds its kernels as nested functions: a kernel calls a helper kernel through its closure. The
    compiler reads closures; the interpreter runs a kernel's source against the function's globals only, so
    there each function gets a copy of its globals with its closure's names added."""
    triton, tl = modules()

    def jit(fn: Callable[..., Any]) -> Any:
        if triton.knobs.runtime.interpret:
            scope = {**fn.__globals__, **inspect.getclosurevars(fn).nonlocals}
            fn = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        return triton.jit(fn)

    return define(jit, tl)


def device_guard(device: torch.device) -> AbstractContextManager[object]:
    """Triton launches on the current CUDA device, so make it the tensors' one (a no-op on the CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (Triton block sizes are powers of two)."""
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def row_groups(rows: int, *, max_programs: int, min_rows: int = 4, max_rows: int = 64) -> tuple[int, int]:
    """(programs, rows_per_program) for a kernel whose programs each sum a group of rows into one partial
    (weight and bias gradients): about `max_programs` partials for torch to add up. rows_per_program is a
    power of two in [min_rows, max_rows], a constexpr: at most a handful of compiled variants, and the
    interpreter (numpy >= 2.4) cannot take a runtime loop bound."""
    per_program = min(max_rows, next_power_of_2(max(min_rows, cdiv(rows, max_programs))))
    return cdiv(rows, per_program), per_program


@dataclass(frozen=True)
class CompiledInfo:
    """One kernel compiled ahead of time: the compiled object (asm["ptx"], asm["cubin"], metadata) and what
    ptxas gave it, read back from the cubin."""

    kernel: Any
    registers: int
    """Registers per thread."""
    local_bytes: int
    """Local memory per thread: where register spills go (0 = no spills)."""
    stack_bytes: int
    shared_bytes: int
    num_warps: int


def compile_for_gpu(kernel: Any, signature: Mapping[str, str], constexprs: Mapping[str, Any], *, num_warps: int,
                    divisible_by_16: Collection[str] = (), arch: int = 90) -> CompiledInfo:
    """Compile a jit kernel (in a process that is not interpreting) for CUDA compute capability `arch` (90 =
    H100/H200) without a GPU. `signature` types every argument ("*bf16", "i32", "fp32", "constexpr"), `constexprs` gives
    the constexpr values, `num_warps` must be the launcher's; `divisible_by_16` names the arguments a launch
    specializes as such (torch's allocations are 16-byte aligned; sizes like 768), as Triton's launcher does."""
    triton, _ = modules()
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible_by_16}
    source = triton.compiler.ASTSource(fn=kernel, signature=dict(signature), constexprs=dict(constexprs), attrs=attrs)
    target = triton.backends.compiler.GPUTarget("cuda", arch, 32)
    compiled = triton.compile(source, target=target, options={"num_warps": num_warps})
    usage = _resource_usage(compiled.asm["cubin"], triton.knobs.nvidia.cuobjdump.path)
    return CompiledInfo(kernel=compiled, registers=usage["REG"], local_bytes=usage["LOCAL"],
                        stack_bytes=usage["STACK"], shared_bytes=compiled.metadata.shared,
                        num_warps=compiled.metadata.num_warps)


def _resource_usage(cubin: bytes, cuobjdump: str) -> dict[str, int]:
    """REG, STACK, LOCAL, SHARED of the cubin's one kernel, from `cuobjdump -res-usage` (Triton ships it): a
    compiled kernel's metadata holds its registers and spills only once loaded on a GPU."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as file:
            file.write(cubin)
        text = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
