"""How the demo's tasks run: in this process, or two processes side by side.

The language task's small models leave a core idle, so with other tasks
the command runs those in a second process alongside it.
"""

import os
import subprocess
import sys
import tempfile
import time


def set_threads(configs):
    """Set the backends' thread counts for the tasks of `configs`.

    Before Keras imports its backend; values the user set are kept.
    """
    # One op at a time: the demo's small models have ops too small to
    # share the cores between them, and two at once train slower.
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    if _alongside(configs):
        # One thread per op as well when the tasks run in two processes
        # side by side (the second process inherits it): with more, their
        # threads contend for the cores, and both processes end later. One
        # thread also leaves no scheduling to change the order of sums, so
        # a run repeats to the last digit.
        os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
        # PyTorch's ops take theirs from OpenMP's.
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def start(configs, args):
    """Start the second process of `configs`' tasks, if they run in two.

    Called before this process imports Keras and its backend: the second
    process imports its own meanwhile (TensorFlow takes seconds), so the
    two imports overlap rather than follow each other.

    Returns:
        A `Side`, to give `run`, or `None` when the tasks run in this
        process alone.
    """
    if not _alongside(configs):
        return None
    return Side(_side_argv(args, list(configs)[1:]))


def run(configs, args, side=None):
    """Run the tasks of `configs`, with the command's parsed `args`.

    Args:
        configs: dict from task to its config.
        args: the command's parsed arguments.
        side: a `Side` from `start`, or `None`. Where the tasks run in two
            processes and it is `None`, the second one starts now.

    Returns:
        The first failing status, else `0`.
    """
    if _alongside(configs):
        return _run_alongside(configs, side or start(configs, args), args.out)
    return _run_in_turn(configs, args.out)


class Side:
    """The second process: `python -m keras_posenc_lab` with `argv`, started now.

    Its output goes to temporary files, printed whole after this
    process's. `stop` ends it, and closes them.
    """

    def __init__(self, argv):
        self.out = tempfile.TemporaryFile("w+")
        self.err = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "keras_posenc_lab", *argv],
            stdout=self.out,
            stderr=self.err,
        )

    def stop(self):
        """Kill the process if it still runs, and close its files."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.out.close()
        self.err.close()


def _alongside(configs):
    """Whether the tasks of `configs` run in two processes: language and more."""
    return "language" in configs and len(configs) > 1


def _run_demo(task, config, out_dir):
    """Run one task's demo in this process; its exit status."""
    if task == "language":
        from keras_posenc_lab import language

        return language.run(config, out_dir)
    if task == "vision":
        from keras_posenc_lab import vision

        return vision.run(config, out_dir)
    from keras_posenc_lab import graph

    return graph.run(config, out_dir)


def _task_names(tasks):
    """`"the vision task"`, `"the vision and graph tasks"`, ..."""
    tasks = list(tasks)
    if len(tasks) == 1:
        return f"the {tasks[0]} task"
    return f"the {', '.join(tasks[:-1])} and {tasks[-1]} tasks"


def _run_in_turn(configs, out_dir):
    """Run the tasks of `configs` in this process, one after the other.

    Each has a heading when there are several.

    Returns:
        The first failing status, else `0`.
    """
    started = time.perf_counter()
    for task, config in configs.items():
        if len(configs) > 1:
            print(f"\n== The {task} task ==\n", flush=True)
        status = _run_demo(task, config, out_dir)
        if status:
            return status
    if len(configs) > 1:
        print(
            f"\n{_task_names(configs).capitalize()} done in "
            f"{time.perf_counter() - started:.0f} s."
        )
    return 0


def _side_argv(args, tasks):
    """The arguments of `keras-posenc demo --task TASK ...` with `args`' options.

    The tasks after the language task run in a second process given these:
    it parses them into the configs this process would have made.
    """
    argv = ["demo", "--task", *tasks, "--out", args.out]
    for flag in ("quick", "full", "verbose"):
        if getattr(args, flag):
            argv.append(f"--{flag}")
    for option in ("steps", "seed", "seeds"):
        value = getattr(args, option)
        if value is not None:
            argv += [f"--{option}", str(value)]
    return argv


def _run_alongside(configs, side, out_dir):
    """Run the language task here and the other tasks alongside it.

    The other tasks (vision, graph) run one after the other in the second
    process, `side`: each task's small models leave a core idle, so the
    two processes at once take less time than one after the other. Its
    output is kept and printed after the language task's, so that neither
    is cut into the other. The language task times its models' training
    after the second process is done, so that the timing has the machine
    to itself.

    Args:
        configs: dict from task to its config, the language task's first.
        side: a `Side`, running the other tasks with the arguments of
            `_side_argv`.
        out_dir: str. Where every task writes.

    Returns:
        The first failing status, the language task's then the second
        process's, else `0`.
    """
    from keras_posenc_lab import language

    started = time.perf_counter()
    others = list(configs)[1:]
    print(
        f"\n== The language task ==\n\n{_task_names(others).capitalize()} "
        f"{'runs alongside' if len(others) == 1 else 'run alongside, one after the other'}"
        ", in a second process; its log follows this one.",
        flush=True,
    )
    try:

        def wait_for_side():
            if side.process.poll() is None:
                print(
                    f"\nWaiting for {_task_names(others)} to finish, so "
                    "that training is timed alone.",
                    flush=True,
                )
            side.process.wait()

        # A run too short to judge the encodings is not worth the wait.
        judged = configs["language"].judged
        status = language.run(
            configs["language"], out_dir, before_timing=wait_for_side if judged else None
        )
        side_status = side.process.wait() if status == 0 else None
        if status:
            return status
        side.out.seek(0)
        side.err.seek(0)
        if len(others) == 1:
            # Several tasks print their own headings.
            print(f"\n== The {others[0]} task ==\n")
        print(side.out.read(), end="", flush=True)
        print(side.err.read(), end="", file=sys.stderr, flush=True)
    finally:
        # An error or Ctrl-C in this process ends the second one too.
        side.stop()
    if side_status:
        return side_status
    print(
        f"\n{_task_names(configs).capitalize()} done in "
        f"{time.perf_counter() - started:.0f} s."
    )
    return 0
