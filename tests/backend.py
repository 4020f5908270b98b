"""What the tests need of the backend they run on, in one place.

The backend comes from `KERAS_BACKEND` (TensorFlow by default, as
`tests/conftest.py` sets it). Tests that only TensorFlow can run by their
nature (SavedModel, TFLite, `tf.distribute`, HLO dumps, graph-mode errors)
carry `@tensorflow_only`; on the other backends they are deselected.
"""

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()

tensorflow_only = pytest.mark.tensorflow_only

# The error a check raises when its condition fails at run time: in a
# TensorFlow graph `InvalidArgumentError`, elsewhere (eager) `ValueError`.
if BACKEND == "tensorflow":
    import tensorflow as tf

    RUN_TIME_ERRORS = (ValueError, tf.errors.InvalidArgumentError)
else:
    RUN_TIME_ERRORS = (ValueError,)


def compiled(function):
    """`function` compiled by XLA where the backend has it.

    TensorFlow: `tf.function(jit_compile=True)`; JAX: `jax.jit`; PyTorch
    runs it eagerly (its compiler is not XLA, and slow to start).
    """
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True)
    if BACKEND == "jax":
        import jax

        return jax.jit(function)
    return function


def gradients(function, *arguments):
    """The gradients of the sum of `function(*arguments)` by each argument.

    Returns NumPy arrays, one per argument (`gradient_function`, run here).
    """
    arguments = [keras.ops.convert_to_tensor(a, "float32") for a in arguments]
    return [numpy(g) for g in gradient_function(function)(*arguments)]


def numpy(value):
    """A tensor of any backend as a NumPy array."""
    return keras.ops.convert_to_numpy(value)


def graph_function(function, input_signature=None, jit_compile=True):
    """`function` traced once into a program, as `tf.function` traces it.

    TensorFlow: `tf.function(function, input_signature=..., jit_compile=...)`,
    each `(shape, dtype)` of `input_signature` a `tf.TensorSpec`: a `None`
    size stays unknown in the graph (the dynamic shapes of a TensorFlow
    model), and `jit_compile=False` runs the graph without XLA. JAX: `jax.jit`
    (every size known, traced again for each shape), or eager without
    `jit_compile`. PyTorch runs it eagerly.
    """
    if BACKEND == "tensorflow":
        import tensorflow as tf

        if input_signature is not None:
            input_signature = [
                tf.TensorSpec(shape, dtype) for shape, dtype in input_signature
            ]
        return tf.function(
            function, input_signature=input_signature, jit_compile=jit_compile
        )
    if BACKEND == "jax" and jit_compile:
        import jax

        return jax.jit(function)
    return function


def keras_mask(tensor):
    """The Keras mask a layer left on `tensor` (None if none), as NumPy.

    TensorFlow and PyTorch tensors carry it as `_keras_mask`; JAX arrays take
    no attributes, so Keras keeps theirs in a table, which its private
    `get_keras_mask` reads (in Keras from 3.8 on).
    """
    from keras.src.backend.common.masking import get_keras_mask

    mask = get_keras_mask(tensor)
    return None if mask is None else numpy(mask)


def gradient_function(function):
    """A function of `function`'s arguments giving the gradients of its sum.

    The gradients by each argument, as tensors of the backend: unlike
    `gradients`, it can run inside `compiled`, so that the gradients
    themselves are compiled (XLA on TensorFlow and JAX).
    """
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def found(*arguments):
            with tf.GradientTape() as tape:
                tape.watch(arguments)
                total = tf.reduce_sum(function(*arguments))
            return tape.gradient(total, arguments)

        return found
    if BACKEND == "jax":
        import jax

        def found(*arguments):
            return jax.grad(
                lambda *a: jax.numpy.sum(function(*a)),
                argnums=tuple(range(len(arguments))),
            )(*arguments)

        return found
    import torch

    def found(*arguments):
        arguments = [a.detach().requires_grad_(True) for a in arguments]
        return torch.autograd.grad(torch.sum(function(*arguments)), arguments)

    return found


# Whether `jit_compile=True` means XLA: on TensorFlow and JAX; PyTorch's
# compiler is not XLA (and `model.compile(jit_compile=True)` there is
# `torch.compile`), so tests of XLA compile there without it.
XLA = BACKEND != "torch"

