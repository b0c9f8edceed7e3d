"""GPU active checks, one JSON line per visible device: `memory`, device-to-device copy
bandwidth (GB/s, read plus write), and `compute`, FP32 FMA throughput (TFLOP/s).

Only the NVIDIA driver is needed: the container toolkit mounts libcuda.so.1 into the pod, and
the image carries no CUDA toolkit, no compiler and no numpy. So the driver API is called through
ctypes, and the kernel is PTX text that the driver compiles for whichever GPU it finds.

    python3 -I -m slonk.health.cuda memory|compute
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

LIBRARY = "libcuda.so.1"
USAGE = "usage: python3 -m slonk.health.cuda memory|compute"

MIB = 1 << 20
COPY_BYTES = 4 << 30  # enough to stream past every cache: HBM is what is measured
COPIES = 10

KERNEL = "fma_loop"
# Independent accumulators per thread: each FMA waits on its own chain's last one, so enough
# chains keep the FP32 pipes full without leaning on other warps to hide the latency.
CHAINS = 16
ROUNDS = 8  # FMAs per chain per loop pass: the loop's counter and branch cost ~2% of issue
FMAS_PER_ITERATION = CHAINS * ROUNDS
THREADS = 256
BLOCKS_PER_SM = 4
# ~0.3 s on an H100 (132 SMs at ~58 TFLOP/s), long enough for the clocks to settle and the
# launch overhead to vanish; a GPU with fewer FP32 lanes per SM takes up to ~3 times as long.
ITERATIONS = 1 << 19
WARMUP_ITERATIONS = ITERATIONS // 8
# a <- a * SCALE + STEP tends to STEP / (1 - SCALE): every value stays finite and normal.
SCALE, STEP = 0.999, 0.001

MULTIPROCESSOR_COUNT = 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6  # CUjit_option
LOG_BYTES = 4096

_P = ctypes.c_void_p  # CUcontext, CUmodule, CUfunction, CUevent, CUstream
_DEVPTR = ctypes.c_ulonglong  # CUdeviceptr (the _v2 API's; the unsuffixed one is 32 bits)
_INT, _UINT, _SIZE = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_INT_P, _P_P = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)

# Each call by the name used here: the symbols to try, newer first, and its C parameters. The
# unsuffixed cuMemAlloc, cuMemFree, cuMemGetInfo and cuMemcpyDtoDAsync take 32-bit sizes or
# pointers, so those have no fallback; cuCtxSynchronize_v2 takes a context, so it is not tried.
FUNCTIONS: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
    "cuGetErrorName": (("cuGetErrorName",), (_INT, ctypes.POINTER(ctypes.c_char_p))),
    "cuGetErrorString": (("cuGetErrorString",), (_INT, ctypes.POINTER(ctypes.c_char_p))),
    "cuInit": (("cuInit",), (_UINT,)),
    "cuDeviceGetCount": (("cuDeviceGetCount",), (_INT_P,)),
    "cuDeviceGet": (("cuDeviceGet",), (_INT_P, _INT)),
    "cuDeviceGetName": (("cuDeviceGetName",), (ctypes.c_char_p, _INT, _INT)),
    "cuDeviceGetAttribute": (("cuDeviceGetAttribute",), (_INT_P, _INT, _INT)),
    "cuDevicePrimaryCtxRetain": (("cuDevicePrimaryCtxRetain",), (_P_P, _INT)),
    "cuDevicePrimaryCtxRelease": (
        ("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
        (_INT,),
    ),
    "cuCtxSetCurrent": (("cuCtxSetCurrent",), (_P,)),
    "cuCtxSynchronize": (("cuCtxSynchronize",), ()),
    "cuMemGetInfo": (("cuMemGetInfo_v2",), (ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE))),
    "cuMemAlloc": (("cuMemAlloc_v2",), (ctypes.POINTER(_DEVPTR), _SIZE)),
    "cuMemFree": (("cuMemFree_v2",), (_DEVPTR,)),
    "cuMemcpyDtoDAsync": (("cuMemcpyDtoDAsync_v2",), (_DEVPTR, _DEVPTR, _SIZE, _P)),
    "cuEventCreate": (("cuEventCreate",), (_P_P, _UINT)),
    "cuEventRecord": (("cuEventRecord",), (_P, _P)),
    "cuEventSynchronize": (("cuEventSynchronize",), (_P,)),
    "cuEventElapsedTime": (
        ("cuEventElapsedTime_v2", "cuEventElapsedTime"),
        (ctypes.POINTER(ctypes.c_float), _P, _P),
    ),
    "cuEventDestroy": (("cuEventDestroy_v2",), (_P,)),
    "cuModuleLoadDataEx": (
        ("cuModuleLoadDataEx",),
        (_P_P, ctypes.c_char_p, _UINT, _INT_P, _P_P),
    ),
    "cuModuleGetFunction": (("cuModuleGetFunction",), (_P_P, _P, ctypes.c_char_p)),
    "cuModuleUnload": (("cuModuleUnload",), (_P,)),
    "cuLaunchKernel": (
        ("cuLaunchKernel",),
        (_P, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _P, _P_P, _P_P),
    ),
}


class ProbeError(Exception):
    """What stops a measurement; its message is the probe's line on stderr."""


class CudaError(ProbeError):
    """A driver call that did not return CUDA_SUCCESS."""

    def __init__(self, call: str, code: int, description: str) -> None:
        super().__init__(f"{call} failed: {description}")
        self.code = code


class Driver:
    """libcuda's calls, typed; a call that fails raises CudaError."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.symbols: dict[str, str] = {}
        self.functions: dict[str, Callable[..., int]] = {}
        for name, (symbols, argtypes) in FUNCTIONS.items():
            symbol = next((s for s in symbols if hasattr(lib, s)), None)
            if symbol is None:
                raise ProbeError(f"{LIBRARY} lacks {symbols[0]}: the driver is too old")
            function = getattr(lib, symbol)
            function.argtypes = argtypes
            function.restype = ctypes.c_int
            self.symbols[name], self.functions[name] = symbol, function

    def __call__(self, name: str, *args: object) -> None:
        code = self.functions[name](*args)
        if code:
            raise CudaError(self.symbols[name], code, self.describe(code))

    def _text(self, name: str, code: int) -> str | None:
        text = ctypes.c_char_p()
        if self.functions[name](code, ctypes.byref(text)) or not text.value:
            return None  # a code this driver has no words for
        return text.value.decode(errors="replace")

    def describe(self, code: int) -> str:
        """The error's name and string: CUDA_ERROR_OUT_OF_MEMORY (out of memory)."""
        name = self._text("cuGetErrorName", code) or f"CUDA error {code}"
        string = self._text("cuGetErrorString", code)
        return f"{name} ({string})" if string else name

    @contextmanager
    def releasing(self, name: str, *args: object) -> Iterator[None]:
        """Calls `name(*args)` on the way out. After a failure it goes unchecked: a context a
        fault left unusable fails every call, and the first error is the one to report."""
        try:
            yield
        except BaseException:
            self.functions[name](*args)
            raise
        self(name, *args)

    @contextmanager
    def allocated(self, size: int) -> Iterator[int]:
        pointer = _DEVPTR()
        self("cuMemAlloc", ctypes.byref(pointer), size)
        with self.releasing("cuMemFree", pointer.value):
            yield pointer.value

    @contextmanager
    def event(self) -> Iterator[ctypes.c_void_p]:
        handle = ctypes.c_void_p()
        self("cuEventCreate", ctypes.byref(handle), 0)  # CU_EVENT_DEFAULT: it keeps time
        with self.releasing("cuEventDestroy", handle):
            yield handle

    def timed(self, work: Callable[[], None]) -> float:
        """Seconds the GPU spent on what `work` queues on the null stream, by its own clock:
        the host's would count the launch and the wait for it."""
        with self.event() as start, self.event() as stop:
            self("cuEventRecord", start, None)
            work()
            self("cuEventRecord", stop, None)
            self("cuEventSynchronize", stop)
            milliseconds = ctypes.c_float()
            self("cuEventElapsedTime", ctypes.byref(milliseconds), start, stop)
        return milliseconds.value / 1e3

    @contextmanager
    def module(self, ptx: str) -> Iterator[ctypes.c_void_p]:
        """`ptx` compiled by the driver for the current context's GPU; a PTX error is reported
        with the compiler's log."""
        handle = ctypes.c_void_p()
        log = ctypes.create_string_buffer(LOG_BYTES)
        options = (ctypes.c_int * 2)(JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.addressof(log), LOG_BYTES)
        try:
            self("cuModuleLoadDataEx", ctypes.byref(handle), ptx.encode(), 2, options, values)
        except CudaError as err:
            detail = " ".join(log.value.decode(errors="replace").split())
            if detail:
                raise ProbeError(f"{err}: {detail}") from err
            raise
        with self.releasing("cuModuleUnload", handle):
            yield handle


def copy_bytes(free: int) -> int:
    """Each of the copy's two buffers: 4 GiB, or a quarter of the free memory where that is
    less (a GPU a job left memory on still gets measured), in whole MiB."""
    return min(COPY_BYTES, free // 4) // MIB * MIB


def bandwidth(size: int, copies: int, seconds: float) -> float:
    """GB/s of `copies` copies of `size` bytes, each read once and written once."""
    return 2 * size * copies / seconds / 1e9


def fmas(blocks: int, threads: int, iterations: int) -> int:
    """The FMAs one launch of the kernel does."""
    return blocks * threads * iterations * FMAS_PER_ITERATION


def tflops(count: int, seconds: float) -> float:
    """TFLOP/s of `count` FMAs, two floating-point operations each."""
    return 2 * count / seconds / 1e12


def _f32(value: float) -> str:
    """A PTX single-precision immediate: 0f and the IEEE 754 bits in hex."""
    return "0f" + struct.pack(">f", value).hex().upper()


def ptx(chains: int = CHAINS, rounds: int = ROUNDS) -> str:
    """The FMA kernel: each thread runs `chains` independent a = a * SCALE + STEP chains,
    `rounds` deep per loop pass, for its `iterations` parameter's passes, then stores their
    sum at out[thread], so that no compiler can drop the work. PTX 7.0 for sm_70: any driver
    from CUDA 11 on compiles it for a Volta or newer GPU."""
    acc = [f"%f{i}" for i in range(chains)]
    scale, step, seed = f"%f{chains}", f"%f{chains + 1}", f"%f{chains + 2}"
    return "\n".join([
        ".version 7.0",
        ".target sm_70",
        ".address_size 64",
        "",
        f".visible .entry {KERNEL}(",
        f"\t.param .u64 {KERNEL}_out,",
        f"\t.param .u32 {KERNEL}_iterations",
        ")",
        "{",
        "\t.reg .pred %p<1>;",
        "\t.reg .b32 %r<5>;",
        "\t.reg .b64 %rd<3>;",
        f"\t.reg .f32 %f<{chains + 3}>;",
        "",
        f"\tld.param.u64 %rd0, [{KERNEL}_out];",
        "\tcvta.to.global.u64 %rd0, %rd0;",
        f"\tld.param.u32 %r0, [{KERNEL}_iterations];",
        "\tmov.u32 %r1, %tid.x;",
        "\tmov.u32 %r2, %ctaid.x;",
        "\tmov.u32 %r3, %ntid.x;",
        "\tmad.lo.u32 %r4, %r2, %r3, %r1;",
        f"\tcvt.rn.f32.u32 {seed}, %r4;",
        *(f"\tadd.f32 {a}, {seed}, {_f32(i)};" for i, a in enumerate(acc)),
        f"\tmov.f32 {scale}, {_f32(SCALE)};",
        f"\tmov.f32 {step}, {_f32(STEP)};",
        "\tsetp.eq.u32 %p0, %r0, 0;",  # else zero passes would wrap around to 2**32
        "\t@%p0 bra DONE;",
        "LOOP:",
        *(f"\tfma.rn.f32 {a}, {a}, {scale}, {step};" for _ in range(rounds) for a in acc),
        "\tsub.u32 %r0, %r0, 1;",
        "\tsetp.ne.u32 %p0, %r0, 0;",
        "\t@%p0 bra LOOP;",
        "DONE:",
        *(f"\tadd.f32 %f0, %f0, {a};" for a in acc[1:]),
        "\tmul.wide.u32 %rd1, %r4, 4;",
        "\tadd.s64 %rd2, %rd0, %rd1;",
        "\tst.global.f32 [%rd2], %f0;",
        "\tret;",
        "}",
        "",
    ])  # fmt: skip


def copy_bandwidth(cuda: Driver, device: ctypes.c_int) -> float:
    free, total = _SIZE(), _SIZE()
    cuda("cuMemGetInfo", ctypes.byref(free), ctypes.byref(total))
    size = copy_bytes(free.value)
    if not size:
        raise ProbeError(f"{free.value // MIB} MiB free, too little to measure")
    with cuda.allocated(size) as source, cuda.allocated(size) as target:

        def copy(times: int) -> None:
            for _ in range(times):
                cuda("cuMemcpyDtoDAsync", target, source, size, None)

        copy(1)  # the first copy pays for mapping the pages and waking the clocks
        seconds = cuda.timed(lambda: copy(COPIES))
    return bandwidth(size, COPIES, seconds)


def fma_throughput(cuda: Driver, device: ctypes.c_int) -> float:
    sms = ctypes.c_int()
    cuda("cuDeviceGetAttribute", ctypes.byref(sms), MULTIPROCESSOR_COUNT, device)
    blocks = BLOCKS_PER_SM * sms.value  # a whole number per SM: no SM idles at the end
    with cuda.module(ptx()) as module, cuda.allocated(blocks * THREADS * 4) as out:
        kernel = ctypes.c_void_p()
        cuda("cuModuleGetFunction", ctypes.byref(kernel), module, KERNEL.encode())

        def launch(iterations: int) -> None:
            # kernelParams: a pointer to each argument's value, in the kernel's order; the
            # driver copies them before cuLaunchKernel returns.
            out_arg, iterations_arg = _DEVPTR(out), ctypes.c_uint(iterations)
            params = (ctypes.c_void_p * 2)(
                ctypes.addressof(out_arg), ctypes.addressof(iterations_arg)
            )
            cuda("cuLaunchKernel", kernel, blocks, 1, 1, THREADS, 1, 1, 0, None, params, None)

        launch(WARMUP_ITERATIONS)  # the clocks rise to their working speed
        seconds = cuda.timed(lambda: launch(ITERATIONS))
        cuda("cuCtxSynchronize")
    return tflops(fmas(blocks, THREADS, ITERATIONS), seconds)


MEASURES: dict[str, tuple[Callable[[Driver, ctypes.c_int], float], str]] = {
    "memory": (copy_bandwidth, "GB/s"),
    "compute": (fma_throughput, "TFLOP/s"),
}


def on_device(
    cuda: Driver, index: int, measure: Callable[[Driver, ctypes.c_int], float]
) -> tuple[str, float]:
    """The name of the device at `index` and what `measure` found, in its primary context (the
    one the CUDA runtime would use, so nothing else on the GPU is disturbed by a second)."""
    device = ctypes.c_int()
    cuda("cuDeviceGet", ctypes.byref(device), index)
    name = ctypes.create_string_buffer(256)
    cuda("cuDeviceGetName", name, len(name), device)
    context = ctypes.c_void_p()
    cuda("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    with cuda.releasing("cuDevicePrimaryCtxRelease", device):
        cuda("cuCtxSetCurrent", context)
        value = measure(cuda, device)
    return name.value.decode(errors="replace"), value


def load() -> ctypes.CDLL:
    return ctypes.CDLL(LIBRARY)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1 or args[0] not in MEASURES:
        print(USAGE, file=sys.stderr)
        return 2
    measure, unit = MEASURES[args[0]]
    try:
        lib = load()
    except OSError as err:
        print(f"{LIBRARY} not found: {err}", file=sys.stderr)
        return 1
    index: int | None = None
    try:
        cuda = Driver(lib)
        cuda("cuInit", 0)
        count = ctypes.c_int()
        cuda("cuDeviceGetCount", ctypes.byref(count))
        if not count.value:
            raise ProbeError("no CUDA device visible")
        for index in range(count.value):
            name, value = on_device(cuda, index, measure)
            line = {"index": index, "name": name, "value": round(value, 1), "unit": unit}
            print(json.dumps(line), flush=True)  # a later device's hang keeps this one's
    except ProbeError as err:
        print(f"device {index}: {err}" if index is not None else str(err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
