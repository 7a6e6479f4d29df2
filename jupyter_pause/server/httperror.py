"""The HTTP error of this extension's refusals, its message kept as written."""

from __future__ import annotations

import tornado.web


class ApiError(tornado.web.HTTPError):
    """An HTTP error whose reply's ``message`` is ``text``, as written."""

    def __init__(self, status: int, text: str) -> None:
        self.text = text
        super().__init__(status, text)

    # APIHandler.write_error replies with ``log_message``, in which tornado (6.5+) doubles
    # every "%" (it is a log format there); a path such as "50%.ipynb" must come back as sent.
    @property
    def log_message(self) -> str:
        return self.text

    @log_message.setter
    def log_message(self, value: str) -> None:  # tornado < 6.5 assigns it
        self.text = value

    def __str__(self) -> str:
        return self.text
