"""The lab on top of keras_posenc: the `keras-posenc` command, its demo and benchmarks.

The command (`cli`) parses its arguments before it imports Keras or the
layers, so `--help` and `--version` answer at once: this package is apart
from `keras_posenc`, whose import registers the layers with Keras. Its
parts: `runner` runs the demo's tasks, one module per task (`language`,
`vision`, `graph`) with what they share in `training`, their settings in
`config`, the encodings they train in one registry (`encodings`), and the
speed and memory benchmarks in `bench`. No layer imports any of it.
"""

import importlib.metadata

__version__ = importlib.metadata.version("keras-posenc")
