"""Independent float64 NumPy references, written from the papers' formulas."""

import math

import numpy as np


def sinusoidal(positions, dim, max_wavelength=10000.0, pairing="interleaved"):
    """Vaswani et al. 2017, section 3.5, one feature at a time, in float64.

    PE(p, 2i) = sin(p / max_wavelength^(2i / dim)),
    PE(p, 2i + 1) = cos(p / max_wavelength^(2i / dim)).
    """
    positions = np.asarray(positions, dtype="float64")
    table = np.zeros(positions.shape + (dim,), dtype="float64")
    for index in np.ndindex(positions.shape):
        p = positions[index]
        for feature in range(dim):
            if pairing == "interleaved":
                pair, use_cos = feature // 2, feature % 2 == 1
            else:
                pair, use_cos = feature % (dim // 2), feature >= dim // 2
            angle = p / max_wavelength ** (2 * pair / dim)
            table[index + (feature,)] = (
                math.cos(angle) if use_cos else math.sin(angle)
            )
    return table


def _default_inverse_frequencies(dim, base):
    """theta_i = base^(-2i / dim), i = 0 .. dim/2 - 1 (Su et al. 2021, eq. 15)."""
    return np.array([base ** (-2.0 * i / dim) for i in range(dim // 2)], "float64")


def _yarn_mscale(scale, mscale=1.0):
    """YaRN's attention temperature, 0.1 ln(s) + 1 (Peng et al. 2023, eq. 22)."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(rotations, dim, base, original):
    """The pair index whose wavelength fits `rotations` times in `original`."""
    turns = original / (rotations * 2.0 * math.pi)
    return dim * math.log(turns) / (2.0 * math.log(base))


def rope_inverse_frequencies(dim, base=10000.0, scaling=None, length=None):
    """RoPE inverse frequencies under a Hugging Face style scaling dict.

    Follows `_compute_*_parameters` of transformers' `modeling_rope_utils.py`
    one pair at a time in float64, with `original_max_position_embeddings`
    always read from `scaling` ("type" is read as "rope_type", as in older
    configs). Returns `(inverse_frequencies, attention_factor)`:
    a float64 array of `dim // 2` values and a Python float.
    """
    scaling = dict(scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    half = dim // 2
    if rope_type == "default":
        return _default_inverse_frequencies(dim, base), 1.0
    if rope_type == "linear":
        return _default_inverse_frequencies(dim, base) / scaling["factor"], 1.0
    factor = scaling.get("factor")
    original = scaling["original_max_position_embeddings"]
    if rope_type == "dynamic":
        length = original if length is None else max(length, original)
        scaled_base = base * (factor * length / original - (factor - 1.0)) ** (
            dim / (dim - 2.0)
        )
        return _default_inverse_frequencies(dim, scaled_base), 1.0
    if rope_type == "yarn":
        low = _yarn_correction_dim(scaling.get("beta_fast", 32.0), dim, base, original)
        high = _yarn_correction_dim(scaling.get("beta_slow", 1.0), dim, base, original)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        inverse_frequencies = np.zeros(half, "float64")
        for i in range(half):
            extrapolation = base ** (-2.0 * i / dim)
            interpolation = extrapolation / factor
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            # ramp 0 (fast pairs): extrapolate; ramp 1 (slow pairs): interpolate.
            inverse_frequencies[i] = interpolation * ramp + extrapolation * (1.0 - ramp)
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            mscale = scaling.get("mscale")
            mscale_all_dim = scaling.get("mscale_all_dim")
            if mscale and mscale_all_dim:
                attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(
                    factor, mscale_all_dim
                )
            else:
                attention_factor = _yarn_mscale(factor)
        return inverse_frequencies, float(attention_factor)
    if rope_type == "llama3":
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        low_freq_wavelength = original / low_freq_factor
        high_freq_wavelength = original / high_freq_factor
        inverse_frequencies = _default_inverse_frequencies(dim, base)
        for i in range(half):
            wavelength = 2.0 * math.pi / inverse_frequencies[i]
            if wavelength > low_freq_wavelength:
                inverse_frequencies[i] /= factor
            elif wavelength >= high_freq_wavelength:
                smooth = (original / wavelength - low_freq_factor) / (
                    high_freq_factor - low_freq_factor
                )
                inverse_frequencies[i] *= (1.0 - smooth) / factor + smooth
        return inverse_frequencies, 1.0
    if rope_type == "longrope":
        use_long = length is not None and length > original
        rescale = scaling["long_factor" if use_long else "short_factor"]
        inverse_frequencies = np.array(
            [1.0 / (rescale[i] * base ** (2.0 * i / dim)) for i in range(half)],
            "float64",
        )
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            if factor is None or factor <= 1.0:
                attention_factor = 1.0
            else:
                attention_factor = math.sqrt(
                    1.0 + math.log(factor) / math.log(original)
                )
        return inverse_frequencies, float(attention_factor)
    raise ValueError(f"Unknown rope_type: {rope_type!r}")


def rotary(
    x,
    positions,
    inverse_frequencies,
    attention_factor=1.0,
    pairing="half",
    rotary_dim=None,
):
    """RoPE (Su et al. 2021, eq. 13), one 2x2 rotation per feature pair, in float64.

    `x` is `(batch, seq, dim)` or `(batch, seq, heads, dim)`; `positions` is
    `(seq,)` or `(batch, seq)`. Layout "half" pairs feature i with i + r/2,
    "interleaved" pairs 2i with 2i + 1, where r = `rotary_dim` or dim; features
    from r on pass through. Pair i turns by position * inverse_frequencies[i],
    and both rotated outputs are scaled by `attention_factor`.
    """
    x = np.asarray(x, dtype="float64")
    positions = np.asarray(positions, dtype="float64")
    inverse_frequencies = np.asarray(inverse_frequencies, dtype="float64")
    rotated_dim = x.shape[-1] if rotary_dim is None else rotary_dim
    output = x.copy()
    for batch in range(x.shape[0]):
        for step in range(x.shape[1]):
            if positions.ndim == 1:
                position = positions[step]
            else:
                position = positions[batch, step]
            for pair in range(rotated_dim // 2):
                if pairing == "half":
                    first, second = pair, pair + rotated_dim // 2
                else:
                    first, second = 2 * pair, 2 * pair + 1
                angle = position * inverse_frequencies[pair]
                rotation = attention_factor * np.array(
                    [[math.cos(angle), -math.sin(angle)],
                     [math.sin(angle), math.cos(angle)]]
                )
                # (2, heads) or (2,): the pair's two features, every head.
                pair_values = np.stack(
                    [x[batch, step, ..., first], x[batch, step, ..., second]]
                )
                rotated = rotation @ pair_values
                output[batch, step, ..., first] = rotated[0]
                output[batch, step, ..., second] = rotated[1]
    return output


# ALiBi and T5.


def alibi_slopes(n):
    """ALiBi's head slopes, as `get_slopes` in the authors' code, in float64.

    Press et al. 2022 (github.com/ofirpress/attention_with_linear_biases,
    fairseq/models/transformer.py): the geometric sequence with start and
    ratio 2^(-8/n) for n a power of two; otherwise the closest power of two
    below's slopes, then every other slope of twice that power.
    """

    def power_of_2_slopes(heads):
        start = 2 ** (-(2 ** -(math.log2(heads) - 3)))
        ratio = start
        return [start * ratio**i for i in range(heads)]

    if math.log2(n).is_integer():
        return np.array(power_of_2_slopes(n), "float64")
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return np.array(
        power_of_2_slopes(closest_power_of_2)
        + list(alibi_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]),
        "float64",
    )


def t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5's bucket of one relative position (key - query), a Python int.

    Mesh TensorFlow's `_relative_position_bucket` (transformer/attention.py)
    for a single integer, with the log in float64: `n` is the distance back
    from the query (both directions if bidirectional, keys after the query
    taking the upper half of the buckets).
    """
    bucket = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(
        math.log(n / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    )
    return bucket + min(large, num_buckets - 1)


# Hugging Face configs beyond the rope_scaling dict.


def proportional_inverse_frequencies(
    head_dim, base, partial_rotary_factor=1.0, factor=1.0
):
    """Proportional RoPE's inverse frequencies (Gemma 4), one pair at a time.

    transformers' `_compute_proportional_rope_parameters`, in float64: the
    first int(partial_rotary_factor * head_dim // 2) pairs take
    base^(-2i / head_dim), spaced over the whole head; the rest take 0; all
    are divided by `factor`.
    """
    rotated_pairs = int(partial_rotary_factor * head_dim // 2)
    return np.array(
        [
            base ** (-2.0 * i / head_dim) / factor if i < rotated_pairs else 0.0
            for i in range(head_dim // 2)
        ],
        "float64",
    )


def rotary_deinterleaved(x, positions, inverse_frequencies, attention_factor=1.0):
    """DeepSeek-V3's rotation in transformers, in float64.

    `apply_rotary_pos_emb_interleave`: features 2i and 2i + 1 first move to
    places i and i + d/2 (every even feature, then every odd one), then turn
    as pairs of the "half" pairing. The pairs (2i, 2i + 1) of the input turn by
    position * inverse_frequencies[i]; the output comes in the moved order.
    """
    x = np.asarray(x, dtype="float64")
    moved = np.concatenate([x[..., 0::2], x[..., 1::2]], -1)
    return rotary(moved, positions, inverse_frequencies, attention_factor, "half")


def rotary_complex(x, positions, inverse_frequencies, attention_factor=1.0):
    """DeepSeek-V2's rotation in transformers (`apply_rotary_emb`), in float64.

    Features 2i and 2i + 1 are the complex number x[2i] + j x[2i + 1], which
    is multiplied by attention_factor * exp(j * position * inverse_frequencies[i]).
    `x` is `(batch, seq, [heads,] dim)`, `positions` `(seq,)`.
    """
    x = np.asarray(x, dtype="float64")
    angles = np.outer(np.asarray(positions, "float64"), inverse_frequencies)
    angles = angles.reshape((1, angles.shape[0]) + (1,) * (x.ndim - 3) + (-1,))
    turned = (x[..., 0::2] + 1j * x[..., 1::2]) * attention_factor * np.exp(1j * angles)
    output = np.empty_like(x)
    output[..., 0::2], output[..., 1::2] = turned.real, turned.imag
    return output


def mae_2d_sincos_pos_embed(embed_dim, grid_size, cls_token=False):
    """MAE's `get_2d_sincos_pos_embed` (facebookresearch/mae util/pos_embed.py).

    Its construction kept as it is, in float64: `np.meshgrid(grid_w, grid_h)`
    makes `grid[0]` the column index, so the first half of the features
    ("emb_h" in MAE) encodes the column and the second half the row. Each
    half is `get_1d_sincos_pos_embed_from_grid`: omega = 1 / 10000 **
    (arange(D / 2) / (D / 2)), all sines then all cosines. A class token
    gets a row of zeros in front.
    """
    grid_h = np.arange(grid_size, dtype="float64")
    grid_w = np.arange(grid_size, dtype="float64")
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0)  # w goes first
    grid = grid.reshape([2, 1, grid_size, grid_size])

    def embed_1d(half_dim, pos):
        omega = np.arange(half_dim // 2, dtype="float64") / (half_dim / 2.0)
        omega = 1.0 / 10000**omega  # (D/2,)
        out = np.einsum("m,d->md", pos.reshape(-1), omega)  # (M, D/2)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)  # (M, D)

    emb_h = embed_1d(embed_dim // 2, grid[0])  # (H*W, D/2)
    emb_w = embed_1d(embed_dim // 2, grid[1])  # (H*W, D/2)
    pos_embed = np.concatenate([emb_h, emb_w], axis=1)  # (H*W, D)
    if cls_token:
        pos_embed = np.concatenate([np.zeros([1, embed_dim]), pos_embed], axis=0)
    return pos_embed


def sinusoidal_on_axes(positions, dim, max_wavelength=10000.0, pairing="half"):
    """N-D sinusoidal encoding: axis a's 1-D encoding in block a, in float64.

    `positions` of shape `(..., num_axes)`; each block has `dim / num_axes`
    features, from `sinusoidal` above.
    """
    positions = np.asarray(positions, dtype="float64")
    num_axes = positions.shape[-1]
    return np.concatenate(
        [
            sinusoidal(positions[..., axis], dim // num_axes, max_wavelength, pairing)
            for axis in range(num_axes)
        ],
        axis=-1,
    )


# RoPE on grids: Theta[i, a] is pair i's frequency for axis a.


def axial_rope_frequencies(rotary_dim, num_axes, base=10000.0):
    """Axial RoPE (EVA-02; rotary-embedding-torch's axial "lang" frequencies).

    Each axis has its own RoPE of rotary_dim / num_axes features: pairs
    a * k .. a * k + k - 1 (k = rotary_dim / (2 num_axes)) read axis a, pair
    a * k + j at base^(-2j / (rotary_dim / num_axes)). Returns a float64
    `(rotary_dim / 2, num_axes)` array.
    """
    axis_dim = rotary_dim // num_axes
    pairs_per_axis = axis_dim // 2
    theta = np.zeros((rotary_dim // 2, num_axes), "float64")
    for pair in range(rotary_dim // 2):
        axis, j = divmod(pair, pairs_per_axis)
        theta[pair, axis] = base ** (-2.0 * j / axis_dim)
    return theta


def mrope_frequencies(rotary_dim, mrope_section, base=10000.0):
    """Qwen2-VL's M-RoPE (Wang et al. 2024, section 2.1; `mrope_section`).

    One RoPE schedule over the whole width, pair i at base^(-2i / rotary_dim);
    the first mrope_section[0] pairs read t, the next mrope_section[1] read h,
    the last mrope_section[2] read w.
    """
    theta = np.zeros((rotary_dim // 2, len(mrope_section)), "float64")
    bounds = np.cumsum(mrope_section)
    for pair in range(rotary_dim // 2):
        axis = int(np.searchsorted(bounds, pair, side="right"))
        theta[pair, axis] = base ** (-2.0 * pair / rotary_dim)
    return theta


def interleaved_mrope_frequencies(rotary_dim, mrope_section, base=10000.0):
    """Qwen3-VL's interleaved M-RoPE (`Qwen3VLTextRotaryEmbedding`).

    One RoPE schedule, pair i at base^(-2i / rotary_dim), reading t by
    default; pair i reads h when i % 3 == 1 and i < 3 * mrope_section[1], w
    when i % 3 == 2 and i < 3 * mrope_section[2].
    """
    theta = np.zeros((rotary_dim // 2, 3), "float64")
    for pair in range(rotary_dim // 2):
        axis = 0
        if pair % 3 == 1 and pair < 3 * mrope_section[1]:
            axis = 1
        elif pair % 3 == 2 and pair < 3 * mrope_section[2]:
            axis = 2
        theta[pair, axis] = base ** (-2.0 * pair / rotary_dim)
    return theta


def pixtral_frequencies(head_dim, base=10000.0):
    """Pixtral's 2-D RoPE (mistral's `precompute_freqs_cis_2d`).

    The head's RoPE schedule w_k = base^(-2k / head_dim), k < head_dim / 2:
    the even ones, w_0, w_2, ..., for rows in the first head_dim / 4 pairs,
    the odd ones, w_1, w_3, ..., for columns in the last head_dim / 4.
    """
    quarter = head_dim // 4
    theta = np.zeros((head_dim // 2, 2), "float64")
    for pair in range(head_dim // 2):
        axis, j = divmod(pair, quarter)
        theta[pair, axis] = base ** (-2.0 * (2 * j + axis) / head_dim)
    return theta


def grid_rotary(x, positions, theta, pairing="half", num_prefix_tokens=0):
    """RoPE on a grid, one 2x2 rotation per feature pair, in float64.

    `x` is `(batch, seq, dim)` or `(batch, seq, heads, dim)`; `positions` is
    `(seq - num_prefix_tokens, n)` or `(batch, seq - num_prefix_tokens, n)`;
    `theta` is `(pairs, n)`, or `(heads, pairs, n)` per head. Pair i of a
    token at p turns by sum_a theta[i, a] * p[a]; its features are (i, i + r/2)
    for pairing "half", (2i, 2i + 1) for "interleaved", r = 2 * pairs, and the
    features from r on pass through, as do the first num_prefix_tokens tokens.
    """
    x = np.asarray(x, dtype="float64")
    positions = np.asarray(positions, dtype="float64")
    theta = np.asarray(theta, dtype="float64")
    pairs = theta.shape[-2]
    output = x.copy()
    for batch in range(x.shape[0]):
        for step in range(num_prefix_tokens, x.shape[1]):
            token = step - num_prefix_tokens
            p = positions[token] if positions.ndim == 2 else positions[batch, token]
            for head in range(x.shape[2] if x.ndim == 4 else 1):
                head_theta = theta[head] if theta.ndim == 3 else theta
                where = (batch, step, head) if x.ndim == 4 else (batch, step)
                for pair in range(pairs):
                    if pairing == "half":
                        first, second = pair, pair + pairs
                    else:
                        first, second = 2 * pair, 2 * pair + 1
                    angle = sum(
                        head_theta[pair, axis] * p[axis] for axis in range(len(p))
                    )
                    a, b = x[where + (first,)], x[where + (second,)]
                    output[where + (first,)] = a * math.cos(angle) - b * math.sin(angle)
                    output[where + (second,)] = b * math.cos(angle) + a * math.sin(angle)
    return output


# Swin's relative position bias on a grid, BEiT's prefix rows.


def swin_relative_position_index(window, class_token=False):
    """Swin's `relative_position_index` for a window of 1, 2 or 3 axes.

    Liu et al. 2021, section 3.2, and its code (SwinTransformer's
    WindowAttention; Video Swin's for three axes): coordinates from an "ij"
    meshgrid, flattened; `coords[:, :, None] - coords[:, None, :]` (query
    minus key); each axis shifted by `w - 1`, multiplied by the number of
    offsets of the axes after it, and summed. With `class_token`, BEiT's
    (Bao et al. 2022, beit/modeling_finetune.py): a first row and column,
    `rows` for class to patch, `rows + 1` patch to class, `rows + 2` class
    to class, where `rows` is the number of patch-to-patch rows.
    """
    coords = np.stack(
        np.meshgrid(*[np.arange(size) for size in window], indexing="ij")
    ).reshape(len(window), -1)  # (axes, cells)
    relative = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
    relative = relative + (np.asarray(window) - 1)  # (cells, cells, axes)
    for axis in range(len(window) - 1):
        relative[:, :, axis] *= math.prod(2 * size - 1 for size in window[axis + 1 :])
    index = relative.sum(-1)  # (cells, cells)
    if class_token:
        rows = math.prod(2 * size - 1 for size in window)
        index = np.pad(index, [(1, 0), (1, 0)])
        index[0, :] = rows
        index[:, 0] = rows + 1
        index[0, 0] = rows + 2
    return index


def grid_relative_position_bias(
    table, window, query_positions, key_positions, num_prefix_tokens=0
):
    """Swin's bias for any positions, one query and key at a time, in float64.

    `table` is `(rows, heads)`; positions are `(batch, sequence, axes)`.
    The offset `query - key` of each axis is clipped to `+-(w - 1)`, then
    read as the row-major index over the `2 w - 1` offsets of each axis.
    Prefix tokens, first in the sequence, read BEiT's three rows after the
    grid's (prefix to grid, grid to prefix, prefix to prefix).

    Returns:
        `(batch, heads, prefix + query, prefix + key)`.
    """
    table = np.asarray(table, "float64")
    sizes = [2 * size - 1 for size in window]
    rows = math.prod(sizes)
    batch, queries, keys = (
        query_positions.shape[0],
        query_positions.shape[1],
        key_positions.shape[1],
    )
    prefix = num_prefix_tokens
    bias = np.zeros((batch, table.shape[1], prefix + queries, prefix + keys))
    for b in range(batch):
        for i in range(prefix + queries):
            for j in range(prefix + keys):
                if i < prefix and j < prefix:
                    row = rows + 2
                elif i < prefix:
                    row = rows
                elif j < prefix:
                    row = rows + 1
                else:
                    offset = [
                        min(max(q - k, 1 - size), size - 1) + size - 1
                        for q, k, size in zip(
                            query_positions[b, i - prefix],
                            key_positions[b, j - prefix],
                            window,
                        )
                    ]
                    row = int(np.ravel_multi_index(offset, sizes))
                bias[b, :, i, j] = table[row]
    return bias


# Graphs: PyTorch Geometric's transforms, from their definitions.


def laplacian(adjacency, normalization="sym"):
    """PyG's `get_laplacian` of one dense `(n, n)` adjacency, in float64.

    Self loops are removed first; the degree of node i is the sum of row i.
    `normalization=None`: `L = D - A`. `"sym"`: `L = I - D^-1/2 A D^-1/2`,
    entry by entry, with `d_i^-1/2 = 0` for a node of degree 0 (PyG turns
    the infinity to 0), so that an isolated node's diagonal entry is 1.
    """
    adjacency = np.array(adjacency, dtype="float64")
    n = len(adjacency)
    for i in range(n):
        adjacency[i, i] = 0.0
    degree = [sum(adjacency[i, j] for j in range(n)) for i in range(n)]
    matrix = np.zeros((n, n), "float64")
    if normalization is None:
        for i in range(n):
            for j in range(n):
                matrix[i, j] = (degree[i] if i == j else 0.0) - adjacency[i, j]
        return matrix
    if normalization != "sym":
        raise ValueError(f"Unknown normalization: {normalization!r}")
    inverse_sqrt = [1.0 / math.sqrt(d) if d > 0 else 0.0 for d in degree]
    for i in range(n):
        for j in range(n):
            matrix[i, j] = (1.0 if i == j else 0.0) - (
                inverse_sqrt[i] * adjacency[i, j] * inverse_sqrt[j]
            )
    return matrix


def laplacian_spectrum(adjacency, normalization="sym"):
    """All eigenvalues, ascending, and eigenvectors (columns) of `laplacian`.

    `numpy.linalg.eigh` in float64, sorted with `argsort` as PyG's
    `AddLaplacianEigenvectorPE` sorts them.
    """
    eigenvalues, eigenvectors = np.linalg.eigh(laplacian(adjacency, normalization))
    order = np.argsort(eigenvalues)
    return eigenvalues[order], eigenvectors[:, order]


def laplacian_eigenvector_pe(adjacency, k, normalization="sym"):
    """PyG's `AddLaplacianEigenvectorPE` of one graph, without its sign flips.

    The eigenvectors of the k smallest eigenvalues after the first
    (`eig_vecs[:, eig_vals.argsort()][:, 1:k + 1]`): exactly one is dropped,
    however many components the graph has. A graph of fewer than k + 1 nodes
    has `n - 1` of them; the missing columns, and their eigenvalues, are 0.

    Returns:
        `(eigenvalues (k,), eigenvectors (n, k))`, float64.
    """
    eigenvalues, eigenvectors = laplacian_spectrum(adjacency, normalization)
    n = len(eigenvalues)
    values = np.zeros(k, "float64")
    vectors = np.zeros((n, k), "float64")
    taken = min(k, n - 1)
    values[:taken] = eigenvalues[1 : taken + 1]
    vectors[:, :taken] = eigenvectors[:, 1 : taken + 1]
    return values, vectors


def random_walk_pe(adjacency, steps):
    """Return probabilities of a random walk: `((D^-1 A)^s)[i, i]`, s = 1 .. steps.

    The package's definition: a step from i goes to j with probability
    `A[i, j] / D[i]`, D the row sums; self loops are kept (they are edges);
    a node with no edge has a zero row. On a 0/1 adjacency this is PyG's
    `AddRandomWalkPE` (`pyg_random_walk_pe`); on a weighted one PyG's steps
    ignore the weights. The power is one matrix product per step, written as
    loops.

    Returns:
        `(n, steps)`, float64.
    """
    adjacency = np.asarray(adjacency, dtype="float64")
    n = len(adjacency)
    transition = np.zeros((n, n), "float64")
    for i in range(n):
        degree = sum(adjacency[i, j] for j in range(n))
        for j in range(n):
            transition[i, j] = adjacency[i, j] / degree if degree > 0 else 0.0
    encoding = np.zeros((n, steps), "float64")
    power = np.eye(n)
    for step in range(steps):
        product = np.zeros((n, n), "float64")
        for i in range(n):
            for j in range(n):
                product[i, j] = sum(power[i, m] * transition[m, j] for m in range(n))
        power = product
        for i in range(n):
            encoding[i, step] = power[i, i]
    return encoding


def pyg_random_walk_pe(adjacency, steps):
    """PyG's `AddRandomWalkPE` as its source reads, on the edge list.

    Each edge (i, j), `adjacency[i, j] != 0`, self loops included, gets the
    value `1 / max(sum of the weights of i's edges, 1)` (its own weight is
    not read); the walk matrix holds these values, and its s-th power's
    diagonal is the encoding at step s. Returns `(n, steps)`, float64.
    """
    adjacency = np.asarray(adjacency, dtype="float64")
    n = len(adjacency)
    edges = [(i, j) for i in range(n) for j in range(n) if adjacency[i, j] != 0]
    out_weight = [0.0] * n
    for i, j in edges:
        out_weight[i] += adjacency[i, j]
    walk = np.zeros((n, n), "float64")
    for i, j in edges:
        walk[i, j] = 1.0 / max(out_weight[i], 1.0)
    encoding = np.zeros((n, steps), "float64")
    power = np.eye(n)
    for step in range(steps):
        power = power @ walk
        encoding[:, step] = np.diag(power)
    return encoding


def hop_counts(adjacency, max_hops):
    """Shortest-path hop counts by breadth-first search from each node.

    An edge goes from i to j where `adjacency[i, j] != 0`. The count from
    i to j is clipped to `max_hops`; `max_hops + 1` where j cannot
    be reached from i at all. Returns `(n, n)` int64.
    """
    n = len(adjacency)
    neighbours = [[j for j in range(n) if adjacency[i][j] != 0] for i in range(n)]
    counts = np.full((n, n), max_hops + 1, "int64")
    for source in range(n):
        distance = {source: 0}
        frontier = [source]
        while frontier:
            following = []
            for node in frontier:
                for neighbour in neighbours[node]:
                    if neighbour not in distance:
                        distance[neighbour] = distance[node] + 1
                        following.append(neighbour)
            frontier = following
        for target, hops in distance.items():
            counts[source, target] = min(hops, max_hops)
    return counts
