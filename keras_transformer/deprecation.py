"""Arguments renamed in this package: the old name keeps working, with a warning."""

import warnings


def renamed_argument(where, new_name, new_value, old_name, old_value, default=None):
    """The value of an argument that was renamed from `old_name` to `new_name`.

    Args:
        where: str, the callable's name, for the messages.
        new_name, new_value: the argument's name and value (None when not
            given).
        old_name, old_value: the deprecated name and its value (None when not
            given).
        default: the value when neither is given.

    Returns:
        `new_value`, else `old_value` (with a `DeprecationWarning`), else
        `default`.

    Raises:
        TypeError: when both names are given.

    Example:
    >>> renamed_argument("f", "sequence_length", 8, "max_length", None)
    8
    """
    if old_value is None:
        return default if new_value is None else new_value
    if new_value is not None:
        raise TypeError(f"{where} got both `{new_name}` and its old name `{old_name}`; "
                        f"pass `{new_name}` only.")
    warnings.warn(f"{where}: `{old_name}` is renamed `{new_name}`; the old name will be removed.",
                  DeprecationWarning, stacklevel=3)
    return old_value
