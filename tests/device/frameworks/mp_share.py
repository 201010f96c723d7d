"""torch.multiprocessing sharing a CUDA tensor allocated by strata's backend (CUDA IPC of the block's base
allocation): the child sees the parent's values and its writes reach the parent. Under stack=default (page-
mapped memory, which CUDA IPC cannot export) sharing is refused with a message naming the way out.
    python3 tests/device/frameworks/mp_share.py
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402


def child(queue, done):
    import torch
    t = queue.get()
    ok = bool((t == 7).all().item())
    t.add_(1)
    torch.cuda.synchronize()
    done.put(ok)


def share(conf):
    import strata_torch
    strata_torch.enable(conf, backend="strata")
    import torch
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    t = torch.full((1 << 20,), 7.0, device="cuda")
    offset_view = t[1000:]   # a view: shared as the base allocation plus an offset
    p = ctx.Process(target=child, args=(queue, done))
    p.start()
    queue.put(offset_view)
    seen = done.get(timeout=120)
    p.join(timeout=120)
    torch.cuda.synchronize()
    print("RESULT", seen, float(t[1000:].sum().item()) == 8.0 * ((1 << 20) - 1000), float(t[:1000].sum().item()) == 7000.0,
          p.exitcode, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--share":
        share(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) > 2 and sys.argv[1] == "--refuse":   # what torch.multiprocessing does first, without a child
        import strata_torch
        strata_torch.enable(sys.argv[2], backend="strata")
        import torch
        t = torch.ones(1 << 20, device="cuda")
        try:
            t.untyped_storage()._share_cuda_()
            print("SHARED", flush=True)
        except RuntimeError as e:
            print("REFUSED", str(e)[:600], flush=True)
        sys.exit(0)
    check = Checks("mp_share")
    run = subprocess.run([sys.executable, __file__, "--share", "stack=coalescing"], capture_output=True, text=True, timeout=300)
    line = next((l for l in run.stdout.splitlines() if l.startswith("RESULT")), "")
    check("stack=coalescing: the child sees the parent's values", line.split()[1:2] == ["True"], run.stdout[-500:] + run.stderr[-1500:])
    check("stack=coalescing: the child's writes reach the parent, at the view's offset", line.split()[2:4] == ["True", "True"], line)
    check("stack=coalescing: the child exits cleanly", line.split()[4:5] == ["0"], line)
    run = subprocess.run([sys.executable, __file__, "--refuse", "stack=default"], capture_output=True, text=True, timeout=300)
    check("stack=default: sharing is refused, naming stack=coalescing",
          run.returncode == 0 and "REFUSED" in run.stdout and "STRATA_ALLOC_CONF=stack=coalescing" in run.stdout,
          run.stdout[-800:] + run.stderr[-800:])
    check.finish()
