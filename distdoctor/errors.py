"""Errors a user can cause. The CLI turns these into one line and a non-zero exit."""


class UserError(Exception):
    """Bad flags, a missing or unreadable run dir, a malformed file: say what and stop.

    `exit_code` is 2 for everything a user can get wrong (flags, paths, files), so a script
    can tell bad input from a command's own non-zero results (diagnose: 1 = errors found).
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
