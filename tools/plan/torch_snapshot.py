#!/usr/bin/env python3
"""Converts a PyTorch memory snapshot into strata's trace format, for strata-plan and bench/replay.

A snapshot is what torch.cuda.memory._dump_snapshot() writes after _record_memory_history(): a pickle of a
dict whose "device_traces" holds, per device, the allocator's events in order ({"action", "addr", "size",
"stream", ...}). Allocations ("alloc") become `a` lines and the moments their blocks became reusable
("free_completed") `f` lines; ids number the allocations, streams are renumbered in order of appearance
with the default stream (0) kept as 0. Sizes are PyTorch's block sizes (its rounded sizes: what
max_memory_allocated counts). Segment events (PyTorch's own cudaMalloc calls) are dropped: they are what a
replay recomputes for each stack.

    python3 tools/plan/torch_snapshot.py SNAPSHOT.pickle [-o TRACE.csv] [--device N] [--quiet]

Standard library only. The pickle is read with every class refused, so a snapshot cannot run code.
Bad input (not a snapshot, an event without a size, a negative or non-integer size, an unknown action, an
allocation at an address still live) is reported with the file and the event's index, exit code 2.
"""
import argparse
import io
import pickle
import sys

ALLOC, FREE = "alloc", "free_completed"
# Actions that do not change what the program holds (free_requested: the block is still held until
# free_completed; segment_*: PyTorch's own device calls; snapshot, oom, user_defined: markers).
IGNORED = {"free_requested", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
           "user_defined"}


class SnapshotError(Exception):
    """Bad input, with where it was found."""


class _NoClasses(pickle.Unpickler):
    def find_class(self, module, name):
        raise SnapshotError(f"the pickle refers to {module}.{name}: not a plain memory snapshot (only dicts, lists, "
                            "strings and numbers are read)")


def load(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror}")
    try:
        snapshot = _NoClasses(io.BytesIO(data)).load()
    except SnapshotError as e:
        raise SnapshotError(f"{path}: {e}")
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, TypeError, KeyError) as e:
        raise SnapshotError(f"{path}: not a readable pickle (truncated or corrupt?): {e or type(e).__name__}")
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        raise SnapshotError(f"{path}: no device_traces: not a torch.cuda.memory._dump_snapshot() file, or recorded "
                            "without torch.cuda.memory._record_memory_history()")
    return snapshot


def pick_device(snapshot, path, device=None):
    traces = snapshot["device_traces"]
    if device is not None:
        if not 0 <= device < len(traces):
            raise SnapshotError(f"{path}: --device {device}: the snapshot has traces for devices 0..{len(traces) - 1}")
        return device
    busiest = [(sum(1 for e in t if isinstance(e, dict) and e.get("action") == ALLOC), d) for d, t in enumerate(traces)]
    if not busiest or max(busiest)[0] == 0:
        raise SnapshotError(f"{path}: the snapshot records no allocation on any device")
    return max(busiest, key=lambda b: (b[0], -b[1]))[1]


def convert(snapshot, path="snapshot", device=None):
    """Returns (rows, summary): rows are (op, id, bytes, stream); summary a dict of what was converted."""
    device = pick_device(snapshot, path, device)
    live = {}  # address -> (id, size, event index)
    streams = {0: 0}
    rows = []
    live_bytes = peak_live = dropped = next_id = 0
    for index, e in enumerate(snapshot["device_traces"][device]):
        where = f"{path}: device {device}, event {index}"
        if not isinstance(e, dict) or "action" not in e:
            raise SnapshotError(f"{where}: not a trace entry (a dict with an action)")
        action = e["action"]
        if action in IGNORED:
            continue
        if action not in (ALLOC, FREE):
            raise SnapshotError(f"{where}: unknown action {action!r} (known: alloc, free_completed, "
                                f"{', '.join(sorted(IGNORED))})")
        for key in ("addr", "size"):
            if key not in e:
                raise SnapshotError(f"{where}: {action} without {key!r}")
        addr, size = e["addr"], e["size"]
        if isinstance(size, bool) or not isinstance(size, int):
            raise SnapshotError(f"{where}: size {size!r} is not an integer")
        if size < 0:
            raise SnapshotError(f"{where}: negative size {size}")
        stream = e.get("stream", 0)
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise SnapshotError(f"{where}: stream {stream!r} is not an integer")
        stream = streams.setdefault(stream, len(streams))
        if action == ALLOC:
            if addr in live:
                raise SnapshotError(f"{where}: alloc at {addr:#x}, still live since event {live[addr][2]}")
            live[addr] = (next_id, size, index)
            rows.append(("a", next_id, size, stream))
            next_id += 1
            live_bytes += size
            peak_live = max(peak_live, live_bytes)
        else:
            if addr not in live:
                dropped += 1  # allocated before the recording began (or before its ring buffer's first entry)
                continue
            block_id, block_size, _ = live.pop(addr)
            rows.append(("f", block_id, block_size, stream))
            live_bytes -= block_size
    segments = [s for s in snapshot.get("segments", []) if isinstance(s, dict) and s.get("device", device) == device]
    allocated_at_dump = sum(s.get("allocated_size", 0) for s in segments) if segments else None
    summary = {"device": device, "allocations": next_id, "frees": sum(1 for r in rows if r[0] == "f"),
               "peak_live": peak_live, "live_at_end": live_bytes, "dropped_frees": dropped,
               "allocated_at_dump": allocated_at_dump, "streams": len(streams)}
    return rows, summary


def write_trace(rows, out, source):
    out.write(f"# converted from {source} by tools/plan/torch_snapshot.py\n")
    out.write("op,id,bytes,stream\n")
    for op, block_id, size, stream in rows:
        out.write(f"{op},{block_id},{size},{stream}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description="PyTorch memory snapshot -> strata trace (CSV)")
    parser.add_argument("snapshot")
    parser.add_argument("-o", "--output", help="the trace to write (default: standard output)")
    parser.add_argument("--device", type=int, help="which device's trace (default: the one with most allocations)")
    parser.add_argument("--quiet", action="store_true", help="no summary on standard error")
    args = parser.parse_args(argv)
    try:
        rows, summary = convert(load(args.snapshot), args.snapshot, args.device)
    except SnapshotError as e:
        print(f"torch_snapshot: {e}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as out:
            write_trace(rows, out, args.snapshot)
    else:
        write_trace(rows, sys.stdout, args.snapshot)
    s = summary
    if not args.quiet or s["dropped_frees"]:
        print(f"torch_snapshot: device {s['device']}: {s['allocations']} allocations, {s['frees']} frees, "
              f"{s['streams']} streams, peak live {s['peak_live']} bytes", file=sys.stderr)
    if s["dropped_frees"]:
        print(f"torch_snapshot: {s['dropped_frees']} frees of blocks allocated before the recording began were dropped; "
              "the peak counts only blocks allocated while recording", file=sys.stderr)
    if not args.quiet and s["allocated_at_dump"] is not None:
        print(f"torch_snapshot: live at the end of the trace {s['live_at_end']} bytes; the snapshot's segments hold "
              f"{s['allocated_at_dump']} bytes allocated at the dump", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
