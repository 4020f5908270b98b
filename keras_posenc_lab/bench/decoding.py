"""Benchmark: cached generation, one token at a time, per position scheme.

A decoder generates a token at a time, each new query attending to the keys
and values of all tokens before it, which a key/value cache keeps. Here one
`PositionalMultiHeadAttention` (8 heads of key_dim 64, features 512) fills a
cache of 768 slots with a 512-token prompt in one call (the prefill), then
decodes 256 tokens one at a time, each step's input being the previous
step's output, in one loop (`keras.ops.fori_loop`) compiled with XLA, as
keras-hub's samplers generate. The target: a decoded token takes at most
1.10 times as long with RoPE (`RotaryEmbedding`), ALiBi (`AlibiBias`) and
T5 (`RelativePositionBias`), 1.05 times with xPos (`XPosEmbedding`), 1.15
times with KERPLE (`KerpleBias`) and FIRE (`FireBias`), and 1.6 times with
CoPE (`ContextualPosition`, one more product of the new queries with the
keys), as with plain attention, the same layer with `position=None` and
the same cache; Shaw et al.'s relative representations
(`RelativePositionEmbedding`, k = 16) are reported beside them. keras-hub's
`CachedMultiHeadAttention`, plain attention with keras-hub's cache and the
causal mask keras-hub's decoders give it, is timed as well, with the plain
layer's weights: the two must agree, which the run checks.

Time: all candidates are built and their prompt cached, then their decoding
loops are compiled with XLA and called in one process, in rounds that call
each once in a new order; each ratio is the median over rounds of the two
calls' times in that round. A second copy of plain attention measures how
far two identical programs time apart. The prefill, one causal call over the
prompt that writes the cache, is timed the same way.

The backend is the one `KERAS_BACKEND` names (`compiled`): XLA on
TensorFlow and JAX; on PyTorch the loop runs eagerly, a step at a time.
Each candidate's cache after the prefill is held in a variable, so that
every backend passes it to the compiled loop rather than folding it in.

Run from the repository root:

    python -m keras_posenc_lab.bench.decoding [--batch 1] [--prompt 512] [--new-tokens 256] [--repeats 30]
"""

import functools
import statistics
import sys

import keras
import keras_hub
import numpy as np

import keras_posenc
from keras_posenc_lab._arguments import int_at_least
from keras_posenc_lab.bench import attention
from keras_posenc_lab.bench import compiled
from keras_posenc_lab.bench import timing

BATCH = 1
PROMPT = 512
NEW_TOKENS = 256
HEADS = 8
KEY_DIM = 64
SCHEMES = ("rope", "alibi", "t5", "shaw", "kerple", "fire", "xpos", "cope")
BASELINE = "plain"
# The most a decoded token may take, over plain attention's time.
TARGETS = {
    "rope": 1.10,
    "alibi": 1.10,
    "t5": 1.10,
    "kerple": 1.15,
    "fire": 1.15,
    "xpos": 1.05,
    "cope": 1.6,
}
CANDIDATES = (BASELINE,) + SCHEMES + ("keras_hub", "plain_again")
LABELS = {
    "plain": "plain (`position=None`)",
    "keras_hub": "keras-hub `CachedMultiHeadAttention`",
    **{name: attention.LABELS[name] for name in SCHEMES},
}
# Plain attention in this package and in keras-hub, the same weights: float32
# sums of a few hundred terms in another order, then 256 steps that feed
# each output back.
AGREEMENT_ATOL = 1e-4


def _layer(name, heads, key_dim):
    """The built attention layer of candidate `name`."""
    if name == "keras_hub":
        layer = keras_hub.layers.CachedMultiHeadAttention(heads, key_dim)
    elif name in (BASELINE, "plain_again"):
        layer = keras_posenc.PositionalMultiHeadAttention(heads, key_dim)
    else:
        layer = keras_posenc.PositionalMultiHeadAttention(
            heads, key_dim, position=attention.position_layer(name, heads)
        )
    # Built eagerly on a short input, so no weight is made under XLA; CoPE
    # refuses attention without the causal mask.
    short = compiled.zeros((1, 2, heads * key_dim))
    if name == "keras_hub":
        layer(short, short)
    else:
        # Causal, as every call here: xPos holds under a causal mask only.
        layer(short, short, use_causal_mask=True)
    return layer


def _step(layer, tokens, cache, index, keras_hub_layer):
    """One cached call on `tokens` written at slot `index`: (output, cache)."""
    if not keras_hub_layer:
        return layer(
            tokens, tokens, cache=cache, cache_update_index=index, use_causal_mask=True
        )
    # keras-hub's decoders give the causal mask themselves: query `index + t`
    # attends to slots up to its own.
    batch, new = keras.ops.shape(tokens)[0], keras.ops.shape(tokens)[1]
    slots = keras.ops.shape(cache)[2]
    queries = index + keras.ops.arange(new)  # (new,)
    mask = keras.ops.arange(slots)[None] <= queries[:, None]  # (new, slots)
    mask = keras.ops.broadcast_to(mask, (batch, new, slots))
    return layer(
        tokens, tokens, cache=cache, cache_update_index=index, attention_mask=mask
    )


def _prefill(layer, keras_hub_layer, slots, prompt):
    """The prompt's outputs and the cache it fills, slots after it empty."""
    cache = compiled.zeros((prompt.shape[0], 2, slots, layer.num_heads, layer.key_dim))
    return _step(layer, prompt, cache, 0, keras_hub_layer)


def _decode(layer, keras_hub_layer, new_tokens, cache, first):
    """`new_tokens` steps from slot `prompt`, each fed the last output.

    Args:
        layer: the attention layer.
        keras_hub_layer: bool. Whether `layer` is keras-hub's.
        new_tokens: int. Tokens to decode.
        cache: the cache after the prefill, `(batch, 2, slots, heads,
            key_dim)`, its first `slots - new_tokens` slots written: a
            tensor or a variable.
        first: the first input, `(batch, 1, features)`.

    Returns:
        The outputs of every step, `(batch, new_tokens, features)`.
    """
    cache = keras.ops.convert_to_tensor(cache)
    start = keras.ops.shape(cache)[2] - new_tokens
    batch, features = keras.ops.shape(first)[0], keras.ops.shape(first)[2]
    outputs = keras.ops.zeros((batch, new_tokens, features), first.dtype)

    def step(count, state):
        tokens, cache, outputs = state
        output, cache = _step(layer, tokens, cache, start + count, keras_hub_layer)
        # (batch, new, features), step `count`'s token written
        outputs = keras.ops.slice_update(outputs, (0, count, 0), output)
        return output, cache, outputs

    _, _, outputs = keras.ops.fori_loop(0, new_tokens, step, (first, cache, outputs))
    return outputs


def run(
    batch=BATCH,
    prompt=PROMPT,
    new_tokens=NEW_TOKENS,
    heads=HEADS,
    key_dim=KEY_DIM,
    repeats=30,
    warmup=3,
    seed=0,
):
    """Time the prefill and the cached decoding of each candidate.

    Args:
        batch: int. Sequences decoded at once. Defaults to `1`.
        prompt: int. Tokens of the prompt, cached in one call. Defaults to
            `512`.
        new_tokens: int. Tokens decoded one at a time after it. Defaults to
            `256`.
        heads: int. Number of attention heads. Defaults to `8`.
        key_dim: int. Size of each head, even (RoPE pairs features).
            Defaults to `64`.
        repeats: int. Timed rounds. Defaults to `30`.
        warmup: int. Untimed calls of each candidate first. Defaults to `3`.
        seed: int. Seed of the weights and the inputs. Defaults to `0`.

    Returns:
        A dict: for each of `CANDIDATES`, the median seconds of its whole
        decoding loop under `"<name>"`, of one decoded token under
        `"<name>_per_token"`, decoded tokens per second (over the batch)
        under `"<name>_tokens_per_second"`, and of its prefill under
        `"<name>_prefill"`; the median over rounds of each candidate's time
        over plain's under `"<name>_vs_plain"` (decoding) and
        `"<name>_prefill_vs_plain"`; the baseline's over its copy's under
        `"vs_itself"`.

    Raises:
        AssertionError: when keras-hub's plain attention and this package's
            disagree.
    """
    keras.utils.set_random_seed(seed)
    slots = prompt + new_tokens
    width = heads * key_dim
    layers = {name: _layer(name, heads, key_dim) for name in CANDIDATES}
    # The plain layers alike, so that keras-hub's checks this package's.
    for name in ("keras_hub", "plain_again"):
        layers[name].set_weights(layers[BASELINE].get_weights())
    prompt_tokens = compiled.normal((batch, prompt, width), seed)
    prefills = {}
    decodes = {}
    for name, layer in layers.items():
        is_hub = name == "keras_hub"
        # Partials, not lambdas: `tf.function` counts traces per code object;
        # on JAX the layer and the cache a partial holds are passed in.
        prefills[name] = functools.partial(_prefill, layer, is_hub, slots)
        _, cache = compiled.jit(prefills[name])(prompt_tokens)
        cache = keras.Variable(cache, trainable=False)
        decodes[name] = functools.partial(
            _decode, layer, is_hub, new_tokens, cache
        )
    first = prompt_tokens[:, -1:]
    decoded = {
        name: keras.ops.convert_to_numpy(compiled.jit(decode)(first))
        for name, decode in decodes.items()
        if name in (BASELINE, "keras_hub")
    }
    difference = np.abs(decoded["keras_hub"] - decoded[BASELINE]).max()
    if not difference <= AGREEMENT_ATOL:
        raise AssertionError(
            "keras-hub's CachedMultiHeadAttention and plain "
            "PositionalMultiHeadAttention decode differently: largest "
            f"difference {difference:.3g}, over {AGREEMENT_ATOL}"
        )
    seconds = timing.rounds(decodes, (first,), repeats, warmup)
    prefill_seconds = timing.rounds(prefills, (prompt_tokens,), repeats, warmup)
    results = {}
    for name in CANDIDATES:
        median = statistics.median(seconds[name])
        results[name] = median
        results[f"{name}_per_token"] = median / new_tokens
        results[f"{name}_tokens_per_second"] = batch * new_tokens / median
        results[f"{name}_prefill"] = statistics.median(prefill_seconds[name])
        if name != BASELINE:
            results[f"{name}_vs_plain"] = timing.paired_ratio(seconds, name, BASELINE)
            results[f"{name}_prefill_vs_plain"] = timing.paired_ratio(
                prefill_seconds, name, BASELINE
            )
    results["vs_itself"] = results.pop("plain_again_vs_plain")
    return results


def format_table(results, judged=True):
    """A Markdown table of `run`'s results and whether the targets are met.

    Args:
        results: dict. What `run` returns.
        judged: bool. `False` for a run at sizes too small to mean anything
            (the tiny run): its "met" cells give no verdict. Defaults to
            `True`.

    Returns:
        A str.
    """
    noise = timing.noise_band(results["vs_itself"])
    lines = [
        "| attention | tokens/s | ms per token | / plain | target | met "
        "| prefill (ms) | / plain |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name in CANDIDATES:
        if name == "plain_again":
            lines.append(
                "| a second copy of plain (noise) | "
                f"{results['plain_again_tokens_per_second']:.0f} | "
                f"{results['plain_again_per_token'] * 1e3:.3f} | "
                f"{results['vs_itself']:.3f}x | | | "
                f"{results['plain_again_prefill'] * 1e3:.1f} | "
                f"{results['plain_again_prefill_vs_plain']:.3f}x |"
            )
            continue
        cells = [
            LABELS[name],
            f"{results[f'{name}_tokens_per_second']:.0f}",
            f"{results[f'{name}_per_token'] * 1e3:.3f}",
        ]
        if name == BASELINE:
            cells += ["", "", ""]
        else:
            ratio = results[f"{name}_vs_plain"]
            cells.append(f"{ratio:.3f}x")
            if name in TARGETS:
                cells += [
                    f"<= {TARGETS[name]:.2f}x",
                    timing.verdict(ratio, TARGETS[name], noise, judged=judged),
                ]
            else:
                cells += ["", ""]
        cells.append(f"{results[f'{name}_prefill'] * 1e3:.1f}")
        cells.append(
            "" if name == BASELINE else f"{results[f'{name}_prefill_vs_plain']:.3f}x"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(batch, prompt, new_tokens, heads, key_dim, repeats):
    """One sentence of what `run` timed, for the tables' heading."""
    return (
        f"Cached generation: a {prompt}-token prompt of batch {batch} cached "
        f"in one call, then {new_tokens} tokens decoded one at a time in one "
        f"{'XLA-compiled' if compiled.has_programs() else 'eager'} loop, "
        f"{heads} heads of key_dim {key_dim}, "
        f"{prompt + new_tokens} cache slots: median of {repeats} rounds, "
        "against plain attention with the same cache"
    )


def main(argv=None):
    """Run the benchmark and print its Markdown table.

    Args:
        argv: list of str or None. The arguments after the program name.
            Defaults to `None`, meaning `sys.argv[1:]`.

    Returns:
        `0`, whether or not the targets are met: timings on a busy machine
        are for a person to read.
    """
    parser = timing.argument_parser(
        "decoding",
        (
            "Time cached generation with each position scheme inside "
            "PositionalMultiHeadAttention against plain attention with the "
            "same key/value cache: a prompt cached in one call, then tokens "
            "decoded one at a time, under XLA where the backend has it."
        ),
    )
    for flag, default, help_text in (
        ("--batch", BATCH, "sequences decoded at once"),
        ("--prompt", PROMPT, "tokens of the prompt, cached in one call"),
        ("--new-tokens", NEW_TOKENS, "tokens decoded one at a time"),
        ("--heads", HEADS, "attention heads"),
    ):
        parser.add_argument(
            flag,
            type=int_at_least(1),
            default=default,
            help=f"{help_text} (default: {default})",
        )
    parser.add_argument(
        "--key-dim",
        type=int_at_least(2),
        default=KEY_DIM,
        help=f"size of each head, even (default: {KEY_DIM})",
    )
    args = parser.parse_args(argv)
    sizes = {
        "batch": args.batch,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "heads": args.heads,
        "key_dim": args.key_dim,
    }
    results = run(**sizes, repeats=args.repeats)
    print(f"Keras {keras.__version__} on its {compiled.backend()} backend: {compiled.versions()}")
    print(describe(**sizes, repeats=args.repeats))
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
