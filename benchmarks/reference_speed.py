"""Speed against the references' own code: relative attention, eager, on the CPU.

Each new attention scheme, inside `PositionalMultiHeadAttention` on the
PyTorch backend, against the Hugging Face module it is checked against,
run eagerly (transformers' "eager" attention) in the same process:

- `TransformerXLPosition` against transformers' `ParakeetEncoderAttention`
  fed by `ParakeetEncoderRelPositionalEncoding`;
- `DisentangledPosition` against transformers' DeBERTa-v2
  `DisentangledSelfAttention` (c2p|p2c, share_att_key, 256 position
  buckets, 512 relative positions: DeBERTa-v3-base's), with the relative
  embeddings (`get_rel_embedding`, its LayerNorm) and positions
  (`get_rel_pos`) that `DebertaV2Encoder` builds for it, and the output
  projection of `DebertaV2SelfOutput`, which the Keras attention has.

Both sides of a pair work at the same shape (batch 4, 1024 tokens, 512
features, 8 heads of 64, float32, no mask) and hold the same weights (the
torch ones copied into the Keras layer); the script prints the largest
difference of their outputs, then times forward calls under
`torch.no_grad()` in rounds that call each side once in a new order, and
prints a Markdown table of the median times and the median of the
rounds' ratios (keras-posenc over the reference). Each reference's
encoding of the positions is timed with it: the Keras layers make theirs
in the call. A scheme that the checkout lacks is skipped.

The target: each scheme takes at most its reference's time (`TARGET`,
a ratio of at most 1.0). The script reports it; no test times anything,
and the times move with the machine, its load and the thread count.

Run it in the scratch virtual environment of
`tests/fixtures/generate_relative_attention.py` (outside the repository,
never in the project's own), with Keras added and the package from source:

    ../scratch-ref/bin/pip install "keras==3.15.*"
    KERAS_BACKEND=torch PYTHONPATH=. ../scratch-ref/bin/python \
        benchmarks/reference_speed.py

`--length` (1024) and `--rounds` (5) make it shorter; a round at 1024
tokens takes a few seconds on two cores.
"""

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DebertaV2Config  # noqa: E402
from transformers import ParakeetEncoderConfig  # noqa: E402
from transformers.models.deberta_v2 import modeling_deberta_v2  # noqa: E402
from transformers.models.parakeet.modeling_parakeet import (  # noqa: E402
    ParakeetEncoderAttention,
    ParakeetEncoderRelPositionalEncoding,
)

import keras_posenc  # noqa: E402
from keras_posenc import PositionalMultiHeadAttention  # noqa: E402

BATCH, FEATURES, HEADS = 4, 512, 8
KEY_DIM = FEATURES // HEADS


def torch_dense(weight):
    """A torch Linear's `(out, in)` weight as Keras' `(in, heads, dim)` kernel."""
    weight = weight.detach().numpy()
    return weight.T.reshape(weight.shape[1], HEADS, KEY_DIM)


def keras_attention(scheme, tokens, query, key, value, output):
    """The Keras attention holding the torch Linears' weights."""
    attention = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, position=scheme
    )
    attention(tokens[:1, :3], tokens[:1, :3])
    for dense, linear in (
        (attention._query_dense, query),
        (attention._key_dense, key),
        (attention._value_dense, value),
    ):
        dense.kernel.assign(torch_dense(linear.weight))
        dense.bias.assign(linear.bias.detach().numpy().reshape(HEADS, KEY_DIM))
    weight = output.weight.detach().numpy()  # (features, heads * dim)
    attention._output_dense.kernel.assign(weight.T.reshape(HEADS, KEY_DIM, FEATURES))
    attention._output_dense.bias.assign(output.bias.detach().numpy())
    return attention


def transformer_xl(tokens):
    """TransformerXLPosition and Parakeet's attention, as two calls."""
    config = ParakeetEncoderConfig(
        hidden_size=FEATURES,
        num_attention_heads=HEADS,
        num_hidden_layers=1,
        attention_dropout=0.0,
        attention_bias=True,
    )
    config._attn_implementation = "eager"
    reference = ParakeetEncoderAttention(config, layer_idx=0).eval()
    encode = ParakeetEncoderRelPositionalEncoding(config).eval()
    with torch.no_grad():  # the u and v biases start at zero
        reference.bias_u.normal_(std=0.1)
        reference.bias_v.normal_(std=0.1)
    attention = keras_attention(
        keras_posenc.TransformerXLPosition(),
        tokens,
        reference.q_proj,
        reference.k_proj,
        reference.v_proj,
        reference.o_proj,
    )
    scheme = attention.position
    scheme.position_kernel.assign(torch_dense(reference.relative_k_proj.weight))
    scheme.content_bias.assign(reference.bias_u.detach().numpy())
    scheme.position_bias.assign(reference.bias_v.detach().numpy())

    def run_reference():
        # ParakeetEncoder.forward: position_embeddings = self.encode_positions(...)
        return reference(tokens, encode(tokens))[0]

    return (lambda: attention(tokens, tokens)), run_reference


def disentangled(tokens):
    """DisentangledPosition and DeBERTa-v3-base's attention, as two calls."""
    config = DebertaV2Config(
        hidden_size=FEATURES,
        num_attention_heads=HEADS,
        num_hidden_layers=1,
        intermediate_size=4 * FEATURES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        relative_attention=True,
        position_buckets=256,
        max_relative_positions=512,
        pos_att_type=["c2p", "p2c"],
        share_att_key=True,
        norm_rel_ebd="layer_norm",
    )
    encoder = modeling_deberta_v2.DebertaV2Encoder(config).eval()
    layer = encoder.layer[0].attention
    reference, output = layer.self, layer.output.dense
    with torch.no_grad():  # LayerNorm starts at 1 and 0
        encoder.LayerNorm.weight.normal_(1.0, 0.1)
        encoder.LayerNorm.bias.normal_(std=0.1)
    attention = keras_attention(
        keras_posenc.DisentangledPosition(
            max_relative_positions=512, position_buckets=256, share_att_key=True
        ),
        tokens,
        reference.query_proj,
        reference.key_proj,
        reference.value_proj,
        output,
    )
    scheme = attention.position
    scheme.embeddings.assign(encoder.rel_embeddings.weight.detach().numpy())
    scheme.layer_norm_gamma.assign(encoder.LayerNorm.weight.detach().numpy())
    scheme.layer_norm_beta.assign(encoder.LayerNorm.bias.detach().numpy())
    batch, length = tokens.shape[:2]
    mask = torch.ones(batch, 1, length, length, dtype=torch.bool)  # DeBERTa needs one

    def run_reference():
        # DebertaV2Encoder.forward builds these once for its layers.
        context, _ = reference(
            tokens,
            mask,
            relative_pos=encoder.get_rel_pos(tokens),
            rel_embeddings=encoder.get_rel_embedding(),
        )
        return output(context)

    return (lambda: attention(tokens, tokens)), run_reference


SCHEMES = {
    "TransformerXLPosition": ("Parakeet", "TransformerXLPosition", transformer_xl),
    "DisentangledPosition": ("DeBERTa-v2", "DisentangledPosition", disentangled),
}


# The most each scheme's time may be, over its reference's.
TARGET = 1.0


def timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokens = torch.randn(BATCH, args.length, FEATURES)
    print(
        f"keras {keras.__version__} ({keras.backend.backend()}), torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads; batch {BATCH}, "
        f"length {args.length}, {FEATURES} features, {HEADS} heads of {KEY_DIM}"
    )
    rows = []
    order = random.Random(0)
    for name, (reference_name, attribute, make) in SCHEMES.items():
        if not hasattr(keras_posenc, attribute):
            print(f"{name}: not in this checkout, skipped")
            continue
        with torch.no_grad():
            ours, reference = make(tokens)
            expected = reference().numpy()
            difference = np.max(np.abs(keras.ops.convert_to_numpy(ours()) - expected))
            print(
                f"{name} vs {reference_name}: max |difference| {difference:.2e} "
                f"(outputs up to {np.max(np.abs(expected)):.2f})"
            )
            times = {"ours": [], "reference": []}
            candidates = [("ours", ours), ("reference", reference)]
            for _ in range(args.rounds):
                order.shuffle(candidates)
                for key, function in candidates:
                    times[key].append(timed(function))
        ratio = statistics.median(
            mine / theirs for mine, theirs in zip(times["ours"], times["reference"])
        )
        rows.append(
            (
                name,
                reference_name,
                args.length,
                1000 * statistics.median(times["ours"]),
                1000 * statistics.median(times["reference"]),
                ratio,
            )
        )
    print()
    print(
        "| scheme | reference | length | keras-posenc ms | reference ms | ratio "
        "| target | met |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, reference_name, length, mine, theirs, ratio in rows:
        met = "yes" if ratio <= TARGET else "no"
        print(
            f"| {name} | {reference_name} | {length} | {mine:.0f} | {theirs:.0f} "
            f"| {ratio:.2f} | <= {TARGET:.1f} | {met} |"
        )


if __name__ == "__main__":
    main()
