#!/usr/bin/python3
"""Hostile-input probes for the `attnref` command (docs/hostile.md), run by CTest (tests/hostile.cmake).

    hostile.py ATTNREF GOLDEN_DIR WORK_DIR CATEGORY [--no-rlimit]

Each probe builds a hostile file or command line (FIFO, device, symlink, deep JSON, huge shapes,
duplicate keys, shell metacharacters, ...), runs the built `attnref` with a wall-clock timeout (a
hang fails the probe) and, unless --no-rlimit (sanitizer builds reserve terabytes of address
space), an address-space limit of 1 GiB (a regression is an allocation failure, not a 5 GB
machine), and asserts the exit code and that stderr is one line naming the file or flag. Prints one
line per probe and a summary "category: N probes, all as expected"; exits 1 if any probe failed.
"""
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np

ATTNREF, GOLDEN, WORK, CATEGORY = sys.argv[1:5]
RLIMIT = '--no-rlimit' not in sys.argv[5:]
AS_LIMIT = 1 << 30
TIMEOUT = int(os.environ.get('ATTNREF_PROBE_TIMEOUT', '60'))  # seconds; a hang fails the probe
failures = []
count = 0


def limit():
    if RLIMIT:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def attnref(*args, stdin=None, stdout=subprocess.PIPE):
    """Runs attnref; returns (rc, stdout, stderr). A timeout is reported as rc 'timeout'."""
    try:
        p = subprocess.run([ATTNREF, *args], stdout=stdout, stderr=subprocess.PIPE, timeout=TIMEOUT,
                           preexec_fn=limit, stdin=subprocess.DEVNULL if stdin is None else stdin)
    except subprocess.TimeoutExpired:
        return 'timeout', '', ''
    return p.returncode, (p.stdout or b'').decode('utf-8', 'replace'), p.stderr.decode('utf-8', 'replace')


def probe(name, result, rc, must=(), must_not=(), one_line=True):
    """Checks one run: exit code `rc`, stderr one line containing every `must` (regex) and none
    of `must_not`."""
    global count
    count += 1
    got_rc, _, err = result
    problems = []
    if got_rc != rc:
        problems.append(f'exit {got_rc}, expected {rc}')
    lines = err.rstrip('\n').split('\n') if err else []
    if one_line and rc == 2 and len(lines) != 1:
        problems.append(f'{len(lines)} lines on stderr, expected 1')
    for m in must:
        if not re.search(m, err):
            problems.append(f'stderr lacks /{m}/')
    for m in must_not:
        if re.search(m, err):
            problems.append(f'stderr has /{m}/')
    status = 'ok' if not problems else 'FAILED: ' + '; '.join(problems)
    print(f'[{CATEGORY}] {name}: {status}  | {err.strip()[:300]!r}')
    if problems:
        failures.append(name)


def check(name, condition, detail=''):
    global count
    count += 1
    print(f'[{CATEGORY}] {name}: {"ok" if condition else "FAILED"} {detail}')
    if not condition:
        failures.append(name)


def fresh(name):
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def copy_case(name, dst):
    d = os.path.join(dst, name)
    shutil.copytree(os.path.join(GOLDEN, name), d, symlinks=True)
    return d


def sha(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def manifest(case):
    with open(os.path.join(case, 'manifest.json')) as f:
        return json.load(f)


def write_manifest(case, m, text=None):
    with open(os.path.join(case, 'manifest.json'), 'w') as f:
        f.write(text if text is not None else json.dumps(m, indent=2))


def entry(m, role):
    return next(t for t in m['tensors'] if t['role'] == role and 'target' not in t)


def candidate(case, d, name='ok.npy', factor=1.0):
    out = np.load(os.path.join(case, 'output.npy'))
    path = os.path.join(d, name)
    np.save(path, (out * factor).astype(np.float32))
    return path


def deep_json(depth):
    return '[' * depth + ']' * depth


def check_args(case, out, *more):
    return ('check', '--golden', case, '--output', out, *more)


# ---------------------------------------------------------------------------------------------
def memory():
    d = fresh('memory')
    case = copy_case('sdpa_basic', d)
    ok = candidate(case, d)
    fifo = os.path.join(d, 'fifo.npy')
    os.mkfifo(fifo)
    probe('--output /dev/zero', attnref(*check_args(case, '/dev/zero')), 2, ['/dev/zero', 'not a regular file'])
    probe('--output FIFO', attnref(*check_args(case, fifo)), 2, ['fifo.npy', 'not a regular file'])
    probe('--weights /dev/zero', attnref(*check_args(case, ok, '--weights', '/dev/zero')), 2, ['/dev/zero'])
    probe('--lse FIFO', attnref(*check_args(case, ok, '--lse', fifo)), 2, ['fifo.npy'])
    # A header that promises 80 GB: refused from the header, nothing allocated.
    huge = os.path.join(d, 'huge_header.npy')
    with open(huge, 'wb') as f:
        f.write(b"\x93NUMPY\x01\x00" + b"v\x00" + b"{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000), }".ljust(117) + b'\n')
    probe('--output header promising 80 GB', attnref(*check_args(case, huge)), 2, ['huge_header.npy', 'header promises 80000000000'])
    # The right header followed by a 20 GB (sparse) tail.
    shape = manifest(case)['shapes']
    sparse = os.path.join(d, 'sparse.npy')
    with open(ok, 'rb') as f:
        good = f.read()
    with open(sparse, 'wb') as f:
        f.write(good)
        f.truncate(20 << 30)
    probe('--output right header, 20 GB file', attnref(*check_args(case, sparse)), 2, ['sparse.npy', 'trailing bytes'])
    # manifest.json: 17 MiB (sparse), a FIFO, /dev/zero via a symlink inside the case.
    big = copy_case('sdpa_basic', fresh('memory_big'))
    with open(os.path.join(big, 'manifest.json'), 'ab') as f:
        f.truncate(17 << 20)
    probe('manifest.json of 17 MiB', attnref(*check_args(big, ok)), 2, ['manifest.json', 'limit'])
    mfifo = copy_case('sdpa_basic', fresh('memory_fifo'))
    os.remove(os.path.join(mfifo, 'manifest.json'))
    os.mkfifo(os.path.join(mfifo, 'manifest.json'))
    probe('manifest.json FIFO', attnref(*check_args(mfifo, ok)), 2, ['manifest.json', 'not a regular file'])
    probe('run on a FIFO manifest', attnref('run', '--golden', mfifo, '--arith', 'float32', '--out', os.path.join(d, 'r')), 2,
          ['manifest.json'])
    probe('list --suite /dev/zero', attnref('list', '--suite', '/dev/zero'), 2, ['/dev/zero', 'not a regular file'])
    probe('generate --suite FIFO', attnref('generate', '--suite', fifo, '--out', d), 2, ['fifo.npy'])
    sfile = os.path.join(d, 'suite17.json')
    with open(sfile, 'wb') as f:
        f.truncate(17 << 20)
    probe('list --suite of 17 MiB', attnref('list', '--suite', sfile), 2, ['suite17.json', 'limit'])
    # A case whose shapes imply ~20 GB (Sq = Sk = 25,000): refused from the manifest, naming the
    # field and the estimate; --max-memory raises the limit (then the tensor files are wrong).
    hug = copy_case('sdpa_basic', fresh('memory_shapes'))
    m = manifest(hug)
    m['shapes']['query_length'] = m['shapes']['key_length'] = 25000
    for t in m['tensors']:
        if t['role'] in ('query', 'output', 'weights', 'lse', 'key', 'value'):
            t['shape'][2] = 25000
        if t['role'] == 'weights':
            t['shape'][3] = 25000
    write_manifest(hug, m)
    probe('case of Sq = Sk = 25000', attnref(*check_args(hug, ok)), 2, ['manifest.json', "field 'shapes'", 'GiB', 'max-memory'])
    probe('same case, run', attnref('run', '--golden', hug, '--arith', 'float32', '--out', os.path.join(d, 'r')), 2, ["field 'shapes'"])
    probe('same case, --max-memory 128G', attnref(*check_args(hug, ok, '--max-memory', '128G')), 2, [r'query\.npy'],
          ["field 'shapes'"])
    probe('--max-memory -1', attnref(*check_args(case, ok, '--max-memory', '-1')), 2, ['--max-memory'])
    probe('generate Sq = Sk = 25000', attnref('generate', '--name', 'big', '--sq', '25000', '--dk', '4', '--out', d), 2,
          ["field 'shapes'", 'GiB'])
    # A golden tensor longer than its dtype and shape allow: refused before hashing.
    longer = copy_case('sdpa_basic', fresh('memory_long'))
    with open(os.path.join(longer, 'weights.npy'), 'ab') as f:
        f.truncate(1 << 30)
    probe('golden tensor of 1 GiB', attnref(*check_args(longer, ok)), 2, ['weights.npy', 'more than'])


def deep():
    d = fresh('deep')
    ok_case = os.path.join(GOLDEN, 'sdpa_basic')
    ok = candidate(ok_case, d)
    case = copy_case('sdpa_basic', d)
    write_manifest(case, None, deep_json(100000))
    probe('manifest of 100000 nested arrays (check)', attnref(*check_args(case, ok)), 2, ['manifest.json', 'deeper'])
    probe('manifest of 100000 nested arrays (run)', attnref('run', '--golden', case, '--arith', 'float32', '--out', os.path.join(d, 'r')),
          2, ['manifest.json', 'deeper'])
    nested = copy_case('sdpa_basic', fresh('deep_obj'))
    write_manifest(nested, None, '{"a":' * 100000 + '1' + '}' * 100000)
    probe('manifest of 100000 nested objects', attnref(*check_args(nested, ok)), 2, ['manifest.json', 'deeper'])
    suite = os.path.join(d, 'suite.json')
    with open(suite, 'w') as f:
        f.write('{"schema": "attnref.suite", "schema_version": 1, "cases": ' + deep_json(100000) + '}')
    probe('suite of 100000 nested arrays (list)', attnref('list', '--suite', suite), 2, ['suite.json', 'deeper'])
    probe('suite of 100000 nested arrays (generate)', attnref('generate', '--suite', suite, '--out', d), 2, ['suite.json', 'deeper'])
    study = os.path.join(d, 'study.json')
    with open(study, 'w') as f:
        f.write(deep_json(100000))
    probe('study --json of 100000 nested arrays', attnref('study', '--json', study, '--out', os.path.join(d, 's'), '--no-plot'), 2,
          ['study.json', 'deeper'])


def sizes():
    d = fresh('sizes')
    probe('--diagonal-offset 2^63-1', attnref('generate', '--name', 'x', '--diagonal-offset', str(2**63 - 1), '--out', d), 2,
          ['diagonal_offset', '2\\^53'])
    probe('--heads 2 --dk 2^63', attnref('generate', '--name', 'x', '--heads', '2', '--dk', str(2**63), '--out', d), 2,
          ['overflows'])
    probe('--sq 2^64-1', attnref('generate', '--name', 'x', '--sq', str(2**64 - 1), '--out', d), 2, ['overflows|GiB'])
    check('nothing written by refused generate runs', not os.path.exists(os.path.join(d, 'x')))
    # The same wrap in a manifest: check must refuse it, never dereference anything.
    case = copy_case('mha_seed_example', d)
    ok = candidate(case, d)
    m = manifest(case)
    m['shapes']['heads'] = m['shapes']['kv_heads'] = 2
    m['shapes']['head_dim_qk'] = m['shapes']['head_dim_v'] = 2**63
    write_manifest(case, m)
    probe('manifest heads x head_dim wraps', attnref(*check_args(case, ok)), 2, ['manifest.json', 'overflows'])
    case2 = copy_case('sdpa_basic', fresh('sizes2'))
    m = manifest(case2)
    m['conventions']['diagonal_offset'] = 2**63 + 5
    write_manifest(case2, m)
    probe('manifest diagonal_offset 2^63+5', attnref(*check_args(case2, candidate(case2, d, 'b.npy'))), 2, ['diagonal_offset'])
    # Offsets up to 2^53 are exact: a causal mask shifted 2^53 keys attends to every key.
    probe('generate --diagonal-offset 2^53 (accepted)',
          attnref('generate', '--name', 'far', '--sq', '2', '--dk', '2', '--causal', 'top_left', '--diagonal-offset', str(2**53),
                  '--out', d, '--quiet'), 0, one_line=False)


def lost():
    d = fresh('lost')
    case = copy_case('sdpa_basic', d)
    ok = candidate(case, d)
    before = {f: sha(os.path.join(case, f)) for f in os.listdir(case)}
    probe('run --out <golden case>', attnref('run', '--golden', case, '--arith', 'float32', '--out', case), 2, ['--out', 'golden case'])
    other = copy_case('sdpa_additive_mask', fresh('lost_other'))
    probe('run --out <another golden case>', attnref('run', '--golden', case, '--arith', 'float32', '--out', other), 2, ['--out'])
    existing = os.path.join(d, 'existing.json')
    with open(existing, 'w') as f:
        f.write('keep me')
    probe('check --json <existing file>', attnref(*check_args(case, ok, '--json', existing)), 2, ['existing.json', '--force'])
    with open(existing) as f:
        check('existing report file kept', f.read() == 'keep me')
    probe('check --json <golden output>', attnref(*check_args(case, ok, '--json', os.path.join(case, 'output.npy'), '--force')), 2,
          ['--json', 'refused'])
    probe('check --junit <candidate>', attnref(*check_args(case, ok, '--junit', ok, '--force')), 2, ['--junit', 'input'])
    probe('check --json X --junit X', attnref(*check_args(case, ok, '--json', os.path.join(d, 'r.x'), '--junit', os.path.join(d, 'r.x'))),
          2, ['same file'])
    check('golden case untouched', before == {f: sha(os.path.join(case, f)) for f in os.listdir(case)})
    check('candidate untouched', np.load(ok).dtype == np.float32)
    rc = attnref(*check_args(case, ok, '--json', existing, '--force'))
    probe('check --json <existing> --force', rc, 0, one_line=False)
    with open(existing) as f:
        check('--force replaced the report', f.read() != 'keep me')
    check('no temporary files left', not [f for f in os.listdir(d) if '.tmp-' in f])
    # --force with fewer outputs: a case regenerated without weights keeps no stale weights.npy.
    out = fresh('lost_force')
    base = ('generate', '--name', 'few', '--sq', '2', '--dk', '2', '--out', out, '--quiet')
    probe('generate a case with weights', attnref(*base), 0, one_line=False)
    had = os.path.exists(os.path.join(out, 'few', 'weights.npy'))
    probe('regenerate it --force --no-weights', attnref(*base, '--force', '--no-weights'), 0, one_line=False)
    check('no stale weights.npy after --force with fewer outputs', had and not os.path.exists(os.path.join(out, 'few', 'weights.npy')))
    # run: a weights.npy from an earlier run is not left next to a case that stores none.
    r = os.path.join(out, 'run')
    probe('run a case with weights', attnref('run', '--golden', case, '--arith', 'float32', '--out', r), 0, one_line=False)
    probe('run a case without weights into the same --out',
          attnref('run', '--golden', os.path.join(out, 'few'), '--arith', 'float32', '--out', r), 0, one_line=False)
    check('no stale weights.npy after run', not os.path.exists(os.path.join(r, 'weights.npy')))


def shell():
    d = fresh('shell')
    marker = os.path.join(d, 'MARKER')
    out = os.path.join(d, "a'$(touch " + marker + ");'b;touch " + marker + "2")
    script = os.path.join(d, 'plot.py')
    with open(script, 'w') as f:
        f.write('import sys, os\nopen(os.path.join(sys.argv[2], "argv.txt"), "w").write("\\n".join(sys.argv[1:]))\n')
    rc = attnref('study', '--out', out, '--policy', 'float32', '--seq', '4', '--head-dim', '2', '--seeds', '1', '--queries', '1',
                 '--plot-script', script)
    probe('study --out with \' $( ) ;', rc, 0, one_line=False)
    check('no shell ran (no marker file)', not os.path.exists(marker) and not os.path.exists(marker + '2'))
    argv_file = os.path.join(out, 'argv.txt')
    check('the plot script got the path verbatim', os.path.exists(argv_file) and open(argv_file).read().split('\n')[-1] == out)


def hang():
    d = fresh('hang')
    case = copy_case('sdpa_basic', d)
    ok = candidate(case, d)
    os.remove(os.path.join(case, 'weights.npy'))
    os.mkfifo(os.path.join(case, 'weights.npy'))
    probe('golden tensor FIFO', attnref(*check_args(case, ok)), 2, ['weights.npy', 'not a regular file'])
    zero = copy_case('sdpa_basic', fresh('hang_zero'))
    os.remove(os.path.join(zero, 'weights.npy'))
    os.symlink('/dev/zero', os.path.join(zero, 'weights.npy'))
    probe('golden tensor symlink to /dev/zero', attnref(*check_args(zero, ok)), 2, ['weights.npy', 'outside'], ['[0-9a-f]{64}'])
    probe('run with a /dev/zero golden tensor', attnref('run', '--golden', zero, '--arith', 'float32', '--out', os.path.join(d, 'r')), 2,
          ['weights.npy'], ['[0-9a-f]{64}'])
    # A symlink to a copy of the right file outside the case: refused, and its hash not printed.
    away = copy_case('sdpa_basic', fresh('hang_away'))
    outside = os.path.abspath(os.path.join(d, 'outside_weights.npy'))
    shutil.copy(os.path.join(away, 'weights.npy'), outside)
    with open(outside, 'ab') as f:
        f.write(b'secret')
    os.remove(os.path.join(away, 'weights.npy'))
    os.symlink(outside, os.path.join(away, 'weights.npy'))
    probe('golden tensor symlink leaving the case', attnref(*check_args(away, ok)), 2, ['weights.npy', 'outside'], ['[0-9a-f]{64}'])
    # A symlink that stays inside the case is fine.
    inside = copy_case('sdpa_basic', fresh('hang_inside'))
    os.rename(os.path.join(inside, 'weights.npy'), os.path.join(inside, 'real_weights.npy'))
    os.symlink('real_weights.npy', os.path.join(inside, 'weights.npy'))
    probe('golden tensor symlink inside the case (accepted)', attnref(*check_args(inside, ok)), 0, one_line=False)


def strict():
    d = fresh('strict')
    ok = candidate(os.path.join(GOLDEN, 'sdpa_basic'), d)

    def variant(name, edit, must, text_edit=None):
        case = copy_case('sdpa_basic', fresh('strict_' + name))
        m = manifest(case)
        if edit:
            edit(case, m)
        text = json.dumps(m, indent=2)
        if text_edit:
            text = text_edit(text)
        write_manifest(case, m, text)
        probe(name, attnref(*check_args(case, ok)), 2, must)

    variant('duplicate JSON key', None, ['manifest.json', 'duplicate key'],
            lambda t: t.replace('"schema_version": 2,', '"schema_version": 2, "schema_version": 2,', 1))
    variant('duplicate nested key', None, ['manifest.json', "shapes.batch", 'duplicate'],
            lambda t: re.sub(r'"batch": (\d+),', r'"batch": \1, "batch": \1,', t, count=1))

    def dup_role(case, m):
        e = dict(entry(m, 'weights'))
        e['file'] = 'weights2.npy'
        shutil.copy(os.path.join(case, 'weights.npy'), os.path.join(case, 'weights2.npy'))
        m['tensors'].append(e)
    variant('duplicate role', dup_role, ['manifest.json', 'listed twice'])
    variant('dtype "garbage"', lambda c, m: entry(m, 'query').update(dtype='garbage'), ['manifest.json', r'tensors\[0\]\.dtype'])
    variant('shape not the case\'s', lambda c, m: entry(m, 'lse').update(shape=[1]), ['manifest.json', 'shape'])
    variant('unknown role', lambda c, m: entry(m, 'lse').update(role='lse2'), ['manifest.json', 'no tensor with role'])
    variant('missing role', lambda c, m: m['tensors'].remove(entry(m, 'lse')), ['manifest.json', "no tensor with role 'lse'"])
    variant('NUL inside a file name', lambda c, m: entry(m, 'lse').update(file='lse\u0000.npy'), ['manifest.json', r'\.file'])
    variant('bytes after a NUL at the end', None, ['manifest.json', 'NUL'], lambda t: t + '\n\u0000{"garbage": 1}')

    # A golden output stored as '<i4' (sha256 and dtype updated): the golden file is blamed.
    i4 = copy_case('sdpa_basic', fresh('strict_i4'))
    out = np.load(os.path.join(i4, 'output.npy'))
    np.save(os.path.join(i4, 'output.npy'), np.zeros(out.shape, dtype='<i4'))
    m = manifest(i4)
    entry(m, 'output').update(dtype='<i4', sha256=sha(os.path.join(i4, 'output.npy')))
    write_manifest(i4, m)
    probe("golden output '<i4' (manifest says so)", attnref(*check_args(i4, ok)), 2, ['manifest.json', 'dtype'])
    entry(m, 'output').update(dtype='<f8')
    write_manifest(i4, m)
    probe("golden output '<i4' (manifest says '<f8')", attnref(*check_args(i4, ok)), 2, ['output.npy', 'descr'])
    # A 1-element weights.npy with a matching sha256: refused (was read out of bounds, PASS).
    one = copy_case('sdpa_basic', fresh('strict_one'))
    np.save(os.path.join(one, 'weights.npy'), np.zeros((1,), dtype='<f8'))
    m = manifest(one)
    entry(m, 'weights').update(sha256=sha(os.path.join(one, 'weights.npy')))
    write_manifest(one, m)
    probe('1-element golden weights, sha256 matching', attnref(*check_args(one, ok)), 2, ['weights.npy', 'shape'])
    entry(m, 'weights').update(shape=[1])
    write_manifest(one, m)
    probe('1-element golden weights, manifest shape [1]', attnref(*check_args(one, ok)), 2, ['manifest.json', 'shape'])


def flags():
    d = fresh('flags')
    gen = ('generate', '--name', 'x', '--out', d)
    probe('--scale nan', attnref(*gen, '--scale', 'nan'), 2, ['--scale'])
    probe('--scale inf', attnref(*gen, '--scale', 'inf'), 2, ['--scale'])
    probe('--softcap -inf', attnref(*gen, '--softcap', '-inf'), 2, ['--softcap'])
    probe('--window-left -1', attnref(*gen, '--window-left', '-1'), 2, ['--window-left'])
    probe('--sq -1', attnref(*gen, '--sq', '-1'), 2, ['--sq'])
    probe('--heads -2', attnref(*gen, '--heads', '-2'), 2, ['--heads'])
    probe('--key-lengths 3,-1', attnref(*gen, '--key-lengths', '3,-1', '--batch', '2'), 2, ['--key-lengths'])
    probe('run --block -1', attnref('run', '--golden', os.path.join(GOLDEN, 'sdpa_basic'), '--arith', 'float32', '--out', d,
                                    '--block', '-1'), 2, ['--block'])
    check('nothing written by refused flags', not os.path.exists(os.path.join(d, 'x')))


def concurrent():
    d = fresh('concurrent')
    # Two generate runs of the same name with different seeds, started together: one publishes,
    # the other must report CONFLICT (exit 2), never silently replace it. Repeated for timing.
    for trial in range(3):
        out = os.path.join(d, f't{trial}')
        args = [[ATTNREF, 'generate', '--name', 'race', '--sq', '4', '--dk', '2', '--seed', str(s), '--out', out, '--quiet']
                for s in (1, 2)]
        procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for a in args]
        rcs = [p.wait(timeout=TIMEOUT) for p in procs]
        errs = [p.stderr.read().decode() for p in procs]
        seed = manifest(os.path.join(out, 'race'))['inputs']['seed']
        winner = rcs.index(0) if 0 in rcs else None
        check(f'trial {trial}: one written, one CONFLICT', sorted(rcs) == [0, 2] and 'use --force' in errs[1 - winner]
              and seed == (1, 2)[winner], f'rcs {rcs}')
        # Same content twice: both succeed (written / unchanged).
        same = [[ATTNREF, 'generate', '--name', 'twin', '--sq', '4', '--dk', '2', '--out', out, '--quiet']] * 2
        procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for a in same]
        check(f'trial {trial}: identical concurrent runs both succeed', [p.wait(timeout=TIMEOUT) for p in procs] == [0, 0])


def exits():
    d = fresh('exits')
    case = os.path.join(GOLDEN, 'sdpa_basic')
    bad = candidate(case, d, 'bad.npy', 1.01)
    ok = candidate(case, d)
    # A report in a missing directory is refused before the check runs (exit 2, said once); one that
    # cannot be written after it ran (/proc/self takes no new files, even for root) keeps the verdict.
    probe('failing candidate, --json in a missing directory', attnref(*check_args(case, bad, '--json', os.path.join(d, 'no', 'such', 'dir', 'r.json'))),
          2, ['--json', 'does not exist'], ['check failed'])
    rc = attnref(*check_args(case, bad, '--json', '/proc/self/r.json'))
    probe('failing candidate, unwritable --json', rc, 1, ['r.json', 'check failed'], one_line=False)
    check('both facts on stderr, one line each', len(rc[2].strip().split('\n')) == 2, repr(rc[2]))
    probe('passing candidate, unwritable --json: said once', attnref(*check_args(case, ok, '--json', '/proc/self/r.json')), 2, ['r.json'])
    probe('unknown subcommand', attnref('frobnicate'), 2, ["unknown subcommand 'frobnicate'"])
    nl = os.path.join(d, 'a\nb.npy')
    probe('newline in a path', attnref(*check_args(case, nl)), 2, [r'a\\nb\.npy'])
    esc = os.path.join(d, 'c\x1b[31md.npy')
    probe('escape sequence in a path', attnref(*check_args(case, esc)), 2, [r'c\\x1b\[31md\.npy'])
    # SIGPIPE: stdout is a pipe nobody reads (closed before attnref writes, as `| head -c0`, or
    # `| head -c1` once head has its byte); the reports must still be written, exit 0. The child
    # gets SIGPIPE's default action (subprocess restores it), as under a shell.
    j, x = os.path.join(d, 'pipe.json'), os.path.join(d, 'pipe.xml')
    r, w = os.pipe()
    os.close(r)
    p = subprocess.Popen([ATTNREF, *check_args(case, ok, '--json', j, '--junit', x)], stdout=w, stderr=subprocess.PIPE,
                         preexec_fn=limit)
    os.close(w)
    rc_pipe = p.wait(timeout=TIMEOUT)
    check('check | head -c1: reports written, exit 0', rc_pipe == 0 and os.path.exists(j) and os.path.exists(x), f'rc {rc_pipe}')


def cli():
    """Command-line and study surfaces: every malformed value is exit 2 naming the flag or JSON field;
    study writes through no planted link and shows an infinite bound as vacuous."""
    d = fresh('cli')
    # The unknown-subcommand message lists every subcommand, merge included.
    probe('attnref merg', attnref('merg'), 2, ["unknown subcommand 'merg'", 'generate', 'list', 'run', 'check', 'study', 'merge'])
    # --shard: an empty spec (an unset $SHARD) and other malformed ones, never an unsharded run.
    for spec in ('', ' ', '1', '/3', '1/', '1/3/4', '-1/3', '3/3', '0/0', '1/x', '+1/3', '0/100001'):
        probe(f'generate --shard {spec!r}', attnref('generate', '--shard', spec, '--out', os.path.join(d, 'shard'), '--quiet'), 2,
              ['--shard'])
    check('no shard directory written', not os.path.exists(os.path.join(d, 'shard')))
    # study flags.
    st = ('study', '--out', os.path.join(d, 'st'), '--no-plot', '--policy', 'float32', '--head-dim', '2', '--seq', '4', '--seeds', '1')
    for flag, value in (('--queries', '0'), ('--seeds', '-1'), ('--seq', '-1'), ('--seq', '0'), ('--head-dim', '0'),
                        ('--block', '0'), ('--queries', '-3'), ('--threads', '-1'), ('--logit-scale', 'nan'),
                        ('--logit-scale', 'inf'), ('--logit-scale', '-inf'), ('--offset', 'nan'), ('--ramp', 'inf'),
                        ('--spread', 'nan'), ('--max-memory', '-1')):
        probe(f'study {flag} {value}', attnref(*st, flag, value), 2, [re.escape(flag)], ['max_size', 'bound was exceeded'])
    probe('study --seq 2^64', attnref(*st, '--seq', str(2**64)), 2, ['--seq'], ['max_size'])
    probe('study --seq 2^63', attnref(*st, '--seq', str(2**63)), 2, ['--seq', 'GiB', '--max-memory'], ['max_size'])
    probe('study --offset 1e308 --ramp 1e308', attnref(*st, '--offset', '1e308', '--ramp', '1e308'), 2, ['--offset'])
    # study --json: every field typed, unknown fields refused, each named.
    def study_json(name, sweeps, must, top=None):
        path = os.path.join(d, name + '.json')
        with open(path, 'w') as f:
            f.write(json.dumps(top if top is not None else {'sweeps': sweeps}))
        probe(f'study --json {name}', attnref('study', '--json', path, '--out', os.path.join(d, 'sj'), '--no-plot'), 2,
              [re.escape(name + '.json')] + must, ['max_size'])
    study_json('head_dim_fraction', [{'head_dim': [4.5]}], [r"sweeps\[0\]\.head_dim\[0\]"])
    study_json('unknown_key', [{'sequence': [4]}], [r"sweeps\[0\]\.sequence", 'unknown field'])
    study_json('negative_seq', [{'seq': [-4]}], [r"sweeps\[0\]\.seq\[0\]"])
    study_json('zero_queries', [{'queries': 0}], [r"sweeps\[0\]\.queries"])
    study_json('negative_seed', [{'seeds': [1, -1]}], [r"sweeps\[0\]\.seeds\[1\]"])
    study_json('string_seq', [{'seq': '4'}], [r"sweeps\[0\]\.seq"])
    study_json('bool_as_int', [{'backward': 1}], [r"sweeps\[0\]\.backward"])
    study_json('bad_policy', [{'policy': ['float31']}], [r"sweeps\[0\]\.policy\[0\]", 'float31'])
    study_json('top_level_key', None, ["'sweep'", 'unknown field'], top={'sweep': []})
    study_json('huge_seq', [{'seq': [2**62], 'head_dim': [4]}], ['GiB', '--max-memory'])
    # Memory up front: a backward study of n = 10^8 is refused with the estimate, and --max-memory is a study flag.
    big = ('study', '--backward', '--policy', 'float32', '--seq', '100000000', '--head-dim', '4', '--out', os.path.join(d, 'big'),
           '--no-plot')
    probe('study --backward --seq 1e8', attnref(*big), 2, ['GiB', 'above the limit of', '--max-memory'])
    probe('study --backward --seq 1e8 --max-memory 1T', attnref(*big, '--max-memory', '1T'), 2, ['GiB', 'limit of 1.02e\\+03 GiB'])
    check('nothing written by refused studies', not os.path.exists(os.path.join(d, 'big')) and not os.path.exists(os.path.join(d, 'st')))
    # study writes study.csv and table.txt (and plots) atomically: links planted in --out are replaced, their targets kept.
    out = os.path.join(d, 'links')
    os.makedirs(out)
    victim = os.path.join(d, 'victim.txt')
    with open(victim, 'w') as f:
        f.write('keep me')
    for name in ('study.csv', 'table.txt'):
        os.symlink(victim, os.path.join(out, name))
    # bf16 (unit roundoff u = 2^-8): the first-order bound's gamma_n needs n*u < 1, so it is finite at
    # n = 64 and infinite ("vacuous") at n = 256.
    rc = attnref('study', '--out', out, '--no-plot', '--policy', 'bf16', '--seq', '64', '256', '--queries', '2', '--head-dim', '4',
                 '--seeds', '1', '--threads', '1')
    probe('study into a directory with planted links', rc, 0, one_line=False)
    with open(victim) as f:
        check('link targets untouched', f.read() == 'keep me')
    check('study.csv and table.txt are regular files', all(os.path.isfile(os.path.join(out, n)) and not os.path.islink(os.path.join(out, n))
                                                          for n in ('study.csv', 'table.txt')))
    check('no temporary files left', not [n for n in os.listdir(out) if '.tmp-' in n])
    import csv as _csv
    rows = {}
    if os.path.isfile(os.path.join(out, 'study.csv')):
        with open(os.path.join(out, 'study.csv')) as f:
            rows = {int(r['seq']): r for r in _csv.DictReader(f) if r.get('seq', '').isdigit()}
    r64, r256 = rows.get(64, {}), rows.get(256, {})
    check('n = 64: finite bound, a ratio in (0, 1]', r64.get('bound_infinite') == '0' and 0 < float(r64.get('bound_ratio', 'nan')) <= 1,
          str(r64.get('bound_ratio')))
    # 2 queries x head_dim 4 output elements, one seed: every one has the infinite bound.
    check('n = 256: bound infinite for every element, ratio nan', r256.get('bound_infinite') == str(2 * 4)
          and r256.get('bound_ratio') == 'nan', str((r256.get('bound_ratio'), r256.get('bound_infinite'))))
    table = [line for line in rc[1].splitlines() if line.startswith('custom ')]
    check('table: n = 256 reads vacuous, n = 64 a number', len(table) >= 2 and table[1].split()[-1] == 'vacuous'
          and table[0].split()[-1] != 'vacuous' and float(table[0].split()[-1]) > 0, repr(table[:2]))


def peak_rss(args):
    """Runs attnref with `args`; returns (exit code, peak resident set size in bytes) from wait4."""
    p = subprocess.Popen([ATTNREF, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=limit)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_maxrss * 1024


def estimate_of(args):
    """The command's memory estimate in bytes, read from its refusal under --max-memory 1K."""
    rc, _, err = attnref(*args, '--max-memory', '1K')
    m = re.search(r'would need about ([0-9.e+-]+) GiB', err)
    return rc, (float(m.group(1)) * 2**30 if m else None), err


def estimates():
    """Memory estimates against measured peaks: generate's is the chosen path's (the fast path's working
    set and its escalation, not 256 bytes per value of the MPFI ladder), run's the arithmetic's; each
    at least the peak resident size measured here, on cases small enough to take a second."""
    d = fresh('estimates')
    cases = [('sdpa 1024x1024', ('--name', 's', '--sq', '1024', '--dk', '32')),
             ('mha (1, 256, 128, 4)', ('--name', 'm', '--kind', 'mha', '--sq', '256', '--heads', '4', '--dk', '32')),
             ('sdpa softcap (MPFI whole case)', ('--name', 'c', '--sq', '64', '--dk', '8', '--softcap', '5'))]
    for name, flags in cases:
        gen = ('generate', *flags, '--out', d, '--quiet', '--threads', '2')
        rc, est, err = estimate_of(gen)
        check(f'generate {name}: refused under 1K with the estimate', rc == 2 and est is not None, err.strip()[:200])
        rc, peak = peak_rss(gen)
        check(f'generate {name}: estimate {est} >= peak {peak}', rc == 0 and est is not None and est >= peak)
    # The mha case's estimate is far below the MPFI ladder's 256 bytes per value, which counted
    # (3*256*128 + 4*128*128 inputs + 4*256*128 outputs + 4*4*256*256 weights + 2*4*256 lse) values,
    # 344 MB: 128 MiB is enough now.
    mpfi_values = 3 * 256 * 128 + 4 * 128 * 128 + 4 * 256 * 128 + 4 * 4 * 256 * 256 + 2 * 4 * 256
    check('the MPFI-ladder estimate of the mha case exceeds 128 MiB', 256 * mpfi_values > 128 * 2**20)
    probe('generate the mha case under --max-memory 128M', attnref('generate', *cases[1][1], '--out', os.path.join(d, 'm128'),
                                                                  '--quiet', '--max-memory', '128M'), 0, one_line=False)
    rc, est, _ = estimate_of(('generate', *cases[1][1], '--out', d, '--method', 'mpfi'))
    check('--method mpfi keeps the MPFI estimate (256 bytes per value)', est is not None and est >= 256 * mpfi_values * 0.99, str(est))
    for arith in ('float32', 'float128'):
        run = ('run', '--golden', os.path.join(d, 'm'), '--arith', arith, '--out', os.path.join(d, 'r_' + arith))
        rc, est, err = estimate_of(run)
        check(f'run --arith {arith}: refused under 1K with the estimate', rc == 2 and est is not None, err.strip()[:200])
        rc, peak = peak_rss(run)
        check(f'run --arith {arith}: estimate {est} >= peak {peak}', rc == 0 and est is not None and est >= peak)
    # check's own estimate (golden/memory.hpp's check_memory_estimate): the candidate's tensors, their
    # bounds and, with weights or lse, the recomputed logits and weights; before, check used only the
    # case-load estimate, which fell below the measured peak with --weights --lse.
    r32 = os.path.join(d, 'r_float32')
    for label, extra in (('output', ()), ('output, weights and lse', ('--weights', os.path.join(r32, 'weights.npy'),
                                                                      '--lse', os.path.join(r32, 'lse.npy')))):
        chk = ('check', '--golden', os.path.join(d, 'm'), '--output', os.path.join(r32, 'output.npy'), *extra)
        rc, est, err = estimate_of(chk)
        check(f'check ({label}): refused under 1K with the estimate', rc == 2 and est is not None, err.strip()[:200])
        rc, peak = peak_rss(chk)
        check(f'check ({label}): estimate {est} >= peak {peak}', rc == 0 and est is not None and est >= peak)
    # A declared policy's bound of a multi-head output holds V·W_o per (batch, head, key) and σ_P per
    # output (up to 2^22 values, 8 bytes each): the estimate counts them (before, it was the same as undeclared).
    chk = ('check', '--golden', os.path.join(d, 'm'), '--output', os.path.join(r32, 'output.npy'))
    _, plain, _ = estimate_of(chk)
    rc, est, err = estimate_of(chk + ('--policy', 'float32', '--input-format', 'case'))
    check(f'check --policy: estimate {est} >= {plain} + 32 MiB', rc == 2 and est is not None and plain is not None and
          est >= plain + 8 * 2**22, err.strip()[:200])
    rc, peak = peak_rss(chk + ('--policy', 'float32', '--input-format', 'case'))
    check(f'check --policy: estimate {est} >= peak {peak}', rc == 0 and est is not None and est >= peak)


def promises():
    """Promises each path keeps: --verify compares the FP8 files, every flag is honoured or refused,
    the diagonal can be set without a causal mask, and messages say what happened (docs/hostile.md)."""
    d = fresh('promises')
    case = os.path.join(GOLDEN, 'sdpa_basic')
    # generate --input-format fp8e4m3: --verify compares fp8/<role>.npy and fp8.json too.
    out = os.path.join(d, 'fp8')
    gen = ('generate', '--golden', case, '--input-format', 'fp8e4m3', '--out', out, '--quiet')
    rc, so, err = attnref(*gen)
    check('generate --input-format fp8e4m3 writes the derived case', rc == 0, err.strip()[:200])
    derived = os.path.join(out, 'sdpa_basic_inputs_fp8e4m3')
    fp8 = os.path.join(derived, 'fp8')
    rc, so, err = attnref(*gen, '--verify')
    check('--verify: the untouched FP8 files are identical', rc == 0, err.strip()[:200])
    pristine = {f: open(os.path.join(fp8, f), 'rb').read() for f in os.listdir(fp8)}

    def restore():
        shutil.rmtree(fp8)
        os.makedirs(fp8)
        for f, b in pristine.items():
            with open(os.path.join(fp8, f), 'wb') as h:
                h.write(b)

    def flip(path):
        b = bytearray(open(path, 'rb').read())
        b[-1] ^= 1
        open(path, 'wb').write(bytes(b))

    def descale(value):
        def edit():
            j = json.loads(pristine['fp8.json'])
            j['tensors'][0]['descale'] = value
            open(os.path.join(fp8, 'fp8.json'), 'w').write(json.dumps(j, indent=2) + '\n')
        return edit
    mutations = [('a flipped bit of query.npy', lambda: flip(os.path.join(fp8, 'query.npy')), 'fp8/query.npy differs'),
                 ('key.npy deleted', lambda: os.remove(os.path.join(fp8, 'key.npy')), 'fp8/key.npy is missing'),
                 ('fp8.json garbage', lambda: open(os.path.join(fp8, 'fp8.json'), 'w').write('{garbage'), 'fp8/fp8.json differs')]
    mutations += [(f'a descale of {v}', descale(v), 'fp8/fp8.json differs') for v in ('NaN', 0, 'Infinity')]
    mutations.append(('a descale x2', descale(2 * json.loads(pristine['fp8.json'])['tensors'][0]['descale']), 'fp8/fp8.json differs'))
    for name, mutate, says in mutations:
        restore()
        mutate()
        before = {f: sha(os.path.join(fp8, f)) for f in os.listdir(fp8)}
        rc, so, err = attnref(*gen[:-1], '--verify')
        check(f'--verify after {name}: DIFFERS, exit 1', rc == 1 and 'DIFFERS' in so + err and says in so + err, (so + err).strip()[-200:])
        rc, so, err = attnref(*gen)
        after = {f: sha(os.path.join(fp8, f)) for f in os.listdir(fp8)}
        check(f'rerun without --force after {name}: a conflict, files untouched', rc == 2 and before == after and says in err,
              err.strip()[:200])
    restore()
    # generate --quiet: nothing on stdout.
    rc, so, err = attnref('generate', '--golden', case, '--verify', '--quiet')
    check('generate --quiet prints no table', rc == 0 and so == '' and err == '', repr((so + err)[:120]))
    # --diagonal: a bottom-right window without a causal mask; with --causal, one alignment.
    adhoc = ('generate', '--name', 'win', '--kind', 'sdpa', '--sq', '2', '--sk', '5', '--dk', '2', '--window-left', '0',
             '--window-right', '0', '--quiet')
    rc, so, err = attnref(*adhoc, '--diagonal', 'bottom_right', '--out', os.path.join(d, 'diag'))
    mf = os.path.join(d, 'diag', 'win', 'manifest.json')
    conv = json.load(open(mf))['conventions'] if rc == 0 and os.path.exists(mf) else {}
    check('generate --diagonal bottom_right: a bottom-right window, no causal mask', rc == 0 and
          json.dumps(conv).count('bottom_right') == 1 and not conv.get('causal', False), err.strip()[:200] + json.dumps(conv)[:300])
    if rc == 0:
        w = np.load(os.path.join(d, 'diag', 'win', 'weights.npy'))[0, 0]
        check('bottom-right window: query i sees key i + Sk - Sq only', all((w[i] > 0).tolist() == [j == i + 3 for j in range(5)] for i in range(2)),
              str(w))
    probe('generate --causal top_left --diagonal bottom_right', attnref(*adhoc, '--causal', 'top_left', '--diagonal', 'bottom_right',
                                                                      '--out', os.path.join(d, 'diag2')), 2, ['--diagonal', '--causal'])
    probe('generate --diagonal sideways', attnref(*adhoc, '--diagonal', 'sideways', '--out', os.path.join(d, 'diag3')), 2, ['--diagonal'])
    # study: an empty --out or --reproduce, and flags a reproduction would ignore.
    probe("study --out ''", attnref('study', '--out', ''), 2, ['--out'])
    probe("study --reproduce ''", attnref('study', '--reproduce', '', '--out', os.path.join(d, 'st')), 2, ['--reproduce'])
    probe('study --reduced without --reproduce', attnref('study', '--reduced', '--out', os.path.join(d, 'st')), 2, ['--reduced'])
    for flag, value in (('--seq', '4'), ('--max-memory', '1G'), ('--json', os.path.join(d, 'x.json'))):
        probe(f'study --reproduce pcast-fp8 {flag}', attnref('study', '--reproduce', 'pcast-fp8', '--out', os.path.join(d, 'st'), flag, value),
              2, [re.escape(flag), '--reproduce'])
    probe('study --reproduce pcast-fp8 --backward', attnref('study', '--reproduce', 'pcast-fp8', '--out', os.path.join(d, 'st'), '--backward'),
          2, ['--backward', '--reproduce'])
    check('no study directory written by a refused study', not os.path.exists(os.path.join(d, 'st')))
    # check: empty flags, report paths checked before the check, policies no file can match.
    ok = candidate(case, d)
    probe("check --policy ''", attnref(*check_args(case, ok, '--policy', '')), 2, ['--policy', 'empty'])
    probe("check --golden ''", attnref('check', '--golden', '', '--output', ok), 2, ['--golden', 'empty'])
    for flag in ('--json', '--junit'):
        probe(f'check {flag} in a missing directory', attnref(*check_args(case, ok, flag, os.path.join(d, 'no', 'such', 'r.json'))), 2,
              [re.escape(flag), 'does not exist'])
    f64 = os.path.join(d, 'f64.npy')
    np.save(f64, np.load(os.path.join(case, 'output.npy')))
    for pol in ('longdouble', 'float128', 'bin50'):
        probe(f'check --policy {pol}', attnref(*check_args(case, f64, '--policy', pol)), 2, ['--policy', 'finer than float64'])
    # A finite input whose FP8 code·descale overflows float64 (DBL_MAX): bad input, exit 2 at once.
    src = os.path.join(d, 'dblmax_inputs')
    os.makedirs(src)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 2, 2))
    q[0, 0, 0, 1] = np.finfo(np.float64).max
    for role, a in (('query', q), ('key', rng.standard_normal((1, 1, 3, 2)) * 1e-300), ('value', rng.standard_normal((1, 1, 3, 2)))):
        np.save(os.path.join(src, role + '.npy'), a)
    rc, so, err = attnref('generate', '--name', 'dblmax', '--kind', 'sdpa', '--inputs-from', src, '--out', d, '--quiet')
    check('a case with a DBL_MAX query certifies', rc == 0, err.strip()[:200])
    big = os.path.join(d, 'dblmax')
    for f8 in ('fp8e4m3', 'fp8e5m2'):
        probe(f'generate --input-format {f8} on a DBL_MAX query', attnref('generate', '--golden', big, '--input-format', f8, '--out',
                                                                       os.path.join(d, 'dblmax_' + f8), '--quiet'), 2,
              ['--input-format', r'query \(flat index 1\)', 'overflows float64'])
        probe(f'check --input-format {f8} on a DBL_MAX query', attnref(*check_args(big, os.path.join(big, 'output.npy'), '--input-format', f8)),
              2, ['--input-format', r'query \(flat index 1\)', 'overflows float64'])
    nan = os.path.join(d, 'nan.npy')
    o = np.load(os.path.join(case, 'output.npy')).astype(np.float32)
    o.flat[3] = np.nan
    np.save(nan, o)
    rc, so, err = attnref(*check_args(case, nan))
    check('check: a NaN where the reference is finite says so', rc == 1 and 'NaN where the reference is finite' in so and 'index 3' in so,
          so[-300:])


CATEGORIES = {'memory': memory, 'deep': deep, 'sizes': sizes, 'lost': lost, 'shell': shell, 'hang': hang, 'strict': strict,
              'flags': flags, 'concurrent': concurrent, 'exits': exits, 'cli': cli, 'estimates': estimates,
              'promises': promises}

if __name__ == '__main__':
    os.makedirs(WORK, exist_ok=True)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    CATEGORIES[CATEGORY]()
    print(f'{CATEGORY}: {count} probes, ' + ('all as expected' if not failures else f'{len(failures)} FAILED: {failures}'))
    sys.exit(1 if failures else 0)
