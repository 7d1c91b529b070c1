"""The runtime's one error type."""


class LoaderError(RuntimeError):
    """A built kernel cannot be used for this call; the message is one line saying why and what to do."""
