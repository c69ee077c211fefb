"""What the decisive scripts share: their arguments (ATTNREF GOLDEN WORK, WORK made empty), `expect`
(prints ok/FAIL, keeps the failures), `run` (the command, output captured) and `finish` (the summary
line and the exit status)."""
import os
import shutil
import subprocess
import sys

attnref, golden, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def expect(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    return subprocess.run([attnref, *args], capture_output=True, text=True)


def finish():
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
