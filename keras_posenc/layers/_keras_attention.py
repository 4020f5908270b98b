"""What `PositionalMultiHeadAttention` reads of Keras' `MultiHeadAttention`.

The private parts of Keras the attention uses, all read here and nowhere
else, with the Keras versions that have them (every release from 3.8 to
3.15 was read for this list). The layer overrides `call` whole, as
keras-hub's `CachedMultiHeadAttention` does, with Keras' own sublayers:

- `_query_dense`, `_key_dense`, `_value_dense`, `_output_dense`: the
  projections, which a scheme may also apply to a table of its own
  (`AttentionContext.project_query`) (3.8 on).
- `_gate_dense`, with `_use_gate`: the output's gate (3.15 on; earlier
  versions have none).
- `_dropout_layer`: the dropout on the attention weights (3.8 on).
- `_flash_attention`: whether flash attention is on (3.8 on).
- `_sliding_window`: the sliding window's size (3.15 on; earlier versions
  have none).
- `_get_common_kwargs_for_sublayer`, `_make_output_dense` and
  `_build_attention`: the parts of Keras' `build` that grouped heads
  reuse, building the key and value projections with fewer heads (3.8 on).
  Keras' public API has no way to build fewer key/value heads:
  `MultiHeadAttention.build` makes the three projections of `num_heads`
  heads, and `keras.layers.GroupQueryAttention` is another layer (one
  `head_dim`, no `value_dim` nor `output_shape`), whose weights nested here
  would move in saved files.

With neither a position nor positions nor a cache, the call is Keras' own
(`keras_call`); else Keras' order around the kernel (`attend`): the
projections, `_attention_kernel`'s attention, the gate and the output. The position's config is serialized here too, where Keras
keeps no public word of whether it is saving (`saving_shares_objects`).
"""

import functools

import keras

from keras_posenc.layers import _attention_checks
from keras_posenc.layers import _attention_kernel
from keras_posenc.ops import _backend


def flash_attention(layer):
    """Whether the user asked for flash attention."""
    return getattr(layer, "_flash_attention", False)


def dropout_layer(layer):
    """The dropout on the attention weights."""
    return layer._dropout_layer


def sliding_window(layer):
    """The sliding window's size, or None (and before Keras 3.15)."""
    return getattr(layer, "_sliding_window", None)


def query_projection(layer):
    """The query projection, `(batch, length, features)` to `(..., heads, key_dim)`."""
    return layer._query_dense


def key_projection(layer):
    """The key projection, `(batch, length, features)` to `(..., heads, key_dim)`."""
    return layer._key_dense


def value_projection(layer):
    """The value projection, `(batch, length, features)` to `(..., heads, value_dim)`."""
    return layer._value_dense


def output_projection(layer):
    """The output projection, `(batch, length, heads, value_dim)` to the output."""
    return layer._output_dense


def gate_projection(layer):
    """The output's gate, `(batch, length, features)` to `(..., heads, value_dim)`, or None."""
    return layer._gate_dense if getattr(layer, "_use_gate", False) else None


def build_grouped(layer, query_shape, value_shape, key_shape):
    """Keras' `build`, the key and value projections of `num_key_value_heads`."""
    key_shape = value_shape if key_shape is None else key_shape
    _attention_checks.check_sequence_inputs(
        "grouped heads (`num_key_value_heads` below `num_heads`)",
        query_shape=query_shape,
        value_shape=value_shape,
        key_shape=key_shape,
    )
    if value_shape[1] != key_shape[1]:
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, "
            f"must be equal. Received: value_shape={tuple(value_shape)} "
            f"and key_shape={tuple(key_shape)}"
        )
    common = layer._get_common_kwargs_for_sublayer()

    def projection(name, heads, size, shape, **kwargs):
        # Keras' projection of inputs of rank 3: `(batch, length,
        # features)` to `(batch, length, heads, size)`.
        dense = keras.layers.EinsumDense(
            "abc,cde->abde",
            output_shape=(None, heads, size),
            bias_axes="de" if layer.use_bias else None,
            name=name,
            **kwargs,
            **common,
        )
        dense.build(shape)
        return dense

    # In Keras' order, so that the weights are listed as there.
    layer._query_dense = projection("query", layer.num_heads, layer.key_dim, query_shape)
    layer._key_dense = projection(
        "key", layer.num_key_value_heads, layer.key_dim, key_shape
    )
    if getattr(layer, "_use_gate", False):
        layer._gate_dense = projection(
            "gate", layer.num_heads, layer.value_dim, query_shape, activation="sigmoid"
        )
    layer._value_dense = projection(
        "value", layer.num_key_value_heads, layer.value_dim, value_shape
    )
    layer._build_attention(4)
    layer._output_dense = layer._make_output_dense(
        query_shape, common, "attention_output"
    )
    layer._output_dense.build(
        tuple(query_shape[:2]) + (layer.num_heads, layer.value_dim)
    )


def build_qk_norm(layer, query_shape):
    """The scales of `layer.qk_norm`'s queries and keys, where it has them."""
    if layer.qk_norm not in ("head", "projection"):
        return
    _attention_checks.check_sequence_inputs("`qk_norm`", query_shape=query_shape)
    for role, heads in (("query", layer.num_heads), ("key", layer.num_key_value_heads)):
        shape = (layer.key_dim,) if layer.qk_norm == "head" else (heads, layer.key_dim)
        scale = layer.add_weight(
            name=f"{role}_norm_scale", shape=shape, initializer="ones", autocast=False
        )
        setattr(layer, f"{role}_norm_scale", scale)


def attend(layer, query, keys, value, mask, context, cache, training, returns_scores):
    """Keras' order around the kernel: projections, attention, output.

    Args:
        layer: the `PositionalMultiHeadAttention`.
        query: tensor of shape `(batch, query, features)`.
        keys: tensor of shape `(batch, key, features)`.
        value: tensor of shape `(batch, key, features)`.
        mask: None, or the masks combined, `(batch, query, key)` or
            `(batch, heads | 1, query, key)`.
        context: the call's `AttentionContext`.
        cache: None, or the call's `AttentionCache`.
        training: bool or None.
        returns_scores: bool.

    Returns:
        `(output, scores, cache)`: the output, `(batch, query,
        features)`; the weights, `(batch, heads, query, key)`, or None
        unless `returns_scores`; the updated `AttentionCache`, or None.
    """
    # The masks are in `mask`; the projections take none and would
    # warn that they drop those the inputs carry. Keras' `__call__`
    # sets the queries' mask on the output.
    gate_layer = gate_projection(layer)
    with _backend.ignoring_warnings("Layer .* was passed an input with a mask"):
        gate = gate_layer(query) if gate_layer else None
        # (batch, query, heads, key_dim)
        query = query_projection(layer)(query)
        key = key_projection(layer)(keys)  # (batch, key, heads, key_dim)
        # (batch, key, heads, value_dim)
        value = value_projection(layer)(value)
    attention = _attention_kernel.Attention(
        position=layer.position,
        dropout=layer.dropout,
        dropout_layer=dropout_layer(layer),
        flash_attention=bool(flash_attention(layer)),
        sliding_window=sliding_window(layer),
        scores_dtype=layer.compute_dtype,
        qk_norm=_qk_norm(layer),
    )
    if cache is None:
        query, key = _attention_kernel.heads(attention, query, key, context)
    else:
        # The new keys at the slots they go to, transformed once (RoPE
        # rotates each key when it is cached), so that the cache holds
        # keys as the logits read them; then the logits read every slot.
        written = cache.new_positions(
            context.key_positions
        )  # (batch or 1, new[, num_axes])
        query, key = _attention_kernel.heads(
            attention, query, key, context.replace(key_positions=written)
        )
        cache = cache.updated(key, value)
        key, value = cache.keys, cache.values  # (batch, slots, heads, dim)
    output, weights = _attention_kernel.attend(
        attention, query, key, value, mask, context, training, bool(returns_scores)
    )  # (batch, query, heads, value_dim)
    if gate is not None:
        output = keras.ops.multiply(output, gate)
    output = output_projection(layer)(output)
    return output, weights, cache


def _qk_norm(layer):
    """The kernel's `QKNorm` of `qk_norm`, or None."""
    if layer.qk_norm is None:
        return None
    return _attention_kernel.QKNorm(
        kind=layer.qk_norm,
        epsilon=layer.qk_norm_epsilon,
        after_position=layer.qk_norm_after_position,
        query_scale=getattr(layer, "query_norm_scale", None),
        key_scale=getattr(layer, "key_norm_scale", None),
    )


def _with_causal_mask(attention_mask, query, value):
    """`attention_mask` and Keras' causal mask, query `i` to keys `j <= i`."""
    ones = keras.ops.ones(
        (1, keras.ops.shape(query)[1], keras.ops.shape(value)[1]), dtype="int32"
    )
    # Keras' own construction, which TFLite's built-in ops convert.
    causal = keras.ops.greater_equal(
        keras.ops.cumsum(ones, axis=-2), keras.ops.cumsum(ones, axis=-1)
    )  # (1, query, key)
    if attention_mask is None:
        return causal
    return keras.ops.logical_and(keras.ops.cast(attention_mask, "bool"), causal)


def _fused_attention_fails(layer):
    """Whether Keras' `dot_product_attention` path fails for this layer.

    On JAX it does for values of another head size than the keys'
    (`_backend.dot_product_attention_needs_equal_head_sizes`).
    """
    return (
        layer.value_dim != layer.key_dim
        and not flash_attention(layer)
        and _backend.dot_product_attention_needs_equal_head_sizes()
    )


def keras_call(layer, call, query, value, use_causal_mask, **arguments):
    """Keras' own attention: `call`, the parent's bound `call`, with `arguments`.

    Args:
        layer: the attention.
        call: `MultiHeadAttention.call`, bound to `layer`.
        query: tensor of shape `(batch, query, features)`.
        value: tensor of shape `(batch, key, features)`.
        use_causal_mask: bool.
        **arguments: the other arguments of Keras' `call`, the masks checked.
    """
    if use_causal_mask:
        # Handed to Keras as a mask: with the causal mask its only mask,
        # Keras 3.15 takes the backend's causal kernel, whose slice
        # TFLite's built-in ops lack.
        arguments["attention_mask"] = _with_causal_mask(
            arguments["attention_mask"], query, value
        )
    if not arguments["return_attention_scores"] and _fused_attention_fails(layer):
        # Keras' path that returns the scores computes the same attention
        # without `dot_product_attention`. Its softmax warns of a single
        # key, whose weight of 1 is right here.
        arguments["return_attention_scores"] = True
        with _backend.ignoring_warnings("You are using a softmax over axis"):
            output, _ = call(query, value, **arguments)
        return output
    return call(query, value, **arguments)


def with_query_mask(attention_mask, query_mask, query, keys, cache):
    """`attention_mask`, checked, with the rows of `query_mask` in it.

    Keras' `call` reads the queries' mask from the tensor alone and drops
    the `query_mask` argument; here a query it masks attends to no key, as
    one whose tensor carries that mask. The keys are `keys`' tokens, or
    with a `cache` (the caller's tensor, not yet checked) its slots.
    """
    if attention_mask is not None:
        attention_mask = keras.ops.convert_to_tensor(attention_mask)
        _attention_checks.check_attention_mask(
            attention_mask, query, keys.shape[1] if cache is None else cache.shape[2]
        )
    if query_mask is None:
        return attention_mask
    query_mask = keras.ops.convert_to_tensor(query_mask)
    _attention_checks.check_mask(
        "query_mask", query_mask, query, "query", "the queries that attend"
    )
    keys_length = (
        keras.ops.shape(keys)[1] if cache is None else keras.ops.shape(cache)[2]
    )
    rows = keras.ops.broadcast_to(
        keras.ops.cast(query_mask, "bool")[:, :, None],
        (keras.ops.shape(query)[0], keras.ops.shape(query)[1], keys_length),
    )  # (batch, query, key)
    if attention_mask is None:
        return rows
    attention_mask = keras.ops.cast(attention_mask, "bool")
    if len(attention_mask.shape) == 4:
        rows = rows[:, None]  # (batch, 1, query, key)
    return keras.ops.logical_and(attention_mask, rows)  # batch first


def combined_mask(attention_mask, value_mask, key_mask):
    """The keys' masks and `attention_mask`, combined as Keras combines them.

    Returns:
        None without any mask; else a boolean tensor of shape `(batch,
        query, key)`, or `(batch, heads | 1, query, key)` for an
        `attention_mask` of that rank.
    """
    heads = attention_mask is not None and len(attention_mask.shape) == 4
    masks = [] if attention_mask is None else [keras.ops.cast(attention_mask, "bool")]
    for mask in (value_mask, key_mask):
        if mask is not None:
            masks.append(keras.ops.cast(mask, "bool")[:, None, :])  # (b, 1, k)
    if heads:
        masks = masks[:1] + [mask[:, None] for mask in masks[1:]]
    return functools.reduce(keras.ops.logical_and, masks) if masks else None


# A Keras object, alive as long as the module, serialized to tell whether
# Keras tracks the objects it serializes (`saving_shares_objects`).
_SHARING_PROBE = keras.initializers.Zeros()


def saving_shares_objects():
    """Whether Keras is saving, the configs it serializes tracked for sharing.

    Keras keeps no public word of it: inside the scope it opens around
    `model.save` and `keras.saving.load_model`, an object serialized again
    comes back marked with a `shared_object_id`, and outside it never does.
    So a probe of its own is serialized twice, never the position.
    """
    keras.saving.serialize_keras_object(_SHARING_PROBE)
    again = keras.saving.serialize_keras_object(_SHARING_PROBE)
    return "shared_object_id" in again


def serialize_position(position):
    """The config of the attention's `position`, or None."""
    if position is None:
        return None
    config = keras.saving.serialize_keras_object(position)
    if saving_shares_objects():
        # Keras marks an object's config with a `shared_object_id` when it
        # serializes the object again, and loading makes one object of the
        # configs so marked; but the first attention's config is copied
        # before a second attention serializes the position. Marked here
        # from the first, a position serving several attention layers (a
        # table shared by the layers, as Graphormer's) loads as one.
        config["shared_object_id"] = id(position)
    return config


def deserialize_position(config):
    """The attention's `position` from its config, unbuilt, or None."""
    if config is None:
        return None
    # Built by the attention's `build`, under its name scope, as when first
    # made: built on deserialization, its weights would lose the
    # attention's prefix.
    config = {key: value for key, value in config.items() if key != "build_config"}
    try:
        return keras.saving.deserialize_keras_object(config)
    except TypeError as error:
        # Keras imports no package to find a class but its own.
        if "Could not locate" not in str(error):
            raise
        name = config.get("registered_name", config.get("class_name"))
        raise TypeError(
            f"`position` of this attention is {name!r}, which Keras "
            "does not know: import the module that registers it (with "
            "`keras.saving.register_keras_serializable`) before "
            "loading, or pass it in `custom_objects`. Keras imports no "
            f"package to find a class but its own. Keras said: {error}"
        ) from None
