"""The grid arguments in a layer's config (private)."""


def add_grid_arguments(config, arguments, one_axis_defaults, on_a_grid):
    """Add the grid arguments to `config`: all on a grid, else those set.

    A layer on a line writes the config it wrote before grids existed, with
    only the grid arguments that differ from their defaults (none, for a
    plain 1-D layer), so that the configs, and the `.keras` files, of 1-D
    models stay as they were; `from_config` gives the missing arguments
    their defaults, which rebuilds an equal layer. A layer on a grid writes
    them all.

    Args:
        config: dict. The layer's config so far; updated in place.
        arguments: dict. The grid arguments' names and values.
        one_axis_defaults: dict. Each argument's default on a line.
        on_a_grid: bool. Whether the layer reads positions of more than one
            axis.

    Returns:
        `config`.
    """
    config.update(
        {
            name: value
            for name, value in arguments.items()
            if on_a_grid or value != one_axis_defaults[name]
        }
    )
    return config
