"""The exceptions by which control leaves a command before its end: `exit`, `return`, `break`
and `continue` unwind to where bash would resume, and `NotRun` gives up on a `$( )` whose output
depends on a command this reader does not run."""

from __future__ import annotations


class Exit(Exception):
    def __init__(self, line: int, text: str) -> None:
        super().__init__(text)
        self.line, self.text = line, text


class Return(Exception):
    pass


class Break(Exception):
    pass


class Continue(Exception):
    pass


class NotRun(Exception):
    """Inside $( ): a command or a condition this reader cannot run, so the output is unknown."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
