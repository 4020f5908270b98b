"""Independent float64 NumPy references, written from the papers' formulas."""

import math

import numpy as np


def sinusoidal(positions, dim, max_wavelength=10000.0, layout="interleaved"):
    """Vaswani et al. 2017, section 3.5, one feature at a time, in float64.

    PE(p, 2i) = sin(p / max_wavelength^(2i / dim)),
    PE(p, 2i + 1) = cos(p / max_wavelength^(2i / dim)).
    """
    positions = np.asarray(positions, dtype="float64")
    table = np.zeros(positions.shape + (dim,), dtype="float64")
    for index in np.ndindex(positions.shape):
        p = positions[index]
        for feature in range(dim):
            if layout == "interleaved":
                pair, use_cos = feature // 2, feature % 2 == 1
            else:
                pair, use_cos = feature % (dim // 2), feature >= dim // 2
            angle = p / max_wavelength ** (2 * pair / dim)
            table[index + (feature,)] = (
                math.cos(angle) if use_cos else math.sin(angle)
            )
    return table
