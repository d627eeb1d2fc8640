"""Errors a user can cause. The CLI turns these into one line and a non-zero exit."""


class UserError(Exception):
    """Bad flags, a missing or unreadable run dir, a malformed file: say what and stop.

    `exit_code` lets a subcommand pick its status (2 = usage, 1 = bad input by default).
    """

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
