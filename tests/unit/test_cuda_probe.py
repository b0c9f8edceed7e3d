"""The GPU active-check probe (slonk.health.cuda) without a GPU: its PTX kernel's text, its
formulas, its command line, and its driver calls against a stand-in libcuda that converts every
argument as ctypes would for the real one and reads the kernel's parameters back from memory.
Where a real libcuda is present, the probe itself runs."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slonk.health import cuda

GIB = 1 << 30


def _loop(text: str) -> list[str]:
    """The kernel's loop body: the lines from its label to its branch back."""
    lines = [line.strip() for line in text.splitlines()]
    start = lines.index("LOOP:")
    return lines[start + 1 : lines.index("@%p0 bra LOOP;", start)]


def test_the_ptx_declares_one_entry_with_balanced_braces():
    text = cuda.ptx()
    assert text.startswith(".version 7.0\n.target sm_70\n.address_size 64\n")
    assert re.findall(r"\.entry (\w+)\(", text) == [cuda.KERNEL]
    assert f".visible .entry {cuda.KERNEL}(" in text
    assert text.count("{") == text.count("}") == 1
    assert text.count("(") == text.count(")") == 1
    assert text.rstrip().endswith("ret;\n}")


@pytest.mark.parametrize(("chains", "rounds"), [(cuda.CHAINS, cuda.ROUNDS), (4, 1), (12, 3)])
def test_the_ptx_declares_every_register_it_uses(chains, rounds):
    text = cuda.ptx(chains, rounds)
    declared = {
        name: int(count) for name, count in re.findall(r"\.reg \.\w+ %([a-z]+)<(\d+)>;", text)
    }
    assert set(declared) == {"p", "r", "rd", "f"}
    body = text.split("{", 1)[1]
    used = re.findall(r"%([a-z]+)(\d+)\b", body)
    assert used
    for name, number in used:
        assert int(number) < declared[name], f"%{name}{number} beyond %{name}<{declared[name]}>"
    assert {f"%f{i}" for i in range(declared["f"])} <= {f"%{n}{i}" for n, i in used}


def test_each_loop_pass_does_the_fmas_the_flop_count_assumes():
    body = _loop(cuda.ptx())
    fmas = [line for line in body if line.startswith("fma.rn.f32 ")]
    assert len(fmas) == cuda.FMAS_PER_ITERATION == cuda.CHAINS * cuda.ROUNDS
    assert len(body) == len(fmas) + 2  # and only the counter's decrement and test besides
    # Consecutive FMAs belong to different chains: none waits on the one just before it.
    targets = [line.split()[1].rstrip(",") for line in fmas]
    assert len(set(targets)) == cuda.CHAINS
    assert all(a != b for a, b in itertools.pairwise(targets))
    assert cuda.fmas(1, 1, 1) == cuda.FMAS_PER_ITERATION


def test_every_chain_reaches_the_stored_result():
    text = cuda.ptx()
    tail = text.split("DONE:", 1)[1]
    summed = set(re.findall(r"add\.f32 %f0, %f0, (%f\d+);", tail))
    assert summed == {f"%f{i}" for i in range(1, cuda.CHAINS)}
    assert "st.global.f32 [%rd2], %f0;" in tail


def test_the_ptx_float_immediates_are_ieee_bits():
    assert cuda._f32(1.0) == "0f3F800000"
    assert cuda._f32(0) == "0f00000000"
    assert re.fullmatch(r"0f[0-9A-F]{8}", cuda._f32(cuda.SCALE))


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="no ptxas (CUDA toolkit) here")
def test_ptxas_assembles_the_kernel(tmp_path: Path):
    source = tmp_path / "fma.ptx"
    source.write_text(cuda.ptx())
    done = subprocess.run(
        ["ptxas", "--gpu-name", "sm_80", str(source), "-o", str(tmp_path / "fma.cubin")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_copy_size_is_4_gib_or_a_quarter_of_free_memory_in_whole_mib():
    assert cuda.copy_bytes(79 * GIB) == 4 * GIB
    assert cuda.copy_bytes(10 * GIB + 12345) == 10 * GIB // 4
    assert cuda.copy_bytes(10 * (1 << 20) + 5) == 2 * (1 << 20)
    assert cuda.copy_bytes(3 << 20) == 0


def test_the_formulas():
    # 10 copies of 4 GiB, read and written, in 28.4 ms; the project's H100 figure.
    assert cuda.bandwidth(4 * GIB, 10, 2 * 4 * GIB * 10 / 3025.1e9) == pytest.approx(3025.1)
    assert cuda.bandwidth(1_000_000_000, 1, 1.0) == 2.0
    assert cuda.fmas(528, 256, 1000) == 528 * 256 * 1000 * cuda.FMAS_PER_ITERATION
    assert cuda.tflops(10**12, 1.0) == 2.0
    # The default launch on an H100 (132 SMs) at 57.8 TFLOP/s: a few hundred ms.
    count = cuda.fmas(cuda.BLOCKS_PER_SM * 132, cuda.THREADS, cuda.ITERATIONS)
    assert 0.2 < 2 * count / 57.8e12 < 0.5


def test_no_libcuda_is_one_line_and_exit_1(monkeypatch, capsys):
    def missing() -> ctypes.CDLL:
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cuda, "load", missing)
    assert cuda.main(["memory"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "libcuda.so.1 not found: libcuda.so.1: cannot open shared object file: "
        "No such file or directory\n"
    )


@pytest.mark.parametrize("argv", [[], ["flops"], ["memory", "compute"], ["--help"]])
def test_bad_arguments_print_the_usage_and_exit_2(argv, capsys):
    assert cuda.main(argv) == 2
    assert capsys.readouterr() == ("", cuda.USAGE + "\n")


ERRORS = {
    2: ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    100: ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
    218: ("CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"),
}


def _set(reference: Any, value: object) -> int:
    """Writes through a byref() argument, as the driver writes its answers; CUDA_SUCCESS."""
    reference._obj.value = value
    return 0


class FakeFunction:
    """One symbol of FakeLib: checks its arguments as ctypes would, then answers."""

    def __init__(self, lib: FakeLib, name: str) -> None:
        self.lib, self.name = lib, name
        self.argtypes: tuple[Any, ...] | None = None
        self.restype: Any = None

    def __call__(self, *args: Any) -> int:
        # ctypes converts each argument before the real call: a wrong type or count fails here.
        assert self.argtypes is not None and self.restype is ctypes.c_int, self.name
        assert len(args) == len(self.argtypes), self.name
        for argtype, arg in zip(self.argtypes, args, strict=True):
            argtype.from_param(arg)
        self.lib.calls.append(self.name)
        if self.name in self.lib.fail:
            return self.lib.fail[self.name]
        handler = self.lib.handlers.get(self.name.removesuffix("_v2"))
        return handler(*args) if handler else 0


class FakeLib:
    """libcuda with one H100: 132 SMs, 79 GiB free, copying at 3025.1 GB/s and doing FMAs at
    57.8 TFLOP/s by its event clock."""

    def __init__(self, symbols: set[str] | None = None, fail: dict[str, int] | None = None):
        self.symbols = NEWEST if symbols is None else symbols
        self.fail = fail or {}
        self.calls: list[str] = []
        self.launches: list[tuple[int, int, int]] = []
        self.live: set[int] = set()
        self.jit_log = ""
        self.timed = 0.0  # GPU seconds since the last start event
        self.handlers: dict[str, Callable[..., int]] = {
            "cuGetErrorName": lambda code, ref: self._text(code, ref, 0),
            "cuGetErrorString": lambda code, ref: self._text(code, ref, 1),
            "cuDeviceGetCount": lambda ref: _set(ref, 1),
            "cuDeviceGetName": self._name,
            "cuDeviceGetAttribute": lambda ref, attribute, device: _set(ref, 132),
            "cuDevicePrimaryCtxRetain": lambda ref, device: _set(ref, 0x10),
            "cuMemGetInfo": lambda free, total: _set(free, 79 * GIB),
            "cuMemAlloc": self._alloc,
            "cuMemFree": self._free,
            "cuMemcpyDtoDAsync": self._copy,
            "cuEventCreate": lambda ref, flags: _set(ref, 0x20 + self.calls.count("cuEventCreate")),
            "cuEventRecord": self._record,
            "cuEventElapsedTime": lambda ref, start, stop: _set(ref, self.timed * 1e3),
            "cuModuleLoadDataEx": self._load,
            "cuModuleGetFunction": lambda ref, module, name: _set(ref, 0x30),
            "cuLaunchKernel": self._launch,
        }

    def __getattr__(self, name: str) -> FakeFunction:
        if name not in self.__dict__.get("symbols", ()):
            raise AttributeError(name)
        function = FakeFunction(self, name)
        setattr(self, name, function)  # ctypes.CDLL also hands out one object per symbol
        return function

    def _text(self, code: int, reference: Any, which: int) -> int:
        return _set(reference, ERRORS[code][which].encode()) if code in ERRORS else 1

    def _name(self, name: Any, size: int, device: Any) -> int:
        assert size == len(name)
        name.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def _alloc(self, reference: Any, size: int) -> int:
        pointer = 0x7F00_0000_0000 + (len(self.live) << 36)
        self.live.add(pointer)
        return _set(reference, pointer)

    def _free(self, pointer: int) -> int:
        self.live.remove(pointer)
        return 0

    def _copy(self, target: int, source: int, size: int, stream: None) -> int:
        assert {target, source} <= self.live and target != source and stream is None
        self.timed += 2 * size / 3025.1e9
        return 0

    def _record(self, event: Any, stream: None) -> int:
        assert stream is None
        if self.calls.count("cuEventRecord") % 2:  # a start event
            self.timed = 0.0
        return 0

    def _load(self, reference: Any, image: bytes, count: int, options: Any, values: Any) -> int:
        assert image.startswith(b".version 7.0\n") and count == 2
        assert list(options) == [cuda.JIT_ERROR_LOG_BUFFER, cuda.JIT_ERROR_LOG_BUFFER_SIZE_BYTES]
        assert values[1] == cuda.LOG_BYTES
        if self.jit_log:
            ctypes.memmove(values[0], self.jit_log.encode(), len(self.jit_log))
            return 218
        return _set(reference, 0x1000)

    def _launch(self, kernel: Any, *dims_and_rest: Any) -> int:
        (gx, gy, gz), (bx, by, bz), (shared, stream, params, extra) = (
            dims_and_rest[:3],
            dims_and_rest[3:6],
            dims_and_rest[6:],
        )
        # kernelParams: the address of each argument's value, read back as the driver does.
        out = ctypes.c_ulonglong.from_address(params[0]).value
        iterations = ctypes.c_uint.from_address(params[1]).value
        assert out in self.live
        assert (gy, gz, by, bz, shared, stream, extra) == (1, 1, 1, 1, 0, None, None)
        self.launches.append((gx, bx, iterations))
        self.timed += 2 * cuda.fmas(gx, bx, iterations) / 57.8e12
        return 0


NEWEST = {names[0] for names, _ in cuda.FUNCTIONS.values()}


@pytest.fixture
def fake(monkeypatch) -> Callable[..., FakeLib]:
    def make(**kwargs: Any) -> FakeLib:
        lib = FakeLib(**kwargs)
        monkeypatch.setattr(cuda, "load", lambda: lib)
        return lib

    return make


def test_memory_prints_the_devices_line_and_frees_what_it_took(fake, capsys):
    lib = fake()
    assert cuda.main(["memory"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == '{"index": 0, "name": "NVIDIA H100 80GB HBM3", "value": 3025.1, "unit": "GB/s"}\n'
    assert lib.calls.count("cuMemcpyDtoDAsync_v2") == 1 + cuda.COPIES
    assert lib.calls.count("cuMemFree_v2") == 2 and not lib.live
    assert lib.calls.count("cuEventDestroy_v2") == lib.calls.count("cuEventCreate") == 2
    assert lib.calls[-1] == "cuDevicePrimaryCtxRelease_v2"


def test_compute_launches_with_its_parameters_in_memory(fake, capsys):
    lib = fake()
    assert cuda.main(["compute"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out) == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "value": 57.8, "unit": "TFLOP/s"
    }  # fmt: skip
    blocks = cuda.BLOCKS_PER_SM * 132
    assert lib.launches == [
        (blocks, cuda.THREADS, cuda.WARMUP_ITERATIONS),
        (blocks, cuda.THREADS, cuda.ITERATIONS),
    ]
    assert "cuModuleUnload" in lib.calls and "cuCtxSynchronize" in lib.calls and not lib.live


def test_a_driver_error_names_the_call_the_error_and_the_device(fake, capsys):
    lib = fake(fail={"cuMemAlloc_v2": 2, "cuDevicePrimaryCtxRelease_v2": 2})
    assert cuda.main(["memory"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    # The release after the failure is made but not reported: the first error is the one.
    assert err == "device 0: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)\n"
    assert lib.calls[-1] == "cuDevicePrimaryCtxRelease_v2"


def test_an_error_before_any_device_and_one_the_driver_cannot_name(fake, capsys):
    fake(fail={"cuInit": 100})
    assert cuda.main(["compute"]) == 1
    assert capsys.readouterr().err == (
        "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)\n"
    )
    fake(fail={"cuEventSynchronize": 999})
    assert cuda.main(["compute"]) == 1
    assert capsys.readouterr().err == "device 0: cuEventSynchronize failed: CUDA error 999\n"


def test_a_ptx_error_carries_the_compilers_log(fake, capsys):
    lib = fake()
    lib.jit_log = "ptxas application ptx input, line 9; error   : Unknown symbol\nptxas fatal\n"
    assert cuda.main(["compute"]) == 1
    assert capsys.readouterr().err == (
        "device 0: cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX (a PTX JIT compilation "
        "failed): ptxas application ptx input, line 9; error : Unknown symbol ptxas fatal\n"
    )


def test_an_older_drivers_symbols_are_used_and_a_missing_one_is_named(fake, capsys):
    older = NEWEST - {"cuDevicePrimaryCtxRelease_v2", "cuEventElapsedTime_v2"}
    lib = fake(symbols=older | {"cuDevicePrimaryCtxRelease", "cuEventElapsedTime"})
    assert cuda.main(["memory"]) == 0
    assert lib.calls[-1] == "cuDevicePrimaryCtxRelease"
    capsys.readouterr()
    fake(symbols=NEWEST - {"cuMemAlloc_v2"})
    assert cuda.main(["memory"]) == 1
    assert capsys.readouterr().err == "libcuda.so.1 lacks cuMemAlloc_v2: the driver is too old\n"


@pytest.mark.skipif(ctypes.util.find_library("cuda") is None, reason="no libcuda here")
@pytest.mark.parametrize(("what", "unit"), [("memory", "GB/s"), ("compute", "TFLOP/s")])
def test_the_real_probe_prints_one_line_per_device(what, unit):
    done = subprocess.run(
        [sys.executable, "-I", "-m", "slonk.health.cuda", what],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode == 1 and "CUDA_ERROR_NO_DEVICE" in done.stderr:
        pytest.skip("a driver, but no GPU")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines
    for index, line in enumerate(lines):
        assert list(line) == ["index", "name", "value", "unit"]
        assert line["index"] == index and line["unit"] == unit and line["name"]
        assert isinstance(line["value"], float) and line["value"] > 0
