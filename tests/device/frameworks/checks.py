"""Shared by the frameworks suite's scripts: named checks that print PASS/FAIL lines and set the exit status,
and the one-line choice of allocator each script runs under ("strata" enables strata_torch first)."""

import os
import sys
import traceback


class Checks:
    def __init__(self, suite):
        self.suite = suite
        self.failed = 0
        self.passed = 0
        self.skipped = 0

    def __call__(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"PASS {self.suite}: {name}" + (f" ({detail})" if detail else ""), flush=True)
        else:
            self.failed += 1
            print(f"FAIL {self.suite}: {name}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    def skip(self, name, why):
        """A check this machine cannot make (a feature the installed PyTorch lacks), said as such: neither passed
        nor failed."""
        self.skipped += 1
        print(f"SKIP {self.suite}: {name}: {why}", flush=True)

    def raises(self, name, exc_type, fn, must_mention=()):
        try:
            fn()
        except exc_type as e:
            text = str(e)
            missing = [m for m in must_mention if m not in text]
            return self(name, not missing, f"message lacks {missing}: {text[:400]}" if missing else "")
        except Exception as e:   # the wrong type is a failure, with what came instead
            return self(name, False, f"{type(e).__name__} instead of {exc_type.__name__}: {str(e)[:400]}")
        return self(name, False, f"no {exc_type.__name__} raised")

    def guard(self, name, fn):
        """Runs fn; an exception is a failed check with its traceback, not the end of the script."""
        try:
            return fn()
        except Exception:
            self(name, False, traceback.format_exc()[-1500:])
            return None

    def finish(self):
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        print(f"{self.suite}: {self.passed} passed, {self.failed} failed{skipped}", flush=True)
        sys.exit(1 if self.failed else 0)


def allocator_from_argv(default_conf="stack=default"):
    """--allocator strata|native [--conf CONF]: strata is enabled before torch touches CUDA. Returns the name."""
    args = sys.argv[1:]
    name = args[args.index("--allocator") + 1] if "--allocator" in args else "strata"
    conf = args[args.index("--conf") + 1] if "--conf" in args else os.environ.get("STRATA_ALLOC_CONF", default_conf)
    if name == "strata":
        import strata_torch
        strata_torch.enable(conf, backend="strata")
    return name
