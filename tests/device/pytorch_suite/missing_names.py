"""Names the judged test files import that the installed PyTorch's testing helpers lack (loaded by
suite_plugin.py before collection). Pure Python; torch is imported only when a listed module is looked at.

Note [Test files from another PyTorch]
The test files judged may come from a PyTorch commit other than the installed release's (README.md, "Placing
PyTorch's test files"). Such a file can import a name the installed torch.testing._internal renamed or dropped,
and then not one of its tests runs. Before collection, provide_missing_names() gives each such module the name
with the meaning the file expects, computed from the installed PyTorch, in both runs alike (it changes nothing
a test checks of the allocator). MISSING_NAMES lists them; a name the installed PyTorch has is left alone.
"""

import importlib


def _cuda_malloc_async_in_use():
    import torch
    return torch.cuda.is_available() and torch.cuda.get_allocator_backend() == "cudaMallocAsync"


def _cuda_and_triton():
    from torch.testing._internal import inductor_utils
    return inductor_utils.HAS_CUDA_AND_TRITON


# (module, name, the value the test files mean by it).
MISSING_NAMES = (
    ("torch.testing._internal.common_utils", "TEST_CUDAMALLOCASYNC", _cuda_malloc_async_in_use),
    ("torch.testing._internal.inductor_utils", "HAS_CUDA", _cuda_and_triton),
)


def provide_missing_names(names=MISSING_NAMES):
    """Sets each listed name its module lacks; returns "module.name" of those set. A module that cannot be
    imported is skipped (its test file then fails to import in both runs alike)."""
    provided = []
    for module_name, name, value in names:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if not hasattr(module, name):
            setattr(module, name, value())
            provided.append(f"{module_name}.{name}")
    return provided
