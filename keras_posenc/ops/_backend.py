"""The one place where the package asks which Keras backend it runs on.

Everything else computes with `keras.ops`. What `keras.ops` does not say
(whether a value is known before the program runs, whether a check can
raise where it stands, whether float32 matmuls keep float32) differs by
backend, and is answered here, for TensorFlow, JAX and PyTorch. Each
backend's library is imported only when it is the one in use.
"""

import contextlib
import dataclasses
import functools
import importlib.util
import re
import warnings

import keras
import numpy as np


def backend():
    """The name of Keras' backend: `"tensorflow"`, `"jax"` or `"torch"`."""
    return keras.backend.backend()


def is_integer(value):
    """Whether `value` is a tensor (or array) of an integer dtype."""
    dtype = keras.backend.standardize_dtype(value.dtype)
    return dtype.startswith("int") or dtype.startswith("uint")


def is_symbolic(value):
    """Whether `value` has no value yet: a Keras input, a trace, a graph."""
    if isinstance(value, keras.KerasTensor):
        return True
    name = backend()
    if name == "tensorflow":
        import tensorflow as tf

        return tf.is_tensor(value) and tf.get_static_value(value) is None
    if name == "jax":
        import jax

        return isinstance(value, jax.core.Tracer)
    if name == "torch":
        import torch

        return keras.ops.is_tensor(value) and (
            value.device.type == "meta" or torch.compiler.is_compiling()
        )
    return False


def static_value(value):
    """`value` as a NumPy array where it is known as the program is built.

    Python numbers and NumPy arrays are known; a tensor is known in eager
    mode, and a TensorFlow graph knows its constants. Returns `None` for a
    value known only when the program runs (a trace, a graph's input).
    """
    if not keras.ops.is_tensor(value) and not isinstance(value, keras.KerasTensor):
        return np.asarray(value)
    if backend() == "tensorflow":
        import tensorflow as tf

        if isinstance(value, keras.KerasTensor):
            return None
        return tf.get_static_value(value)
    if is_symbolic(value):
        return None
    if backend() == "torch":
        import torch

        # Keras' conversion calls `np.array` on the tensor, whose
        # `__array__` lacks NumPy 2's `copy` keyword: a DeprecationWarning.
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.detach().cpu().numpy()
    return keras.ops.convert_to_numpy(value)


def ignoring_warnings(message, category=UserWarning):
    """A context in which warnings matching `message` are not shown.

    `warnings.catch_warnings`, but where PyTorch's compiler traces the code,
    which cannot trace it and would break its graph there: there nothing.
    """
    if backend() == "torch":
        import torch

        if torch.compiler.is_compiling():
            return contextlib.nullcontext()
    context = warnings.catch_warnings()

    @contextlib.contextmanager
    def ignoring():
        with context:
            warnings.filterwarnings("ignore", message, category)
            yield

    return ignoring()


def executing_eagerly():
    """Whether ops run as they are called (no `tf.function` being traced).

    On JAX and PyTorch a trace is told by its values (`is_symbolic`); this
    is TensorFlow's own answer, true on the other backends.
    """
    if backend() == "tensorflow":
        import tensorflow as tf

        return tf.executing_eagerly()
    return True


def unconverted(function):
    """`function`, kept from TensorFlow's AutoGraph; itself elsewhere.

    `tf.map_fn` hands its body to AutoGraph, eagerly too, unless its caller
    turned AutoGraph off (Keras' own training and prediction functions do).
    The package's code is written in `keras.ops` for graphs as it is, with
    no Python control flow on tensors to convert, and converting the
    attention's blocks rewrote its whole call path: 8 to 16 s of an eager
    call's first run past the blocks' size.
    """
    if backend() == "tensorflow":
        import tensorflow as tf

        return tf.autograph.experimental.do_not_convert(function)
    return function


def checked(value, condition, message, summary=(), summarize=3):
    """`value`, once the boolean tensor `condition` is known to hold.

    Where `condition` has a value (eager mode, any backend), a false one
    raises `ValueError(message)` at once. In a TensorFlow graph the check
    runs with the graph and raises `InvalidArgumentError` with `message`
    (and the tensors of `summary`); XLA drops it. A JAX or PyTorch trace
    cannot raise: there the value passes unchecked.

    Args:
        value: tensor. What the check guards.
        condition: bool tensor, any shape: all must be true.
        message: str. Static: XLA has no strings at run time.
        summary: tuple of tensors printed after `message` by TensorFlow's
            graph check.
        summarize: int. How many entries of each it prints.

    Returns:
        `value`, in TensorFlow graphs after the check.
    """
    known = static_value(condition)
    if known is not None:
        if not np.all(known):
            raise ValueError(message)
        return value
    if backend() == "tensorflow" and not isinstance(condition, keras.KerasTensor):
        import tensorflow as tf

        assertion = tf.debugging.Assert(
            tf.reduce_all(condition),
            [message, *summary],
            summarize=summarize,
        )
        with tf.control_dependencies([assertion]):
            return tf.identity(value)
    return value


def checked_or_nan(value, valid, message):
    """`value`, checked: an error where one can be raised, NaN where not.

    Where `valid` has a value (eager mode, any backend), a false entry
    raises `ValueError(message)` at once. Elsewhere the entries of `value`
    where `valid` is false become NaN, as JAX's `take(..., mode="fill")`
    fills rows it cannot read, so that compiled code shows a bad input
    rather than a plausible number: XLA drops run-time assertions, and a
    JAX or PyTorch trace cannot raise. A TensorFlow graph run without XLA
    also raises `InvalidArgumentError` with `message` (see `checked`).

    Args:
        value: float tensor.
        valid: bool tensor that broadcasts to `value`'s shape.
        message: str. Static: XLA has no strings at run time.

    Returns:
        A tensor of `value`'s shape and dtype, equal to it where `valid`.
    """
    known = static_value(valid)
    if known is not None:
        if not np.all(known):
            raise ValueError(message)
        return value
    value = keras.ops.where(valid, value, float("nan"))
    return checked(value, keras.ops.all(valid), message)


def float32_matmul_is_exact():
    """Whether float32 matmuls on this machine keep float32's precision.

    TPUs multiply float32 in bfloat16 passes, and GPUs with TensorFloat-32
    enabled (TensorFlow's and JAX's default on Ampere and later) round the
    factors to 10 bits: a product of positions and slopes then loses the
    exact values that an identity needs.
    """
    name = backend()
    if name == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("TPU"):
            return False
        return not (
            tf.config.list_logical_devices("GPU")
            and tf.config.experimental.tensor_float_32_execution_enabled()
        )
    if name == "jax":
        import jax

        platform = jax.default_backend()
        if platform == "cpu":
            return True
        return platform == "gpu" and jax.config.jax_default_matmul_precision in (
            "highest",
            "float32",
        )
    if name == "torch":
        import torch

        return not (
            torch.cuda.is_available()
            and torch.get_float32_matmul_precision() != "highest"
        )
    return True


def sums_product_columns_in_order():
    """Whether a float32 product's first columns are summed before the rest.

    Where the bias joins the logits' product as its first columns
    (`AttentionPosition.logits_factors`), its terms cancel exactly only
    if they are summed first. JAX's products and PyTorch's do; TensorFlow's
    may not, eagerly or under XLA (Eigen's contraction sums by blocks of
    the summed axis on some processors and versions, TensorFlow 2.18's
    XLA too): there the bias is added instead.
    """
    return backend() != "tensorflow"


def take_in_range(x, indices):
    """`keras.ops.take(x, indices, axis=0)`, for indices known in range.

    `keras.ops.take` on TensorFlow first maps negative indices up, a compare,
    an add and a select per index that XLA keeps inside the fused gather
    (it cannot tell the indices are never negative); on PyTorch it makes
    them passes of their own. Indices from a clipped distance never are:
    on TensorFlow this is `tf.gather` alone, on PyTorch `index_select`;
    elsewhere `keras.ops.take`.

    Args:
        x: tensor. The rows to read, along its first axis.
        indices: integer tensor, every entry in `[0, x.shape[0])`.

    Returns:
        A tensor of shape `indices.shape + x.shape[1:]`.
    """
    symbolic = isinstance(x, keras.KerasTensor) or isinstance(
        indices, keras.KerasTensor
    )
    if backend() == "tensorflow" and not symbolic:
        import tensorflow as tf

        return tf.gather(x, indices)
    if backend() == "torch" and not symbolic:
        import torch

        # Keras' `take` on PyTorch maps negative indices up and casts them
        # to int64, three passes over the indices before the gather.
        x = keras.ops.convert_to_tensor(x)
        indices = keras.ops.convert_to_tensor(indices)
        return torch.index_select(x, 0, indices.reshape(-1)).reshape(
            tuple(indices.shape) + tuple(x.shape[1:])
        )
    return keras.ops.take(x, indices, axis=0)


def dot_product_attention_needs_equal_head_sizes():
    """Whether Keras' fused attention fails on values of another head size.

    `keras.layers.MultiHeadAttention` hands its projected heads to
    `keras.ops.dot_product_attention` when no scores and no dropout are
    asked for. Keras' JAX backend (3.8 to 3.15) reshapes that output to
    the queries' shape, so a `value_dim` other than `key_dim` fails there;
    TensorFlow's and PyTorch's take any.
    """
    return backend() == "jax"


@functools.lru_cache(maxsize=None)
def _jax_on_the_cpu():
    """Whether the backend is JAX and its default device a CPU."""
    if backend() != "jax":
        return False
    import jax

    return jax.default_backend() == "cpu"


# The first jaxlib whose XLA fuses Keras' attention whole on the CPU, as
# measured: 0.5.0 to 0.10.1 write the logits in either order.
FUSED_ATTENTION_JAXLIB = (0, 10, 2)


@functools.lru_cache(maxsize=None)
def fuses_attention():
    """Whether XLA fuses Keras' attention whole, in Keras' order.

    Keras' einsum path computes the logits, takes the softmax, its weights
    divided by their sums, and multiplies them by the values. JAX's XLA
    on the CPU (jaxlib 0.10.2 and later) runs all of that as one kernel
    that writes no logits, where the sizes suit it (measured: 256 to 2048
    keys of 64 features at batch 2 and 4; not 128 keys of 16 features,
    nor 2048 keys at batch 1). It takes into that kernel a bias computed
    element by element from vectors (ALiBi's `m j - m i`) or read from a
    tensor; a division after the values' product, a check for a zero sum
    or an integer subtraction of the logits' size splits it. So there the
    attention keeps Keras' order, and it writes the logits no more often
    than Keras where XLA does not fuse. Elsewhere XLA writes the logits
    whatever the order, and the attention divides after the values'
    product (one pass fewer over the logits), adds a bias of rank two as
    columns of the product, and bounds a bias by blocks of keys.
    """
    if not _jax_on_the_cpu():
        return False
    import jaxlib

    version = tuple(int(part) for part in re.findall(r"\d+", jaxlib.__version__)[:3])
    return version >= FUSED_ATTENTION_JAXLIB


def writes_every_tensor():
    """Whether each op writes its whole output: PyTorch, run eagerly.

    No compiler fuses the attention's element-wise steps there, so each
    step of a block of logits is a tensor of the block's size.
    """
    if backend() != "torch":
        return False
    import torch

    return not torch.compiler.is_compiling()


def computes_tables_apart():
    """Whether XLA computes a small table again in each of its readers.

    XLA's CPU backend on JAX fuses a cheap-looking element-wise op into
    each reader and computes it again there: RoPE's cosines and sines of
    the angles, read by a rotation over the batch and the heads, are then
    computed once per query and key feature, once for each batch entry
    and head. There such tables are made tensors of their own
    (`computed_apart`). TensorFlow folds them into constants at the
    default positions.
    """
    return _jax_on_the_cpu()


def computed_apart(x):
    """`x`, as a tensor of its own that its readers read, where that helps.

    Where `computes_tables_apart()`: a matrix product is never fused into
    a loop, and an optimization barrier is removed before fusion, so `x`
    passes through a product with the identity, exact in float32 (each
    entry is `x * 1` plus zeros). Elsewhere `x` itself.

    Args:
        x: float tensor of rank 1 or more.

    Returns:
        A tensor equal to `x`.
    """
    if not computes_tables_apart():
        return x
    import jax

    identity = jax.numpy.eye(x.shape[-1], dtype=x.dtype)
    return jax.numpy.matmul(x, identity, precision=jax.lax.Precision.HIGHEST)


def take_along_last_axis(values, indices):
    """`values`' entries along its last axis at `indices`, broadcast.

    On PyTorch one `torch.gather` of the indices expanded, a view, where
    `keras.ops.take_along_axis` maps negative indices up over the whole
    expanded index first; elsewhere `keras.ops.take_along_axis`.

    Args:
        values: tensor of shape `(..., count)`.
        indices: integer tensor broadcastable to `values`' leading axes
            with a last axis of its own, every entry in `[0, count)`.

    Returns:
        A tensor of shape `values.shape[:-1] + indices.shape[-1:]`.
    """
    shape = tuple(keras.ops.shape(values)[:-1]) + tuple(keras.ops.shape(indices)[-1:])
    if backend() == "torch" and not is_symbolic(values) and not is_symbolic(indices):
        import torch

        return torch.gather(values, -1, indices.to(torch.int64).expand(shape))
    return keras.ops.take_along_axis(
        values, keras.ops.broadcast_to(indices, shape), axis=-1
    )


def per_query_table_block():
    """The queries of a block for a bias read from a table per query.

    On TensorFlow, 1024, so that up to 1024 queries the attention is one
    block (its loop over blocks costs more than the blocks' tensors save);
    elsewhere 256, so that on JAX's CPU, whose fused kernel takes a block's
    logits, they stay small.
    """
    return 1024 if backend() == "tensorflow" else 256


def dot_at_rows(query, table, rows):
    """`query[b, i, n] . table[rows[b, i, j], n]` for every query and key.

    Each query's product with every row of the table, then each pair's
    row of it (DeBERTa's content-to-position term). On PyTorch the rows
    last, read along that axis, as Hugging Face reads them
    (`torch.gather`), `rows` not copied for every batch entry; elsewhere
    the heads last, so that the gather reads contiguous rows and XLA fuses
    it, and the transpose after it, into the logits' sum.

    Args:
        query: float tensor of shape `(batch, query, heads, dim)`.
        table: float tensor of shape `(rows, heads, dim)`.
        rows: int32 tensor of shape `(batch or 1, query, key)`, entries in
            `[0, rows)`.

    Returns:
        A tensor of shape `(batch, heads, query, key)`.
    """
    if backend() == "torch":
        per_row = keras.ops.einsum("btnd,rnd->bntr", query, table)  # (batch, heads, query, rows)
        return take_along_last_axis(per_row, rows[:, None])
    batch_size, queries = keras.ops.shape(query)[:2]
    rows = keras.ops.broadcast_to(
        rows, (batch_size, queries, keras.ops.shape(rows)[2])
    )  # (batch, query, key)
    per_row = keras.ops.einsum("btnd,rnd->btrn", query, table)  # (batch, query, rows, heads)
    return keras.ops.transpose(
        take_rows_per_query(per_row, rows), [0, 3, 1, 2]
    )  # (batch, heads, query, key)


def take_rows_per_key(values, rows):
    """Each key `j`'s entry of row `rows[b, i, j]`: `values[b, n, rows, j]`.

    Keys last in the table, so that the keys of one query read one row
    where their row is the same (most of DeBERTa's log buckets, at long
    lengths), one after another; with the rows last, each key would read
    a row of its own. The table is read as one row of `rows * key`
    entries per batch entry and head: on PyTorch along that row
    (`take_along_last_axis`), `rows` of batch 1 read by every batch entry
    as they are; elsewhere by `take_rows_per_query`.

    Args:
        values: float tensor of shape `(batch, heads, rows, key)`.
        rows: int32 tensor of shape `(batch or 1, query, key)`, entries in
            `[0, rows)`.

    Returns:
        A tensor of shape `(batch, heads, query, key)`.
    """
    batch_size, heads, count, keys = keras.ops.shape(values)
    queries = keras.ops.shape(rows)[1]
    entries = rows * keys + keras.ops.arange(keys, dtype="int32")  # (batch or 1, query, key)
    if backend() == "torch":
        taken = take_along_last_axis(
            keras.ops.reshape(values, (batch_size, heads, count * keys)),
            keras.ops.reshape(entries, (-1, 1, queries * keys)),
        )  # (batch, heads, query * key)
        return keras.ops.reshape(taken, (batch_size, heads, queries, keys))
    entries = keras.ops.broadcast_to(
        keras.ops.reshape(entries, (-1, 1, queries * keys)),
        (batch_size, heads, queries * keys),
    )  # (batch, heads, query * key)
    taken = take_rows_per_query(
        keras.ops.reshape(values, (batch_size, heads, count * keys, 1)), entries
    )  # (batch, heads, query * key, 1)
    return keras.ops.reshape(taken, (batch_size, heads, queries, keys))


def take_rows_per_query(values, rows):
    """Each `(batch, query)`'s rows `rows[b, q]` of its own `values[b, q]`.

    On TensorFlow one `tf.gather` with two batch dimensions, which XLA
    fuses into its consumer reading contiguous rows, faster than a gather
    of a flattened table with computed indices; elsewhere that flattened
    gather.

    Args:
        values: tensor of shape `(batch, query, rows, features)`.
        rows: integer tensor of shape `(batch, query, key)`, entries in
            `[0, rows)`.

    Returns:
        A tensor of shape `(batch, query, key, features)`.
    """
    symbolic = isinstance(values, keras.KerasTensor) or isinstance(
        rows, keras.KerasTensor
    )
    if backend() == "tensorflow" and not symbolic:
        import tensorflow as tf

        return tf.gather(values, rows, axis=2, batch_dims=2)
    batch_size, queries, count, features = keras.ops.shape(values)
    starts = keras.ops.reshape(
        keras.ops.arange(batch_size * queries, dtype="int32") * count,
        (batch_size, queries, 1),
    )  # (batch, query, 1): where each pair's rows start, flattened
    taken = take_in_range(keras.ops.reshape(values, (-1, features)), starts + rows)
    # Shaped again: Keras' JAX `take` of no indices drops their axes.
    return keras.ops.reshape(
        taken, (batch_size, queries, keras.ops.shape(rows)[2], features)
    )  # (batch, query, key, features)


def read_at(table, *indices):
    """`table[indices]`, each index an integer tensor, broadcast together.

    Pointwise: the form a scheme's `score_bias` reads its small tables in,
    called with whole grids of indices (the reference's bias) or, inside
    PyTorch's FlexAttention, with one index of each, where only Python's
    indexing of a tensor is traced. On PyTorch that indexing; elsewhere one
    `keras.ops.take` of the flattened table at the flattened index.

    Args:
        table: tensor of rank `len(indices)`.
        *indices: integer tensors (or Python ints) that broadcast together,
            each in `[0, table.shape[axis])` along its axis.

    Returns:
        A tensor of the indices' broadcast shape.
    """
    if backend() == "torch" and not isinstance(table, keras.KerasTensor):
        import torch

        return table[
            tuple(
                index if isinstance(index, int) else index.to(torch.int64)
                for index in indices
            )
        ]
    flat = 0
    for size, index in zip(tuple(table.shape), indices):
        flat = flat * size + (
            index if isinstance(index, int) else keras.ops.cast(index, "int32")
        )
    return keras.ops.take(keras.ops.reshape(table, (-1,)), flat)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What the backend and its device offer the attention's kernel.

    One object, asked once per call: the kernel's paths say which calls
    they accept from it, so no other place asks the backend.

    Attributes:
        backend: str. Keras' backend, `"tensorflow"`, `"jax"` or `"torch"`.
        device: str. The default device's kind: `"cpu"`, `"gpu"` or `"tpu"`.
        fused: bool. Whether `fused_attention` is there to call
            (`has_fused_attention`).
        low_precision_fused: bool. Whether the fused kernel takes bfloat16
            and float16 heads, their bias too, at their own precision
            (SDPA and JAX's cuDNN attention on GPUs; on CPUs the reference's
            float32 logits are kept).
        flex: bool. Whether PyTorch's FlexAttention computes a scheme's
            `score_bias` inside the kernel (on CUDA, where torch has it).
        flex_compiles: bool. Whether FlexAttention runs compiled
            (`torch.compile`, on GPUs), else eagerly, as on the CPU.
        flex_trains: bool. Whether FlexAttention has a backward pass on
            this device (not on the CPU).
    """

    backend: str
    device: str
    fused: bool
    low_precision_fused: bool = False
    flex: bool = False
    flex_compiles: bool = False
    flex_trains: bool = False


@functools.lru_cache(maxsize=None)
def capabilities():
    """The `Capabilities` of this backend and its default device."""
    name = backend()
    device = "cpu"
    flex = False
    if name == "torch":
        import torch

        device = "gpu" if torch.cuda.is_available() else "cpu"
        flex = device == "gpu" and (
            importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
        )
    elif name == "jax":
        import jax

        device = {"cpu": "cpu", "tpu": "tpu"}.get(jax.default_backend(), "gpu")
    elif name == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("TPU"):
            device = "tpu"
        elif tf.config.list_logical_devices("GPU"):
            device = "gpu"
    return Capabilities(
        backend=name,
        device=device,
        fused=has_fused_attention(),
        low_precision_fused=name in ("torch", "jax") and device == "gpu",
        flex=flex,
        flex_compiles=flex,
        flex_trains=flex,
    )


def records_gradient():
    """Whether the backend records a gradient of what is computed now.

    PyTorch's `torch.is_grad_enabled()`; elsewhere a gradient is taken of
    a function, and may be of any call: True.
    """
    if backend() != "torch":
        return True
    import torch

    return torch.is_grad_enabled()


# The (scheme, dtype, shapes) of calls that FlexAttention failed to run:
# they go to the next path, with one warning each.
_FLEX_FAILURES = set()
FLEX_BLOCK = 128


@functools.lru_cache(maxsize=None)
def _compiled_flex_attention():
    """`flex_attention` under `torch.compile`, made once per process."""
    import torch
    from torch.nn.attention import flex_attention

    return torch.compile(flex_attention.flex_attention, dynamic=False)


def _band_block_mask(mask_mod, queries, keys, first, low, high, device):
    """FlexAttention's blocks where `low <= key - (query + first) <= high`.

    Each block of `FLEX_BLOCK` queries and keys is empty (skipped), full
    (no mask read) or partial (`mask_mod` read), from the range of `key -
    query` over it: no tensor of the logits' size is made.
    """
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    query_blocks = -(-queries // FLEX_BLOCK)
    key_blocks = -(-keys // FLEX_BLOCK)
    rows = torch.arange(query_blocks, device=device)[:, None]
    columns = torch.arange(key_blocks, device=device)[None, :]
    first_query = rows * FLEX_BLOCK + first
    last_query = torch.clamp((rows + 1) * FLEX_BLOCK, max=queries) - 1 + first
    first_key = columns * FLEX_BLOCK
    last_key = torch.clamp((columns + 1) * FLEX_BLOCK, max=keys) - 1
    smallest, largest = first_key - last_query, last_key - first_query
    inside = torch.ones_like(smallest, dtype=torch.bool)
    meets = torch.ones_like(inside)
    if low is not None:
        inside &= smallest >= low
        meets &= largest >= low
    if high is not None:
        inside &= largest <= high
        meets &= smallest <= high
    partial = meets & ~inside  # (query blocks, key blocks)

    def listed(flags):
        count = flags.sum(-1, dtype=torch.int32)
        # The flagged blocks first, in order: a stable sort of the others after.
        order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True)
        return count[None, None], order.to(torch.int32)[None, None]

    return BlockMask.from_kv_blocks(
        *listed(partial),
        *listed(inside),
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(queries, keys),
    )


def _dense_block_mask(mask_mod, queries, keys, device):
    """FlexAttention's blocks, every one read with `mask_mod`."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    query_blocks = -(-queries // FLEX_BLOCK)
    key_blocks = -(-keys // FLEX_BLOCK)
    count = torch.full((1, 1, query_blocks), key_blocks, dtype=torch.int32, device=device)
    order = torch.arange(key_blocks, dtype=torch.int32, device=device).expand(
        1, 1, query_blocks, key_blocks
    )
    return BlockMask.from_kv_blocks(
        count,
        order.contiguous(),
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(queries, keys),
    )


def flex_attention(
    query, key, value, score_mod, mask_mod=None, band=None, compiled=True, name=""
):
    """PyTorch's FlexAttention of scaled heads, a bias added inside the kernel.

    Compiled once per process (`torch.compile` then keeps one kernel per
    scheme, dtype and shape), or eager where `compiled` is False. Where
    FlexAttention fails for a kind of call (a kernel that does not
    compile, say), it warns once, in one line, and returns None for that
    kind from then on, so that the caller takes its next path.

    Args:
        query: tensor of shape `(batch, query, heads, key_dim)`, scaled.
        key: tensor of shape `(batch, key, key/value heads, key_dim)`.
        value: tensor of shape `(batch, key, key/value heads, value_dim)`.
        score_mod: function `(score, batch, head, query, key)` to the
            score, FlexAttention's.
        mask_mod: None, or a function `(batch, head, query, key)` to a
            bool, True where the query attends to the key.
        band: None, or `(first, low, high)`, for a `mask_mod` that holds
            inside `low <= key - (query + first) <= high` alone (either
            bound None): the blocks outside are skipped.
        compiled: bool. Whether to run the compiled kernel.
        name: str. What the warning names (the scheme).

    Returns:
        A tensor of shape `(batch, query, heads, value_dim)`, or None.
    """
    import torch
    from torch.nn.attention import flex_attention as flex

    failure = (name, query.dtype, tuple(query.shape), tuple(key.shape), mask_mod is None)
    if failure in _FLEX_FAILURES:
        return None
    query_, key_, value_ = (torch.transpose(x, 1, 2) for x in (query, key, value))
    queries, keys = query_.shape[2], key_.shape[2]
    block_mask = None
    if mask_mod is not None:
        if band is not None:
            block_mask = _band_block_mask(mask_mod, queries, keys, *band, query.device)
        else:
            block_mask = _dense_block_mask(mask_mod, queries, keys, query.device)
    arguments = dict(score_mod=score_mod, block_mask=block_mask, scale=1.0)
    if query_.shape[1] != key_.shape[1]:
        arguments["enable_gqa"] = True
    if torch.compiler.is_compiling():
        # Inside a compiled model, whose compiler takes it in.
        output = flex.flex_attention(query_, key_, value_, **arguments)
        return torch.transpose(output, 1, 2)
    attend = _compiled_flex_attention() if compiled else flex.flex_attention
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", "flex_attention called without torch.compile", UserWarning
            )
            output = attend(query_, key_, value_, **arguments)
    except Exception as error:  # noqa: BLE001: any failure falls back, once
        _FLEX_FAILURES.add(failure)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(
            f"FlexAttention failed for {name} in {query.dtype} at "
            f"{tuple(query.shape)}, which takes PyTorch's SDPA from now on: "
            f"{reason[:200]}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return torch.transpose(output, 1, 2)  # (batch, query, heads, value_dim)


def has_fused_attention():
    """Whether this backend's device has a fused attention kernel to call.

    PyTorch's `scaled_dot_product_attention` (SDPA) on any device: its
    flash kernel for the CPU keeps memory linear in length, a mask or a
    bias included. JAX's `dot_product_attention` on GPUs and TPUs (cuDNN's
    flash attention where asked). Not on JAX's CPU, where XLA writes the
    logits whole and the attention's own blocks are faster, nor on
    TensorFlow, which has no such kernel.
    """
    name = backend()
    if name == "torch":
        return True
    return name == "jax" and not _jax_on_the_cpu()


def takes_cudnn(dtype):
    """Whether JAX's attention of heads in `dtype` goes to cuDNN's kernel.

    On JAX's GPUs in bfloat16 and float16, which cuDNN's fused attention
    takes with a bias; float32 stays with XLA, which cuDNN refuses.
    """
    return (
        backend() == "jax"
        and capabilities().device == "gpu"
        and keras.backend.standardize_dtype(dtype) in ("bfloat16", "float16")
    )


def fused_attention_writes_logits(flash_attention):
    """Whether `fused_attention` writes the whole logits in memory.

    PyTorch's SDPA keeps them in blocks (its flash and memory-efficient
    kernels, on the CPU too); JAX's `dot_product_attention` writes them
    but for cuDNN's flash attention.
    """
    return backend() == "jax" and not flash_attention


def fused_attention(
    query, key, value, bias=None, mask=None, is_causal=False, flash_attention=False
):
    """The backend's fused attention of scaled heads: SDPA or JAX's kernel.

    The queries come multiplied by the logits' scale already. Where `mask`
    leaves a query no key, its output is zero, as the attention's
    reference kernel gives (the fused kernels would give NaN or the mean
    of the values); a query holding NaN gives NaN, as there.

    Args:
        query: tensor of shape `(batch, query, heads, key_dim)`, scaled.
        key: tensor of shape `(batch, key, key/value heads, key_dim)`: as
            many heads, or fewer dividing them (grouped-query attention,
            query head `h` reading key/value head `h // groups`).
        value: tensor of shape `(batch, key, key/value heads, value_dim)`.
        bias: None, or a float tensor broadcastable to `(batch, heads,
            query, key)`, in the queries' dtype.
        mask: None, or a bool tensor broadcastable to `(batch, heads,
            query, key)`: True where a query attends to a key.
        is_causal: bool. Whether to mask keys after each query by index
            (queries and keys both from index 0); only without `mask`.
        flash_attention: bool. Whether to ask for the flash kernel (SDPA's
            flash backend on PyTorch, cuDNN on JAX).

    Returns:
        A tensor of shape `(batch, query, heads, value_dim)`.
    """
    cudnn = takes_cudnn(query.dtype)
    if flash_attention and not (
        backend() == "torch" or (backend() == "jax" and not _jax_on_the_cpu())
    ):
        raise ValueError(
            "`flash_attention=True` needs a flash kernel: PyTorch's (on any "
            "device) or cuDNN's on JAX's GPUs. Keras' "
            f"{backend()} backend on this device has none. Received: "
            "flash_attention=True"
        )
    has_key = None
    if mask is not None:
        has_key = keras.ops.any(mask, axis=-1, keepdims=True)  # (b | 1, n | 1, t, 1)
        mask = keras.ops.logical_or(mask, keras.ops.logical_not(has_key))
        if bias is not None:
            bias = keras.ops.where(mask, bias, float("-inf"))
            mask = None
    if backend() == "torch":
        import torch

        def heads_first(x):
            return torch.transpose(x, 1, 2)

        attend = dict(attn_mask=bias if mask is None else mask, is_causal=is_causal)
        query_, key_, value_ = map(heads_first, (query, key, value))
        groups = query_.shape[1] // key_.shape[1]
        if groups > 1:
            attend["enable_gqa"] = True
        # SDPA gives a query holding NaN (xPos's sign of a position out of
        # its range) an output of zeros, and with a mask or a bias passes a
        # key's NaN on to every query, those that mask the key too. So the
        # queries' NaN is passed on, and a NaN key is read as zeros with
        # NaN given to the queries that attend to it, as the reference
        # kernel gives them. On an accelerator, or compiled, that is done
        # whatever the values, with no test on the host, which would wait
        # for the device and break the graph; eagerly on the CPU, where a
        # test costs nothing, only where a sum shows a NaN (one pass each).
        on_host = query_.device.type == "cpu" and not torch.compiler.is_compiling()
        nan_queries = reads_nan = None
        if not on_host or torch.isnan(torch.sum(query_) + torch.sum(key_)):
            nan_queries = torch.isnan(query_).any(-1, keepdim=True)  # (b, h, t, 1)
            nan_keys = torch.isnan(key_).any(-1)  # (batch, key/value heads, key)
            if attend["attn_mask"] is not None and (not on_host or nan_keys.any()):
                key_ = torch.where(nan_keys[..., None], 0.0, key_)
                attended = (
                    mask if mask is not None else bias > float("-inf")
                )  # (batch | 1, heads | 1, query, key)
                # Each query head reads its group's key/value head.
                nan_keys = torch.repeat_interleave(nan_keys, groups, dim=1)
                reads_nan = (attended & nan_keys[:, :, None]).any(-1, keepdim=True)
        if flash_attention:
            with torch.nn.attention.sdpa_kernel(
                [torch.nn.attention.SDPBackend.FLASH_ATTENTION]
            ):
                output = torch.nn.functional.scaled_dot_product_attention(
                    query_, key_, value_, scale=1.0, **attend
                )
        else:
            output = torch.nn.functional.scaled_dot_product_attention(
                query_, key_, value_, scale=1.0, **attend
            )
        for nan in (nan_queries, reads_nan):
            if nan is not None:
                output = torch.where(nan, float("nan"), output)
        output = heads_first(output)  # (batch, query, heads, value_dim)
    else:
        import jax

        arguments = dict(bias=bias, mask=mask, scale=1.0, is_causal=is_causal)
        if flash_attention and capabilities().device == "tpu":
            # Keras' own flash attention on TPUs (Pallas' splash attention).
            output = keras.ops.dot_product_attention(
                query, key, value, flash_attention=True, **arguments
            )
        else:
            output = jax.nn.dot_product_attention(
                query,
                key,
                value,
                implementation="cudnn" if flash_attention or cudnn else None,
                **arguments,
            )  # (batch, query, heads, value_dim)
    if has_key is not None:
        output = keras.ops.where(
            keras.ops.transpose(has_key, [0, 2, 1, 3]), output, 0.0
        )
    return output


def count_below(thresholds, x):
    """The number of entries of `thresholds` below each entry of `x`, int32.

    On PyTorch a binary search of the sorted thresholds: eager PyTorch would
    write the comparisons whole, a tensor of `x`'s size times the
    thresholds'. Elsewhere a sum of the comparisons, which XLA computes in
    one pass over `x`.

    Args:
        thresholds: float tensor of shape `(count,)`.
        x: float tensor of any shape.

    Returns:
        An int32 tensor of `x`'s shape.
    """
    symbolic = isinstance(x, keras.KerasTensor) or isinstance(
        thresholds, keras.KerasTensor
    )
    if backend() == "torch" and not symbolic:
        import torch

        return torch.searchsorted(
            torch.sort(thresholds).values, x.contiguous(), side="left"
        ).to(torch.int32)
    return keras.ops.sum(keras.ops.cast(thresholds < x[..., None], "int32"), axis=-1)


def spread_diagonals(vectors, queries, keys, out=None):
    """The matrices whose diagonals are `vectors`' entries: `(..., query, key)`.

    Entry `(i, j)` is `vectors[..., j - i + queries - 1]`: the vector holds
    one value per relative position `j - i`, from `1 - queries` to `keys -
    1`. On PyTorch the windows of the vector (`unfold`, a view) in reverse
    row order, one copy of whole rows; elsewhere one gather.

    Args:
        vectors: tensor of shape `(..., queries + keys - 1)`.
        queries: int. The rows.
        keys: int. The columns.
        out: None, or on eager PyTorch without a gradient (`writes_in_place`) a
            tensor of the result's shape to write it into.

    Returns:
        A tensor of shape `(..., queries, keys)`: `out` where given.
    """
    if (
        backend() == "torch"
        and not isinstance(vectors, keras.KerasTensor)
        and queries > 0
        and keys > 0
    ):
        import torch

        # The windows in reverse order, gathered whole rows at a time: row
        # `i` is window `queries - 1 - i`, laid out row by row (a flip of
        # the windows would lay them out column by column).
        windows = vectors.unfold(-1, keys, 1)
        order = torch.arange(queries - 1, -1, -1, device=vectors.device)
        if out is None:
            return torch.index_select(windows, -2, order)
        return torch.index_select(windows, -2, order, out=out)
    rows = (
        keras.ops.arange(keys, dtype="int32")[None]
        - keras.ops.arange(queries, dtype="int32")[:, None]
        + (queries - 1)
    )  # (query, key): where `key - query` sits in the vector
    return keras.ops.take(vectors, rows, axis=-1)


def writes_in_place(*tensors):
    """Whether a result's parts may be written into one tensor (`out=`).

    On eager PyTorch, where no gradient is recorded for `tensors`, each
    part can be written in place, where joining the parts would copy them
    again, into new memory; elsewhere no.
    """
    if not writes_every_tensor():
        return False
    import torch

    return not (
        torch.is_grad_enabled()
        and any(getattr(t, "requires_grad", False) for t in tensors)
    )


def differentiates_update_slices():
    """Whether a gradient flows through `keras.ops.slice_update`.

    On TensorFlow it is `XlaDynamicUpdateSlice`, which has no gradient
    registered; JAX's `dynamic_update_slice` and PyTorch's copy into a
    slice have one.
    """
    return backend() != "tensorflow"


def piecewise_linear(slopes, intercepts, interval, x, batch_size=None, out=None):
    """Per head, the line of each entry's interval at that entry.

    On TensorFlow, whose XLA fuses a gather per head into the product, a
    gather from each head's flattened table; on PyTorch, eager, a head at a
    time, each head's two small tables read with the one index and the line
    written in place; on JAX one gather of rows that hold every head's
    slope and intercept, then the heads moved first, which its XLA reads
    faster than one value per head.

    Args:
        slopes: float tensor of shape `(heads, intervals)`.
        intercepts: float tensor of shape `(heads, intervals)`.
        interval: integer tensor of shape `(batch, query, key)`, every entry
            in `[0, intervals)`.
        x: float tensor of shape `(batch, query, key)`.
        batch_size: None, or int or scalar integer tensor: on TensorFlow,
            the batch that `interval` and `x`, of batch 1, are read for, as
            the attention's logits have it. Defaults to `None`.
        out: None, or on eager PyTorch without a gradient (`writes_in_place`) a
            tensor of the result's shape, each head's rows contiguous, to
            write it into.

    Returns:
        `slopes[h, interval] * x + intercepts[h, interval]`, of shape
        `(batch, heads, query, key)`: `out` where given.
    """
    heads, intervals = slopes.shape
    symbolic = any(
        isinstance(t, keras.KerasTensor) for t in (slopes, intercepts, interval, x)
    )
    if backend() == "torch" and not symbolic:
        import torch

        # A head at a time, each reading its own small tables with the one
        # index: the reads stay in the cache, the writes are contiguous.
        def line(h, index, at):
            return torch.index_select(intercepts[h], 0, index), torch.index_select(
                slopes[h], 0, index
            ), at

        if torch.is_grad_enabled() and any(
            t.requires_grad for t in (slopes, intercepts, x)
        ):
            index, at = interval.reshape(-1), x.reshape(-1)
            return torch.stack(
                [
                    torch.addcmul(*line(h, index, at)).reshape(interval.shape)
                    for h in range(heads)
                ],
                1,
            )  # (batch, heads, query, key)
        if out is None:
            out = torch.empty(
                (interval.shape[0], heads) + tuple(interval.shape[1:]),
                dtype=x.dtype,
                device=x.device,
            )
        for b in range(interval.shape[0]):
            index, at = interval[b].reshape(-1), x[b].reshape(-1)
            for h in range(heads):
                torch.addcmul(*line(h, index, at), out=out[b, h].view(-1))
        return out
    if backend() == "tensorflow":
        if batch_size is not None:
            # One read per batch element, which XLA computes inside the
            # addition to the logits, where lines shared by the batch would
            # be written whole and read once per batch element.
            shape = (batch_size,) + tuple(keras.ops.shape(interval)[1:])
            interval = keras.ops.broadcast_to(interval, shape)
            x = keras.ops.broadcast_to(x, shape)
        index = interval[:, None] + intervals * keras.ops.arange(
            heads, dtype="int32"
        )[:, None, None]  # (batch, heads, query, key)
        slope = take_in_range(keras.ops.reshape(slopes, (-1,)), index)
        intercept = take_in_range(keras.ops.reshape(intercepts, (-1,)), index)
        return slope * x[:, None] + intercept
    rows = keras.ops.concatenate(
        [keras.ops.transpose(slopes), keras.ops.transpose(intercepts)], axis=1
    )  # (intervals, 2 heads)
    line = take_in_range(rows, interval)  # (batch, query, key, 2 heads)
    values = line[..., :heads] * x[..., None] + line[..., heads:]
    return keras.ops.transpose(values, (0, 3, 1, 2))
