"""The base of errors that are the user's to fix (bad config, bad data, bad flags).

The CLI prints them as one clear message and exits 2 instead of dumping a traceback; anything
else is a bug or an environment failure and keeps its traceback.
"""


class AsyncdapoError(Exception):
    pass
