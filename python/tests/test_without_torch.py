"""The module's behaviour where PyTorch or CuPy is missing (simulated by blocking the import), and its device
argument parsing, which never needs torch."""

import unittest

import support
import strata_torch

BLOCK = "import sys; sys.modules['{0}'] = None\n"   # `import {0}` then raises ImportError


class WithoutTorch(unittest.TestCase):
    def test_module_imports_without_torch(self):
        rc, out, err = support.run_python(BLOCK.format("torch") + "import json, strata_torch\n"
                                          "print(json.dumps(sorted(strata_torch.__all__)))")
        self.assertEqual(rc, 0, err)
        self.assertIn("enable", out)

    def test_enable_says_torch_is_needed(self):
        code = BLOCK.format("torch") + (
            "import json, strata_torch\n"
            "try:\n    strata_torch.enable('stack=default')\nexcept ImportError as e:\n"
            "    print(json.dumps(str(e)))\n")
        rc, out, err = support.run_python(code)
        self.assertEqual(rc, 0, err)
        self.assertIsNotNone(out, "enable() did not raise ImportError without torch")
        self.assertIn("needs PyTorch", out)

    def test_mempool_says_torch_is_needed(self):
        code = BLOCK.format("torch") + (
            "import json, strata_torch\n"
            "try:\n    strata_torch.MemPool()\nexcept ImportError as e:\n    print(json.dumps(str(e)))\n")
        rc, out, err = support.run_python(code)
        self.assertEqual(rc, 0, err)
        self.assertIn("needs PyTorch", out or "")

    def test_cupy_enable_says_cupy_is_needed(self):
        code = BLOCK.format("cupy") + (
            "import json, strata_torch.cupy\n"
            "try:\n    strata_torch.cupy.enable()\nexcept ImportError as e:\n    print(json.dumps(str(e)))\n")
        rc, out, err = support.run_python(code)
        self.assertEqual(rc, 0, err)
        self.assertIn("needs CuPy", out or "")


class DeviceArgument(unittest.TestCase):
    def test_accepted_forms(self):
        index = strata_torch._device_index
        self.assertEqual(index(3), 3)
        self.assertEqual(index("2"), 2)
        self.assertEqual(index("cuda:1"), 1)

        class FakeDevice:   # the attributes torch.device has
            type, index = "cuda", 4
        self.assertEqual(index(FakeDevice()), 4)

    def test_bad_forms_name_the_value(self):
        index = strata_torch._device_index
        for bad, error in ((-1, ValueError), ("cuda:x", ValueError), ("cpu", ValueError), (True, TypeError),
                           (1.5, TypeError)):
            with self.assertRaises(error) as caught:
                index(bad)
            self.assertIn(str(bad) if not isinstance(bad, bool) else "True", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
