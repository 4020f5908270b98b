"""The key/value cache of `PositionalMultiHeadAttention`, as one object.

The tensor a caller passes keeps keras-hub's layout (its
`CachedMultiHeadAttention`): `(batch, 2, slots, num_key_value_heads,
key_dim)`, the keys at index 0 of axis 1 and the values at 1. A call
writes its new tokens at `cache_update_index` and attends over every slot;
the slots from `cache_update_index + new` on hold no key yet. This object
checks what the caller passes, writes the new tokens, gives their slots'
positions and says which slots hold a key: the attention's masks and
CoPE's counts ask it.
"""

import dataclasses
import numbers
from typing import Any

import keras

from keras_posenc import ops
from keras_posenc.ops import _backend


@dataclasses.dataclass(frozen=True)
class AttentionCache:
    """A call's key/value cache: its slots and where the call writes.

    Attributes:
        update_index: int or int32 scalar tensor. The slot of the first new
            token.
        new_length: int or integer scalar tensor. The new tokens, written at
            `update_index + 0, 1, ...`.
        slots: int or integer scalar tensor. The cache's slots.
        tensor: None, or the cache, `(batch, 2, slots, num_key_value_heads,
            key_dim)`. None where only the slots are known (a context made
            by hand with a `cache_update_index`).
    """

    update_index: Any
    new_length: Any
    slots: Any
    tensor: Any = None

    @classmethod
    def checked(
        cls, attention, cache, cache_update_index, query, new_keys, masked, scheme
    ):
        """`(cache, query)`, once the caller's cache fits the attention and call.

        Where the index is read at run time and compiled code cannot raise,
        the index is clipped into the slots and, for one that does not fit,
        the cache and the queries made NaN.

        Args:
            attention: the `PositionalMultiHeadAttention`.
            cache: the caller's `cache`.
            cache_update_index: the caller's `cache_update_index`.
            query: the queries, `(batch, query, features)`.
            new_keys: the new keys' inputs, `(batch, new, features)`.
            masked: bool. Whether the call's `value` or `key` carries a mask.
            scheme: str. The attention's `position`, described for messages.

        Returns:
            `(cache, query)`: this object, and the queries.
        """
        tensor = keras.ops.convert_to_tensor(cache)
        key_dim = attention.key_dim
        expected = (2, attention.num_key_value_heads, key_dim)
        if attention.value_dim != key_dim:
            raise ValueError(
                "A `cache` holds keys and values in one tensor of shape "
                "(batch, 2, slots, num_key_value_heads, key_dim), as "
                "keras-hub's CachedMultiHeadAttention does: it needs value_dim equal to "
                f"key_dim. Received: key_dim={key_dim}, "
                f"value_dim={attention.value_dim}"
            )
        if len(tensor.shape) != 5 or (
            tuple(tensor.shape[i] for i in (1, 3, 4)) != expected
        ):
            raise ValueError(
                "`cache` must have shape (batch, 2, slots, "
                "num_key_value_heads, key_dim), here (batch, 2, slots, "
                f"{attention.num_key_value_heads}, {key_dim}): keys at index "
                "0 of axis 1, values at 1. Received: cache of shape "
                f"{tuple(tensor.shape)}"
            )
        if attention.position is not None and attention.position.num_prefix_tokens:
            raise ValueError(
                "A `cache` holds tokens that all have positions: it needs a "
                f"`position` without prefix tokens. Received: {scheme}"
            )
        if masked:
            raise ValueError(
                "With a `cache`, the keys are the cache's slots, which a mask "
                "of the new `value` or `key` does not cover: pass "
                "`attention_mask` of shape (batch, query, slots) instead. "
                "Received: a Keras mask on `value` or `key` (`value_mask` or "
                "`key_mask`)"
            )
        if cache_update_index is None:
            raise ValueError(
                "A `cache` needs `cache_update_index`, the slot where the new "
                "keys and values go (the number of tokens cached before "
                "them). Received: cache_update_index=None"
            )
        ops.check_integer_scalar("cache_update_index", cache_update_index)
        new = new_keys.shape[1]
        slots = tensor.shape[2]
        if isinstance(cache_update_index, numbers.Integral) and (
            cache_update_index < 0
            or (
                new is not None
                and slots is not None
                and cache_update_index + new > slots
            )
        ):
            raise ValueError(
                "`cache_update_index` plus the new tokens must fit the "
                f"cache's {slots} slots. Received: "
                f"cache_update_index={cache_update_index} with {new} new tokens"
            )
        if keras.ops.is_tensor(cache_update_index):
            # Read at run time; an index past the slots would otherwise be
            # moved back by the update, silently. Compiled code cannot
            # raise: there the index is clipped into the slots, the queries
            # and the cache made NaN, so that the outputs show it.
            index = keras.ops.cast(cache_update_index, "int32")
            last = keras.ops.shape(tensor)[2] - keras.ops.shape(new_keys)[1]
            fits = keras.ops.logical_and(0 <= index, index <= last)
            message = (
                "`cache_update_index` must be at least 0, and plus the new "
                "tokens fit the cache's slots"
            )
            tensor = _backend.checked_or_nan(tensor, fits, message)
            query = _backend.checked_or_nan(query, fits, message)
            cache_update_index = keras.ops.clip(
                index, 0, keras.ops.maximum(last, 0)
            )
        if query.shape[1] is not None and new is not None and query.shape[1] != new:
            raise ValueError(
                "With a `cache`, the queries are the new tokens whose keys and "
                "values are written: `query` and `value` need the same "
                f"length. Received: query of shape {tuple(query.shape)} and "
                f"value of shape {tuple(new_keys.shape)}"
            )
        cache = cls(
            update_index=cache_update_index,
            new_length=keras.ops.shape(new_keys)[1],
            slots=keras.ops.shape(tensor)[2],
            tensor=tensor,
        )
        return cache, query

    @property
    def keys(self):
        """The cached keys, `(batch, slots, num_key_value_heads, key_dim)`."""
        return self.tensor[:, 0]

    @property
    def values(self):
        """The cached values, `(batch, slots, num_key_value_heads, key_dim)`."""
        return self.tensor[:, 1]

    @property
    def end(self):
        """The first slot after the new tokens: the slots before it hold a key."""
        return self.update_index + self.new_length

    def written(self):
        """Which slots hold a key once the call has written: bool, `(slots,)`."""
        return keras.ops.arange(self.slots, dtype="int32") < self.end

    def written_at(self, slot):
        """`written()` read pointwise: whether the `slot` (int tensor) holds a key."""
        return slot < self.end

    def new_positions(self, key_positions):
        """The positions of the slots the new tokens go to.

        Args:
            key_positions: int32, the slots' positions, `(batch or 1,
                slots[, num_axes])`.

        Returns:
            int32, `(batch or 1, new[, num_axes])`.
        """
        # A gather, not a slice: XLA would compile a slice again for every
        # start it reads at run time.
        return keras.ops.take(
            key_positions, ops.position_ids(self.new_length, self.update_index), axis=1
        )

    def updated(self, key, value):
        """This cache with the new keys and values written at `update_index`.

        Args:
            key: the new keys, `(batch, new, num_key_value_heads, key_dim)`,
                as the logits read them (RoPE's already rotated).
            value: the new values, `(batch, new, num_key_value_heads,
                key_dim)`.
        """
        updates = keras.ops.stack([key, value], axis=1)  # (batch, 2, new, heads, dim)
        tensor = keras.ops.slice_update(
            self.tensor, [0, 0, self.update_index, 0, 0], updates
        )  # (batch, 2, slots, heads, dim)
        return dataclasses.replace(self, tensor=tensor)
