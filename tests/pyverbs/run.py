#!/usr/bin/env python3
"""Runs chosen modules of rdma-core's own test suite (tests/, fetched by
scripts/rdma-core-tests.sh) on pyverbs, and writes one line per test.

Usage: run.py RDMA_CORE_DIR OUT_FILE MODULE... [-- ARGS for args_parser]

rdma-core's tests/__init__.py imports every test module, the mlx5, EFA and
CUDA ones too; those need providers this library does not stand in for.
So the package `tests` is made here without running its __init__, and only
the named modules are imported. Each result line is
`STATUS<TAB>test id<TAB>reason`, STATUS one of pass, fail, error, skip.
"""
import importlib
import os
import sys
import types
import unittest


def bridge_pyverbs_versions():
    """The suite comes from the newest rdma-core source the mirror serves
    (trixie's 56.1: bookworm's 44.0 tarball is gone from the pool), the
    pyverbs from the installed package (bookworm's 44.0). Names the newer
    tests import that 44.0 lacks are added here, each doing what 56.1's
    does, and listed in BRIDGED so the results say so."""
    import ctypes
    import pyverbs.mem_alloc as mem
    from pyverbs.base import PyverbsRDMAErrno
    if not hasattr(mem, "madvise"):
        libc = ctypes.CDLL(None, use_errno=True)

        def madvise(addr, length, flags=4):  # MADV_DONTNEED
            if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), flags):
                raise PyverbsRDMAErrno("Failed to madvise memory")

        mem.madvise = madvise
        BRIDGED.append("pyverbs.mem_alloc.madvise")
    # Constants of the newer verbs.h (56.1) that the tests name at import
    # or compare with (tests/utils.py's send_op, test_qpex's flush
    # cases); 44.0's pyverbs.enums lacks them. Values as 56.1's verbs.h.
    import pyverbs.enums as enums
    for name, value in (
        ("IBV_WR_FLUSH", 14),
        ("IBV_WR_ATOMIC_WRITE", 15),
        ("IBV_ACCESS_FLUSH_GLOBAL", 1 << 8),
        ("IBV_ACCESS_FLUSH_PERSISTENT", 1 << 9),
        ("IBV_QP_EX_WITH_FLUSH", 1 << 11),
        ("IBV_QP_EX_WITH_ATOMIC_WRITE", 1 << 12),
        ("IBV_FLUSH_GLOBAL", 1 << 0),
        ("IBV_FLUSH_PERSISTENT", 1 << 1),
        ("IBV_FLUSH_RANGE", 0),
        ("IBV_FLUSH_MR", 1),
    ):
        if not hasattr(enums, name):
            setattr(enums, name, value)
            BRIDGED.append(f"pyverbs.enums.{name} = {value}")


BRIDGED = []


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    root, out, modules = argv[0], argv[1], argv[2:]
    tests_dir = os.path.join(root, "tests")
    sys.path.insert(0, tests_dir)
    from args_parser import parser
    sys.argv = [sys.argv[0]] + extra
    parser.parse_args()
    bridge_pyverbs_versions()
    pkg = types.ModuleType("tests")
    pkg.__path__ = [tests_dir]
    sys.modules["tests"] = pkg
    # These devices have no kernel net device (no netlink RDMA link, no
    # /sys/class/infiniband): the answer rdma-core's base.py reaches for a
    # device without one, without shelling out to `rdma link show`.
    base = importlib.import_module("tests.base")
    base.RDMATestCase.get_net_name = staticmethod(lambda dev, port=None: None)
    BRIDGED.append("tests.base.RDMATestCase.get_net_name (no netdev)")
    # tests.utils and tests.mlx5_base import each other; upstream's package
    # __init__ has utils loaded first, which the mlx5 modules rely on.
    importlib.import_module("tests.utils")
    suite = unittest.TestSuite()
    lines = []
    for m in modules:
        try:
            mod = importlib.import_module("tests." + m)
        except Exception as e:  # a module that does not load is named, not hidden
            lines.append(f"error\ttests.{m}\timport: {type(e).__name__}: {e}")
            continue
        suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(mod))

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            lines.append(f"pass\t{test.id()}\t")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            lines.append(f"fail\t{test.id()}\t{self._why(err)}")

        def addError(self, test, err):
            super().addError(test, err)
            lines.append(f"error\t{test.id()}\t{self._why(err)}")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            lines.append(f"skip\t{test.id()}\t{reason}".replace("\n", " "))

        @staticmethod
        def _why(err):
            return f"{err[0].__name__}: {err[1]}".replace("\n", " ")[:300]

    runner = unittest.TextTestRunner(verbosity=2, resultclass=Result)
    runner.run(suite)
    lines.extend(f"bridged\t{b}\t" for b in BRIDGED)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
