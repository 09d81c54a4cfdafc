#!/usr/bin/env python3
"""rdma-core's test suite (its tests/, as run_tests.py loads it) in one
process, one result line per test in RESULTS as it ends:

    <ok|FAIL|ERROR|skip|xfail|xpass> TAB <test id> TAB <reason, one line>

so a host can compare them test by test (tests/tests/qemu_mlx5.rs, the
ratchet). Arguments after RESULTS go to rdma-core's argument parser
(--dev, --gid, ...). A test that runs past PER_TEST seconds is interrupted
(SIGALRM raises in it) and recorded as ERROR, so one hang costs one test.
RDMA_SUITE_FILES (comma-separated file names, e.g. test_mlx5_dc,test_odp)
runs only those files' tests (for short runs while iterating).

The tests run in a child process; one that kills it (a crash in libmlx5 or
pyverbs on what the device answered) is recorded as ERROR with the signal,
and a new child goes on with the tests after it, so a crash also costs one
test only.
"""
import faulthandler
import gc
import os
import signal
import subprocess
import sys
import time
import traceback
import unittest
from importlib.machinery import SourceFileLoader

TESTS = os.environ.get('RDMA_SUITE_TESTS', '/opt/rdma-core/tests')
PER_TEST = int(os.environ.get('RDMA_SUITE_PER_TEST', '60'))


def supervise(path, args):
    """Runs workers until one ends by itself; records each crash."""
    open(path, 'w').close()
    start = time.monotonic()
    crashed = set()
    while True:
        cur = path + '.cur'
        if os.path.exists(cur):
            os.unlink(cur)
        rc = subprocess.call([sys.executable, __file__, '--worker', path] + args)
        if rc >= 0 or not os.path.exists(cur):
            break
        with open(cur) as f:
            test_id = f.read().strip()
        if test_id in crashed:
            # Outside a test (a class or module fixture): give up.
            break
        crashed.add(test_id)
        with open(path, 'a') as f:
            f.write(f'ERROR\t{test_id}\tthe test process died of signal {-rc} '
                    f'({signal.Signals(-rc).name}){crash_frames(path)}\n')
    with open(path) as f:
        ran = sum(1 for line in f if not line.startswith('#'))
    with open(path, 'a') as f:
        f.write(f'# ran {ran} in {time.monotonic() - start:.0f}s\n')
    return rc


def crash_frames(path):
    """Where the worker was when it died: the innermost Python frames
    faulthandler wrote (most recent first), as one line."""
    try:
        with open(path + '.crash') as f:
            frames = [' '.join(line.split()) for line in f if line.strip().startswith('File ')]
    except OSError:
        return ''
    return ': ' + '; '.join(frames[:4]) if frames else ''


if sys.argv[1] != '--worker':
    sys.exit(max(supervise(sys.argv[1], sys.argv[2:]), 0))
results_path = sys.argv[2]
with open(results_path) as f:
    done = {line.split('\t')[1] for line in f if '\t' in line}
results = open(results_path, 'a', buffering=1)
# A crash (SIGSEGV in libmlx5 or pyverbs) leaves its Python stack here.
crash_log = open(results_path + '.crash', 'w')
faulthandler.enable(file=crash_log)
sys.argv = [os.path.join(TESTS, 'run_tests.py')] + sys.argv[3:]
sys.path.insert(0, TESTS)
from args_parser import parser  # noqa: E402

parser.parse_args()
tests = SourceFileLoader('tests', os.path.join(TESTS, '__init__.py')).load_module()


class TestTimeout(Exception):
    pass


def on_alarm(_sig, _frame):
    raise TestTimeout(f'no result after {PER_TEST} s')


signal.signal(signal.SIGALRM, on_alarm)
# Python's cyclic collector runs between tests only, after tearDown
# (stopTest). pyverbs' objects are Cython classes whose tp_clear empties
# their weak sets of dependents: a test that leaves by an exception keeps
# its frames in a cycle (the exception's traceback), and when the collector
# frees them in the middle of the test, a DR action among their locals is
# cleared first, so its __dealloc__ cannot reach its rule to close it, its
# own destroy fails (EBUSY, ignored) and the rule stays in the device's
# flow table. tearDown then cannot destroy the QP the rule forwards to
# (EBUSY) and leaves the context open, and the rule takes every later
# test's frames of its match (test_mlx5_dr's root rules match the smac all
# the raw-traffic tests send). When it runs depends on how many objects
# earlier tests made, so a change anywhere moved it onto
# test_root_tbl_qp_tag_rule. After tearDown the actions were closed in
# order and freeing them does nothing.
gc.disable()


def one_line(s):
    return ' '.join(str(s).split())[:400]


def why(err):
    exc_type, exc, tb = err
    where = ''
    frames = [f for f in traceback.extract_tb(tb) if '/tests/' in f.filename]
    if frames:
        f = frames[-1]
        where = f' at {os.path.basename(f.filename)}:{f.lineno}'
    return one_line(f'{exc_type.__name__}: {exc}{where}')


class Result(unittest.TextTestResult):
    def emit(self, test, status, reason=''):
        results.write(f'{status}\t{test.id()}\t{one_line(reason)}\n')

    def startTest(self, test):
        with open(results_path + '.cur', 'w') as f:
            f.write(test.id())
        self.t0 = time.monotonic()
        signal.alarm(PER_TEST)
        super().startTest(test)

    def stopTest(self, test):
        signal.alarm(0)
        super().stopTest(test)
        gc.collect()

    def addSuccess(self, test):
        super().addSuccess(test)
        self.emit(test, 'ok', f'{time.monotonic() - self.t0:.1f}s')

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.emit(test, 'FAIL', why(err))

    def addError(self, test, err):
        super().addError(test, err)
        self.emit(test, 'ERROR', why(err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.emit(test, 'skip', reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.emit(test, 'xfail', why(err))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.emit(test, 'xpass')

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            bad = issubclass(err[0], test.failureException)
            self.emit(subtest, 'FAIL' if bad else 'ERROR', why(err))


def only(suite, files):
    """The tests of `suite` whose file (the id's second part) is in files."""
    out = unittest.TestSuite()
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            out.addTests(only(t, files))
        elif t.id().split('.')[1] in files:
            out.addTest(t)
    return out


def not_done(suite):
    """The tests of `suite` an earlier (crashed) worker did not finish."""
    out = unittest.TestSuite()
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            out.addTests(not_done(t))
        elif t.id() not in done:
            out.addTest(t)
    return out


suite = unittest.TestLoader().loadTestsFromModule(tests)
if os.environ.get('RDMA_SUITE_FILES'):
    suite = only(suite, set(os.environ['RDMA_SUITE_FILES'].split(',')))
suite = not_done(suite)
runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=1, resultclass=Result)
runner.run(suite)
os.unlink(results_path + '.cur')
