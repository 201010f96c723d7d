"""strata_torch.pinned's control flow without PyTorch: when enable() installs the pinned allocator, and how the
hooks library's figures become pinned_stats(). What PyTorch does with the allocator is checked on the device
(tests/device/torch/pinned_host.py)."""

import contextlib
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


class Lending(unittest.TestCase):
    """enable(pinned=True) lends the pool to sleep/wake's backup once the allocator is in place; disable_pinned()
    undoes it in order: the backup no paused tag holds goes back, the lending stops, then the uninstall."""

    @contextlib.contextmanager
    def library(self, lend_answers):
        """The hooks library's lend (answers for on=1, on=0) and uninstall, and release_backup, recording their
        calls in the list it yields; nothing lent at the start."""
        from strata_torch import sleep
        calls = []
        answers = {1: lend_answers[0], 0: lend_answers[1]}

        def function(name, restype, argtypes):
            if name == "strata_torch_lend_pinned":
                return lambda on: calls.append(("lend", on)) or answers[on]
            if name == "strata_torch_uninstall_pinned":
                return lambda: calls.append(("uninstall",)) or 0
            return lambda: b"a paused tag's backup is out"

        with mock.patch.object(pinned, "_function", function), mock.patch.object(pinned, "_lending", [False]), \
                mock.patch.object(sleep, "release_backup", lambda: calls.append(("release_backup",)) or 0):
            yield calls

    def test_enable_lends_after_the_allocator_and_only_when_it_installed_the_pool(self):
        import strata_torch
        for installed in (True, False):
            order = []
            with mock.patch.object(pinned, "enable_pinned_from_env", lambda p: order.append("install") or installed), \
                    mock.patch.object(strata_torch, "_enable_allocator", lambda *a: order.append("allocator") or "A"), \
                    mock.patch.object(pinned, "lend_pinned", lambda: order.append("lend") or True):
                self.assertEqual(strata_torch.enable("stack=default", pinned=installed), "A")
            self.assertEqual(order, ["install", "allocator", "lend"] if installed else ["install", "allocator"])

    def test_disable_gives_the_backup_back_then_stops_lending_then_uninstalls(self):
        with self.library((1, 0)) as calls:
            self.assertTrue(pinned.lend_pinned())
            pinned.disable_pinned()
            self.assertEqual(calls, [("lend", 1), ("release_backup",), ("lend", 0), ("uninstall",)])
            calls.clear()
            pinned.disable_pinned()  # nothing lent any more: the uninstall alone
            self.assertEqual(calls, [("uninstall",)])

    def test_a_stack_that_cannot_sleep_borrows_nothing_and_disable_only_uninstalls(self):
        with self.library((0, 0)) as calls:
            self.assertFalse(pinned.lend_pinned())
            pinned.disable_pinned()
        self.assertEqual(calls, [("lend", 1), ("uninstall",)])

    def test_a_refused_stop_raises_and_leaves_the_pool_installed(self):
        with self.library((1, -1)) as calls:
            pinned.lend_pinned()
            with self.assertRaisesRegex(RuntimeError, "resume the paused tags first"):
                pinned.disable_pinned()
        self.assertNotIn(("uninstall",), calls)

    def test_a_refused_lend_raises_with_the_library_message(self):
        with self.library((-1, 0)):
            with self.assertRaisesRegex(RuntimeError, "backup is out"):
                pinned.lend_pinned()

if __name__ == "__main__":
    unittest.main()
