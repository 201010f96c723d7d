"""library_path(): the environment variable, the installed package, build trees, in that order."""

import os
import tempfile
import time
import unittest

import support  # noqa: F401
from strata_torch import _library


def touch(path, mtime=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb"):
        pass
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


class LibraryPath(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        self.package = os.path.join(self.root, "python", "strata_torch")
        os.makedirs(self.package)

    def tearDown(self):
        self.tmp.cleanup()

    def find(self, env):
        return _library.library_path(env=env, package_dir=self.package, repo_root=self.root)

    def test_environment_variable_wins(self):
        explicit = touch(os.path.join(self.root, "elsewhere", "libstrata_alloc.so"))
        touch(os.path.join(self.package, "libstrata_alloc.so"))
        self.assertEqual(self.find({"STRATA_ALLOC_LIBRARY": explicit}), explicit)

    def test_environment_variable_naming_nothing_is_an_error_not_a_fallback(self):
        touch(os.path.join(self.package, "libstrata_alloc.so"))
        missing = os.path.join(self.root, "typo.so")
        with self.assertRaises(FileNotFoundError) as caught:
            self.find({"STRATA_ALLOC_LIBRARY": missing})
        self.assertIn("STRATA_ALLOC_LIBRARY", str(caught.exception))
        self.assertIn("typo.so", str(caught.exception))

    def test_installed_copy_before_build_trees(self):
        installed = touch(os.path.join(self.package, "libstrata_alloc.so"))
        touch(os.path.join(self.root, "build", "plugin", "libstrata_alloc.so"))
        self.assertEqual(self.find({}), installed)

    def test_newest_build_tree(self):
        now = time.time()
        touch(os.path.join(self.root, "build", "plugin", "libstrata_alloc.so"), now - 100)
        newest = touch(os.path.join(self.root, "build-py", "plugin", "libstrata_alloc.so"), now)
        touch(os.path.join(self.root, "build-old", "plugin", "libstrata_alloc.so"), now - 50)
        self.assertEqual(self.find({}), newest)

    def test_nothing_found_lists_where_it_looked(self):
        with self.assertRaises(FileNotFoundError) as caught:
            self.find({})
        message = str(caught.exception)
        self.assertIn(self.package, message)
        self.assertIn("STRATA_ALLOC_LIBRARY", message)
        self.assertIn("pip install", message)

    def test_candidates_in_order(self):
        b = touch(os.path.join(self.root, "build", "plugin", "libstrata_alloc.so"))
        paths = _library.candidate_paths({"STRATA_ALLOC_LIBRARY": "/x.so"}, self.package, self.root)
        self.assertEqual(paths, ["/x.so", os.path.join(self.package, "libstrata_alloc.so"), b])


class HooksLibraryPath(unittest.TestCase):
    def test_beside_the_plugin_or_below_it_or_none(self):
        with tempfile.TemporaryDirectory() as root:
            alloc = touch(os.path.join(root, "libstrata_alloc.so"))
            self.assertIsNone(_library.hooks_library_path(alloc, env={}))
            below = touch(os.path.join(root, "torch_hooks", "libstrata_torch_hooks.so"))
            self.assertEqual(_library.hooks_library_path(alloc, env={}), below)
            beside = touch(os.path.join(root, "libstrata_torch_hooks.so"))
            self.assertEqual(_library.hooks_library_path(alloc, env={}), beside)

    def test_environment_variable_must_name_a_file(self):
        with tempfile.TemporaryDirectory() as root:
            alloc = touch(os.path.join(root, "libstrata_alloc.so"))
            explicit = touch(os.path.join(root, "x", "hooks.so"))
            self.assertEqual(_library.hooks_library_path(alloc, {"STRATA_TORCH_HOOKS_LIBRARY": explicit}), explicit)
            with self.assertRaises(FileNotFoundError) as caught:
                _library.hooks_library_path(alloc, {"STRATA_TORCH_HOOKS_LIBRARY": explicit + ".typo"})
            self.assertIn("STRATA_TORCH_HOOKS_LIBRARY", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
