#!/usr/bin/python3
"""Regenerates the seed corpus fuzz/corpus/npy/: small valid .npy files written by numpy (every
supported dtype, a scalar, a zero-size array, versions 2.0 and 3.0) and invalid variants of them
(truncated, trailing bytes, big-endian, Fortran order, bad magic, missing key, negative shape,
lying header length). Deterministic: rerunning it rewrites the same bytes for a given numpy.

Run with an interpreter that has numpy:  /usr/bin/python3 fuzz/make_corpus.py
"""
import io
import os
import struct

import numpy as np
from numpy.lib import format as npformat

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus', 'npy')


def saved(array, version=None):
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        npformat.write_array(buffer, array, version=version)
    return buffer.getvalue()


def v1(header, data=b''):
    """A version 1.0 file from a header dict (padded to 64 bytes, '\\n'-terminated) and data."""
    header = header.encode('latin1')
    header += b' ' * ((64 - (10 + len(header) + 1) % 64) % 64) + b'\n'
    return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(header)) + header + data


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    f8 = np.arange(6, dtype='<f8').reshape(2, 3) / 4
    valid = {
        'valid_f8_2x3': saved(f8),
        'valid_f4': saved(np.array([1.5, -0.0, np.inf], dtype='<f4')),
        'valid_f2': saved(np.array([0, 1, 65504, 6e-8, np.nan], dtype='<f2')),
        'valid_b1_mask': saved(np.tril(np.ones((3, 3), dtype=bool))),
        'valid_u1': saved(np.arange(5, dtype='u1')),
        'valid_i4': saved(np.array([-3, 7], dtype='<i4')),
        'valid_i8_scalar': saved(np.array(-2**40, dtype='<i8')),
        'valid_u2_empty': saved(np.zeros((0, 4), dtype='<u2')),
        'valid_v2_i1': saved(np.arange(-2, 2, dtype='i1'), version=(2, 0)),
        'valid_v3_f8': saved(f8[:1], version=(3, 0)),
    }
    good = valid['valid_f8_2x3']
    invalid = {
        'invalid_truncated': good[:-5],
        'invalid_trailing': good + b'\0' * 8,
        'invalid_big_endian': saved(f8.astype('>f8')),
        'invalid_fortran': saved(np.asfortranarray(f8)),
        'invalid_magic': b'\x93NUMPZ' + good[6:],
        'invalid_missing_key': v1("{'descr': '<f8', 'shape': (2,), }", b'\0' * 16),
        'invalid_negative_shape': v1("{'descr': '<f8', 'fortran_order': False, 'shape': (3, -1), }"),
        'invalid_header_length': good[:8] + struct.pack('<H', 4000) + good[10:],
        'invalid_bool_byte': v1("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", b'\x01\x05'),
    }
    for name, data in {**valid, **invalid}.items():
        with open(os.path.join(OUT, name + '.npy'), 'wb') as f:
            f.write(data)
    print(f'{len(valid) + len(invalid)} files in {OUT}')


if __name__ == '__main__':
    main()
