"""Checks of the counts, rates and flags passed to the library's public functions."""

import math

import numpy as np


def check_count(value, name, minimum=1, unit=""):
    """`value` as a python int, when it is a whole number >= `minimum`
    (`unit`, e.g. " of search loops", names what it counts in the message).

    Raises:
        ValueError: for a bool, a string, a fractional or non-finite number,
            or one below `minimum` (`beam_size=2.5` would otherwise be cut
            to 2 without a word).

    Example:
    >>> check_count(4, "beam_size")
    4
    >>> check_count(2.5, "beam_size")
    Traceback (most recent call last):
    ...
    ValueError: `beam_size` must be a whole number >= 1; got 2.5.
    """
    try:
        whole = not isinstance(value, (bool, str, bytes)) and int(value) == value
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or int(value) < minimum:
        raise ValueError(f"`{name}` must be a whole number{unit} >= {minimum}; got {value!r}.")
    return int(value)


def check_rate(value, name):
    """`value` as a python float, when it is a real number in `[0, 1)` (a
    dropout rate: 1 would drop everything).

    Raises:
        ValueError: for a bool, a string, NaN, or a number outside `[0, 1)`.

    Example:
    >>> check_rate(0.1, "dropout_rate")
    0.1
    >>> check_rate("0.1", "dropout_rate")
    Traceback (most recent call last):
    ...
    ValueError: `dropout_rate` must be a number in [0, 1); got '0.1'.
    """
    try:
        rate = None if isinstance(value, (bool, str, bytes)) else float(value)
    except (TypeError, ValueError):
        rate = None
    if rate is None or not (math.isfinite(rate) and 0.0 <= rate < 1.0):
        raise ValueError(f"`{name}` must be a number in [0, 1); got {value!r}.")
    return rate


def check_positive(value, name):
    """`value` as a python float, when it is a finite number > 0: an
    epsilon added to a variance before its square root (a negative one
    gives NaN where a row's variance is below it), a length ratio.

    Raises:
        ValueError: for a bool, a string, or a number that is not finite
            and positive.

    Example:
    >>> check_positive(1e-6, "layer_norm_epsilon")
    1e-06
    >>> check_positive(-1, "layer_norm_epsilon")
    Traceback (most recent call last):
    ...
    ValueError: `layer_norm_epsilon` must be a finite number > 0; got -1.
    """
    try:
        number = None if isinstance(value, (bool, str, bytes)) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not (math.isfinite(number) and number > 0.0):
        raise ValueError(f"`{name}` must be a finite number > 0; got {value!r}.")
    return number


def check_bool(value, name):
    """`value` as a python bool, when it is one (or a NumPy bool).

    Raises:
        ValueError: for anything else: the string "False" is truthy, so
            `norm_first="False"` would build pre-LN blocks without a word.

    Example:
    >>> check_bool(True, "norm_first")
    True
    >>> check_bool("False", "norm_first")
    Traceback (most recent call last):
    ...
    ValueError: `norm_first` must be a bool (True or False); got 'False' (str).
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"`{name}` must be a bool (True or False); got {value!r} ({type(value).__name__}).")
