#!/usr/bin/env python3
"""rdma-core's test suite (its tests/, as run_tests.py loads it) in one
process, one result line per test in RESULTS as it ends:

    <ok|FAIL|ERROR|skip|xfail|xpass> TAB <test id> TAB <reason, one line>

so a host can compare them test by test (tests/tests/qemu_mlx5.rs, the
ratchet). Arguments after RESULTS go to rdma-core's argument parser
(--dev, --gid, ...). A test that runs past PER_TEST seconds is interrupted
(SIGALRM raises in it) and recorded as ERROR, so one hang costs one test.
"""
import os
import signal
import sys
import time
import traceback
import unittest
from importlib.machinery import SourceFileLoader

TESTS = '/opt/rdma-core/tests'
PER_TEST = int(os.environ.get('RDMA_SUITE_PER_TEST', '60'))

results = open(sys.argv[1], 'w', buffering=1)
sys.argv = [os.path.join(TESTS, 'run_tests.py')] + sys.argv[2:]
sys.path.insert(0, TESTS)
from args_parser import parser  # noqa: E402

parser.parse_args()
tests = SourceFileLoader('tests', os.path.join(TESTS, '__init__.py')).load_module()


class TestTimeout(Exception):
    pass


def on_alarm(_sig, _frame):
    raise TestTimeout(f'no result after {PER_TEST} s')


signal.signal(signal.SIGALRM, on_alarm)


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
        self.t0 = time.monotonic()
        signal.alarm(PER_TEST)
        super().startTest(test)

    def stopTest(self, test):
        signal.alarm(0)
        super().stopTest(test)

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


suite = unittest.TestLoader().loadTestsFromModule(tests)
runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=1, resultclass=Result)
start = time.monotonic()
res = runner.run(suite)
results.write(f'# ran {res.testsRun} in {time.monotonic() - start:.0f}s\n')
