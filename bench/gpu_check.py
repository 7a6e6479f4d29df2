"""GPU check: the checkpoint engine's CUDA paths on a real GPU, each timed against the usual tools.

    python bench/gpu_check.py              # needs CUDA; a ~1 GB fp16 model, a few minutes
    python bench/gpu_check.py --gb 3       # a bigger model (1-3 GB of fp16 weights)
    python bench/gpu_check.py --dry-run    # CPU only, a small model, seconds (run by the suite)

What it proves, on one GPU:
- a CUDA model of ``--gb`` GB of fp16 weights with an AdamW optimizer (the lower half of the
  layers frozen, as when fine-tuning the top) checkpointed, with the process state;
- restored onto the same GPU: every weight and optimizer state equal, on the device, the
  optimizer's parameters the very parameters of the restored model, and one more step of both
  optimizers giving the same weights; the CUDA RNG gives the draws it gave after the
  checkpoint;
- restored onto the CPU (``device="cpu"``): equal values, the links kept;
- an incremental checkpoint after one training step: the engine's device-copy counters show
  that every device storage was hashed (a piece at a time, through host memory) but only the
  changed ones (the trainable half and the optimizer state) were copied off the device to be
  written. Autosaves and pauses take this same path (a write with the change cache);
- each timed against ``torch.save`` + fsync of the same tensors, and the restores against
  ``safetensors.torch.load_file(..., device="cuda")`` and ``torch.load(map_location="cuda")``.

``--dry-run`` runs the same code on the CPU with a small model: the storages are recorded as
``cuda:0`` (so the restore maps them to the CPU, as on a machine without a GPU), the CPU
generator stands in for the CUDA RNG, and the device-copy counters, which only a device storage
moves, are replaced by the bytes the write reports; each such substitution is printed.
Exit code 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_checkpoint import drop_caches, exit_on_sigterm

FAILED: list[str] = []
PASSED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    (PASSED if ok else FAILED).append(name)
    print(f"  [{'ok' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)


def note(text: str) -> None:
    print(f"  [simulated] {text}", flush=True)


def ratio_line(name: str, value: float, ref_name: str, ref: float) -> None:
    print(f"  {name}: {value:.3f} s | reference {ref_name}: {ref:.3f} s | "
          f"ratio {value / ref if ref else float('nan'):.3f}", flush=True)


def timed(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe_gpu(torch: Any) -> str:
    props = torch.cuda.get_device_properties(0)
    driver = "unknown driver"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader", "-i", "0"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.strip()
        driver = f"nvidia-smi: {out}"
    except (OSError, subprocess.SubprocessError):
        pass
    return (f"GPU {props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability "
            f"{props.major}.{props.minor}; CUDA {torch.version.cuda}; {driver}")


def build(torch: Any, gb: float, device: str, dtype: Any) -> tuple[Any, Any, int]:
    """A stack of square fp16 linear layers of about ``gb`` GB; the lower half frozen; AdamW
    over the rest (foreach on CUDA; the CPU's per-tensor path elsewhere)."""
    d = 4096 if gb >= 0.5 else 256
    layers = max(2, round(gb * 1e9 / (d * d * 2)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(d, d) for _ in range(layers)))
    model = model.to(device=device, dtype=dtype)
    for layer in list(model)[: layers // 2]:
        layer.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # eps 1e-4: AdamW's default 1e-8 is zero in fp16, and its update then divides by zero
    opt = torch.optim.AdamW(trainable, lr=1e-3, eps=1e-4, foreach=device.startswith("cuda"))
    return model, opt, d


def step(torch: Any, model: Any, opt: Any, d: int, device: str, dtype: Any, seed: int) -> None:
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(8, d, device=device, generator=g).to(dtype)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def tensors_of(model: Any, opt: Any) -> dict[str, Any]:
    """The tensors a checkpoint holds, flat (the references save and load these)."""
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if hasattr(v, "device"):
                out[f"opt.{i}.{k}"] = v
    return out


def same_values(torch: Any, a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, str]:
    if a.keys() != b.keys():
        return False, f"keys differ: {sorted(a.keys() ^ b.keys())[:3]}"
    for k, x in a.items():
        y = b[k].to(x.device)
        # bit for bit (a NaN equals itself here, as it does in the checkpoint's bytes)
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(
                x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            return False, f"{k} differs"
    return True, f"{len(a)} tensors equal"


def linked(model: Any, opt: Any) -> tuple[bool, str]:
    params = {id(p) for p in model.parameters()}
    in_opt = [p for g in opt.param_groups for p in g["params"]]
    if not in_opt or any(id(p) not in params for p in in_opt):
        return False, "an optimizer parameter is not a parameter of the model"
    if any(id(p) not in {id(q) for q in in_opt} for p in opt.state):
        return False, "an optimizer state is keyed by a foreign tensor"
    return True, f"{len(in_opt)} optimizer parameters are the model's own"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU only, a small model, seconds")
    ap.add_argument("--gb", type=float, default=None, help="GB of fp16 weights (default 1)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir on disk)")
    args = ap.parse_args()

    import torch

    from jupyter_pause.checkpoint import WriteCache, load_or_create_key, open_store, read, write
    from jupyter_pause.checkpoint import tensors as engine_tensors

    started = time.monotonic()
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device here: run with --dry-run for the CPU version of this check")
        return 1
    device = "cpu" if dry else "cuda:0"
    dtype = torch.float16
    gb = args.gb if args.gb is not None else (0.004 if dry else 1.0)
    print(f"jupyter-pause GPU check ({'DRY RUN on the CPU' if dry else device}); torch "
          f"{torch.__version__}; load average {os.getloadavg()[0]:.2f}", flush=True)
    print("  " + ("no GPU used (dry run)" if dry else describe_gpu(torch)), flush=True)

    def sync() -> None:
        if not dry:
            torch.cuda.synchronize()

    exit_on_sigterm()
    root = tempfile.mkdtemp(prefix="jp-gpu-check-", dir=args.dir or "/var/tmp")
    restore_record = engine_tensors.record_device
    try:
        key = load_or_create_key(os.path.join(root, "check.key"))
        store = open_store(os.path.join(root, "store"))
        model, opt, d = build(torch, gb, device, dtype)
        step(torch, model, opt, d, device, dtype, seed=1)  # the optimizer has state now
        before = {k: v.clone() for k, v in tensors_of(model, opt).items()}
        nbytes = sum(v.numel() * v.element_size() for v in before.values())
        print(f"\nmodel: {len(model)} layers of {d}x{d} fp16 on {device}, "
              f"{sum(p.numel() for p in model.parameters()) * 2 / 1e9:.3f} GB of weights, "
              f"{nbytes / 1e9:.3f} GB with the optimizer state", flush=True)
        if dry:
            # as on a GPU machine: storages recorded on cuda:0, so the restore maps them
            engine_tensors.record_device = lambda us: "cuda:0"
            note("storages recorded as cuda:0 (the CPU stands in for the GPU)")

        # (1) checkpoint, with the process state (the CUDA RNG among it)
        cache = WriteCache()
        copies0 = engine_tensors.DEVICE_COPIES.snapshot()
        ns = {"model": model, "opt": opt}
        res, t_ckpt = timed(lambda: write(ns, store, key=key, cache=cache, keep=None,
                                          process_state=True), sync)
        expected_draw = torch.randn(16, device=device)  # what the captured RNG gives next
        rows = {r.name: r.status for r in res.process_state}
        rng_row = "RNG: torch" if dry else "RNG: cuda:0"
        if dry:
            note("the CPU generator stands in for the CUDA RNG")
        check("checkpoint saved every variable",
              all(v.status == "saved" for v in res.variables),
              f"{res.bytes_written / 1e9:.3f} GB written")
        check(f"process state holds {rng_row}", rows.get(rng_row) == "saved",
              f"rows {sorted(rows)}")
        ts_path = os.path.join(root, "torch_save.pt")
        _, t_save = timed(lambda: (torch.save(tensors_of(model, opt), ts_path),
                                   fsync_path(ts_path)), sync)
        ratio_line("checkpoint (with fsync)", t_ckpt, "torch.save + fsync of the same tensors",
                   t_save)
        copies1 = engine_tensors.DEVICE_COPIES.snapshot()
        if not dry:
            check("first checkpoint copied every device byte once to write it",
                  copies1["write"] - copies0["write"] == nbytes,
                  f"{(copies1['write'] - copies0['write']) / 1e9:.3f} GB copied to write, "
                  f"{(copies1['hash'] - copies0['hash']) / 1e9:.3f} GB to hash")

        # (2) restore onto the same device, RNG first
        from safetensors.torch import load_file, save_file

        st_path = os.path.join(root, "same.safetensors")
        save_file({k: v.contiguous() for k, v in tensors_of(model, opt).items()}, st_path)
        torch.randn(1000, device=device)  # move the RNG on: the restore must bring it back
        cold = drop_caches()
        target = "cpu" if dry else device
        rr, t_read = timed(lambda: read(store, key=key, checkpoint_id=res.checkpoint_id,
                                        device="auto", process_state=True), sync)
        draw = torch.randn(16, device=device)
        if dry:
            engine_tensors.record_device = restore_record
        m2, o2 = rr.values["model"], rr.values["opt"]
        ok, why = same_values(torch, before, tensors_of(m2, o2))
        check(f"restore onto {target}: values equal", ok, why)
        devs = {str(p.device) for p in m2.parameters()}
        check(f"restore onto {target}: on {target}", devs == {target}, f"devices {devs}")
        ok, why = linked(m2, o2)
        check("restore: optimizer -> parameter links kept", ok, why)
        check(f"restore: {rng_row} restored, next draws equal", torch.equal(draw, expected_draw),
              f"process-state rows {[(r.name, r.status) for r in rr.process_state][:6]}")
        if dry:
            check("restore without CUDA maps cuda:0 to the CPU and says so",
                  any("cuda:0" in w and "cpu" in w for w in rr.warnings), str(rr.warnings[:2]))
        drop_caches()
        _, t_st = timed(lambda: load_file(st_path, device=target), sync)
        drop_caches()
        _, t_tl = timed(lambda: torch.load(ts_path, map_location=target, weights_only=True), sync)
        cache_note = "" if cold else " (warm: could not drop the page cache)"
        ratio_line(f"restore onto {target}{cache_note}", t_read,
                   f'safetensors load_file(device="{target}") of the same tensors', t_st)
        ratio_line(f"restore onto {target}{cache_note}", t_read,
                   f'torch.load(map_location="{target}") of the same tensors', t_tl)
        # one more step of each optimizer: the same weights (the state really came back)
        step(torch, model, opt, d, device, dtype, seed=2)
        step(torch, m2, o2, d, device, dtype, seed=2)
        ok, why = same_values(torch, tensors_of(model, opt), tensors_of(m2, o2))
        check("one more step of the original and the restored gives the same weights", ok, why)
        del m2, o2, rr
        if not dry:
            torch.cuda.empty_cache()

        # (3) restore onto the CPU
        rc, t_cpu = timed(lambda: read(store, key=key, checkpoint_id=res.checkpoint_id,
                                       device="cpu"), sync)
        ok, why = same_values(torch, {k: v.cpu() for k, v in before.items()},
                              tensors_of(rc.values["model"], rc.values["opt"]))
        check("restore onto the CPU: values equal", ok, why)
        devs = {str(p.device) for p in rc.values["model"].parameters()}
        check("restore onto the CPU: on the CPU", devs == {"cpu"}, f"devices {devs}")
        ok, why = linked(rc.values["model"], rc.values["opt"])
        check("restore onto the CPU: links kept", ok, why)
        print(f"  restore onto the CPU: {t_cpu:.3f} s", flush=True)
        del rc

        # (4) incremental after one step: only what changed is copied off the device
        # what the step changed, byte for byte (an all-zero exp_avg_sq of fp16 may not change)
        now = tensors_of(model, opt)
        changed = sum(v.numel() * v.element_size() for k, v in now.items()
                      if not same_values(torch, {k: before[k]}, {k: v})[0])
        c0 = engine_tensors.DEVICE_COPIES.snapshot()
        if dry:
            engine_tensors.record_device = lambda us: "cuda:0"
        r2, t_inc = timed(lambda: write(ns, store, key=key, cache=cache, keep=None,
                                        process_state=True), sync)
        engine_tensors.record_device = restore_record
        c1 = engine_tensors.DEVICE_COPIES.snapshot()
        # the frozen half is unchanged; the packs' headers add a little
        check("incremental checkpoint wrote only the changed tensors",
              changed <= r2.bytes_written <= changed * 1.01 + (64 << 10),
              f"{r2.bytes_written / 1e6:.1f} MB written, {changed / 1e6:.1f} MB changed, "
              f"{nbytes / 1e6:.1f} MB in all")
        if dry:
            note("device-copy counters move only for device storages: the bytes written stand "
                 "in for the bytes copied off the device")
        else:
            hashed, copied = c1["hash"] - c0["hash"], c1["write"] - c0["write"]
            check("incremental: every device byte hashed, only the changed ones copied to write",
                  hashed >= nbytes and changed <= copied <= changed * 1.01 + (64 << 10),
                  f"{hashed / 1e9:.3f} GB copied to hash, {copied / 1e9:.3f} GB copied to write")
        ratio_line("incremental checkpoint after one step", t_inc,
                   "torch.save + fsync of the same tensors", t_save)
        if dry:
            engine_tensors.record_device = lambda us: "cuda:0"
        r3, t_same = timed(lambda: write(ns, store, key=key, cache=cache, keep=None), sync)
        engine_tensors.record_device = restore_record
        check("checkpoint with nothing changed writes nothing", r3.bytes_written == 0,
              f"{r3.bytes_written} bytes")
        print(f"  checkpoint with nothing changed: {t_same:.3f} s", flush=True)
    finally:
        engine_tensors.record_device = restore_record
        shutil.rmtree(root, ignore_errors=True)
    took = time.monotonic() - started
    if FAILED:
        print(f"\nGPU check FAILED ({len(FAILED)} of {len(FAILED) + len(PASSED)}): "
              f"{'; '.join(FAILED)} ({took:.0f} s)")
        return 1
    print(f"\nGPU check passed: {len(PASSED)} checks ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
