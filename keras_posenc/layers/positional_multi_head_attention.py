import warnings

import keras

from keras_posenc import ops
from keras_posenc.layers import _attention_checks
from keras_posenc.layers import _attention_positions
from keras_posenc.layers import _keras_attention
from keras_posenc.layers._attention_cache import AttentionCache
from keras_posenc.layers._attention_checks import describe as _describe

# The checks of the arguments and inputs are in `_attention_checks`, the
# positions in `_attention_positions`, the key/value cache in
# `_attention_cache`, the private parts of Keras this layer reads in
# `_keras_attention` (with the Keras versions that have them, the masks in
# Keras' order, and the projections around the kernel), and the attention
# itself in `_attention_kernel`.


@keras.saving.register_keras_serializable(package="keras_posenc")
class PositionalMultiHeadAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention with a relative position scheme inside.

    A `keras.layers.MultiHeadAttention` with one more argument, `position`:
    a position scheme, any layer subclassing `AttentionPosition` (RoPE,
    ALiBi, T5, Shaw et al., Swin's grid bias, Graphormer's, ... or one of
    your own). The layer asks its `position` for what it contributes,
    handing each hook this call's `AttentionContext`, and knows nothing
    else of the scheme. With `position=None` it is the Keras layer: same
    weights, same outputs.

    Every scheme reads the positions of queries and keys (`0 .. length - 1`
    by default), so cached decoding, left padding and packed sequences
    work, and the causal mask compares positions. The logits, their bias
    and the softmax are computed in float32 whatever the dtype policy.
    Grids, graphs, grouped heads, `qk_norm`, the key/value cache and the
    kernels on each backend are explained in the documentation's page on
    the attention layer.

    Args:
        num_heads: int. Number of attention heads.
        key_dim: int. Size of each head's queries and keys.
        position: an `AttentionPosition` layer (a position scheme), or None.
            Defaults to `None`.
        num_key_value_heads: int or None. Number of key and value heads, a
            divisor of `num_heads`: below it, grouped-query attention, query
            head `h` reading key/value head `h // (num_heads //
            num_key_value_heads)`. Needs inputs of shape `(batch, sequence,
            features)`. Defaults to `None`, `num_heads`.
        qk_norm: None, `"head"`, `"head_unscaled"` or `"projection"`: the
            projected queries and keys divided by their root mean square,
            over each head's features with a learned scale of `key_dim`
            (Qwen3), the same without a scale (Llama 4), or over all the
            heads' features with a learned scale of each (OLMo 2). Defaults
            to `None`, not at all.
        qk_norm_after_position: bool. Whether they are normalised after the
            position's change of the queries and keys rather than before.
            Defaults to `False`.
        qk_norm_epsilon: float. Added to the mean square. Defaults to
            `1e-6`.
        **kwargs: the other arguments of `keras.layers.MultiHeadAttention`
            (`value_dim`, `dropout`, `use_bias`, `output_shape`,
            initializers, ...) and of `keras.layers.Layer`.

    Call arguments:
        query: tensor of shape `(batch, query, features)`.
        value: tensor of shape `(batch, key, features)`.
        key: optional tensor of shape `(batch, key, features)`; defaults to
            `value`.
        query_mask, value_mask, key_mask, attention_mask, training,
            use_causal_mask, return_attention_scores: as in
            `keras.layers.MultiHeadAttention`.
        query_positions: optional integer tensor of shape `([batch,]
            query[, num_axes])`, `num_axes` for a scheme of more than one,
            `query` counting the tokens after its `num_prefix_tokens`.
            Defaults to `0 .. query - 1` on one axis; required for more.
            Computed in int32: a value past it raises a `ValueError` where
            known, and makes the output NaN in compiled code.
        key_positions: likewise, `([batch,] key[, num_axes])`; with a
            `cache`, one per slot.
        cache: optional float tensor of shape `(batch, 2, slots,
            num_key_value_heads, key_dim)`, keras-hub's layout: the keys
            (index 0) and values (1) of the tokens before these, which
            `query` and `value` are, of one length. Mask its slots with an
            `attention_mask` of shape `(batch, query, slots)`.
        cache_update_index: int or integer scalar tensor, required with a
            `cache`: the slot of the first new token.
        adjacency: tensor of shape `(batch, nodes, nodes)`, the graph whose
            nodes the queries and values are; required by a `position` on
            graphs (`ShortestPathBias`), refused by the others.
        grid_shape: optional list of `num_axes` ints: the queries and keys
            are the cells of that grid, row-major, at
            `ops.grid_positions(grid_shape)`. Pass it or the positions.

    Returns:
        The attention output of shape `(batch, query, features)` (or
        `output_shape`), and with `return_attention_scores=True` also the
        attention weights of shape `(batch, heads, query, key)` (`key`
        being the slots with a cache); with a `cache`, last, the updated
        cache.

    Example:

    >>> from keras_posenc import AlibiBias
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=AlibiBias(num_heads=2)
    ... )
    >>> tokens = np.random.default_rng(0).normal(size=(1, 5, 16))
    >>> tuple(attention(tokens, tokens, use_causal_mask=True).shape)
    (1, 5, 16)
    >>> cache = np.zeros((1, 2, 8, 2, 8), "float32")  # 8 slots
    >>> prompt, cache = attention(
    ...     tokens[:, :4], tokens[:, :4], use_causal_mask=True,
    ...     cache=cache, cache_update_index=0,
    ... )
    >>> last, cache = attention(
    ...     tokens[:, 4:], tokens[:, 4:], use_causal_mask=True,
    ...     cache=cache, cache_update_index=4,
    ... )
    >>> full = attention(tokens, tokens, use_causal_mask=True)
    >>> last, full = keras.ops.convert_to_numpy(last), keras.ops.convert_to_numpy(full)
    >>> bool(np.allclose(last[:, 0], full[:, 4], atol=1e-6))
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409)
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
        - [Raffel et al., 2020](https://arxiv.org/abs/1910.10683)
        - [Liu et al., 2021](https://arxiv.org/abs/2103.14030)
        - [Ying et al., 2021](https://arxiv.org/abs/2106.05234)
        - [Dai et al., 2019](https://arxiv.org/abs/1901.02860)
        - [He et al., 2021](https://arxiv.org/abs/2006.03654)
        - [Golovneva et al., 2024](https://arxiv.org/abs/2405.18719)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        position=None,
        num_key_value_heads=None,
        qk_norm=None,
        qk_norm_after_position=False,
        qk_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(num_heads, key_dim, **kwargs)
        _attention_checks.check_qk_norm(qk_norm)
        ops.check_bool("qk_norm_after_position", qk_norm_after_position)
        ops.check_positive_number("qk_norm_epsilon", qk_norm_epsilon)
        self.qk_norm = qk_norm
        self.qk_norm_after_position = qk_norm_after_position
        self.qk_norm_epsilon = float(qk_norm_epsilon)
        self.num_key_value_heads = _attention_checks.check_num_key_value_heads(
            num_key_value_heads, num_heads, self.attention_axes
        )
        _attention_checks.check_position(
            position,
            self.attention_axes,
            _keras_attention.flash_attention(self),
            _keras_attention.sliding_window(self),
        )
        if position is not None:
            position.check_attention(num_heads, key_dim, self.value_dim)
        self.position = position

    @property
    def _grouped(self):
        """Whether the key and value heads are fewer than the query heads."""
        return self.num_key_value_heads != self.num_heads

    def build(self, query_shape, value_shape, key_shape=None):
        # The features the projections take, which `check_features` reads.
        self._feature_sizes = (
            query_shape[-1],
            value_shape[-1],
            (value_shape if key_shape is None else key_shape)[-1],
        )
        if self._grouped:
            _keras_attention.build_grouped(self, query_shape, value_shape, key_shape)
        else:
            super().build(query_shape, value_shape, key_shape)
        if self.position is not None:
            _attention_checks.check_sequence_inputs("a `position`", query_shape=query_shape)
            self.position.build_for_attention(
                self.num_heads, self.key_dim, self.value_dim, features=query_shape[-1]
            )
        _keras_attention.build_qk_norm(self, query_shape)

    def __call__(self, *args, **kwargs):
        _attention_checks.check_before_conversion(kwargs)
        return super().__call__(*args, **kwargs)

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        query_positions=None,
        key_positions=None,
        cache=None,
        cache_update_index=None,
        adjacency=None,
        grid_shape=None,
    ):
        (query_positions, key_positions), on_graph = _attention_positions.checked(
            self.position, query, value, key, (query_positions, key_positions), cache,
            adjacency, grid_shape, use_causal_mask,
        )
        _attention_checks.check_batch_sizes(query=query, value=value, key=key)
        _attention_checks.check_features(
            getattr(self, "_feature_sizes", (None, None, None)), query, value, key
        )
        if cache is None:
            _attention_checks.check_key_masks(
                value if key is None else key, value_mask, key_mask
            )
        attention_mask = _keras_attention.with_query_mask(
            attention_mask, query_mask, query, value if key is None else key, cache
        )
        _attention_checks.check_cache_index(cache, cache_update_index)
        if self.position is None and self.qk_norm is None and not self._grouped and (
            query_positions is None and key_positions is None and cache is None
        ):
            return _keras_attention.keras_call(
                self,
                super().call,
                query,
                value,
                use_causal_mask,
                key=key,
                query_mask=query_mask,
                value_mask=value_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
        start_index = 0
        if cache is not None:
            cache, query = AttentionCache.checked(
                self,
                cache,
                cache_update_index,
                query,
                value if key is None else key,
                value_mask is not None or key_mask is not None,
                _describe(self.position),
            )
            start_index = cache.update_index
        keys = value if key is None else key
        context, past_int32 = _attention_positions.context(
            self.position,
            query,
            # With a cache the keys are its slots, `0 .. slots - 1`.
            keys if cache is None else cache.keys,
            query_positions,
            key_positions,
            start_index=start_index,
            adjacency=adjacency if on_graph else None,
            causal=bool(use_causal_mask),
            cache=cache,
            grid_shape=grid_shape if cache is None else None,
            projections=(
                _keras_attention.query_projection(self),
                _keras_attention.key_projection(self),
            ),
        )
        # `attention_mask` holds the queries' mask (`with_query_mask`).
        mask = _keras_attention.combined_mask(attention_mask, value_mask, key_mask)
        output, scores, cache = _keras_attention.attend(
            self, query, keys, value, mask, context, cache, training, return_attention_scores
        )
        output = _attention_positions.nan_past_int32(output, past_int32)
        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache.tensor,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        query_positions=None,
        key_positions=None,
        cache=None,
        cache_update_index=None,
        adjacency=None,
        grid_shape=None,
    ):
        _attention_positions.checked(
            self.position, query, value, key, (query_positions, key_positions), cache,
            adjacency, grid_shape, use_causal_mask,
        )
        output_spec = super().compute_output_spec(query, value, key)
        outputs = (output_spec,)
        if return_attention_scores:
            weights_shape = (
                query.shape[0],
                self.num_heads,
                query.shape[1],
                value.shape[1] if cache is None else cache.shape[2],
            )
            outputs += (keras.KerasTensor(weights_shape, dtype=self.compute_dtype),)
        if cache is not None:
            outputs += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return outputs[0] if len(outputs) == 1 else outputs

    def get_config(self):
        config = super().get_config()
        config["num_key_value_heads"] = self.num_key_value_heads
        config["qk_norm"] = self.qk_norm
        config["qk_norm_after_position"] = self.qk_norm_after_position
        config["qk_norm_epsilon"] = self.qk_norm_epsilon
        config["position"] = _keras_attention.serialize_position(self.position)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["position"] = _keras_attention.deserialize_position(config.get("position"))
        return super().from_config(config)

    @staticmethod
    def positions_from_hf_config(config):
        """Deprecated: `keras_posenc.hf_attention.positions_per_layer(config)`."""
        from keras_posenc import hf_attention  # above the layers

        warnings.warn(
            "`PositionalMultiHeadAttention.positions_from_hf_config` moved: "
            "use `keras_posenc.hf_attention.positions_per_layer(config)`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return hf_attention.positions_per_layer(config)
