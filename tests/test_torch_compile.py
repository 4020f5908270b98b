"""PyTorch's compiler traces the attention whole: no break on a value.

`torch.compile` splits a function into graphs where it cannot trace
(a test of a tensor's value on the host, a NumPy array made a tensor, a
`warnings.catch_warnings`). Each scheme's attention breaks no more often
than Keras' own `MultiHeadAttention`, counted by `torch._dynamo.explain` on
the CPU (tracing alone, nothing compiled).
"""

import warnings

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import PositionalMultiHeadAttention

pytestmark = pytest.mark.torch_only

HEADS = 4
SCHEMES = {
    "rotary": lambda: keras_posenc.RotaryEmbedding(),
    "alibi": lambda: keras_posenc.AlibiBias(HEADS),
    "t5": lambda: keras_posenc.RelativePositionBias(HEADS),
    "fire": lambda: keras_posenc.FireBias(HEADS),
    "cope": lambda: keras_posenc.ContextualPosition(4),
}


def breaks(layer):
    """The graph breaks of one causal self-attention call, and their reasons."""
    import torch

    tokens = torch.tensor(
        np.random.default_rng(0).normal(size=(2, 64, 32)).astype("float32")
    )
    layer(tokens, tokens, use_causal_mask=True)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        # The tracer's own notes on what it steps around in Keras.
        warnings.simplefilter("ignore")
        explained = torch._dynamo.explain(
            lambda x: layer(x, x, use_causal_mask=True)
        )(tokens)
    return explained.graph_break_count, [
        reason.reason.splitlines()[0] for reason in explained.break_reasons
    ]


@pytest.fixture(scope="module")
def keras_breaks():
    return breaks(keras.layers.MultiHeadAttention(HEADS, 8))[0]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_more_graph_breaks_than_keras_attention(scheme, keras_breaks):
    count, reasons = breaks(
        PositionalMultiHeadAttention(HEADS, 8, position=SCHEMES[scheme]())
    )
    assert count <= keras_breaks, reasons
    # Never on a value: no data-dependent branch, no `.item()`.
    assert not [reason for reason in reasons if "data-dependent" in reason or "item" in reason]
