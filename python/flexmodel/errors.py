"""flexmodel's exceptions: the C++ engine's typed errors, with its message.

Each is a subclass of :class:`flexmodel.Error` and of the built-in exception a
Python user would catch for that kind of fault.
"""


class Error(Exception):
    """Any error raised by flexmodel's engine."""


class NotFoundError(Error, LookupError):
    """A module, parameter, hook, group or key name that does not exist (the message lists close names)."""


class ShapeError(Error, ValueError):
    """A tensor of the wrong shape or dtype for where it is used."""


class FileFormatError(Error, ValueError):
    """A file whose contents do not follow its format."""


class IOError(Error, OSError):  # noqa: A001 - flexmodel.IOError, as the C++ flex::IOError
    """A file or folder that cannot be read or written."""


class DeviceMapError(Error, ValueError):
    """A device map or memory budget that cannot be satisfied or parsed."""


class DeviceError(DeviceMapError):
    """A tensor given to a module on another device than the module's weights (names both, and the module)."""


class ConfigError(Error, ValueError):
    """Contradictory or invalid options or configuration."""


class UnsupportedError(Error, NotImplementedError):
    """Something flexmodel does not do (the message says what instead)."""


class NumericError(Error, ArithmeticError):
    """A computation turned NaN or infinite (a diverging training run)."""


class EditingFunctionError(Error, RuntimeError):
    """An editing function raised (its exception is the __cause__) or returned something other than a tensor."""
