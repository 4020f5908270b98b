import math
import numbers

import keras

from keras_posenc import ops
from keras_posenc.layers._schemes import read_initializer
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.ops import _backend

POSITION_TERMS = ("c2p", "p2c")


def _read_pos_att_type(pos_att_type):
    """`pos_att_type` as a tuple of terms, or a `ValueError` naming it."""
    terms = pos_att_type.split("|") if isinstance(pos_att_type, str) else pos_att_type
    if (
        not isinstance(terms, (list, tuple))
        or not terms
        or any(term not in POSITION_TERMS for term in terms)
        or len(set(terms)) != len(terms)
    ):
        raise ValueError(
            "`pos_att_type` must name the position terms, each once: a list "
            'of "c2p" and "p2c" (or a string such as "c2p|p2c", as Hugging '
            f"Face configs have it). Received: pos_att_type={pos_att_type!r}"
        )
    return tuple(terms)


@keras.saving.register_keras_serializable(package="keras_posenc")
class DisentangledPosition(AttentionPosition):
    """DeBERTa's disentangled attention: content-to-position and back.

    DeBERTa (He et al. 2021, section 3.1, eq. 4) keeps one table of
    relative position embeddings `P`, `2k` rows for relative positions
    `-k .. k - 1`, and projects it as the keys and the queries are
    projected: `P_k = P W_k,r`, `P_q = P W_q,r`. The logit of query `i` and
    key `j` adds to the content term two position terms,

    `A_ij = (q_i . k_j + q_i . P_k[d(i, j)] + k_j . P_q[d(i, j)]) /
    sqrt(3 d)`,

    the content-to-position term (c2p) and the position-to-content term
    (p2c), where `d(i, j) = clip(delta(i - j) + k, 0, 2k - 1)` is the row of
    the relative position `query - key`. DeBERTa v2 and v3 put longer
    distances in log buckets (`ops.make_log_bucket_position`), so that `k`
    is `position_buckets` and distances up to `max_relative_positions` get
    buckets of their own; without buckets `k` is `max_relative_positions`
    and distances are clipped. The scale is `sqrt(d (1 + terms))`, `terms`
    the number of position terms used (eq. 4's `sqrt(3d)` with both).

    This scheme computes exactly what Hugging Face's `DebertaV2`
    `DisentangledSelfAttention` computes, given the same weights: inside
    `PositionalMultiHeadAttention`, whose query, key and value projections
    are DeBERTa's `query_proj`, `key_proj` and `value_proj`, it makes the
    table (`"embeddings"`, the encoder's `rel_embeddings`), the optional
    LayerNorm applied to it (the encoder's `LayerNorm`, when `norm_rel_ebd`
    holds `"layer_norm"`), and, unless `share_att_key`, DeBERTa's own
    `pos_key_proj` and `pos_query_proj` (weights `"pos_key_kernel"`,
    `"pos_key_bias"`, `"pos_query_kernel"` and `"pos_query_bias"`, kernels
    of shape `(features, heads, key_dim)`); with `share_att_key` the table
    goes through the attention's own key and query projections (under
    grouped heads, each query head reads the table as its keys: through its
    group's key head). DeBERTa has no output projection in this module:
    the attention's output projection is its `DebertaV2SelfOutput.dense`.

    Each term is computed once against the whole table, `(batch, heads,
    query, 2k)`, then read per query and key, so no `(query, key, key_dim)`
    tensor is formed and XLA fuses the read into the logits' sum. Inside
    the attention, queries go by blocks of `query_block` (1024 on
    TensorFlow, 256 elsewhere), so that the c2p term's table is a block's;
    at the default positions the log buckets are taken once per block, of
    the window of its `query - key`.
    Relative positions come from the positions of queries and keys, not from the
    lengths of their axes: cached decoding, keys longer than the queries
    and explicit positions need only their positions (Hugging Face
    refuses the p2c term when the query and key lengths differ; here it is
    the same formula, `k_j . P_q[d(i, j)]`, at every pair). The table and
    its projections are kept and read in float32 whatever the dtype
    policy (with `share_att_key`, the projection is the attention's, in
    its compute dtype), and the terms are float32.

    Args:
        max_relative_positions: int. DeBERTa's `max_relative_positions`
            (its `max_position_embeddings` where the config has -1): the
            distance the log buckets reach, or without buckets the
            clipping distance `k`. Defaults to `512`.
        position_buckets: int. DeBERTa's `position_buckets`, `k`: the table
            has `2 * position_buckets` rows. At least 2, and `max_relative_positions`
            must pass `position_buckets // 2 + 1`; 0 or less for no
            buckets, as Hugging Face. Defaults to `256`.
        share_att_key: bool. Whether the table goes through the attention's
            own key and query projections (DeBERTa v3), rather than
            projections of its own. Needs queries and keys of the same
            feature size. Defaults to `True`.
        pos_att_type: list or tuple of `"c2p"` and `"p2c"`, or a string
            such as `"p2c|c2p"`: the position terms used. Defaults to
            `("c2p", "p2c")`.
        layer_norm: bool. Whether the table goes through a LayerNorm
            first, as DeBERTa's `norm_rel_ebd="layer_norm"`. Defaults to
            `True`.
        layer_norm_epsilon: float. The LayerNorm's epsilon. Defaults to
            `1e-7`, DeBERTa's.
        embeddings_initializer: str or `keras.initializers.Initializer`. How
            the table starts. Defaults to `"truncated_normal"`.
        kernel_initializer: str or `keras.initializers.Initializer`. How the
            kernels of the own projections start. Defaults to
            `"glorot_uniform"`.
        bias_initializer: str or `keras.initializers.Initializer`. How their
            biases start. Defaults to `"zeros"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        The scheme has no call of its own: `PositionalMultiHeadAttention`
        calls its hooks with the projected queries (scaled by
        `logits_scale`), the projected keys, and the positions of both.

    Returns:
        Through `logits_bias`, the position terms: a float32 tensor of
        shape `(batch, heads, query, key)`, added to the attention's
        logits.

    Example:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> deberta = DisentangledPosition(max_relative_positions=16, position_buckets=8)
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=deberta
    ... )
    >>> tokens = np.random.default_rng(0).normal(size=(1, 5, 16))
    >>> tuple(attention(tokens, tokens).shape)
    (1, 5, 16)
    >>> tuple(deberta.embeddings.shape)  # 2 * position_buckets rows
    (16, 16)
    >>> round(deberta.logits_scale(8) ** -2)  # 8 * (1 + 2 terms)
    24

    References:
        - [He et al., 2021](https://arxiv.org/abs/2006.03654)
        - [He et al., 2023](https://arxiv.org/abs/2111.09543)
    """

    @property
    def query_block(self):
        """The queries of a block: the c2p term's per-query table a block's.

        XLA hoists the p2c table, of the keys, out of the loop over blocks.
        The backend's size for a table per query
        (`_backend.per_query_table_block`).
        """
        return _backend.per_query_table_block()

    def __init__(
        self,
        max_relative_positions=512,
        position_buckets=256,
        share_att_key=True,
        pos_att_type=("c2p", "p2c"),
        layer_norm=True,
        layer_norm_epsilon=1e-7,
        embeddings_initializer="truncated_normal",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        ops.check_positive_int("max_relative_positions", max_relative_positions)
        if isinstance(position_buckets, bool) or not isinstance(
            position_buckets, numbers.Integral
        ):
            raise ValueError(
                "`position_buckets` must be an integer (0 or less for no "
                f"buckets). Received: position_buckets={position_buckets!r}"
            )
        if position_buckets == 1:
            raise ValueError(
                "`position_buckets` must be at least 2, or 0 or less for no "
                f"buckets. Received: position_buckets={position_buckets}"
            )
        if position_buckets > 0 and max_relative_positions <= position_buckets // 2 + 1:
            raise ValueError(
                "`max_relative_positions` must be greater than "
                "`position_buckets // 2 + 1`, the last distance of a bucket "
                "of its own, so that the log buckets widen. Received: "
                f"max_relative_positions={max_relative_positions} with "
                f"position_buckets={position_buckets}"
            )
        for name, value in (("share_att_key", share_att_key), ("layer_norm", layer_norm)):
            if not isinstance(value, bool):
                raise ValueError(
                    f"`{name}` must be True or False. Received: {name}={value!r}"
                )
        ops.check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        self.max_relative_positions = max_relative_positions
        self.position_buckets = position_buckets
        self.share_att_key = share_att_key
        self.pos_att_type = _read_pos_att_type(pos_att_type)
        self.layer_norm = layer_norm
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.embeddings_initializer = read_initializer(
            "embeddings_initializer", embeddings_initializer
        )
        self.kernel_initializer = read_initializer(
            "kernel_initializer", kernel_initializer
        )
        self.bias_initializer = read_initializer("bias_initializer", bias_initializer)
        # HF's `pos_ebd_size`: the table has 2 * span rows.
        self.span = position_buckets if position_buckets > 0 else max_relative_positions

    @property
    def weight_sizes(self):
        # The table is `(2 span, features)`, the own projections `(features,
        # heads, key_dim)`.
        if self.share_att_key:
            return ("features",)
        return ("num_heads", "key_dim", "features")

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        if features is None:
            raise ValueError(
                "DisentangledPosition sizes its table by the attention's "
                "query features: `build_for_attention` needs `features`. "
                "Received: features=None"
            )
        # Read in float32 even inside a mixed precision attention.
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(2 * self.span, features),
            initializer=self.embeddings_initializer,
            autocast=False,
        )
        if self.layer_norm:
            self.layer_norm_gamma = self.add_weight(
                name="layer_norm_gamma",
                shape=(features,),
                initializer="ones",
                autocast=False,
            )
            self.layer_norm_beta = self.add_weight(
                name="layer_norm_beta",
                shape=(features,),
                initializer="zeros",
                autocast=False,
            )
        if not self.share_att_key:
            for term, role in (("c2p", "key"), ("p2c", "query")):
                if term not in self.pos_att_type:
                    continue
                kernel = self.add_weight(
                    name=f"pos_{role}_kernel",
                    shape=(features, num_heads, key_dim),
                    initializer=self.kernel_initializer,
                    autocast=False,
                )
                bias = self.add_weight(
                    name=f"pos_{role}_bias",
                    shape=(num_heads, key_dim),
                    initializer=self.bias_initializer,
                    autocast=False,
                )
                setattr(self, f"pos_{role}_kernel", kernel)
                setattr(self, f"pos_{role}_bias", bias)

    def logits_scale(self, key_dim):
        # Eq. 4's sqrt(3d) with both terms; HF's `scale_factor`.
        return 1.0 / math.sqrt(key_dim * (1 + len(self.pos_att_type)))

    def _table(self):
        """The relative embeddings as the projections read them, float32."""
        table = self.embeddings  # (2 span, features)
        if not self.layer_norm:
            return table
        mean = keras.ops.mean(table, axis=-1, keepdims=True)
        variance = keras.ops.var(table, axis=-1, keepdims=True)
        return (table - mean) * keras.ops.rsqrt(
            variance + self.layer_norm_epsilon
        ) * self.layer_norm_gamma + self.layer_norm_beta

    def _projected(self, table, role, context):
        """The table as keys (`role="key"`) or queries, float32 `(2 span, heads, key_dim)`."""
        if self.share_att_key:
            project = context.project_key if role == "key" else context.project_query
            if project is None:
                raise ValueError(
                    "With share_att_key=True, DisentangledPosition projects "
                    "its table with the attention's own projections: use it "
                    "inside PositionalMultiHeadAttention. Received: a context "
                    f"without `project_{role}`"
                )
            kernel = getattr(project, "kernel", None)
            width = None if kernel is None else kernel.shape[0]
            if width is not None and width != table.shape[-1]:
                inputs = "key (or value)" if role == "key" else "query"
                raise ValueError(
                    "With share_att_key=True, DisentangledPosition projects "
                    f"its table, of the queries' width {table.shape[-1]}, with "
                    f"the attention's {role} projection, which takes {inputs} "
                    f"inputs of width {width}: give the {inputs} inputs the "
                    "queries' width, or set share_att_key=False. Received: "
                    f"{inputs} inputs of width {width}"
                )
            projected = keras.ops.cast(project(table[None])[0], "float32")
            # Under grouped heads the key projection has fewer heads: the
            # table then reads as the keys do, each query head through its
            # group's key head.
            heads = self.attention_sizes["num_heads"]
            if projected.shape[1] != heads:
                projected = keras.ops.repeat(
                    projected, heads // projected.shape[1], axis=1
                )
            return projected  # (2 span, heads, key_dim)
        kernel = getattr(self, f"pos_{role}_kernel")
        bias = getattr(self, f"pos_{role}_bias")
        return keras.ops.einsum("rf,fnd->rnd", table, kernel) + bias

    def _rows(self, query_positions, key_positions):
        """HF's c2p_pos: the table's row of each `query - key`, int32."""
        return keras.ops.clip(
            ops.build_relative_position(
                query_positions,
                key_positions,
                self.position_buckets,
                self.max_relative_positions,
            )
            + self.span,
            0,
            2 * self.span - 1,
        )  # (batch or 1, query, key)

    def _consecutive_rows(self, queries, keys, context):
        """`_rows` at queries `start ..` and keys `0 ..`, from one window.

        `query - key` runs over one window of `query + key - 1` values, so
        the log buckets are taken of that window only, and each pair reads
        its row from it: else, inside the attention's blocks of queries,
        XLA fuses the buckets' logarithm into the logits' sum and computes
        it again for every batch entry, head and term.
        """
        start = context.query_positions[0, 0]
        query_minus_key = (
            start + queries - 1 - keras.ops.arange(queries + keys - 1, dtype="int32")
        )  # (width,): i - j, descending
        window = self._rows(
            query_minus_key[None], keras.ops.zeros((1, 1), "int32")
        )[0, :, 0]  # (width,)
        # Pair (i, j) has `i - j` at `query - 1 - i + j` of the window.
        index = (
            queries
            - 1
            - keras.ops.arange(queries, dtype="int32")[:, None]
            + keras.ops.arange(keys, dtype="int32")[None, :]
        )  # (query, key)
        return keras.ops.take(window, index)[None]  # (1, query, key)

    def logits_bias(self, query, key, context):
        if 0 in (query.shape[1], key.shape[1]):
            # No logits: the attention's output is empty, or its bias alone.
            return None
        queries, keys = keras.ops.shape(query)[1], keras.ops.shape(key)[1]
        if context.consecutive:
            rows = self._consecutive_rows(queries, keys, context)
        else:
            rows = self._rows(context.query_positions, context.key_positions)
        table = self._table()
        terms = []
        if "c2p" in self.pos_att_type:
            # q_i . P_k[r] for every row r, read at each pair's row; the
            # queries carry the scale.
            pos_key = self._projected(table, "key", context)  # (2 span, heads, key_dim)
            terms.append(
                _backend.dot_at_rows(keras.ops.cast(query, "float32"), pos_key, rows)
            )
        if "p2c" in self.pos_att_type:
            # k_j . P_q[r], read at the same row: HF's p2c index, `-(key -
            # query)`, is the c2p one, the buckets being odd.
            pos_query = self._projected(table, "query", context) * self.logits_scale(
                self.attention_sizes["key_dim"]
            )  # (2 span, heads, key_dim)
            # The table first, so that XLA's product writes the keys last;
            # one per batch entry, so that it reads the keys laid out as
            # the logits' product does, `(batch, heads, key_dim, key)`,
            # where with the heads alone as its batch it would lay them
            # out again.
            pos_query = keras.ops.transpose(pos_query, [1, 0, 2])
            pos_query = keras.ops.broadcast_to(
                pos_query[None], (keras.ops.shape(key)[0],) + tuple(pos_query.shape)
            )  # (batch, heads, 2 span, key_dim)
            per_row = keras.ops.einsum(
                "bnrd,bsnd->bnrs", pos_query, keras.ops.cast(key, "float32")
            )  # (batch, heads, 2 span, key)
            terms.append(_backend.take_rows_per_key(per_row, rows))
        return sum(terms[1:], terms[0])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_relative_positions": self.max_relative_positions,
                "position_buckets": self.position_buckets,
                "share_att_key": self.share_att_key,
                "pos_att_type": list(self.pos_att_type),
                "layer_norm": self.layer_norm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
