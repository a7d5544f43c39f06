"""griffe extension (mkdocs.yml loads it): shows docstrings' `>>>` examples as code in the API reference.

kfast's docstrings write an example as `Example:`, a blank line, then doctest lines at the docstring's own
indentation, so that `tests/test_doctests.py` runs them. griffe's Google parser reads those lines as
plain text, which Markdown turns into nested quotes (and `x[0]["key"]` into a broken link). This wraps
each run of doctest lines, up to the next blank line, in a ```pycon fence; the docstrings themselves
are left alone.
"""

import griffe


def fence_doctests(text):
    """Returns `text` with each run of lines starting at `>>>` (and its output) fenced as pycon."""
    out, in_run = [], False
    for line in text.splitlines():
        if not in_run and line.startswith(">>>"):
            out.append("```pycon")
            in_run = True
        elif in_run and not line.strip():
            out.append("```")
            in_run = False
        out.append(line)
    if in_run:
        out.append("```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_object(self, *, obj, loader, **kwargs):
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
