"""The speed and memory benchmarks: `keras-posenc bench`, not timed tests.

They need the `bench` extra (keras-hub, the baseline). Each module also runs
alone: `python -m keras_posenc_lab.bench.attention --help`.
"""
