"""Benchmark: grouped-query attention with RoPE, against Keras' own.

`PositionalMultiHeadAttention(8, 64, num_key_value_heads=2,
position=RotaryEmbedding())`, one causal self-attention call on `(4, 1024,
512)` float32 inputs, against Keras' `GroupQueryAttention` of the same
heads, which takes no position. The same layer without a position, given
Keras' weights, is timed too, and must agree with Keras' layer, which the
run checks. Target: RoPE at most 1.05 times Keras' layer on TensorFlow and
JAX. On PyTorch the baseline is x-transformers' `Attention(kv_heads=2,
flash=True)` with its RoPE, where installed (the `bench-torch` extra);
target: at most 1.10 times.

Decoding: one token at the end of 768 tokens. This package's layer reads
the keys and values from its cache, `(batch, 2, slots, 2, 64)`, a quarter
of a multi-head cache; Keras' layer, which has none, projects the 768
tokens' keys and values each time. Target: at most 1.10 times Keras'.

Time: the candidates are compiled (`compiled.jit`: XLA on TensorFlow and
JAX, eager on PyTorch) and called in rounds, each in a new order; a ratio
is the median over rounds of the two calls' times in that round. A second
copy of Keras' layer measures how far two identical programs time apart.

    python -m keras_posenc_lab.bench.grouped [--length 1024] [--slots 768] [--repeats 30]
"""

import functools
import statistics
import sys

import keras
import numpy as np

import keras_posenc
from keras_posenc_lab._arguments import int_at_least
from keras_posenc_lab.bench import compiled
from keras_posenc_lab.bench import timing

BATCH = 4
LENGTH = 1024
HEADS = 8
KEY_VALUE_HEADS = 2
KEY_DIM = 64
# The decoded token's keys: a prompt of 767 and itself.
SLOTS = 768
BASELINE = "keras"
CANDIDATES = ("keras", "plain", "rope", "keras_again")
STEP_CANDIDATES = ("keras_step", "rope_step")
TARGETS = {"rope": 1.05, "rope_step": 1.10}
TORCH_TARGET = 1.10
LABELS = {
    "keras": "Keras `GroupQueryAttention` (no position)",
    "plain": "this package, `position=None`",
    "rope": "this package, RoPE (`RotaryEmbedding`)",
    "keras_again": "a second copy of Keras' layer (noise)",
    "x_transformers": "x-transformers `Attention(kv_heads=2)`, RoPE",
    "keras_step": "Keras `GroupQueryAttention`, one query over the tokens",
    "rope_step": "this package, RoPE, one query over its cache",
}
# The same weights, float32 sums of a few hundred terms in another order.
AGREEMENT_ATOL = 1e-4


def _keras_layer(heads, key_value_heads, key_dim, width):
    layer = keras.layers.GroupQueryAttention(
        head_dim=key_dim, num_query_heads=heads, num_key_value_heads=key_value_heads
    )
    short = compiled.zeros((1, 2, width))
    layer(short, short)
    return layer


def _layer(position, heads, key_value_heads, key_dim, width):
    layer = keras_posenc.PositionalMultiHeadAttention(
        heads, key_dim, position=position, num_key_value_heads=key_value_heads
    )
    short = compiled.zeros((1, 2, width))
    layer(short, short, use_causal_mask=True)
    return layer


def _copy_weights(source, target):
    """Keras' projections into this package's layer, weight by weight."""
    for mine, theirs in zip(target.weights, source.weights):
        mine.assign(theirs.value)


def _causal(layer, inputs):
    return layer(inputs, inputs, use_causal_mask=True)


def _keras_step(layer, tokens):
    # The last token over all of them: no key comes after it.
    return layer(tokens[:, -1:], tokens)


def _cached_step(layer, cache, tokens):
    return layer(
        tokens[:, -1:],
        tokens[:, -1:],
        cache=cache,
        cache_update_index=keras.ops.shape(tokens)[1] - 1,
        use_causal_mask=True,
    )[0]


def _x_transformers(heads, key_value_heads, key_dim, width):
    """x-transformers' grouped attention with its RoPE, or None if not installed."""
    try:
        from x_transformers.x_transformers import Attention
        from x_transformers.x_transformers import RotaryEmbedding
    except ImportError:
        return None
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    attention = Attention(
        dim=width,
        heads=heads,
        dim_head=key_dim,
        kv_heads=key_value_heads,
        flash=True,
        causal=True,
    ).to(device).eval()
    rotary = RotaryEmbedding(key_dim).to(device)

    def call(x):
        with torch.no_grad():
            return attention(
                x, rotary_pos_emb=rotary.forward_from_seq_len(x.shape[1])
            )

    return call


def run(
    batch=BATCH,
    length=LENGTH,
    heads=HEADS,
    key_value_heads=KEY_VALUE_HEADS,
    key_dim=KEY_DIM,
    slots=SLOTS,
    repeats=30,
    warmup=3,
    seed=0,
):
    """Time the grouped attention's call and its decoding step.

    Returns:
        A dict: the median seconds of each candidate under its name, of
        `CANDIDATES` and `STEP_CANDIDATES` (and `"x_transformers"` on
        PyTorch with x-transformers installed); each one's median ratio
        over its baseline under `"<name>_vs_baseline"`; the cache's shape
        under `"cache_shape"` and the multi-head cache's under
        `"multi_head_cache_shape"`.

    Raises:
        AssertionError: when Keras' layer and this package's without a
            position disagree.
    """
    keras.utils.set_random_seed(seed)
    width = heads * key_dim
    sizes = (heads, key_value_heads, key_dim, width)
    keras_layer = _keras_layer(*sizes)
    keras_again = _keras_layer(*sizes)
    plain = _layer(None, *sizes)
    rope = _layer(keras_posenc.RotaryEmbedding(), *sizes)
    _copy_weights(keras_layer, plain)
    inputs = compiled.normal((batch, length, width), seed)
    agreement = np.abs(
        keras.ops.convert_to_numpy(compiled.jit(functools.partial(_causal, plain))(inputs))
        - keras.ops.convert_to_numpy(
            compiled.jit(functools.partial(_causal, keras_layer))(inputs)
        )
    ).max()
    if not agreement <= AGREEMENT_ATOL:
        raise AssertionError(
            "Keras' GroupQueryAttention and PositionalMultiHeadAttention "
            "without a position disagree: largest difference "
            f"{agreement:.3g}, over {AGREEMENT_ATOL}"
        )
    candidates = {
        "keras": functools.partial(_causal, keras_layer),
        "plain": functools.partial(_causal, plain),
        "rope": functools.partial(_causal, rope),
        "keras_again": functools.partial(_causal, keras_again),
    }
    reference = None
    if compiled.backend() == "torch":
        reference = _x_transformers(*sizes)
        if reference is not None:
            candidates["x_transformers"] = reference
    seconds = timing.rounds(candidates, (inputs,), repeats, warmup)
    results = {name: statistics.median(times) for name, times in seconds.items()}
    for name in ("plain", "rope", "keras_again"):
        results[f"{name}_vs_baseline"] = timing.paired_ratio(seconds, name, BASELINE)
    if reference is not None:
        results["rope_vs_x_transformers"] = timing.paired_ratio(
            seconds, "rope", "x_transformers"
        )

    tokens = compiled.normal((batch, slots, width), seed + 1)
    cache = keras.ops.zeros((batch, 2, slots, key_value_heads, key_dim))
    # The prompt's keys and values cached, the last slot left to the step.
    _, cache = rope(
        tokens[:, :-1],
        tokens[:, :-1],
        cache=cache,
        cache_update_index=0,
        use_causal_mask=True,
    )
    cache = keras.Variable(cache, trainable=False)
    steps = {
        "keras_step": functools.partial(_keras_step, keras_layer),
        "rope_step": functools.partial(_cached_step, rope, cache),
    }
    step_seconds = timing.rounds(steps, (tokens,), repeats, warmup)
    for name, times in step_seconds.items():
        results[name] = statistics.median(times)
    results["rope_step_vs_baseline"] = timing.paired_ratio(
        step_seconds, "rope_step", "keras_step"
    )
    results["cache_shape"] = tuple(cache.shape)
    results["multi_head_cache_shape"] = (batch, 2, slots, heads, key_dim)
    return results


def describe(batch, length, heads, key_value_heads, key_dim, slots, repeats):
    """What `run` times, in a sentence of the report."""
    mode = "under XLA" if compiled.has_programs() else "eager"
    return (
        f"One causal self-attention call on a ({batch}, {length}, "
        f"{heads * key_dim}) float32 input, {heads} query heads and "
        f"{key_value_heads} key/value heads of {key_dim}, {mode}, against "
        "Keras' `GroupQueryAttention`; and one decoding step, the last of "
        f"{slots} tokens, read from the cache here and projected afresh by "
        f"Keras' layer: medians of {repeats} rounds"
    )


def format_table(results, judged=True):
    """A Markdown table of `run`'s results and whether the targets are met."""
    noise = timing.noise_band(results["keras_again_vs_baseline"])
    lines = [
        "| attention | ms | / baseline | target | met |",
        "|---|---:|---:|---:|---|",
    ]

    def row(name, ratio_key, baseline_label, target=None):
        ratio = results.get(ratio_key)
        cells = [LABELS[name], f"{results[name] * 1e3:.2f}"]
        cells.append("" if ratio is None else f"{ratio:.3f}x ({baseline_label})")
        if target is None or ratio is None:
            cells += ["", ""]
        else:
            cells += [
                f"<= {target:.2f}x",
                timing.verdict(ratio, target, noise, judged=judged),
            ]
        lines.append("| " + " | ".join(cells) + " |")

    row("keras", None, "")
    row("plain", "plain_vs_baseline", "Keras")
    on_torch = "rope_vs_x_transformers" in results
    row("rope", "rope_vs_baseline", "Keras", None if on_torch else TARGETS["rope"])
    if on_torch:
        row("x_transformers", None, "")
        lines.append(
            f"| {LABELS['rope']} | {results['rope'] * 1e3:.2f} | "
            f"{results['rope_vs_x_transformers']:.3f}x (x-transformers) | "
            f"<= {TORCH_TARGET:.2f}x | "
            f"{timing.verdict(results['rope_vs_x_transformers'], TORCH_TARGET, noise, judged=judged)} |"
        )
    row("keras_again", "keras_again_vs_baseline", "Keras")
    row("keras_step", None, "")
    row("rope_step", "rope_step_vs_baseline", "Keras' step", TARGETS["rope_step"])
    cache, multi_head = results["cache_shape"], results["multi_head_cache_shape"]
    lines += [
        "",
        f"Cache: {cache}, {np.prod(cache) * 4 / 2**20:.1f} MiB in float32, "
        f"{np.prod(cache) / np.prod(multi_head):.2f} of the multi-head "
        f"cache {multi_head}.",
    ]
    return "\n".join(lines)


def main(argv=None):
    """Run the benchmark and print its Markdown table; `0` whatever it finds."""
    parser = timing.argument_parser(
        "grouped",
        "Time grouped-query attention with RoPE against Keras' own, a call "
        "and a decoding step.",
    )
    for name, default in (
        ("batch", BATCH),
        ("length", LENGTH),
        ("heads", HEADS),
        ("key-value-heads", KEY_VALUE_HEADS),
        ("key-dim", KEY_DIM),
        ("slots", SLOTS),
    ):
        parser.add_argument(
            f"--{name}", type=int_at_least(1), default=default,
            help=f"(default: {default})",
        )
    args = parser.parse_args(argv)
    sizes = dict(
        batch=args.batch,
        length=args.length,
        heads=args.heads,
        key_value_heads=args.key_value_heads,
        key_dim=args.key_dim,
        slots=args.slots,
    )
    results = run(**sizes, repeats=args.repeats)
    print(describe(**sizes, repeats=args.repeats) + ".")
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
