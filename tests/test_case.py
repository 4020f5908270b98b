"""The one place that imports Keras' private layer test harness.

`keras.src.testing.TestCase.run_layer_test` checks a layer the way Keras
checks its own: config round trip, serialization, symbolic and eager calls,
a training step, mixed precision. It is private to Keras, so the test extra
pins the Keras minor version it was written against.
"""

from keras.src.testing import TestCase

__all__ = ["TestCase"]
