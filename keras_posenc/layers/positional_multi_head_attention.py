import keras
import tensorflow as tf

# Keras' own MultiHeadAttention reads and clears input masks through these;
# the subclass builds on its internals anyway (sublayers, equations, masks).
from keras.src.backend import get_keras_mask
from keras.src.backend import set_keras_mask

from keras_posenc import ops
from keras_posenc.layers._attention_position import AttentionPosition


@keras.saving.register_keras_serializable(package="keras_posenc")
class PositionalMultiHeadAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention with a relative position scheme inside.

    A `keras.layers.MultiHeadAttention` with one more argument, `position`:
    a `RotaryEmbedding` (rotates the projected queries and keys), an
    `AlibiBias` or a `RelativePositionBias` (add a bias per head to the
    logits), or a `RelativePositionEmbedding` (Shaw et al.: a term on the
    logits and one on the values). The layer asks its `position` for these
    contributions and knows nothing else of the scheme. With
    `position=None` it is the Keras layer: same weights, same outputs.

    Every scheme reads the positions of queries and keys, `query_positions`
    and `key_positions` (`0 .. length - 1` by default), so cached decoding
    (one query at its position against all keys so far), left padding and
    packed sequences work, and the causal mask of `use_causal_mask=True`
    compares positions: a query attends to keys at its position or before.
    The logits, their bias and the softmax are computed in float32 whatever
    the dtype policy. Masks of the inputs, `attention_mask` and the causal
    mask combine as in Keras.

    Args:
        num_heads: int. Number of attention heads.
        key_dim: int. Size of each head's queries and keys.
        position: a `RotaryEmbedding`, `AlibiBias`, `RelativePositionBias`
            or `RelativePositionEmbedding` layer, or None. Defaults to
            `None`.
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
        query_positions: optional integer tensor of shape `(query,)` or
            `(batch, query)`. Defaults to `0 .. query - 1`.
        key_positions: optional integer tensor of shape `(key,)` or
            `(batch, key)`. Defaults to `0 .. key - 1`.

    Returns:
        The attention output of shape `(batch, query, features)` (or
        `output_shape`), and with `return_attention_scores=True` also the
        attention weights of shape `(batch, heads, query, key)`.

    Example:

    >>> from keras_posenc import AlibiBias
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=AlibiBias(num_heads=2)
    ... )
    >>> tokens = np.random.default_rng(0).normal(size=(1, 5, 16))
    >>> attention(tokens, tokens, use_causal_mask=True).shape
    TensorShape([1, 5, 16])

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409)
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
        - [Raffel et al., 2020](https://arxiv.org/abs/1910.10683)
    """

    def __init__(self, num_heads, key_dim, position=None, **kwargs):
        super().__init__(num_heads, key_dim, **kwargs)
        if position is not None:
            if not isinstance(position, AttentionPosition):
                raise ValueError(
                    "`position` must be None or a RotaryEmbedding, AlibiBias, "
                    "RelativePositionBias or RelativePositionEmbedding layer. "
                    f"Received: position={position!r}"
                )
            # Axis 1 (or -2) of the projected (batch, seq, heads, dim).
            if self._attention_axes is not None and tuple(
                self._attention_axes
            ) not in ((1,), (-2,)):
                raise ValueError(
                    "A `position` needs attention over the sequence axis "
                    "only. Received: "
                    f"attention_axes={self._attention_axes}"
                )
            if self._flash_attention:
                raise ValueError(
                    "A `position` adds to the logits, which flash attention "
                    "does not expose. Received: flash_attention=True"
                )
            position.check_attention(num_heads, key_dim, self._value_dim)
        self.position = position

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self.position is not None:
            if len(query_shape) != 3:
                raise ValueError(
                    "With a `position`, PositionalMultiHeadAttention takes "
                    "inputs of shape (batch, sequence, features). Received: "
                    f"query_shape={tuple(query_shape)}"
                )
            self.position.build_for_attention(
                self._num_heads, self._key_dim, self._value_dim
            )

    def _positions(self, positions, inputs, name):
        """`positions` as int32 of shape (batch or 1, length), or the default."""
        if positions is None:
            return ops.position_ids(tf.shape(inputs)[1])[tf.newaxis]  # (1, length)
        positions = tf.convert_to_tensor(positions)
        if not positions.dtype.is_integer:
            raise ValueError(
                f"`{name}` must be integers. Received: {name} of dtype "
                f"{positions.dtype.name}"
            )
        try:
            ops.check_positions(positions, inputs.shape[1], inputs.shape[0])
        except ValueError:
            raise ValueError(
                f"`{name}` must have shape (sequence,) or (batch, sequence) "
                f"for inputs of shape {inputs.shape}. "
                f"Received: {name} of shape {positions.shape}"
            ) from None
        positions = tf.cast(positions, "int32")
        if positions.shape.rank == 1:
            positions = positions[tf.newaxis]
        return positions  # (batch or 1, length)

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
    ):
        if self.position is None and query_positions is None and (
            key_positions is None
        ):
            return super().call(
                query,
                value,
                key=key,
                query_mask=query_mask,
                value_mask=value_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                use_causal_mask=use_causal_mask,
            )
        if key is None:
            key = value
        query_mask = get_keras_mask(query)
        for tensor in (query, value, key):
            set_keras_mask(tensor, None)
        query_positions = self._positions(
            query_positions, query, "query_positions"
        )  # (batch or 1, query)
        key_positions = self._positions(
            key_positions, key, "key_positions"
        )  # (batch or 1, key)
        # The Keras masks and attention_mask; the causal and sliding-window
        # masks follow from positions below.
        attention_mask = self._compute_attention_mask(
            query,
            value,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
        )  # (batch, query, key) or None
        attention_mask = self._position_masks(
            attention_mask, query_positions, key_positions, use_causal_mask
        )
        if self._use_gate:
            gate = self._gate_dense(query)
        query = self._query_dense(query)  # (batch, query, heads, key_dim)
        key = self._key_dense(key)  # (batch, key, heads, key_dim)
        value = self._value_dense(value)  # (batch, key, heads, value_dim)
        attention_output, attention_weights = self._attend(
            query,
            key,
            value,
            attention_mask,
            query_positions,
            key_positions,
            training,
        )
        if self._use_gate:
            attention_output = attention_output * gate
        attention_output = self._output_dense(attention_output)
        if query_mask is not None:
            set_keras_mask(attention_output, query_mask)
        if return_attention_scores:
            return attention_output, attention_weights
        return attention_output

    def _position_masks(
        self, attention_mask, query_positions, key_positions, use_causal_mask
    ):
        """`attention_mask` and the causal and sliding-window masks."""
        distance = ops.relative_distance(
            query_positions, key_positions
        )  # (batch or 1, query, key): key - query
        masks = [] if attention_mask is None else [attention_mask]
        if use_causal_mask:
            masks.append(distance <= 0)
        if self._sliding_window is not None:
            masks.append(tf.abs(distance) < self._sliding_window)
        if not masks:
            return None
        combined = masks[0]
        for mask in masks[1:]:
            combined = tf.logical_and(combined, mask)
        return combined

    def _attend(
        self,
        query,
        key,
        value,
        attention_mask,
        query_positions,
        key_positions,
        training,
    ):
        """Attention with the position's contributions; float32 softmax."""
        position = self.position
        if position is not None:
            query, key = position.transform_query_key(
                query, key, query_positions, key_positions
            )
        query = query * tf.cast(self._inverse_sqrt_key_dim, query.dtype)
        logits = tf.cast(
            tf.einsum(self._dot_product_equation, key, query), "float32"
        )  # (batch, heads, query, key)
        if position is not None:
            bias = position.logits_bias(query, query_positions, key_positions)
            if bias is not None:
                logits = logits + bias
        if attention_mask is None:
            weights = tf.nn.softmax(logits, axis=-1)  # (batch, heads, query, key)
        else:
            # As Keras' masked softmax: a large negative number where masked,
            # then zero weight there (a query with no key left gets none).
            mask = tf.expand_dims(attention_mask, 1)  # (batch, 1, query, key)
            weights = tf.nn.softmax(tf.where(mask, logits, -1e9), axis=-1)
            weights = tf.where(mask, weights, 0.0)
        if self._dropout > 0.0:
            weights = self._dropout_layer(weights, training=training)
        output = tf.einsum(
            self._combine_equation, tf.cast(weights, value.dtype), value
        )  # (batch, query, heads, value_dim)
        if position is not None:
            term = position.value_term(weights, query_positions, key_positions)
            if term is not None:
                output = output + tf.cast(term, output.dtype)
        return output, tf.cast(weights, self.compute_dtype)

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
    ):
        output_spec = super().compute_output_spec(query, value, key)
        if return_attention_scores:
            weights_shape = (
                query.shape[0],
                self.num_heads,
                query.shape[1],
                value.shape[1],
            )
            return output_spec, keras.KerasTensor(
                weights_shape, dtype=self.compute_dtype
            )
        return output_spec

    def get_config(self):
        config = super().get_config()
        config["position"] = (
            None
            if self.position is None
            else keras.saving.serialize_keras_object(self.position)
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("position") is not None:
            config["position"] = keras.saving.deserialize_keras_object(
                config["position"]
            )
        return super().from_config(config)
