"""Every Triton kernel of fastcrit_kernels compiled for the GPUs it is meant for, without a GPU.

Triton ships ptxas, so ``triton.compile`` runs the real pipeline (TTIR -> TTGIR -> LLVM IR -> PTX ->
cubin) for a ``GPUTarget`` on a CPU-only machine. For every variant a GPU launch can ask for (each
module's ``_gpu_variants()``: every dtype, constexpr combination and autotune tile the dispatch can
choose), for sm_80 (A100) and sm_90a (H100), this checks that it compiles, that its shared memory
fits one block's limit, that ptxas reports no register spills, and that bf16/fp16 (and opt-in tf32)
GEMMs use tensor-core instructions (``mma`` / ``wgmma``) while exact fp32 ones and the element-wise
kernels do not. Nothing is launched: speed, and what a launch decides at run time, are checked
elsewhere (under the interpreter here, on a GPU by the tests marked ``gpu``).

Each variant is compiled as a launch specialises it: every pointer 16-byte aligned, and for the
GEMMs H and the row strides multiples of 16 (on a GPU the dispatch sends anything else to the torch
path); other integers unspecialised. Triton also specialises integers that happen to be divisible
by 16 or equal to 1 (e.g. N = 1): those variants are not compiled here.

The compilation runs in a subprocess (this file run as a script): the kernels must be imported with
the interpreter off, and the Triton cache lives in a fresh temporary directory, so nothing compiled
in another session can stand in for a fresh compile.

Run with ``-s`` to see the table of every compilation (shared memory, registers, spills, tensor-core
instructions, compile time).
"""

import contextlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import subprocess
import sys
import time

import pytest

# Shared memory one thread block may use (the opt-in maximum, what Triton compares ``shared``
# against at load time via cudaDevAttrMaxSharedMemoryPerBlockOptin):
# - sm_80, A100: 163 KB = 166912 bytes ("NVIDIA Ampere GPU Architecture Tuning Guide", 1.4.1.4
#   Shared Memory: 164 KB per SM, of which a single thread block can address up to 163 KB);
# - sm_90, H100: 227 KB = 232448 bytes ("NVIDIA Hopper Tuning Guide", 1.4.1.5 Shared Memory: up
#   to 228 KB per SM, 227 KB per thread block; 1 KB per block is reserved by CUDA);
# https://docs.nvidia.com/cuda/ampere-tuning-guide/ and https://docs.nvidia.com/cuda/hopper-tuning-guide/
# The default (first) tile of each GEMM must also fit sm_86 / sm_89 (RTX 30xx / 40xx, L4, L40):
# 99 KB = 101376 bytes per block (same guide's table of compute capabilities); there, the autotuner
# drops any other tile that does not fit.
SHARED_LIMIT = {80: 166912, 90: 232448}
SHARED_LIMIT_SM86 = 101376
ARCHS = (80, 90)


def _ptxas_missing():
    """Why ptxas cannot run here, or None."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except Exception as e:  # triton (or its NVIDIA backend) is not installed
        return f"triton's NVIDIA backend is unavailable: {e!r}"
    for arch in ARCHS:
        try:
            path = get_ptxas(arch).path
            subprocess.run([path, "--version"], check=True, capture_output=True, timeout=60)
        except Exception as e:
            return f"ptxas for sm_{arch} is unavailable: {e!r}"
    return None


_MISSING = _ptxas_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"cannot compile for NVIDIA GPUs: {_MISSING}")


def _modules():
    import fastcrit_kernels

    return [
        importlib.import_module(f"fastcrit_kernels.{m.name}") for m in pkgutil.iter_modules(fastcrit_kernels.__path__)
    ]


def _kernels(module):
    """The launchable Triton kernels a module defines (named ``*_kernel``; helpers are inlined)."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if name.endswith("_kernel") and hasattr(obj, "fn") and obj.fn.__module__ == module.__name__
    }


def _variants():
    return [v for m in _modules() if hasattr(m, "_gpu_variants") for v in m._gpu_variants()]


# ----------------------------------------------------------------------------------------------
# The compiling side (run as a script, interpreter off)
# ----------------------------------------------------------------------------------------------
def _compile_one(job):
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    index, arch = job
    v = _variants()[index]
    names = list(inspect.signature(v.kernel.fn).parameters)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in v.aligned}
    src = triton.compiler.ASTSource(fn=v.kernel, signature=v.signature, constexprs=v.constexprs, attrs=attrs)
    rec = dict(
        index=index, arch=arch, kernel=v.kernel.__name__, name=v.name, dtype=v.dtype, tensor_cores=v.tensor_cores
    )
    knobs.nvidia.dump_ptxas_log = True  # ptxas -v: registers and spills, printed to stdout
    log = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log):
            k = triton.compile(
                src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=v.num_warps, num_stages=v.num_stages)
            )
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"[-3000:]
        return rec
    text = log.getvalue()
    regs = re.findall(r"Used (\d+) registers", text)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    ptx = k.asm["ptx"]
    rec.update(
        seconds=round(time.perf_counter() - start, 2),
        shared=k.metadata.shared,
        num_warps=k.metadata.num_warps,
        regs=int(regs[-1]) if regs else None,
        spill_stores=int(spills[-1][0]) if spills else None,
        spill_loads=int(spills[-1][1]) if spills else None,
        mma=len(re.findall(r"^\s*mma\.sync\.", ptx, re.M)),
        wgmma=len(re.findall(r"^\s*wgmma\.mma_async\.", ptx, re.M)),
    )
    return rec


def _compile_all(workers: int):
    import multiprocessing as mp

    jobs = [(i, arch) for i in range(len(_variants())) for arch in ARCHS]
    # fork: the workers inherit the imported modules (nothing CUDA exists to be forked)
    with mp.get_context("fork").Pool(workers) as pool:
        return pool.map(_compile_one, jobs, chunksize=1)


# ----------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    workers = str(max(1, min(2, os.cpu_count() or 1)))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, workers], capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-5000:]
    records = json.loads(out.stdout.strip().splitlines()[-1])
    wall = time.perf_counter() - start
    print(
        f"\ncompiled {len(records)} kernels in {wall:.0f} s "
        f"(sum of compile times {sum(r.get('seconds', 0) for r in records):.0f} s, {workers} workers)"
    )
    print(f"{'kernel variant':<100} {'arch':>5} {'smem':>7} {'regs':>4} {'spill':>5} {'mma':>4} {'wgmma':>5}")
    for r in records:
        if "error" in r:
            print(f"{r['name']:<100} sm_{r['arch']:<2} ERROR")
        else:
            print(
                f"{r['name']:<100} sm_{r['arch']:<2} {r['shared']:>7} {r['regs']:>4} "
                f"{r['spill_stores']:>5} {r['mma']:>4} {r['wgmma']:>5}"
            )
    return records


def test_every_kernel_has_its_variants():
    """Each launchable kernel is listed, with a value for each constexpr and the real argument list;
    a kernel added without its variants would otherwise escape this file."""
    listed = {}
    for v in _variants():
        listed.setdefault(v.kernel.__name__, []).append(v)
        params = inspect.signature(v.kernel.fn).parameters
        constexprs = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
        assert set(v.constexprs) == constexprs, v.name
        assert list(v.signature) == list(params), v.name
    kernels = {name for m in _modules() for name in _kernels(m)}
    assert kernels == set(listed), f"kernels without variants: {sorted(kernels - set(listed))}"
    for name, vs in listed.items():  # every float dtype a launch can hand it
        assert {v.dtype for v in vs} == ({"fp32"} if name in FP32_ONLY else {"fp32", "bf16", "fp16"}), name


# kernels whose float inputs the launcher makes fp32 whatever the caller's dtype
FP32_ONLY = {"_pacs_group_kernel"}


@pytest.mark.parametrize("kernel", sorted({v.kernel.__name__ for v in _variants()}))
def test_compiles_fits_and_does_not_spill(compiled, kernel):
    mine = [r for r in compiled if r["kernel"] == kernel]
    assert {r["arch"] for r in mine} == set(ARCHS)
    problems = []
    for r in mine:
        where = f"{r['name']} on sm_{r['arch']}"
        if "error" in r:
            problems.append(f"{where}: does not compile: {r['error']}")
            continue
        if r["shared"] > SHARED_LIMIT[r["arch"]]:
            problems.append(f"{where}: {r['shared']} bytes of shared memory > {SHARED_LIMIT[r['arch']]}")
        if r["spill_stores"] is None or r["regs"] is None:
            problems.append(f"{where}: no ptxas resource report")
        elif r["spill_stores"] or r["spill_loads"]:
            problems.append(
                f"{where}: spills {r['spill_stores']} B stored / {r['spill_loads']} B loaded at {r['regs']} registers"
            )
        uses_tc = r["mma"] + r["wgmma"] > 0
        if uses_tc != r["tensor_cores"]:
            problems.append(
                f"{where}: tensor-core instructions {'missing' if r['tensor_cores'] else 'present'} "
                f"(mma {r['mma']}, wgmma {r['wgmma']})"
            )
    assert not problems, "\n".join(problems)


def test_default_tiles_fit_sm86(compiled):
    """The first (default) tile of each GEMM kernel also fits the 99 KB of sm_86 / sm_89, so the
    kernels run there with autotuning off. The sm_80 compilations stand in for sm_86 (an assumption:
    Triton takes the same pipelining and layout decisions for both; not compiled for sm_86 here)."""
    from fastcrit_kernels import logprobs

    firsts = {
        (t.BLOCK_N, t.BLOCK_V, t.BLOCK_H, t.num_warps, t.num_stages)
        for t in (logprobs._TILES_16BIT[0], logprobs._TILES_FP32[0])
    }
    checked = 0
    for r in compiled:
        v = _variants()[r["index"]]
        tile = (
            v.constexprs.get("BLOCK_N"),
            v.constexprs.get("BLOCK_V"),
            v.constexprs.get("BLOCK_H"),
            v.num_warps,
            v.num_stages,
        )
        if r["arch"] == 80 and "BLOCK_V" in v.constexprs and tile in firsts:
            checked += 1
            assert r["shared"] <= SHARED_LIMIT_SM86, r["name"]
    assert checked > 0


if __name__ == "__main__":
    print(json.dumps(_compile_all(int(sys.argv[1]))))
