"""Makes strata PyTorch's CUDA allocator in every Python process that starts with this folder on PYTHONPATH and
STRATA_SUITE_CONF set: pytest's own process, and the processes PyTorch's tests start themselves (subprocess
scripts, torch.multiprocessing children), which inherit both. Python imports sitecustomize before any other
module, so enable() runs before CUDA can start.

A process where enable() fails stops at once (exit status 97, the reason on stderr): going on would run the
test on PyTorch's own allocator and count its result for strata.
"""

import os
import sys

_conf = os.environ.get("STRATA_SUITE_CONF")
if _conf:
    try:
        import strata_torch
        strata_torch.enable(_conf)
    except Exception as e:  # noqa: BLE001 - any failure must stop the process, whatever raised it
        sys.stderr.write(f"strata suite: strata_torch.enable({_conf!r}) failed in {sys.argv!r}: {e!r}\n")
        sys.stderr.flush()
        os._exit(97)
