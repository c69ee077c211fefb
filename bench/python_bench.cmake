# The Python benchmark: not a test; run it by hand (see docs/python.md):
#   PYTHONPATH=build/default/python /usr/bin/python3 bench/python_sdpa.bench.py
