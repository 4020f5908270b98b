"""The encodings the lab trains and times: their names, labels and layers.

One registry serves every task of the demo, the benchmarks and the tables
they write: an encoding's name, the label of its row, the public layer
that makes it, where a model puts that layer, and the arguments it is made
with. A new encoding is one entry here.

Plain Python: the command reads the names for its `--help` without
importing Keras, and `build` imports the package only when called.
"""

import dataclasses

# Where a model puts an encoding's layer.
ROLES = (
    # No layer: the model without positions.
    "none",
    # Added to the token (or patch) embeddings before the first block.
    "embeddings",
    # The `position` of every `PositionalMultiHeadAttention` block.
    "attention",
    # Added to the node features, from the graph's adjacency.
    "nodes",
)

# What a model gives `build`, each taken by the encodings that name it.
MODEL_VALUES = ("num_heads", "sequence_length", "grid_shape", "seed")
# The trained length the language entries' lengths are set for: an
# entry's `scales` arguments hold their values at it, and `build`, given
# the model's `train_length`, scales them to that length.
TRAINED_LENGTH = 64


@dataclasses.dataclass(frozen=True)
class Encoding:
    """One encoding of the lab.

    Args:
        label: str. Its row's name in the tables.
        layer: str or None. The name of the public `keras_posenc` layer
            that makes it; `None` for no encoding.
        role: str. Where the model puts the layer, from `ROLES`.
        arguments: dict. The layer's constructor arguments.
        takes: tuple of str. The constructor arguments that come from the
            model (`num_heads`, `sequence_length`, `grid_shape`, `seed`),
            given to `build`.
        scales: tuple of str. The arguments that are set in proportion to
            the trained length: `arguments` holds their values for a model
            trained at `TRAINED_LENGTH` tokens.
        full_only: bool. Whether only `keras-posenc demo --full` (or
            `--encodings` naming it) trains it: the rows `make demo` leaves
            out to stay within its minutes (`config.DEMO_MINUTES`).
    """

    label: str
    layer: str = None
    role: str = "none"
    arguments: dict = dataclasses.field(default_factory=dict)
    takes: tuple = ()
    scales: tuple = ()
    full_only: bool = False


# The language task: a causal language model over a sequence. A new
# encoding goes last: an entry's place seeds its model's training data
# (`language._training_stream`), so that adding one changes no other row.
# `make demo` trains all but the `full_only` ones, within its minutes;
# `keras-posenc demo --full` trains all. The vision task's too.
LANGUAGE = {
    "none": Encoding("none"),
    "sinusoidal": Encoding(
        "sinusoidal", "SinusoidalPositionEncoding", "embeddings"
    ),
    "learned": Encoding(
        "learned",
        "PositionEmbedding",
        "embeddings",
        takes=("sequence_length",),
        full_only=True,
    ),
    "rope": Encoding("rope", "RotaryEmbedding", "attention"),
    "alibi": Encoding("alibi", "AlibiBias", "attention", takes=("num_heads",)),
    "shaw": Encoding(
        "shaw",
        "RelativePositionEmbedding",
        "attention",
        {"max_relative_position": 16},
        full_only=True,
    ),
    # Causal: T5's buckets of the decoder, 32 of them saturating at 128.
    "t5": Encoding(
        "t5",
        "RelativePositionBias",
        "attention",
        {"num_buckets": 32, "max_distance": 128, "bidirectional": False},
        takes=("num_heads",),
    ),
    # Transformer-XL's relative attention: sinusoidal relative positions
    # projected per head, with its content and position biases.
    "transformer_xl": Encoding(
        "transformer-xl", "TransformerXLPosition", "attention", full_only=True
    ),
    # DeBERTa's disentangled attention, both terms, its buckets as T5's
    # above: exact up to 16, logarithmic to 128.
    "deberta": Encoding(
        "deberta",
        "DisentangledPosition",
        "attention",
        {"position_buckets": 32, "max_relative_positions": 128},
        full_only=True,
    ),
    # Llama 4's layers without RoPE: no positions, the queries sharpened past
    # the trained length. Llama 4 sets floor_scale at its trained context
    # (8192), so that the temperature is 1 within it and grows beyond; here
    # at the trained length too, and at 8x (as Llama 4 at 64k) the factor
    # is 1 + 0.1 log(9), as Llama 4's there.
    "nope_temperature": Encoding(
        "NoPE + temperature",
        "AttentionTemperature",
        "attention",
        {"floor_scale": 64, "attn_scale": 0.1},
        scales=("floor_scale",),
        full_only=True,
    ),
    # KERPLE's log kernel, the form that extrapolated best in the paper,
    # its coefficients per head as the repository initializes them.
    "kerple": Encoding(
        "kerple (log)",
        "KerpleBias",
        "attention",
        takes=("num_heads",),
        full_only=True,
    ),
    # FIRE: an MLP of the distance over the query's position, log-scaled,
    # as the paper's appendix code builds it.
    "fire": Encoding(
        "fire", "FireBias", "attention", takes=("num_heads",), full_only=True
    ),
    # RoPE with xPos's decay per pair. Its paper sets the scale base at half
    # the trained length (512 for 1024 tokens); here too.
    "xpos": Encoding(
        "xpos",
        "XPosEmbedding",
        "attention",
        {"scale_base": 32.0},
        scales=("scale_base",),
    ),
    # CoPE: positions counted by gates of the logits. As many rows as the
    # training length: a training sequence's counts reach at most that
    # many (a gate is at most 1), so every row is trained; past it the
    # larger counts read the last row, clamped, never an untrained one.
    "cope": Encoding(
        "cope",
        "ContextualPosition",
        "attention",
        {"max_positions": 64},
        scales=("max_positions",),
        full_only=True,
    ),
}

# The vision task: a ViT over a grid of patches, with one class token.
# `learned` is added to the patch grid before it is flattened;
# `sinusoidal_raster` and `sinusoidal_2d` to the flattened tokens, the class
# token first (the 2-D encoding at the patches' grid positions); the rotary
# schemes and Swin's bias act in the attention, on those positions.
VISION = {
    "none": Encoding("none"),
    "learned": Encoding(
        "learned, not resized", "PositionEmbedding", "embeddings", takes=("grid_shape",)
    ),
    "sinusoidal_raster": Encoding(
        "sinusoidal 1-D, raster order",
        "SinusoidalPositionEncoding",
        "embeddings",
        {"num_prefix_tokens": 1},
        full_only=True,
    ),
    "sinusoidal_2d": Encoding(
        "sinusoidal 2-D",
        "SinusoidalPositionEncoding",
        "embeddings",
        {"num_axes": 2, "num_prefix_tokens": 1},
    ),
    "axial_rope": Encoding(
        "axial RoPE",
        "RotaryEmbedding",
        "attention",
        {"num_axes": 2, "num_prefix_tokens": 1},
    ),
    # Qwen2-VL's multimodal RoPE gives its (time, row, column) sections 16,
    # 24 and 24 of 64 rotary pairs; these are the same shares of a head's 8.
    "mrope": Encoding(
        "M-RoPE sections",
        "RotaryEmbedding",
        "attention",
        {
            "num_axes": 3,
            "axis_layout": "sections",
            "axis_sections": [2, 3, 3],
            "num_prefix_tokens": 1,
        },
        full_only=True,
    ),
    "swin_bias": Encoding(
        "Swin relative bias",
        "GridRelativePositionBias",
        "attention",
        {"num_prefix_tokens": 1},
        takes=("num_heads", "grid_shape"),
        full_only=True,
    ),
}

# The graph task: a graph transformer over a graph's nodes.
GRAPH = {
    "none": Encoding("none"),
    "laplacian": Encoding(
        "Laplacian eigenvectors",
        "LaplacianPositionEncoding",
        "nodes",
        {"k": 8},
        takes=("seed",),
    ),
    "random_walk": Encoding(
        "random-walk probabilities",
        "RandomWalkPositionEncoding",
        "nodes",
        {"steps": 8},
    ),
    "shortest_path": Encoding(
        "shortest-path bias",
        "ShortestPathBias",
        "attention",
        {"max_hops": 6},
        takes=("num_heads",),
    ),
}

TASKS = {"language": LANGUAGE, "vision": VISION, "graph": GRAPH}


def build(task, name, role=None, **context):
    """A fresh layer of encoding `name` of `task`, or `None`.

    Args:
        task: str. A key of `TASKS`.
        name: str. An encoding of that task.
        role: str or None. When given, `None` unless the encoding's role is
            this one: a model asks for the layer of each place it has.
            Defaults to `None`.
        **context: the model's values of the arguments the encoding
            `takes`, its `train_length` (the arguments the encoding
            `scales` are scaled from `TRAINED_LENGTH` to it), and any
            argument that replaces the registry's (a RoPE scaling, a
            table's interpolation); the others are ignored.

    Returns:
        A `keras_posenc` layer, or `None` for an encoding with no layer or
        of another role.
    """
    encoding = TASKS[task][name]
    if encoding.layer is None or role not in (None, encoding.role):
        return None
    import keras_posenc

    arguments = dict(encoding.arguments)
    train_length = context.pop("train_length", TRAINED_LENGTH)
    for argument in encoding.scales:
        value = arguments[argument] * train_length / TRAINED_LENGTH
        # A count stays an int: 64 rows at 64 tokens are 512 at 512.
        arguments[argument] = (
            round(value) if isinstance(arguments[argument], int) else value
        )
    arguments.update(
        (key, value)
        for key, value in context.items()
        if key in encoding.takes or key not in MODEL_VALUES
    )
    return getattr(keras_posenc, encoding.layer)(**arguments)


def full_only(task):
    """The names of `task`'s encodings that only `--full` runs train."""
    return tuple(name for name, encoding in TASKS[task].items() if encoding.full_only)


def labels(task):
    """`{name: label}` of `task`'s encodings, in the registry's order."""
    return {name: encoding.label for name, encoding in TASKS[task].items()}
