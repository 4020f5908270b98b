"""Old argument names and values, still taken (private): the renamed arguments of 0.1.0.

A public function or layer whose argument was renamed takes the old name
(and an old value) with a `DeprecationWarning` naming the new one; a saved
config holding them loads silently (`keras_posenc.layers._renamed`).
"""

import functools
import inspect
import warnings


def new_arguments(function, owner, arguments, renames, values, positional=()):
    """`function`'s arguments under their new names and values.

    Args:
        function: the callable whose signature holds the new names.
        owner: str. The name the messages give it.
        arguments: dict. The keyword arguments received.
        renames: dict. Old argument name -> new name.
        values: dict. New argument name -> {old value: new value}.
        positional: tuple. The positional arguments received.

    Returns:
        A tuple `(args, kwargs, messages)`: the arguments to pass on, and one
        message per old name or value received.
    """
    arguments = dict(arguments)
    messages = []
    old_names = {}
    for old, new in renames.items():
        if old in arguments:
            if new in arguments:
                raise TypeError(
                    f"{owner} got both `{old}` and `{new}`, its new name: "
                    f"pass `{new}` alone. Received: {old}={arguments[old]!r}, "
                    f"{new}={arguments[new]!r}"
                )
            arguments[new] = arguments.pop(old)
            old_names[new] = old
    bound = inspect.signature(function).bind_partial(*positional, **arguments)
    for new, old in old_names.items():
        value = bound.arguments.get(new)
        new_value = _new_value(values.get(new, {}), value)
        messages.append(
            f"{owner}({old}={value!r}) is deprecated: use "
            f"{owner}({new}={new_value!r})."
        )
    for name, mapping in values.items():
        value = bound.arguments.get(name)
        new_value = _new_value(mapping, value)
        if new_value is not value:
            bound.arguments[name] = new_value
            if name not in old_names:
                messages.append(
                    f"{owner}({name}={value!r}) is deprecated: use "
                    f"{owner}({name}={new_value!r})."
                )
    return bound.args, bound.kwargs, messages


def _new_value(mapping, value):
    """`value`, or its new spelling if `mapping` renames it."""
    if isinstance(value, str):
        return mapping.get(value, value)
    return value


def renamed_arguments(renames=None, values=None):
    """Decorate a function to take its arguments' old names and values.

    Args:
        renames: dict or None. Old argument name -> new name.
        values: dict or None. Argument name (new) -> {old value: new value}.
    """
    renames = renames or {}
    values = values or {}

    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if not uses_old(args, kwargs, renames, values):
                return function(*args, **kwargs)
            args, kwargs, messages = new_arguments(
                function, function.__name__, kwargs, renames, values, args
            )
            for message in messages:
                warnings.warn(message, DeprecationWarning, stacklevel=2)
            return function(*args, **kwargs)

        return wrapper

    return decorate


def uses_old(args, kwargs, renames, values):
    """Whether a call holds an old name, or a string that is an old value."""
    if any(old in kwargs for old in renames):
        return True
    old_values = {old for mapping in values.values() for old in mapping}
    return any(
        isinstance(value, str) and value in old_values
        for value in (*args, *kwargs.values())
    )


def renamed_function(function, old_name):
    """`function` under its old name: a thin alias that warns, naming the new."""

    @functools.wraps(function)
    def alias(*args, **kwargs):
        warnings.warn(
            f"`{old_name}` is deprecated: use `{function.__name__}`, the same "
            "function under its new name.",
            DeprecationWarning,
            stacklevel=2,
        )
        return function(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old_name
    alias.__doc__ = (
        f"Deprecated: `{function.__name__}` under its old name.\n\n"
        f"Calls `{function.__name__}` with the same arguments and warns.\n"
    )
    return alias
