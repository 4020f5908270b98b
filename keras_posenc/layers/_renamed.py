"""Layers that take their arguments' old names (private): the renamed arguments of 0.1.0.

`renamed_arguments` makes a layer's constructor take an old name or value
with a `DeprecationWarning` naming the new one, and its `from_config` read
them silently, so that `.keras` files saved before the renames load;
`get_config` holds the new names only.
"""

import functools
import inspect
import warnings

from keras_posenc.ops._renamed import new_arguments
from keras_posenc.ops._renamed import uses_old


def renamed_arguments(renames=None, values=None):
    """Class decorator: the layer takes old argument names and values.

    Args:
        renames: dict or None. Old argument name -> new name.
        values: dict or None. Argument name (new) -> {old value: new value}.
    """
    renames = renames or {}
    values = values or {}

    def decorate(cls):
        init = cls.__init__
        from_config = cls.from_config.__func__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            if uses_old(args, kwargs, renames, values):
                args, kwargs, messages = new_arguments(
                    init, cls.__name__, kwargs, renames, values, (self, *args)
                )
                for message in messages:
                    warnings.warn(message, DeprecationWarning, stacklevel=2)
                args = args[1:]  # without self
            init(self, *args, **kwargs)

        def read_config(klass, config):
            config = {renames.get(key, key): value for key, value in config.items()}
            for name, mapping in values.items():
                if isinstance(config.get(name), str):
                    config[name] = mapping.get(config[name], config[name])
            return from_config(klass, config)

        # Keras reads the constructor's arguments with
        # `inspect.getfullargspec`, which does not follow `__wrapped__`.
        __init__.__signature__ = inspect.signature(init)
        cls.__init__ = __init__
        cls.from_config = classmethod(functools.wraps(from_config)(read_config))
        return cls

    return decorate
