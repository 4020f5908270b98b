"""A griffe extension: Keras-style docstring sections, read as Google style.

Keras docstrings write their examples unindented after a blank line
("Example:", blank, ">>> ..."), which griffe's Google parser leaves as
plain text, and list their call arguments as "name: text" lines, which
Markdown runs together into one paragraph. This rewrites both before
griffe parses the docstring: the example lines are indented under their
heading, so they become an examples section, and each call argument
becomes a list item.
"""

import re

import griffe

# A heading of the Google style: a line such as "Returns:" or "Call arguments:".
_HEADING = re.compile(r"^[A-Z][A-Za-z ]*:$")
_ARGUMENT = re.compile(r"^(    )([\w*][\w*, ]*):\s*(.*)$")


def _indent_examples(lines):
    """Indent the lines after each "Example:" heading, up to the next heading.

    The heading becomes "Examples:", the one griffe knows.
    """
    rewritten = []
    in_example = False
    for line in lines:
        if _HEADING.match(line):
            in_example = line in ("Example:", "Examples:")
            # Griffe knows "Examples:" only; "Example:" would be an admonition.
            rewritten.append("Examples:" if in_example else line)
        elif in_example:
            # A blank line between the heading and the first example would
            # end the section before it begins.
            if line.strip() or rewritten[-1] != "Examples:":
                rewritten.append("    " + line if line.strip() else "")
        else:
            rewritten.append(line)
    return rewritten


def _list_call_arguments(lines):
    """Turn each "name: text" line under "Call arguments:" into a list item."""
    rewritten = []
    in_call_arguments = False
    pending = ""
    for line in lines:
        # Several names sharing one text may run over two lines.
        if pending:
            line, pending = pending + " " + line.strip(), ""
        elif in_call_arguments and re.match(r"^    \w.*,$", line):
            pending = line
            continue
        if _HEADING.match(line):
            in_call_arguments = line == "Call arguments:"
            rewritten.append(line)
            continue
        match = _ARGUMENT.match(line) if in_call_arguments else None
        if match:
            indent, names, text = match.groups()
            rewritten.append(f"{indent}- `{names}`: {text}")
        else:
            rewritten.append(line)
    return rewritten


class KerasDocstrings(griffe.Extension):
    """Rewrites Keras' example and call-argument sections for griffe."""

    def on_object(self, *, obj, **kwargs):
        if obj.docstring is None:
            return
        lines = obj.docstring.value.split("\n")
        lines = _list_call_arguments(_indent_examples(lines))
        obj.docstring.value = "\n".join(lines)
