"""strata's statistics in PyTorch's shape: a flat, sorted dict with torch.cuda.memory_stats() key names, and a
readable summary of it. Pure Python: no torch, no library needed (tested on any machine)."""

import collections
import numbers

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n):
    """'512 B', '1.50 KiB', '2.00 GiB': binary units, as torch.cuda.memory_summary() prints them."""
    if not isinstance(n, numbers.Real) or isinstance(n, bool):
        raise TypeError(f"format_bytes needs a number of bytes, not {n!r}")
    if n < 0:
        return "-" + format_bytes(-n)
    value, unit = float(n), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{int(n)} B" if unit == 0 else f"{value:.2f} {_UNITS[unit]}"


def flatten(stats, prefix=""):
    """A flat OrderedDict sorted by key, nested dicts joined with '.', the way torch.cuda.memory_stats() does."""
    if not isinstance(stats, dict):
        raise TypeError(f"statistics must be a JSON object, not {type(stats).__name__}")
    items = []

    def walk(key, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}.{k}" if key else str(k), v)
        else:
            items.append((key, value))

    walk(prefix, stats)
    items.sort()
    return collections.OrderedDict(items)


# (label, key stem, is bytes): each row shows the stem's .current and .peak.
_ROWS = [
    ("Reserved memory", "reserved_bytes.all", True),
    ("Allocated memory", "allocated_bytes.all", True),
    ("Active memory", "active_bytes.all", True),
    ("Allocations", "allocation.all", False),
    ("Segments", "segment.all", False),
]


def _cell(value, is_bytes):
    if value is None:
        return "-"
    return format_bytes(value) if is_bytes else str(value)


def _limit(value):
    # The plug-in reports "no limit" as the largest size_t.
    if value is None:
        return "-"
    return "none" if value >= 2**63 else format_bytes(value)


def summary(stats, device=0):
    """A fixed-width table of one device's statistics (from memory_stats()). Missing keys print as '-'."""
    stats = flatten(stats)
    get = stats.get
    title = f"strata memory summary, device {device}"
    if get("strata.stack") is not None:
        title += f" (stack: {get('strata.stack')})"
    width = 75
    lines = ["=" * width, f"| {title:<{width - 4}} |", "|" + "-" * (width - 2) + "|",
             f"| {'Metric':<25} | {'Current':>12} | {'Peak':>12} | {'Total':>13} |", "|" + "-" * (width - 2) + "|"]
    for label, stem, is_bytes in _ROWS:
        total = get(f"{stem}.allocated")
        lines.append(f"| {label:<25} | {_cell(get(stem + '.current'), is_bytes):>12} | "
                     f"{_cell(get(stem + '.peak'), is_bytes):>12} | {_cell(total, is_bytes):>13} |")
    lines.append("|" + "-" * (width - 2) + "|")
    peak_reserved, peak_allocated = get("reserved_bytes.all.peak"), get("allocated_bytes.all.peak")
    ratio = f"{peak_reserved / peak_allocated:.3f}" if peak_reserved and peak_allocated else "-"
    extras = [
        ("Peak reserved / peak allocated", ratio),
        ("Fragmentation", "-" if get("strata.fragmentation") is None else f"{get('strata.fragmentation'):.3f}"),
        ("Largest free block", _cell(get("strata.largest_free"), True)),
        ("Freed, waiting for other streams", _cell(get("strata.held_for_other_streams_bytes"), True)),
        ("Limit", _limit(get("strata.limit_bytes"))),
        ("Out-of-memory errors", _cell(get("num_ooms"), False)),
        ("Allocation retries", _cell(get("num_alloc_retries"), False)),
    ]
    for label, value in extras:
        lines.append(f"| {label:<40} | {value:>28} |")
    lines.append("=" * width)
    return "\n".join(lines)


def peak_ratio(stats):
    """Peak reserved over peak allocated (how much more memory the allocator held than the program used)."""
    stats = flatten(stats)
    allocated = stats.get("allocated_bytes.all.peak")
    if not allocated:
        return None
    return stats.get("reserved_bytes.all.peak", 0) / allocated
