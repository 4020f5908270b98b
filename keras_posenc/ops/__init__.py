"""Pure functions of tensors behind the layers: frequencies, angles, tables.

Everything here takes and returns tensors of the Keras backend, holds no
Keras state and imports nothing from the rest of the package. Angles and
tables are float32; the layers cast them to their compute dtype at the very
end. One module per topic; every name is re-exported here.
"""

from keras_posenc.ops._checks import (
    PAIRINGS,
    check_pairing,
    check_rotary_dim,
    check_sequence_and_feature_axes,
    rotary_axes,
    check_number_above_one,
    check_max_wavelength,
    check_positive_int,
    check_bool,
    check_num_axes,
    check_grid_shape,
    check_integer_scalar,
    AXIS_LAYOUTS,
    check_axis_layout,
    check_relative_position_buckets,
    INTERPOLATIONS,
    check_interpolation,
    LAPLACIAN_NORMALIZATIONS,
    check_laplacian_normalization,
    check_adjacency_shape,
)
from keras_posenc.ops.positions import (
    read_positions,
    grid_positions,
    position_ids,
    multimodal_positions,
)
from keras_posenc.ops.sinusoidal import (
    inverse_frequencies,
    angles,
    sinusoidal,
    translation_matrix,
)
from keras_posenc.ops.rotary import (
    rotate,
    rotate_by_tables,
    shifted_cos_sin,
    rope_pair_axes,
    rope_frequency_matrix,
    grid_angles,
)
from keras_posenc.ops.relative import (
    alibi_slopes,
    relative_position_shape,
    relative_position,
    relative_distance_shape,
    relative_distance,
    clipped_distance_rows,
    relative_position_bucket,
    grid_relative_position_index,
    make_log_bucket_position,
    build_relative_position,
)
from keras_posenc.ops.resize import (
    resize_matrix,
    resize_grid,
)
from keras_posenc.ops.graph import (
    read_adjacency,
    laplacian,
    laplacian_eigenvectors,
    random_walk_probabilities,
    hop_counts,
    nan_where_nan_graphs,
)

__all__ = [
    "AXIS_LAYOUTS",
    "INTERPOLATIONS",
    "LAPLACIAN_NORMALIZATIONS",
    "PAIRINGS",
    "alibi_slopes",
    "angles",
    "build_relative_position",
    "check_adjacency_shape",
    "check_axis_layout",
    "check_bool",
    "check_grid_shape",
    "check_integer_scalar",
    "check_interpolation",
    "check_laplacian_normalization",
    "check_max_wavelength",
    "check_num_axes",
    "check_number_above_one",
    "check_pairing",
    "check_positive_int",
    "check_relative_position_buckets",
    "check_rotary_dim",
    "check_sequence_and_feature_axes",
    "clipped_distance_rows",
    "grid_angles",
    "grid_positions",
    "grid_relative_position_index",
    "hop_counts",
    "nan_where_nan_graphs",
    "inverse_frequencies",
    "laplacian",
    "laplacian_eigenvectors",
    "make_log_bucket_position",
    "multimodal_positions",
    "position_ids",
    "random_walk_probabilities",
    "read_adjacency",
    "read_positions",
    "relative_distance",
    "relative_distance_shape",
    "relative_position",
    "relative_position_bucket",
    "relative_position_shape",
    "resize_grid",
    "resize_matrix",
    "rope_frequency_matrix",
    "rope_pair_axes",
    "rotary_axes",
    "rotate",
    "rotate_by_tables",
    "shifted_cos_sin",
    "sinusoidal",
    "translation_matrix",
]
