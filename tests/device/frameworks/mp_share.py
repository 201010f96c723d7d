"""torch.multiprocessing sharing CUDA tensors under strata's stack=default (page-mapped memory, shared by file
descriptor as PyTorch shares its expandable segments), both ways and with PyTorch's own allocator on the other
side, and stack=coalescing (cudaMalloc'd chunks, CUDA IPC):
  - a parent on strata sends tensors (a view at an offset, a block over several mappings) to a spawned child on
    strata, and to a child on PyTorch's own allocator (blocks whose mappings are of one size: PyTorch's handle);
  - a spawned child sends tensors to a parent on strata: the child on strata, on PyTorch's expandable segments,
    on PyTorch's default allocator; and DataLoader workers on strata produce CUDA tensors for it;
each side checks the other's values and sees the other's writes, and once both sides dropped the tensors the
exporter's allocated bytes are back where they were and, after empty_cache, so is the device's free memory
(which the importer's mapping would still hold). With two GPUs the strata-to-strata cases run on device 1 too.
    python3 tests/device/frameworks/mp_share.py
Every case runs in a process of its own (each one chooses its allocator before CUDA starts).
"""

import ctypes
import struct
import gc
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

MiB = 1 << 20
SLACK = 64 * MiB   # device memory that may come and go beside the shared blocks (lazy kernel loading)
TIMEOUT = 300


def enable_strata(conf="stack=default"):
    import strata_torch
    strata_torch.enable(conf, backend="strata")


def allow_importers():
    """PyTorch's allocator takes the exporter's descriptors with pidfd_getfd only, which needs ptrace permission:
    under Yama's ptrace_scope 1 only an ancestor has it, so a process whose tensors a child on PyTorch's allocator
    opens allows it, as a PyTorch process sharing expandable segments with its children must. (strata's importer
    asks the exporter's descriptor service where pidfd_getfd is refused: nothing to allow.) Returns what it did."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        return "no Yama"
    if scope != "1":
        return f"ptrace_scope {scope}"
    PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)
    rc = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)
    return f"ptrace_scope 1, PR_SET_PTRACER_ANY {'set' if rc == 0 else 'refused'}"


def warm(torch, device):
    """Runs the kernels the checks use once, so lazy module loading does not move free memory later."""
    x = torch.full((1 << 16,), 7.0, device=device)
    x[10:].add_(1)
    _ = bool((x == 7).all().item()), float(x.double().sum().item()), float(torch.arange(16, device=device, dtype=torch.float32).sum().item())
    x.mul_(2)
    torch.cuda.synchronize(device)


def held_figures(torch, dev):
    """What the device holds beside the shared blocks, for a free-memory check that failed: this process's
    reserved bytes and, per process, what the driver says each uses (nvidia-smi, where it reports them)."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        apps = [f"nvidia-smi: {e}"]
    return {"pid": os.getpid(), "reserved": torch.cuda.memory_reserved(dev), "processes": apps}


def fingerprint(t):
    return [t.numel(), float(t.double().sum().item()), float(t.reshape(-1)[0].item()), float(t.reshape(-1)[-1].item())]


def made_tensors(torch, device, value):
    """The tensors every case shares: an 8 MiB block sent as a view at an offset, and a 300 MiB block made after
    it, which lies over several of strata's mappings (up to 128 MiB each)."""
    small = torch.full((2 * MiB,), float(value), device=device)
    big = torch.arange(75 * MiB, device=device, dtype=torch.float32)
    return small, big


def handle_type(reduced):
    """The type byte of the handle reduce_tensor made ('e' expandable segment, 's' strata's pages, 'c' cudaMalloc):
    the byte after the format's version (2); a handle without the version is a bare cudaIpcMemHandle_t."""
    handle = reduced[1][7]
    return chr(handle[1]) if len(handle) >= 2 and handle[0] == 2 else "c"


def handle_sizes(reduced):
    """The sizes of the physical allocations a page-mapped handle names, in order (plugin/src/ipc_handles.hpp's
    Note [PyTorch's shareable handles]): 'e' {pid, segment size, count} then the descriptors, every allocation
    the segment size; 's' {pid, 0, count}, the sizes, then the descriptors. [] for any other handle."""
    handle, kind = bytes(reduced[1][7]), handle_type(reduced)
    if kind == "e":
        segment, count = struct.unpack_from("<QQ", handle, 2 + 8)
        return [segment] * count
    if kind == "s":
        (count,) = struct.unpack_from("<Q", handle, 2 + 8)
        return list(struct.unpack_from(f"<{count}Q", handle, 2 + 16))
    return []


# ---- a parent exporting to a spawned child ----------------------------------------------------------------------

def open_check_write(torch, inbox, device):
    """Receives the parent's tensors (or reduce_tensor's arguments for them), fingerprints them and adds 1 to
    each. Every reference to them dies with this call."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    items = inbox.get(timeout=TIMEOUT)
    try:
        tensors = {name: (rebuild_cuda_tensor(*payload) if isinstance(payload, tuple) else payload) for name, payload in items}
        seen = {}
        for name, t in tensors.items():
            seen[name] = fingerprint(t)
            t.add_(1)
        torch.cuda.synchronize(device)
        return ("seen", seen)
    except Exception as e:   # what the importer met, for the parent to report
        return ("error", f"{type(e).__name__}: {str(e)[:800]}")


def importer_child(inbox, outbox, device, use_strata):
    if use_strata:
        enable_strata()
    import torch
    torch.cuda.set_device(device)
    warm(torch, device)
    outbox.put(("ready", os.getpid()))
    outbox.put(open_check_write(torch, inbox, device))
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()   # the importer's own temporaries (its checks' copies) are not the shared memory
    outbox.put(("dropped", torch.cuda.memory_allocated(device)))
    inbox.get(timeout=TIMEOUT)


def export_to_child(device, child_on_strata):
    enable_strata()
    import torch
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor
    r = {"ptrace": "not needed" if child_on_strata else allow_importers()}
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    warm(torch, dev)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=importer_child, args=(inbox, outbox, device, child_on_strata))
    p.start()
    r["child_ready"] = outbox.get(timeout=TIMEOUT)[0] == "ready"
    torch.cuda.synchronize(dev)
    allocated0, free0 = torch.cuda.memory_allocated(dev), torch.cuda.mem_get_info(dev)[0]
    small, big = made_tensors(torch, dev, 7)
    view = small[1000:]
    expected = {"view": fingerprint(view), "big": fingerprint(big)}
    if child_on_strata:
        items = [("view", view), ("big", big)]              # torch.multiprocessing's own pickling, end to end
        r["types"] = {}
    else:
        reduced = {"view": reduce_tensor(view), "big": reduce_tensor(big)}
        r["types"] = {name: handle_type(x) for name, x in reduced.items()}
        r["sizes"] = {name: handle_sizes(x) for name, x in reduced.items()}
        # PyTorch's own allocator opens blocks whose physical allocations are of one size ('e'); strata's handle
        # ('s') carries the others, and only strata opens it.
        items = [(name, x[1]) for name, x in reduced.items() if r["types"][name] == "e"]
        for name, x in reduced.items():   # a handle not sent is released here, as the child would
            if r["types"][name] != "e":
                torch.UntypedStorage._release_ipc_counter_cuda(x[1][11], x[1][12])
        expected = {name: fp for name, fp in expected.items() if r["types"][name] == "e"}
    inbox.put(items)
    kind, seen = outbox.get(timeout=TIMEOUT)
    r["child_error"] = seen if kind == "error" else ""
    r["values_seen"] = kind == "seen" and all(seen.get(n) == fp for n, fp in expected.items()) and len(seen) == len(expected)
    r["sent"] = sorted(expected)
    torch.cuda.synchronize(dev)
    r["writes_seen"] = {
        "view": bool((small[1000:] == 8).all().item()) and bool((small[:1000] == 7).all().item()) if "view" in expected else None,
        "big": bool(torch.equal(big, torch.arange(75 * MiB, device=dev, dtype=torch.float32) + 1)) if "big" in expected else None,
    }
    kind, _ = outbox.get(timeout=TIMEOUT)
    r["child_dropped"] = kind == "dropped"
    del small, big, view, items
    if not child_on_strata:
        del reduced
    gc.collect()
    torch.cuda.ipc_collect()   # blocks every importer released go back now
    r["allocated_back"] = torch.cuda.memory_allocated(dev) == allocated0
    r["allocated"] = [allocated0, torch.cuda.memory_allocated(dev)]
    torch.cuda.empty_cache()
    free1 = torch.cuda.mem_get_info(dev)[0]
    r["free"] = [free0, free1]
    r["free_back"] = free1 + SLACK >= free0
    if not r["free_back"]:
        r["held"] = held_figures(torch, dev)
    inbox.put("exit")
    p.join(timeout=TIMEOUT)
    r["child_exit"] = p.exitcode
    return r


# ---- a spawned child exporting to its parent --------------------------------------------------------------------

def exporter_child(inbox, outbox, device, mode):
    if mode == "strata":
        enable_strata()
    elif mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    torch.cuda.set_device(device)
    dev = torch.device("cuda", device)
    warm(torch, dev)
    r = {}
    allocated0, free0 = torch.cuda.memory_allocated(dev), torch.cuda.mem_get_info(dev)[0]
    small, big = made_tensors(torch, dev, 3)
    view = small[1000:]
    outbox.put(("tensors", [("view", view), ("big", big)], {"view": fingerprint(view), "big": fingerprint(big)}))
    inbox.get(timeout=TIMEOUT)   # the parent has checked, written and dropped them
    torch.cuda.synchronize(dev)
    r["writes_seen"] = bool((small[1000:] == 4).all().item()) and bool((small[:1000] == 3).all().item()) and \
        bool(torch.equal(big, torch.arange(75 * MiB, device=dev, dtype=torch.float32) + 1))
    del small, big, view
    gc.collect()
    torch.cuda.ipc_collect()
    r["allocated"] = [allocated0, torch.cuda.memory_allocated(dev)]
    r["allocated_back"] = torch.cuda.memory_allocated(dev) == allocated0
    torch.cuda.empty_cache()
    free1 = torch.cuda.mem_get_info(dev)[0]
    r["free"] = [free0, free1]
    r["free_back"] = free1 + SLACK >= free0
    if not r["free_back"]:
        r["held"] = held_figures(torch, dev)
    outbox.put(("done", r))


def check_write(torch, outbox, dev):
    """Receives the child's tensors, checks them against the child's fingerprints and adds 1 to each. Every
    reference to them dies with this call."""
    try:
        _, items, expected = outbox.get(timeout=TIMEOUT)
        tensors = dict(items)
        seen = all(fingerprint(tensors[n]) == fp for n, fp in expected.items())
        for t in tensors.values():
            t.add_(1)
        torch.cuda.synchronize(dev)
        return {"values_seen": seen, "error": ""}
    except Exception as e:
        return {"values_seen": False, "error": f"{type(e).__name__}: {str(e)[:800]}"}


def import_from_child(device, mode):
    enable_strata()
    import torch
    import torch.multiprocessing as mp
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    warm(torch, dev)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=exporter_child, args=(inbox, outbox, device, mode))
    p.start()
    r = check_write(torch, outbox, dev)
    gc.collect()
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()   # the importer's own temporaries (its checks' copies) are not the shared memory
    inbox.put("dropped")
    kind, child = outbox.get(timeout=TIMEOUT)
    r.update({"child_" + k: v for k, v in child.items()})
    p.join(timeout=TIMEOUT)
    r["child_exit"] = p.exitcode
    return r


# ---- DataLoader workers producing CUDA tensors ------------------------------------------------------------------

class CudaItems:
    def __init__(self, device, n):
        self.device, self.n = device, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        return torch.full((1 << 18,), float(i), device=f"cuda:{self.device}")


def worker_on_strata(_):
    enable_strata()


def data_loader(device):
    enable_strata()
    import torch
    from torch.utils.data import DataLoader
    torch.cuda.set_device(device)
    loader = DataLoader(CudaItems(device, 12), batch_size=None, num_workers=2, multiprocessing_context="spawn",
                        worker_init_fn=worker_on_strata)
    got = []
    for t in loader:
        got.append(float(t.double().sum().item()) / t.numel())
        del t
    return {"items": got, "values_seen": got == [float(i) for i in range(12)]}


def coalescing(device):
    """stack=coalescing: CUDA IPC of the cudaMalloc'd chunk, to a child on PyTorch's own allocator."""
    enable_strata("stack=coalescing")
    import torch
    import torch.multiprocessing as mp
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=importer_child, args=(inbox, outbox, device, False))
    p.start()
    outbox.get(timeout=TIMEOUT)
    t = torch.full((1 << 20,), 7.0, device=dev)
    view = t[1000:]
    expected = fingerprint(view)
    inbox.put([("view", view)])
    kind, seen = outbox.get(timeout=TIMEOUT)
    torch.cuda.synchronize(dev)
    r = {"values_seen": kind == "seen" and seen.get("view") == expected,
         "writes_seen": bool((t[1000:] == 8).all().item()) and bool((t[:1000] == 7).all().item())}
    outbox.get(timeout=TIMEOUT)
    inbox.put("exit")
    p.join(timeout=TIMEOUT)
    r["child_exit"] = p.exitcode
    return r


CASES = {
    "to_strata": lambda d: export_to_child(d, True),
    "to_native": lambda d: export_to_child(d, False),
    "from_strata": lambda d: import_from_child(d, "strata"),
    "from_expandable": lambda d: import_from_child(d, "expandable"),
    "from_native": lambda d: import_from_child(d, "native"),
    "data_loader": data_loader,
    "coalescing": coalescing,
}


def run_case(check, name, device):
    label = f"{name} on cuda:{device}"
    try:
        run = subprocess.run([sys.executable, __file__, "--case", name, str(device)], capture_output=True, text=True,
                             timeout=2 * TIMEOUT)
    except subprocess.TimeoutExpired as e:
        check(f"{label}: runs to the end", False, f"timeout; {str(e.stdout)[-500:]} {str(e.stderr)[-1500:]}")
        return None
    line = next((l for l in run.stdout.splitlines() if l.startswith("RESULT ")), None)
    if run.returncode != 0 or line is None:
        check(f"{label}: runs to the end", False, f"exit {run.returncode}: {run.stdout[-600:]} {run.stderr[-2000:]}")
        return None
    r = json.loads(line[len("RESULT "):])
    print(f"{label}: {json.dumps(r)}", flush=True)
    return r


def main():
    check = Checks("mp_share")
    import torch
    devices = [0] + ([1] if torch.cuda.device_count() >= 2 else [])
    for device in devices:
        r = run_case(check, "to_strata", device)
        if r:
            label = f"stack=default, cuda:{device}, parent to a child on strata"
            check(f"{label}: the child sees the parent's values (a view at an offset, a block over several mappings)",
                  r["values_seen"] and not r["child_error"], r["child_error"] or json.dumps(r["writes_seen"]))
            check(f"{label}: the child's writes reach the parent, at the view's offset", all(r["writes_seen"].values()),
                  json.dumps(r["writes_seen"]))
            check(f"{label}: with both sides done the blocks come back (allocated, then the device's free memory)",
                  r["child_dropped"] and r["allocated_back"] and r["free_back"], f"allocated {r['allocated']}, free {r['free']}")
            check(f"{label}: the child exits cleanly", r["child_exit"] == 0, f"exit {r['child_exit']}")
        r = run_case(check, "from_strata", device)
        if r:
            label = f"stack=default, cuda:{device}, child on strata to the parent"
            check(f"{label}: the parent sees the child's values", r["values_seen"], r["error"])
            check(f"{label}: the parent's writes reach the child", r["child_writes_seen"], "")
            check(f"{label}: with both sides done the child's blocks come back",
                  r["child_allocated_back"] and r["child_free_back"], f"allocated {r['child_allocated']}, free {r['child_free']}")
            check(f"{label}: the child exits cleanly", r["child_exit"] == 0, f"exit {r['child_exit']}")
        if device != 0:
            continue
        r = run_case(check, "to_native", 0)
        if r:
            label = "stack=default, parent to a child on PyTorch's own allocator"
            one_size = {n: len(set(sz)) == 1 for n, sz in r["sizes"].items()}
            # Strata's own handle only where PyTorch's cannot describe the block (its allocations differ in size).
            check(f"{label}: strata's handle goes out only for a block over physical allocations of several sizes",
                  all(r["types"][n] in "es" and (r["types"][n] == "e" or not one_size[n]) for n in r["types"]),
                  json.dumps([r["types"], r["sizes"]]))
            if not r["sent"]:
                # Which blocks lie over allocations of one size depends on what the pool mapped before: strata
                # does not promise it for a given block, so this run had nothing PyTorch's allocator can open.
                check.skip(f"{label}: the child sees the parent's values",
                           f"every block lay over allocations of several sizes in this run: {json.dumps(r['sizes'])}")
            else:
                check(f"{label}: the child sees the parent's values", r["values_seen"] and not r["child_error"],
                      r["child_error"] or json.dumps(r["sent"]))
                check(f"{label}: the child's writes reach the parent", all(r["writes_seen"][n] is True for n in r["sent"]),
                      json.dumps(r["writes_seen"]))
            check(f"{label}: with both sides done the blocks come back", r["child_dropped"] and r["allocated_back"] and r["free_back"],
                  f"allocated {r['allocated']}, free {r['free']}")
            check(f"{label}: the child exits cleanly", r["child_exit"] == 0, f"exit {r['child_exit']}")
        for mode, what in (("expandable", "PyTorch's expandable segments"), ("native", "PyTorch's default allocator")):
            r = run_case(check, "from_" + mode, 0)
            if r:
                label = f"stack=default parent, a child on {what} sharing with it"
                check(f"{label}: the parent sees the child's values", r["values_seen"], r["error"])
                check(f"{label}: the parent's writes reach the child", r["child_writes_seen"], "")
                check(f"{label}: with both sides done the child's blocks come back",
                      r["child_allocated_back"] and r["child_free_back"], f"allocated {r['child_allocated']}, free {r['child_free']}")
        r = run_case(check, "data_loader", 0)
        if r:
            check("stack=default: DataLoader workers on strata produce CUDA tensors the parent reads", r["values_seen"],
                  json.dumps(r["items"]))
        r = run_case(check, "coalescing", 0)
        if r:
            check("stack=coalescing: a child on PyTorch's own allocator sees the parent's values and its writes come back",
                  r["values_seen"] and r["writes_seen"] and r["child_exit"] == 0, json.dumps(r))
    check.finish()


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--case":
        print("RESULT " + json.dumps(CASES[sys.argv[2]](int(sys.argv[3]))), flush=True)
        sys.exit(0)
    main()
