"""Bad inputs, and what each layer makes of them: eager, in a graph, under XLA.

Each case calls a layer on one bad argument or input value and says what
came of it:

- clear: a `ValueError` (or TensorFlow's `InvalidArgumentError`, or a
  `UserWarning` where transformers only warns) whose message names the
  argument;
- cryptic: any other exception;
- shows: NaN in the output (all that compiled code, which cannot raise,
  can do);
- silently wrong: a finite output;
- empty: an output with no entries (right for a graph of no nodes);
- works: a finite output where the input is one the layer takes as it is
  (a user's bias in bfloat16, cast to float32).

Run from the repository root (TensorFlow runs all three modes; on JAX,
`graph` is skipped and `xla` is `jax.jit`; on PyTorch only `eager`):

    python benchmarks/bad_inputs.py
"""

import collections
import sys
import warnings

import keras
import numpy as np

import keras_posenc as kp

BACKEND = keras.backend.backend()
VERBOSE = "-v" in sys.argv  # print the cryptic errors


def compiled(function, mode):
    """`function` run eagerly, as a `tf.function`, or compiled by XLA."""
    if mode == "eager":
        return function
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=mode == "xla")
    import jax

    return jax.jit(function)


# The argument of a case whose input the layer takes: a finite output is right.
WORKS = object()


def outcome(run, argument):
    """What `run()` gave: clear, cryptic, shows or silently wrong."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            # Keras' own, on every `.numpy()` of a variable under NumPy 2.
            warnings.filterwarnings(
                "ignore", "__array__ implementation doesn't accept", DeprecationWarning
            )
            output = run()
    except Exception as error:  # noqa: BLE001 - classifying every failure
        kinds = ["ValueError", "InvalidArgumentError", "UserWarning"]
        # Keras appends the call's arguments, each by name, to an error
        # raised inside `call`: the name must come before that.
        message = str(error).split("Arguments received by")[0]
        named = isinstance(argument, str) and argument in message
        if type(error).__name__ in kinds and named:
            return "clear"
        if VERBOSE:
            print(f"  {type(error).__name__}: {str(error)[:300]}")
        return "cryptic"
    if isinstance(output, keras.layers.Layer):
        return "silently wrong"  # made without a word
    value = keras.ops.convert_to_numpy(output)
    if value.size == 0:
        return "empty"
    if np.isnan(value).any():
        return "shows"
    return "works" if argument is WORKS else "silently wrong"


tokens = np.zeros((1, 4, 8), "float32")
ring = np.roll(np.eye(4), 1, axis=1)
ring = (ring + ring.T)[None].astype("float32")
nodes = np.zeros((1, 4, 8), "float32")


def _tensors(arguments, mode):
    """The arguments as a user passes them: NumPy eagerly, tensors compiled.

    (JAX without 64-bit numbers makes an int64 array int32, wrapped, when it
    converts it: the layers see NumPy's int64 eagerly only.)
    """
    if mode == "eager":
        return list(arguments)
    return [keras.ops.convert_to_tensor(value) for value in arguments]


def called(layer, *arguments, **keywords):
    """A case: the layer called on tensors, in a mode."""

    def run(mode):
        tensors = _tensors(arguments, mode)
        return lambda: compiled(lambda *t: layer(*t, **keywords), mode)(*tensors)

    return run


def calling(function, *arguments):
    """A case: `function` of tensors, in a mode."""

    def run(mode):
        tensors = _tensors(arguments, mode)
        return lambda: compiled(function, mode)(*tensors)

    return run


def constructed(function):
    """A case settled as the layer is made: run once, in the eager column."""
    return lambda mode: function if mode == "eager" else None


def cached_attention(index):
    attention = kp.PositionalMultiHeadAttention(2, 4, position=kp.RotaryEmbedding())
    cache = np.zeros((1, 2, 4, 2, 4), "float32")
    return calling(
        lambda x, c, i: attention(x, x, cache=c, cache_update_index=i)[0],
        tokens[:, :1],
        cache,
        np.int32(index),
    )


attention = kp.PositionalMultiHeadAttention(2, 4, position=kp.RotaryEmbedding())


def positions_of(value):
    return np.array([0.0, 1.0, value, 3.0], "float32")


def rotary_positions(value):
    rotary = kp.RotaryEmbedding()
    return called(
        lambda x, p: rotary(x, positions=p),
        np.ones((1, 4, 2, 8), "float32"),
        positions_of(value),
    )


def learned_table():
    layer = kp.PositionEmbedding(8)
    layer.build(tokens.shape)
    return layer


def grid_table():
    layer = kp.PositionEmbedding(grid_shape=(2, 2))
    layer.build(tokens.shape)
    return layer


def bad_graph(kind):
    adjacency = ring.copy()
    if kind == "NaN":
        adjacency[0, 0, 1] = adjacency[0, 1, 0] = np.nan
    elif kind == "negative":
        adjacency[0, 0, 1] = adjacency[0, 1, 0] = -1.0
    else:
        adjacency[0, 0, 2] = 1.0
    return adjacency


CASES = {
    "1 learned: position 50 of 8": (
        lambda l=learned_table(): called(
            lambda x, p: l(x, positions=p), tokens, np.int32([0, 1, 50, 3])
        ),
        "sequence_length",
    ),
    "1 learned: position -1": (
        lambda l=learned_table(): called(
            lambda x, p: l(x, positions=p), tokens, np.int32([-1, 1, 2, 3])
        ),
        "sequence_length",
    ),
    "1 learned grid: coordinate (2, 0) of 2 x 2": (
        lambda l=grid_table(): called(
            lambda x, p: l(x, positions=p),
            tokens,
            np.int32([[0, 0], [0, 1], [2, 0], [1, 1]]),
        ),
        "grid_shape",
    ),
    "1 token and learned position: 50 of 8": (
        lambda l=kp.TokenAndPositionEmbedding(10, 8, 8, position_encoding="learned"): called(
            lambda x, p: l(x, positions=p),
            np.int32([[1, 2, 3, 4]]),
            np.int32([0, 1, 50, 3]),
        ),
        "sequence_length",
    ),
    "2 learned: start_index 6 of 8, 4 tokens": (
        lambda l=learned_table(): called(
            lambda x, s: l(x, start_index=s), tokens, np.int32(6)
        ),
        "sequence_length",
    ),
    **{
        f"3 {name}: {kind} adjacency": (
            lambda layer=layer, kind=kind, first=nodes_first: called(
                layer, *(([nodes] if first else []) + [bad_graph(kind)])
            ),
            "adjacency",
        )
        for name, layer, nodes_first in (
            ("laplacian", kp.LaplacianPositionEncoding(2, merge_mode=None), True),
            ("random walk", kp.RandomWalkPositionEncoding(3, merge_mode=None), True),
            ("shortest path", kp.ShortestPathBias(2, 3), False),
        )
        for kind in ("NaN", "negative", "non-symmetric")
        if not (name == "random walk" and kind == "non-symmetric")
    },
    **{
        f"4 {name}: {value} position": (
            lambda make=make, value=value: make(value),
            "positions",
        )
        for name, make in (
            (
                "sinusoidal",
                lambda value: called(
                    lambda x, p: kp.SinusoidalPositionEncoding()(x, positions=p),
                    tokens,
                    positions_of(value),
                ),
            ),
            ("rotary", rotary_positions),
            (
                "rotary attention",
                lambda value: called(
                    lambda x, p: attention(x, x, query_positions=p, key_positions=p),
                    tokens,
                    positions_of(value),
                ),
            ),
        )
        for value in (np.nan, np.inf)
    },
    "5 cached attention: index 6 of 4 slots": (
        lambda: cached_attention(6),
        "cache_update_index",
    ),
    "6 from_hf_config: rope_scaling without a type": (
        lambda: constructed(
            lambda: kp.RotaryEmbedding.from_hf_config(
                {"head_dim": 8, "rope_scaling": {"factor": 4.0}}
            )
        ),
        "rope_type",
    ),
    "7 max_wavelength=inf": (
        lambda: constructed(lambda: kp.RotaryEmbedding(max_wavelength=np.inf)),
        "max_wavelength",
    ),
    "7 from_hf_config: rope_theta Infinity": (
        lambda: constructed(
            lambda: kp.RotaryEmbedding.from_hf_config(
                {"head_dim": 8, "rope_theta": float("inf")}
            )
        ),
        "max_wavelength",
    ),
    "7 sinusoidal max_wavelength=inf": (
        lambda: constructed(
            lambda: kp.SinusoidalPositionEncoding(max_wavelength=np.inf)
        ),
        "max_wavelength",
    ),
    "8 yarn beta_fast < beta_slow": (
        lambda: constructed(
            lambda: kp.RotaryEmbedding(
                scaling={
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 64,
                    "beta_fast": 1.0,
                    "beta_slow": 32.0,
                }
            )
        ),
        "beta_fast",
    ),
    "9 laplacian: zero nodes": (
        lambda: called(
            kp.LaplacianPositionEncoding(2, merge_mode=None),
            np.zeros((1, 0, 8), "float32"),
            np.zeros((1, 0, 0), "float32"),
        ),
        None,  # any error is cryptic: the other graph layers return empty outputs
    ),
    "9 graph: adjacency batch 2, nodes batch 1": (
        lambda: called(
            kp.RandomWalkPositionEncoding(3),
            nodes,
            np.concatenate([ring, ring]),
        ),
        "adjacency",
    ),
    "9 learned: num_prefix_tokens=6, 4 tokens": (
        lambda: called(kp.PositionEmbedding(8, num_prefix_tokens=6), tokens),
        "num_prefix_tokens",
    ),
    "9 sinusoidal: num_prefix_tokens=6, 4 tokens": (
        lambda: called(kp.SinusoidalPositionEncoding(num_prefix_tokens=6), tokens),
        "num_prefix_tokens",
    ),
    "9 from_hf_config: num_attention_heads 0": (
        lambda: constructed(
            lambda: kp.RotaryEmbedding.from_hf_config(
                {"hidden_size": 64, "num_attention_heads": 0}
            )
        ),
        "num_attention_heads']=0",
    ),
}



def scheme_attention(position):
    """A built attention of 2 heads of 4 with `position`, on `tokens`."""
    layer = kp.PositionalMultiHeadAttention(2, 4, position=position)
    layer(tokens, tokens, use_causal_mask=True)
    return layer


def past_int32(position):
    """A case: the attention with `position` at int64 positions past int32."""
    layer = scheme_attention(position)
    positions = np.arange(4, dtype="int64") + 2**31
    return calling(
        lambda x, p: layer(
            x, x, use_causal_mask=True, query_positions=p, key_positions=p
        ),
        tokens,
        positions,
    )


class WrongShape(kp.AttentionPosition):
    """A user's scheme whose hook returns the keys of the queries' length."""

    def transform_query_key(self, query, key, context):
        return query, query[:, :1]


class WrongBias(kp.AttentionPosition):
    """A user's scheme whose bias is an integer tensor."""

    def logits_bias(self, query, key, context):
        return keras.ops.zeros((1, 2, 4, 4), "int32")


def hf_config(**entries):
    """A Llama-like config of 4 layers with `entries` on top."""
    return {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "head_dim": 8,
        "hidden_size": 16,
        "num_attention_heads": 2,
        **entries,
    }


CASES.update(
    {
        **{
            f"10 {name} attention: int64 positions past int32": (
                lambda make=make: past_int32(make()),
                "positions",
            )
            for name, make in (
                ("Transformer-XL", lambda: kp.TransformerXLPosition()),
                (
                    "DeBERTa",
                    lambda: kp.DisentangledPosition(
                        max_relative_positions=8, position_buckets=4
                    ),
                ),
                ("KERPLE", lambda: kp.KerpleBias(2)),
                ("FIRE", lambda: kp.FireBias(2)),
                ("CoPE", lambda: kp.ContextualPosition(4)),
            )
        },
        "10 DeBERTa share_att_key: values 12 wide, queries 8": (
            lambda layer=kp.PositionalMultiHeadAttention(
                2,
                4,
                position=kp.DisentangledPosition(
                    max_relative_positions=8, position_buckets=4
                ),
            ): called(
                lambda x, v: layer(x, v), tokens, np.zeros((1, 4, 12), "float32")
            ),
            "share_att_key",
        ),
        "10 attention_mask (batch, key) of rank 2, batch 2": (
            lambda: called(
                lambda x, m: attention(x, x, attention_mask=m),
                np.zeros((2, 4, 8), "float32"),
                np.ones((2, 4), bool),
            ),
            "attention_mask",
        ),
        "10 attention_mask of 3 keys, 4 given": (
            lambda: called(
                lambda x, m: attention(x, x, attention_mask=m),
                tokens,
                np.ones((1, 4, 3), bool),
            ),
            "attention_mask",
        ),
        "10 a scheme's transform_query_key of another shape": (
            lambda: called(
                lambda x: scheme_attention(WrongShape())(x, x), tokens
            ),
            "transform_query_key",
        ),
        "10 a scheme's logits_bias of integers": (
            lambda: called(lambda x: scheme_attention(WrongBias())(x, x), tokens),
            "logits_bias",
        ),
        "10 query and value of batch 1 and 2": (
            lambda: called(
                lambda x, v: attention(x, v), tokens, np.zeros((2, 4, 8), "float32")
            ),
            "value",
        ),
        "10 from_hf_config: partial_rotary_factor '0.5'": (
            lambda: constructed(
                lambda: kp.RotaryEmbedding.from_hf_config(
                    hf_config(partial_rotary_factor="0.5")
                )
            ),
            "partial_rotary_factor",
        ),
        "10 positions_per_layer: layer_types 'banana'": (
            lambda: constructed(
                lambda: kp.hf_config.positions_per_layer(
                    hf_config(layer_types=["full_attention"] * 3 + ["banana"])
                )
            ),
            "layer_types",
        ),
        "10 positions_per_layer: attn_temperature_tuning 'false'": (
            lambda: constructed(
                lambda: kp.hf_config.positions_per_layer(
                    hf_config(
                        model_type="llama4_text",
                        no_rope_layers=[1, 1, 1, 0],
                        attn_temperature_tuning="false",
                    )
                )
            ),
            "attn_temperature_tuning",
        ),
        "10 from_hf_config: rope_type default with a factor": (
            lambda: constructed(
                lambda: kp.RotaryEmbedding.from_hf_config(
                    hf_config(rope_scaling={"rope_type": "default", "factor": 4.0})
                )
            ),
            "factor",
        ),
        "10 laplacian: adjacency of strings": (
            lambda: constructed(
                lambda: kp.LaplacianPositionEncoding(2)(
                    nodes, np.full((1, 4, 4), "1")
                )
            ),
            "adjacency",
        ),
        "10 random walk: node features of strings": (
            lambda: constructed(
                lambda: kp.RandomWalkPositionEncoding(3)(np.full((1, 4, 8), "a"), ring)
            ),
            "inputs",
        ),
        "10 shortest path attention: adjacency of batch 2": (
            lambda layer=kp.PositionalMultiHeadAttention(
                2, 4, position=kp.ShortestPathBias(2, 3)
            ): called(
                lambda x, a: layer(x, x, adjacency=a), nodes, np.concatenate([ring, ring])
            ),
            "adjacency",
        ),
    }
)


class BfloatBias(kp.AttentionPosition):
    """A user's scheme whose bias is bfloat16, where float32 is asked."""

    def logits_bias(self, query, key, context):
        return keras.ops.zeros((1, 2, 4, 4), "bfloat16")


class NarrowValueTerm(kp.AttentionPosition):
    """A user's scheme whose value term is 5 wide, for values of 8."""

    def value_term(self, attention_weights, context):
        return keras.ops.zeros((1, 4, 2, 5))


class StringScale(kp.AttentionPosition):
    """A user's scheme whose logits' scale is a string."""

    def logits_scale(self, key_dim):
        return "0.5"


class ListBias(kp.AttentionPosition):
    """A user's scheme whose bias is a nested Python list."""

    def logits_bias(self, query, key, context):
        return [[[[0.0] * 4] * 4] * 2]


def xl_attention():
    """Transformer-XL's attention, built on 16 features."""
    layer = kp.PositionalMultiHeadAttention(2, 4, position=kp.TransformerXLPosition())
    layer(np.zeros((1, 4, 16), "float32"), np.zeros((1, 4, 16), "float32"))
    return layer


def xl_bias_before_build():
    """`TransformerXLPosition.logits_bias` of a scheme no attention has built."""
    heads = np.zeros((1, 4, 2, 4), "float32")
    positions = np.arange(4, dtype="int32")[None]
    context = kp.AttentionContext(query_positions=positions, key_positions=positions)
    return kp.TransformerXLPosition().logits_bias(heads, heads, context)


def nan_query_token():
    """Tokens whose second query holds a NaN."""
    value = np.random.default_rng(0).normal(size=(1, 4, 8)).astype("float32")
    value[0, 1, 0] = np.nan
    return value


def mask_case(mask_name, inputs, mask):
    """A case: the rotary attention with `mask_name=mask` on `inputs`."""
    return called(
        lambda x, m: attention(x, x, **{mask_name: m}), inputs, mask
    )


def graph_mask_case(layer):
    """A case: a graph encoding with a node mask of 3 nodes for 4."""
    return called(
        lambda x, a, m: layer(x, a, mask=m), nodes, ring, np.ones((1, 3), bool)
    )


CASES.update(
    {
        "11 Transformer-XL: memory of 20 features, built on 16": (
            lambda layer=xl_attention(): called(
                lambda x, k: layer(x, k),
                np.zeros((1, 4, 16), "float32"),
                np.zeros((1, 6, 20), "float32"),
            ),
            "value",
        ),
        "11 Transformer-XL: logits_bias before build": (
            lambda: constructed(xl_bias_before_build),
            "build_for_attention",
        ),
        "11 xPos alone: int64 positions past int32": (
            lambda xpos=kp.XPosEmbedding(): called(
                lambda q, k, p: xpos(q, k, query_positions=p, key_positions=p),
                np.ones((1, 4, 2, 8), "float32"),
                np.ones((1, 4, 2, 8), "float32"),
                np.arange(4, dtype="int64") + 2**31,
            ),
            "positions",
        ),
        "11 temperature alone: string positions": (
            lambda: called(
                kp.AttentionTemperature(floor_scale=4), np.array(["0", "1", "2"])
            ),
            "positions",
        ),
        "11 CoPE: NaN in one query token": (
            lambda layer=kp.PositionalMultiHeadAttention(
                2, 4, position=kp.ContextualPosition(4)
            ): called(
                lambda x: layer(x, x, use_causal_mask=True), nan_query_token()
            ),
            "query",
        ),
        "11 a scheme's logits_bias of bfloat16": (
            lambda layer=scheme_attention(BfloatBias()): called(
                lambda x: layer(x, x), tokens
            ),
            WORKS,  # cast to float32, as the protocol computes the logits
        ),
        "11 a scheme's value_term 5 wide for 8": (
            lambda layer=kp.PositionalMultiHeadAttention(
                2, 8, position=NarrowValueTerm()
            ): called(lambda x: layer(x, x), tokens),
            "value_term",
        ),
        "11 a scheme's logits_scale a string": (
            lambda: called(lambda x: scheme_attention(StringScale())(x, x), tokens),
            "logits_scale",
        ),
        "11 a scheme's logits_bias a nested list": (
            lambda: called(lambda x: scheme_attention(ListBias())(x, x), tokens),
            "logits_bias",
        ),
        "11 attention_mask of strings": (
            lambda: mask_case("attention_mask", tokens, np.full((1, 4, 4), "1")),
            "attention_mask",
        ),
        "11 attention_mask of batch 3 for batch 2": (
            lambda: mask_case(
                "attention_mask",
                np.zeros((2, 4, 8), "float32"),
                np.ones((3, 4, 4), bool),
            ),
            "attention_mask",
        ),
        "11 query_mask of 5 for 8 queries": (
            lambda: mask_case(
                "query_mask", np.zeros((1, 8, 8), "float32"), np.ones((1, 5), bool)
            ),
            "query_mask",
        ),
        "11 value_mask of 5 for 8 keys": (
            lambda: mask_case(
                "value_mask", np.zeros((1, 8, 8), "float32"), np.ones((1, 5), bool)
            ),
            "value_mask",
        ),
        "12 token and position: token id 12 of 10": (
            lambda layer=kp.TokenAndPositionEmbedding(10, 8, 8): called(
                layer, np.int32([[1, 2, 12, 4]])
            ),
            "vocabulary_size",
        ),
        "12 token and position: string token ids": (
            lambda layer=kp.TokenAndPositionEmbedding(10, 8, 8): called(
                layer, np.array([["1", "2", "3", "4"]])
            ),
            "inputs",
        ),
        "12 rotary: string inputs": (
            lambda: called(kp.RotaryEmbedding(), np.full((1, 4, 2, 8), "1")),
            "inputs",
        ),
        "12 laplacian: mask of 3 nodes for 4": (
            lambda: graph_mask_case(kp.LaplacianPositionEncoding(2)),
            "mask",
        ),
        "12 random walk: mask of 3 nodes for 4": (
            lambda: graph_mask_case(kp.RandomWalkPositionEncoding(3)),
            "mask",
        ),
        "12 from_hf_config: head_dim '16', partial_rotary_factor": (
            lambda: constructed(
                lambda: kp.RotaryEmbedding.from_hf_config(
                    {"head_dim": "16", "partial_rotary_factor": 0.5}
                )
            ),
            "head_dim",
        ),
    }
)

MODES = {"tensorflow": ("eager", "graph", "xla"), "jax": ("eager", "xla")}


def main():
    modes = MODES.get(BACKEND, ("eager",))
    print(f"{'case':52}" + "".join(f"{mode:>16}" for mode in modes))
    counts = collections.Counter()
    for name, (case, argument) in CASES.items():
        results = []
        for mode in modes:
            try:
                run = case()(mode)
            except Exception as error:  # noqa: BLE001 - made, not yet called
                run = lambda error=error: (_ for _ in ()).throw(error)  # noqa: E731
            results.append("" if run is None else outcome(run, argument))
        counts.update(result for result in results if result)
        print(f"{name:52}" + "".join(f"{result:>16}" for result in results))
    print(", ".join(f"{kind}: {counts[kind]}" for kind in (
        "clear", "cryptic", "shows", "silently wrong", "empty", "works"
    )))


if __name__ == "__main__":
    main()
