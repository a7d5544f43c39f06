"""print_msg: how kfast's callbacks talk to the user, following Keras's own switch for it.

Keras routes callback output through `keras.config.is_interactive_logging_enabled()`: stdout in a
terminal or notebook, the logging system when a user turned interactive logging off. Its own helper is
not public API, so kfast follows the same switch here.
"""

import logging
import sys

import keras

_log = logging.getLogger("kfast")


def print_msg(message):
    """Writes `message` to stdout (flushed), or to the `kfast` logger when Keras's interactive logging is off.

    Example:

    >>> from kfast._core.messages import print_msg
    >>> print_msg("kfast: hello")
    kfast: hello
    """
    if keras.config.is_interactive_logging_enabled():
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    else:
        _log.info(message)
