"""Shared by the command-line test scripts under tests/inputs_from/: the attnref command run without a
shell, a record of checks that prints each one, and a fresh working directory."""
import os
import shutil
import subprocess
import sys


class Checks:
    def __init__(self, attnref):
        self.attnref = attnref
        self.failures = []

    def expect(self, cond, what):
        """Records one check and prints it: 'ok' or 'FAIL' and what it checks."""
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            self.failures.append(what)

    def run(self, *args):
        """attnref ARGS (an argument list, never a shell line): (exit code, stdout, stderr)."""
        p = subprocess.run([self.attnref, *args], capture_output=True, text=True)
        return p.returncode, p.stdout, p.stderr

    def finish(self):
        """Exits 1 when a check failed, 0 otherwise, with the count."""
        print(f"{len(self.failures)} failure(s)" if self.failures else "all passed")
        sys.exit(1 if self.failures else 0)


def fresh(path):
    """An empty directory at path (removed first if it exists)."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path
