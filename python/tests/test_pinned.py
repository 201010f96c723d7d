"""strata_torch.pinned's control flow without PyTorch: when enable() installs the pinned allocator, and how the
hooks library's figures become pinned_stats(). What PyTorch does with the allocator is checked on the device
(tests/device/torch/pinned_host.py)."""

import ctypes
import os
import unittest
from unittest import mock

import support  # noqa: F401  (puts python/ on sys.path)
from strata_torch import pinned


class EnableFromEnv(unittest.TestCase):
    def run_with(self, argument, env_value):
        calls = []
        env = {} if env_value is None else {pinned.ENV_PINNED: env_value}
        with mock.patch.dict(os.environ, env, clear=False), mock.patch.object(pinned, "enable_pinned", lambda: calls.append(1)):
            if env_value is None:
                os.environ.pop(pinned.ENV_PINNED, None)
            pinned.enable_pinned_from_env(argument)
        return len(calls)

    def test_argument_decides(self):
        self.assertEqual(self.run_with(True, None), 1)
        self.assertEqual(self.run_with(False, "1"), 0)

    def test_environment_decides_when_the_argument_is_none(self):
        self.assertEqual(self.run_with(None, "1"), 1)
        self.assertEqual(self.run_with(None, "0"), 0)
        self.assertEqual(self.run_with(None, None), 0)


class Stats(unittest.TestCase):
    def test_figures_are_named_and_the_numa_node_is_shifted_back(self):
        def figures(out, n):
            array = ctypes.cast(out, ctypes.POINTER(ctypes.c_ulonglong))
            for i in range(n):
                array[i] = 100 + i
            array[n - 1] = 0  # numa_node + 1 == 0: no node
            return n

        with mock.patch.object(pinned, "_function", lambda name, restype, argtypes: figures):
            stats = pinned.pinned_stats()
        self.assertEqual(list(stats), list(pinned._FIGURES))
        self.assertEqual(stats["pinned"], 100)
        self.assertEqual(stats["pins"], 106)
        self.assertEqual(stats["numa_node"], -1)

    def test_nothing_before_the_first_allocation(self):
        with mock.patch.object(pinned, "_function", lambda name, restype, argtypes: lambda out, n: 0):
            self.assertEqual(pinned.pinned_stats(), {})

    def test_a_refused_install_raises_with_the_library_message(self):
        def function(name, restype, argtypes):
            if name == "strata_torch_install_pinned":
                return lambda: 1
            return lambda: b"PyTorch's pinned-memory allocator holds 3 live blocks"

        with mock.patch.object(pinned, "_function", function):
            with self.assertRaisesRegex(RuntimeError, "holds 3 live blocks"):
                pinned.enable_pinned()


if __name__ == "__main__":
    unittest.main()
