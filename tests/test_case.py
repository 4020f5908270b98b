"""The one place that imports Keras' private layer test harness.

`keras.src.testing.TestCase.run_layer_test` checks a layer the way Keras
checks its own: config round trip, serialization, symbolic and eager calls,
a training step, mixed precision. It is private to Keras; it runs at both
ends of the Keras range in setup.cfg (`make test` at the newest,
`make test-oldest` at the floor), which is what keeps it usable here.
"""

import warnings

from keras.src import testing


class TestCase(testing.TestCase):
    def run_layer_test(self, *args, **kwargs):
        with warnings.catch_warnings():
            # The harness's training step fits on a generator with Keras'
            # default shuffle=True, which Keras warns it cannot honour.
            warnings.filterwarnings(
                "ignore", message="`shuffle=True` was passed", category=UserWarning
            )
            # Its fit step on a layer without weights (the sinusoidal one)
            # still runs forward and computes the loss; Keras warns there is
            # nothing to update.
            warnings.filterwarnings(
                "ignore",
                message="The model does not have any trainable weights",
                category=UserWarning,
            )
            return super().run_layer_test(*args, **kwargs)


__all__ = ["TestCase"]
