"""Out of memory under strata: a loop that grows the batch of a real model until the allocator refuses gets
torch.OutOfMemoryError (not a crash, not a RuntimeError of another kind), and the process keeps working after it:
memory is given back, and a new allocation and a computation succeed and give the right answer.
Prints one JSON line; exit status 0 only if every check held.

    python3 oom.py [--conf stack=default] [--limit-gib 0 (0: the whole device)]
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--conf", default=os.environ.get("STRATA_TEST_CONF", "stack=default"))
    p.add_argument("--limit-gib", type=int, default=0)
    args = p.parse_args()
    conf = args.conf + (f",limit={args.limit_gib}GiB" if args.limit_gib else "")
    import strata_torch
    strata_torch.enable(conf)
    import torch
    sys.path.insert(0, HERE)
    import models

    # Whether libstrata_torch_hooks.so's handler is installed (it makes strata's out-of-memory a
    # torch.OutOfMemoryError): False here explains a RuntimeError below.
    checks, result = {}, {"conf": conf, "oom_handler": strata_torch.oom_raises_torch_error()}
    model = models.GPT2(layers=4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch, fitted, error = 1, 0, None
    while batch <= 4096:
        try:
            x = torch.randint(0, 50257, (batch, 1024), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            fitted = batch
            batch *= 2
        except torch.OutOfMemoryError as e:
            error = ("torch.OutOfMemoryError", str(e).splitlines()[0][:300])
            break
        except RuntimeError as e:   # the wrong kind of error for an out-of-memory: reported, then failed
            error = (type(e).__name__, str(e).splitlines()[0][:300])
            break
        finally:
            x = loss = None
    optimizer.zero_grad(set_to_none=True)
    result.update(largest_batch=fitted, failed_at=batch, error=error)
    checks["raised torch.OutOfMemoryError"] = error is not None and error[0] == "torch.OutOfMemoryError"
    stats = strata_torch.memory_stats()
    checks["num_ooms counted"] = stats.get("num_ooms", 0) >= 1
    # After the error: the failed step's memory is back, and the GPU computes correctly.
    torch.cuda.empty_cache()
    after = strata_torch.memory_stats()
    result["reserved_after_empty_cache"] = after["reserved_bytes.all.current"]
    try:
        a = torch.full((4096, 4096), 2.0, device="cuda")
        b = torch.full((4096, 4096), 0.5, device="cuda")
        c = (a @ b).sum().item()     # every element 4096 * 1.0
        checks["compute after OOM"] = c == 4096.0 * 4096 * 4096
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = torch.randint(0, 50257, (max(1, fitted // 2), 1024), device="cuda")
            loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
        loss.backward()
        torch.cuda.synchronize()
        checks["training step after OOM"] = bool(torch.isfinite(loss).item())
    except Exception as e:   # noqa: BLE001 - any failure here is the finding
        result["after_error"] = f"{type(e).__name__}: {e}"
        checks.setdefault("compute after OOM", False)
        checks["training step after OOM"] = False
    result["checks"] = checks
    print(strata_torch.memory_summary(), file=sys.stderr)
    print(json.dumps(result))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
