"""Sleep and wake by tag: give a group of tensors' GPU memory back and take it again later at the same
addresses, so CUDA graphs and raw pointers stay valid (an RL trainer and an inference engine sharing a GPU).

    import strata_torch
    with strata_torch.tag("trainer"):
        model = build_model().cuda()          # every allocation in here carries the tag
    strata_torch.pause("trainer")             # contents to pinned host memory, device memory given back
    ...                                       # the inference engine runs with the memory
    strata_torch.resume("trainer")            # mapped again at the same addresses, contents copied back

Tags are names (or small integers); each name gets its own id on first use, 0 being the untagged default.
The tag of an allocation is the calling thread's at the time (a `with tag(...)` block nests); autograd's
backward threads carry tag 0. docs/sleep_wake.md
says what each call costs. Pure Python over the plug-in's C entry points: no torch import.
"""

import contextlib
import threading

from . import _library

_names_lock = threading.Lock()
_ids = {"default": 0}


def tag_id(name):
    """The integer id of a tag: its own for an int, else the one the name was given on first use."""
    if isinstance(name, bool) or not isinstance(name, (int, str)):
        raise TypeError(f"a tag is a name (str) or an id (int), not {type(name).__name__}")
    if isinstance(name, int):
        if not 0 <= name < 1024:
            raise ValueError(f"tag id {name} is not in [0, 1024)")
        return name
    with _names_lock:
        if name not in _ids:
            if len(_ids) >= 1024:
                raise ValueError(f"more than 1024 tags; cannot name {name!r}")
            _ids[name] = max(_ids.values()) + 1
        return _ids[name]


def _ids_of(tags):
    if isinstance(tags, (str, int)):
        tags = [tags]
    return [tag_id(t) for t in tags]


@contextlib.contextmanager
def tag(name):
    """Allocations made by this thread inside the block carry the tag `name`."""
    lib = _library.load()
    lib.tag_begin(tag_id(name))
    try:
        yield tag_id(name)
    finally:
        lib.tag_end()


def current_tag():
    return _library.load().current_tag()


def pause(tags, backup=True):
    """Puts the tags to sleep on every device: waits for the device, copies their live tensors to pinned host
    memory (kept for the next pause; backup=False drops the contents), and gives their device memory back."""
    _library.load().pause(_ids_of(tags), backup)


def resume(tags):
    """Wakes the tags at the same addresses. MemoryError when they do not fit: they stay paused, nothing lost."""
    _library.load().resume(_ids_of(tags))


def reserve_backup(size, device=0):
    """Pins `size` bytes ahead, so a later pause of up to that much pins nothing (pinning is the slow part)."""
    _library.load().reserve_backup(device, size)


def release_backup():
    """Unpins the backup memory no paused tag holds; returns the bytes unpinned."""
    return _library.load().release_backup()


def tag_stats(name, device=0):
    """One tag's figures on one device: `physical` (device memory mapped for it), `in_use` (its live bytes),
    `paused_bytes` (its blocks asleep) and `paused`. Zeros for a tag the device never served."""
    return _library.load().tag_figures(device, tag_id(name))
