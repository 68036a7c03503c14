"""The project's user-facing failures: the command line prints their message, no traceback."""


class Error(Exception):
  """Something the user can fix (bad input, config or checkpoint); the message says what."""
