"""Shared helpers of the strata_torch host tests."""

import json
import os
import subprocess
import sys
import unittest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)


def require_gpu():
    """STRATA_REQUIRE_GPU=1: a test that needs torch/CUDA/the library fails instead of skipping."""
    return os.environ.get("STRATA_REQUIRE_GPU") == "1"


def skip_or_fail(test, why):
    if require_gpu():
        test.fail(f"STRATA_REQUIRE_GPU=1 but {why}")
    raise unittest.SkipTest(why)


def find_library():
    import strata_torch
    try:
        return strata_torch.library_path()
    except FileNotFoundError:
        return None


def run_python(code, env_extra=None, timeout=120):
    """Run code in a fresh interpreter (the plug-in keeps per-process state: each scenario starts clean).
    The code prints one JSON document as its last line; returns (returncode, parsed or None, stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    parsed = None
    if lines:
        try:
            parsed = json.loads(lines[-1])
        except ValueError:
            parsed = None
    return proc.returncode, parsed, proc.stderr
