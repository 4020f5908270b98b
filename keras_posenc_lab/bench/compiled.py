"""The benchmarks' one view of the backend: compile, wait, read the program.

`keras-posenc bench` measures on the backend that `KERAS_BACKEND` names.
TensorFlow and JAX compile every candidate with XLA (`tf.function(
jit_compile=True)`, `jax.jit`) and read the compiled program: its
optimized HLO text and the bytes XLA assigns to it. PyTorch runs the
candidates as they are (its compiler is not XLA), and has no program to
read: there the memory columns are left out.

On JAX a layer's weights are arguments of the compiled program, as
TensorFlow's variables are, not constants folded into it: a candidate that
is a `functools.partial` over Keras layers is compiled with their
variables passed in (`keras.StatelessScope`); so is a layer, or a function
whose closure holds layers or bare `keras.Variable`s.
"""

import functools
import math
import re

import keras


def backend():
    """The backend measured: `"tensorflow"`, `"jax"` or `"torch"`."""
    return keras.backend.backend()


def has_programs():
    """Whether the backend compiles with XLA, so that HLO can be read."""
    return backend() in ("tensorflow", "jax")


def _held_by(fn):
    """The values a `functools.partial` or a function's closure holds."""
    if isinstance(fn, functools.partial):
        return list(fn.args) + list(fn.keywords.values())
    return [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()]


def _layers_of(fn):
    """The Keras layers a candidate is or closes over.

    A layer itself, a `functools.partial` over layers, or a function whose
    closure holds them (the lambdas of the grid benchmark).
    """
    if isinstance(fn, keras.layers.Layer):
        return [fn]
    return [value for value in _held_by(fn) if isinstance(value, keras.layers.Layer)]


def _variables_of(fn):
    """The variables of `fn`'s layers, and those it holds itself.

    A bare `keras.Variable` in a closure or a partial (a floor's table, a
    start index read at run time) is an argument too, as on TensorFlow.
    """
    variables = [variable for layer in _layers_of(fn) for variable in layer.variables]
    if not isinstance(fn, keras.layers.Layer):
        variables += [value for value in _held_by(fn) if isinstance(value, keras.Variable)]
    return variables


def jit(fn):
    """`fn` compiled with XLA where the backend has it; eager on PyTorch."""
    name = backend()
    if name == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if name == "jax":
        return _JaxCandidate(fn)
    return fn


class _JaxCandidate:
    """`jax.jit` of `fn`, the variables of its layers passed as arguments."""

    def __init__(self, fn):
        import jax

        self.variables = _variables_of(fn)

        def pure(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(self.variables, values))):
                return fn(*args)

        self.compiled = jax.jit(pure)

    def values(self):
        return [variable.value for variable in self.variables]

    def __call__(self, *args):
        return self.compiled(self.values(), *args)

    def lowered(self, *args):
        return self.compiled.lower(self.values(), *args).compile()


def wait_for(outputs):
    """Return once every tensor in `outputs` has been computed."""
    # Reading one element waits for the whole computation that made the
    # tensor (asynchronous devices included) without copying all of it back.
    for tensor in keras.tree.flatten(outputs):
        keras.ops.convert_to_numpy(keras.ops.reshape(tensor, (-1,))[:1])


def optimized_hlo(fn, *args):
    """The optimized HLO text of `fn(*args)` compiled with XLA."""
    compiled = jit(fn)
    if backend() == "tensorflow":
        return compiled.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
    if backend() == "jax":
        return compiled.lowered(*args).as_text()
    raise RuntimeError(
        f"Keras' {backend()} backend does not compile with XLA: no HLO to read."
    )


def results_of_size(hlo, size):
    """How many results of `size` elements the entry computation writes.

    Read from optimized HLO text (`optimized_hlo`): each instruction of the
    entry computation (a fusion, product or reduction that XLA did not
    fuse into another) writes its result; a bitcast reinterprets a buffer
    and writes nothing. Shapes are matched by their number of elements, as
    XLA drops axes of size 1. With `size` that of attention logits, the
    passes that write them.

    Args:
        hlo: str. Optimized HLO text.
        size: int. The number of elements.

    Returns:
        An int.
    """
    entry = hlo[hlo.index("\nENTRY") :]
    return sum(
        1
        for dims, op in re.findall(r"= (?:f32|pred)\[([\d,]+)\]\S* ([\w-]+)\(", entry)
        if op != "bitcast" and math.prod(int(dim) for dim in dims.split(",")) == size
    )


def compiled_bytes(fn, *args):
    """Bytes that XLA assigns to one compiled call of `fn(*args)`.

    The temporary buffers (XLA's heap simulation of the schedule sizes
    their block to the most that is live at once), the output and, on
    TensorFlow, the constants folded into the program. Left out are the
    parameters: the inputs and the weights.
    """
    compiled = jit(fn)
    if backend() == "tensorflow":
        from tensorflow.compiler.xla.service import hlo_pb2

        serialized = compiled.experimental_get_compiler_ir(*args)(
            stage="optimized_hlo_proto_serialized"
        )
        assignment = hlo_pb2.HloProto.FromString(serialized).buffer_assignment
        return sum(
            allocation.size
            for allocation in assignment.buffer_allocations
            if not allocation.is_entry_computation_parameter
        )
    if backend() == "jax":
        analysis = compiled.lowered(*args).memory_analysis()
        return analysis.temp_size_in_bytes + analysis.output_size_in_bytes
    raise RuntimeError(
        f"Keras' {backend()} backend does not compile with XLA: no buffer "
        "assignment to read."
    )


def zeros(shape):
    return keras.ops.zeros(shape, "float32")


def normal(shape, seed):
    """A float32 standard normal tensor of `shape`, the same for a seed."""
    return keras.random.normal(shape, seed=keras.random.SeedGenerator(seed))


def versions():
    """The backend's library and its version, as a line of the report."""
    name = backend()
    if name == "tensorflow":
        import tensorflow as tf

        return f"TensorFlow {tf.__version__}"
    if name == "jax":
        import jax

        return f"JAX {jax.__version__} ({jax.default_backend()})"
    import torch

    return f"PyTorch {torch.__version__}"


_LIBRARIES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}


def library():
    """The name of the backend's library: "TensorFlow", "JAX" or "PyTorch"."""
    return _LIBRARIES[backend()]


def accelerators():
    """The names of the GPUs the backend sees; empty where it sees none."""
    name = backend()
    if name == "tensorflow":
        import tensorflow as tf

        return [
            tf.config.experimental.get_device_details(device).get(
                "device_name", device.name
            )
            for device in tf.config.list_physical_devices("GPU")
        ]
    if name == "jax":
        import jax

        return [device.device_kind for device in jax.devices() if device.platform == "gpu"]
    import torch

    return [
        torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())
    ]
