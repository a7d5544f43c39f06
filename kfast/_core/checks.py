"""Argument checks shared by kfast's constructors and functions, so a bad value reads the same everywhere.

Each message names who received what, what was expected, and (through `or_none`/`hint`) how to fix it:

>>> check_int("FastLoader", "workers", 0, or_none="to pick one per CPU core")
Traceback (most recent call last):
...
ValueError: FastLoader got workers=0; it must be a positive int, or None to pick one per CPU core.
"""

import math
import numbers


def _fail(owner, name, value, expected, or_none, hint):
    text = f"{owner} got {name}={value!r}; it must be {expected}"
    if or_none:
        text += f", or None {or_none}"
    if hint:
        text += f" ({hint})"
    raise ValueError(text + ".")


def check_int(owner, name, value, *, least=1, or_none=None, hint=None):
    """Returns `value` if it is an int >= `least`; raises `ValueError` otherwise.

    `bool` is refused although Python counts it as an int: `workers=True` is a mistake, not 1 worker.
    numpy integers are accepted.

    Args:
        owner: who received the value, as the user called it (e.g. `"FastLoader"`).
        name: the argument's name.
        value: what was received.
        least: the smallest allowed value. Defaults to `1`.
        or_none: when set, `None` is accepted too, and this text says what `None` means.
        hint: a short fix or explanation, shown in parentheses.

    Example:

    >>> check_int("ArrayDataset", "batch_size", 32)
    32
    """
    if value is None and or_none:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        expected = "a positive int" if least == 1 else f"an int >= {least}"
        _fail(owner, name, value, expected, or_none, hint)
    return value


def check_number(owner, name, value, *, above=None, least=None, below=None, unit=None, or_none=None, hint=None):
    """Returns `value` if it is a finite real number within the bounds; raises `ValueError` otherwise.

    Args:
        owner: who received the value.
        name: the argument's name.
        value: what was received.
        above: the value must be greater than this (exclusive). Defaults to `None`.
        least: the value must be at least this (inclusive). Defaults to `None`.
        below: the value must be less than this (exclusive). Defaults to `None`.
        unit: what the number counts, e.g. `"seconds"`. Defaults to `None`.
        or_none: when set, `None` is accepted too, and this text says what `None` means.
        hint: a short fix or explanation, shown in parentheses.

    Example:

    >>> check_number("GPUMonitor", "interval", 0.1, above=0, unit="seconds")
    0.1
    >>> check_number("tune", "budget_s", float("nan"), above=0, unit="seconds", hint="e.g. budget_s=30")
    Traceback (most recent call last):
    ...
    ValueError: tune got budget_s=nan; it must be a finite number of seconds > 0 (e.g. budget_s=30).
    """
    if value is None and or_none:
        return value
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and (above is None or value > above) and (least is None or value >= least)
          and (below is None or value < below))
    if not ok:
        bounds = [text for text in (f"> {above}" if above is not None else None,
                                    f">= {least}" if least is not None else None,
                                    f"< {below}" if below is not None else None) if text]
        expected = "a finite number" + (f" of {unit}" if unit else "")
        if bounds:
            expected += " " + " and ".join(bounds)
        _fail(owner, name, value, expected, or_none, hint)
    return value
