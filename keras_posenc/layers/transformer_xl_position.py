import math

import keras

from keras_posenc import ops
from keras_posenc.layers._schemes import read_initializer
from keras_posenc.layers.attention_position import AttentionPosition

SHIFTS = ("full", "legacy")


def _skew(relative_logits, keys):
    """Each query's entries of the keys, from its entries of the window.

    Column `c` of query `i` holds the key at `c - (query - 1) + i` (the
    window runs over `key - query` from `-(query - 1)`, so that one query
    later is one column further): `y[i, j] = x[i, j - i + query - 1]`. On
    the flattened rows that is entry `i (width - 1) + j + query - 1`: a
    slice, a reshape and a slice, which XLA reads in place, where a gather
    would write its indices. The window's one column more than the `query
    + key - 1` it needs keeps `width - 1` at least `key`, one query
    included.

    Args:
        relative_logits: float32 tensor of shape `(batch, heads, query,
            width)`, `width = query + key`.
        keys: int. The number of keys.

    Returns:
        A float32 tensor of shape `(batch, heads, query, key)`.
    """
    batch_size, heads, queries, width = keras.ops.shape(relative_logits)
    flat = keras.ops.reshape(relative_logits, (batch_size, heads, queries * width))
    flat = keras.ops.slice(
        flat, (0, 0, queries - 1), (batch_size, heads, queries * (width - 1))
    )  # (batch, heads, query * (width - 1))
    rows = keras.ops.reshape(flat, (batch_size, heads, queries, width - 1))
    return rows[..., :keys]  # (batch, heads, query, key)


def _legacy_shift(logits):
    """ESPnet's legacy shift of `(batch, heads, T, T)`: pad, fold, drop a row.

    As `LegacyRelPositionMultiHeadedAttention.rel_shift`: query `i` reads
    column `T - 1 - i + j` of its row for keys `j <= i`, zero at `j = i + 1`,
    and column `j - i - 2` of query `i + 1`'s row after that.
    """
    batch_size, heads, queries, keys = keras.ops.shape(logits)
    padded = keras.ops.pad(logits, [[0, 0], [0, 0], [0, 0], [1, 0]])
    folded = keras.ops.reshape(padded, (batch_size, heads, keys + 1, queries))
    return keras.ops.reshape(folded[:, :, 1:], (batch_size, heads, queries, keys))


@keras.saving.register_keras_serializable(package="keras_posenc")
class TransformerXLPosition(AttentionPosition):
    """Transformer-XL's relative attention, as XLNet and Conformers use it.

    Inside `PositionalMultiHeadAttention`, the logits of query `i` and key
    `j` become (Dai et al., 2019, section 3.3)

    `((q_i + u) . k_j + (q_i + v) . W_R R_{p_i - p_j}) / sqrt(key_dim)`

    with `R_d` the sinusoidal encoding of the relative position `d` (the
    query's position less the key's), `W_R` a learned projection of it to
    each head (`position_kernel`, no bias), and `u` and `v` learned biases
    per head (`content_bias`, `position_bias`): a content term every query
    shares, and a position term.

    `shift="full"` is the shift of ESPnet's `RelPositionMultiHeadedAttention`
    and of Hugging Face's Parakeet, Wav2Vec2-Conformer and XLNet: every
    logit reads its own relative position, so cached decoding, memory
    segments (keys longer than the queries, at `query_positions` after the
    memory's), cross-attention and packed sequences work. `shift="legacy"`
    is ESPnet's `LegacyRelPositionMultiHeadedAttention`: the encoding of
    positions `L - 1, ..., L - T` (`L = max(legacy_max_length, T)`)
    shifted by padding and folding, which reads the next query's row above
    the diagonal, for checkpoints trained with it; it needs the default
    positions and as many queries as keys.

    `pairing="interleaved"` is ESPnet's and Hugging Face's Conformers'
    encoding (sines at even features, cosines at odd), `"half"` XLNet's
    (all sines, then all cosines). `clamp_len` is XLNet's: relative
    positions beyond it either way read the encoding at `clamp_len`.

    The relative logits at the default positions are those of the `query +
    key - 1` relative positions, read in place by a slice and reshape;
    the attention then takes `query_block` queries at a time, so that
    they are a block's, not twice the logits' size. At other positions
    without `clamp_len` the position term is computed as a product over
    the encoding's features, exact at any positions; with `clamp_len`,
    from a table of its `2 clamp_len + 1` positions.

    Args:
        pairing: `"interleaved"` or `"half"`. Which features of the
            encoding form a (sin, cos) pair. Defaults to `"interleaved"`.
        shift: `"full"` or `"legacy"`. Defaults to `"full"`.
        max_wavelength: float. The encoding's longest wavelength. Defaults
            to `10000.0`.
        clamp_len: int or None. The largest relative position either way;
            None for none. Defaults to `None`.
        embedding_dim: int or None. The encoding's width, the rows of
            `position_kernel`; None for the attention's query features, as
            the references have it. Defaults to `None`.
        legacy_max_length: int. ESPnet's `max_len` for `shift="legacy"`:
            its table's length. Defaults to `5000`.
        kernel_initializer: initializer of `position_kernel`. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer of `content_bias` and
            `position_bias`. Defaults to `"zeros"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        The layer works inside `PositionalMultiHeadAttention(position=...)`,
        which calls its hooks; it is not called on its own.

    Returns:
        Inside the attention, the logits' term above, float32.

    Example:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=TransformerXLPosition()
    ... )
    >>> frames = np.random.default_rng(0).normal(size=(1, 6, 16))
    >>> tuple(attention(frames, frames).shape)
    (1, 6, 16)
    >>> tuple(attention.position.position_kernel.shape)  # W_R
    (16, 2, 8)
    >>> memory = np.random.default_rng(1).normal(size=(1, 4, 16))
    >>> keys = np.concatenate([memory, frames], axis=1)  # the memory first
    >>> tuple(attention(frames, keys, query_positions=np.arange(4, 10)).shape)
    (1, 6, 16)

    References:
        - [Dai et al., 2019](https://arxiv.org/abs/1901.02860)
        - [Yang et al., 2019](https://arxiv.org/abs/1906.08237)
        - [Gulati et al., 2020](https://arxiv.org/abs/2005.08100)
    """

    # The relative logits of a block of queries, `(batch, heads, block,
    # block + key)`, not twice the logits' size, `(batch, heads, query,
    # query + key)`.
    query_block = 256

    def __init__(
        self,
        pairing="interleaved",
        shift="full",
        max_wavelength=10000.0,
        clamp_len=None,
        embedding_dim=None,
        legacy_max_length=5000,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        ops.check_pairing(pairing)
        if shift not in SHIFTS:
            raise ValueError(
                f"`shift` must be one of {SHIFTS}. Received: shift={shift!r}"
            )
        ops.check_max_wavelength(max_wavelength)
        if clamp_len is not None:
            ops.check_positive_int("clamp_len", clamp_len)
            if shift == "legacy":
                raise ValueError(
                    "`clamp_len` clamps relative positions, which the legacy "
                    "shift does not read. Received: clamp_len="
                    f"{clamp_len} with shift='legacy'"
                )
        if embedding_dim is not None:
            ops.check_positive_int("embedding_dim", embedding_dim)
            _check_even(embedding_dim, "embedding_dim")
        ops.check_positive_int("legacy_max_length", legacy_max_length)
        self.pairing = pairing
        self.shift = shift
        self.max_wavelength = float(max_wavelength)
        self.clamp_len = clamp_len
        self.embedding_dim = embedding_dim
        self.legacy_max_length = legacy_max_length
        self.kernel_initializer = read_initializer(
            "kernel_initializer", kernel_initializer
        )
        self.bias_initializer = read_initializer("bias_initializer", bias_initializer)
        if shift == "legacy":
            self.query_block = None

    @property
    def weight_sizes(self):
        # `position_kernel` is `(embedding_dim or features, heads, key_dim)`.
        if self.embedding_dim is None:
            return ("num_heads", "key_dim", "features")
        return ("num_heads", "key_dim")

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        dim = self.embedding_dim if self.embedding_dim is not None else features
        if dim is None:
            raise ValueError(
                "TransformerXLPosition sizes its encoding by the attention's "
                "query features: pass it to PositionalMultiHeadAttention, or "
                "give `embedding_dim`. Received: embedding_dim=None"
            )
        _check_even(dim, "embedding_dim" if self.embedding_dim else "features")
        self._dim = int(dim)
        self.position_kernel = self.add_weight(
            name="position_kernel",
            shape=(self._dim, num_heads, key_dim),
            initializer=self.kernel_initializer,
            autocast=False,
        )
        self.content_bias = self.add_weight(
            name="content_bias",
            shape=(num_heads, key_dim),
            initializer=self.bias_initializer,
            autocast=False,
        )
        self.position_bias = self.add_weight(
            name="position_bias",
            shape=(num_heads, key_dim),
            initializer=self.bias_initializer,
            autocast=False,
        )

    def _projected(self, positions):
        """`W_R R_d` for relative positions `d`, `(positions, heads, key_dim)`."""
        encoding = ops.sinusoidal(
            positions, self._dim, self.max_wavelength, self.pairing
        )  # (positions, dim)
        # No ellipsis: TensorFlow 2.18's einsum gets "...e,end->...nd" wrong
        # past 16 rows.
        return keras.ops.einsum("we,end->wnd", encoding, self.position_kernel)

    def logits_bias(self, query, key, context):
        if self.attention_sizes is None:
            raise ValueError(
                "TransformerXLPosition.logits_bias needs the weights made for "
                "the attention it serves: pass it to PositionalMultiHeadAttention "
                "as `position`, or call `build_for_attention(num_heads, key_dim, "
                "value_dim, features)` first. Received: a scheme not built"
            )
        if 0 in (query.shape[1], key.shape[1]):
            # No logits: the attention's output is empty, or its bias alone.
            return None
        scale = 1.0 / math.sqrt(self.attention_sizes["key_dim"])
        query = keras.ops.cast(query, "float32")  # already times `scale`
        key = keras.ops.cast(key, "float32")
        content = scale * keras.ops.einsum(
            "bknd,nd->bnk", key, self.content_bias
        )[:, :, None]  # (batch, heads, 1, key): u . k_j
        query = query + scale * self.position_bias  # (batch, query, heads, key_dim)
        if self.shift == "legacy":
            position = self._legacy_term(query, key, context)
        elif self.clamp_len is not None:
            position = self._clamped_term(query, context)
        elif context.consecutive:
            position = self._consecutive_term(query, key, context)
        else:
            position = self._any_positions_term(query, context)
        return content + position

    def _consecutive_term(self, query, key, context):
        # Queries at `start .. start + query - 1`, keys at `0 .. key - 1`:
        # the relative positions `i - j` run from `start + query - 1` down
        # to `start - key + 1`, and one more (`_skew`).
        queries, keys = keras.ops.shape(query)[1], keras.ops.shape(key)[1]
        start = context.query_positions[0, 0]
        relative = (
            start + queries - 1 - keras.ops.arange(queries + keys, dtype="int32")
        )  # (width,): i - j, key - query ascending
        table = self._projected(relative)  # (width, heads, key_dim)
        relative_logits = keras.ops.einsum(
            "btnd,wnd->bntw", query, table
        )  # (batch, heads, query, width)
        return _skew(relative_logits, key.shape[1] or keys)

    def _clamped_term(self, query, context):
        # A table of the 2 clamp_len + 1 positions, read per query and key.
        c = self.clamp_len
        table = self._projected(
            keras.ops.arange(c, -c - 1, -1, dtype="int32")
        )  # (2c + 1, heads, key_dim): row r is i - j = c - r, j - i = r - c
        relative_logits = keras.ops.einsum(
            "btnd,rnd->btrn", query, table
        )  # (batch, query, 2c + 1, heads)
        rows = ops.clipped_distance_rows(
            context.query_positions,
            context.key_positions,
            c,
            keras.ops.shape(query)[0],
        )  # (batch, query, key): clip(j - i, -c, c) + c
        per_key = keras.ops.take_along_axis(
            keras.ops.transpose(relative_logits, (0, 1, 3, 2)),  # (b, q, n, 2c+1)
            keras.ops.expand_dims(rows, 2),  # (b, q, 1, key)
            axis=3,
        )  # (batch, query, heads, key)
        return keras.ops.transpose(per_key, (0, 2, 1, 3))

    def _any_positions_term(self, query, context):
        # `R_{i - j}` by the angle-difference identities: per frequency w,
        # a . [sin((i - j) w), cos((i - j) w)] = cos(j w) (a_s sin(i w) +
        # a_c cos(i w)) + sin(j w) (a_c sin(i w) - a_s cos(i w)), a product
        # over the encoding's features of a term of the query's position
        # and one of the key's.
        projected = keras.ops.einsum(
            "btnd,end->btne", query, self.position_kernel
        )  # (batch, query, heads, dim): W_R^T (q_i + v)
        query_encoding = ops.sinusoidal(
            context.query_positions, self._dim, self.max_wavelength, self.pairing
        )[:, :, None]  # (batch or 1, query, 1, dim)
        key_encoding = ops.sinusoidal(
            context.key_positions, self._dim, self.max_wavelength, self.pairing
        )  # (batch or 1, key, dim)
        key_encoding = keras.ops.broadcast_to(
            key_encoding,
            (keras.ops.shape(query)[0],) + tuple(keras.ops.shape(key_encoding)[1:]),
        )  # (batch, key, dim)
        sines, cosines = _sines_cosines(projected, self.pairing)
        query_sines, query_cosines = _sines_cosines(query_encoding, self.pairing)
        key_sines, key_cosines = _sines_cosines(key_encoding, self.pairing)
        of_cosines = sines * query_sines + cosines * query_cosines  # (b, q, n, f)
        of_sines = cosines * query_sines - sines * query_cosines
        return keras.ops.einsum(
            "btnf,bsf->bnts", of_cosines, key_cosines
        ) + keras.ops.einsum("btnf,bsf->bnts", of_sines, key_sines)

    def _legacy_term(self, query, key, context):
        queries, keys = query.shape[1], key.shape[1]
        if not context.consecutive or (
            None not in (queries, keys) and queries != keys
        ):
            given = "" if context.consecutive else " at positions given"
            raise ValueError(
                "shift='legacy' reads ESPnet's table by the sequence's "
                "indices: it takes the default positions and as many "
                "queries as keys (no cache, no memory); shift='full' takes "
                f"any. Received: {queries} queries and {keys} keys{given}"
            )
        length = keras.ops.shape(query)[1]
        last = keras.ops.maximum(length, self.legacy_max_length) - 1
        table = self._projected(
            last - keras.ops.arange(length, dtype="int32")
        )  # (T, heads, key_dim): positions L - 1, ..., L - T
        logits = keras.ops.einsum("btnd,snd->bnts", query, table)  # (b, n, T, T)
        return _legacy_shift(logits)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "pairing": self.pairing,
                "shift": self.shift,
                "max_wavelength": self.max_wavelength,
                "clamp_len": self.clamp_len,
                "embedding_dim": self.embedding_dim,
                "legacy_max_length": self.legacy_max_length,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config


def _sines_cosines(encoding, pairing):
    """The sine features and the cosine features of an (even) encoding."""
    if pairing == "half":
        half = encoding.shape[-1] // 2
        return encoding[..., :half], encoding[..., half:]
    return encoding[..., 0::2], encoding[..., 1::2]


def _check_even(dim, name):
    # Every feature of the encoding is in a (sin, cos) pair.
    if dim % 2:
        raise ValueError(
            f"The encoding's width, `{name}`, must be even: each sine pairs "
            f"with a cosine. Received: {name}={dim}"
        )
