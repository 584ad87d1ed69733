"""uvicorn's h11 protocol with the two deadlines uvicorn lacks (its issue #157: `timeout_keep_alive` only
covers the idle time between requests, and every byte received resets it): a request's headers must be
whole within `header_timeout` seconds of the server waiting for them (the connection opening, or the
previous reply ending), and its body within `body_timeout` seconds of its headers. Past either, the client
gets 408 (unless its reply had begun) and its connection is closed; other connections never wait on it.

A client that leaves before its request is whole, or before its reply is complete, is one log line.
Checked by tests/faults/test_clients.py with real slow sockets on 127.0.0.1.
"""
from __future__ import annotations

import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .schema import ApiError

log = logging.getLogger("k3.serve")
FLAGS = {"headers": "--header-timeout", "body": "--body-timeout"}


class DeadlineProtocol(H11Protocol):
    def __init__(self, *args, header_timeout: float, body_timeout: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = {"headers": header_timeout, "body": body_timeout}
        self.waiting: str | None = None  # "headers" or "body": what the running deadline is for
        self.timer = None
        self.cut = False  # this side closed the connection (a deadline passed)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc) -> None:
        waiting, replying = self.waiting, self.cycle is not None and not self.cycle.response_complete
        self._arm(None)
        if not self.cut and (waiting == "body" or (waiting == "headers" and self._begun())):
            log.warning("%s left before its request's %s arrived whole: dropped", self._who(), waiting)
        elif not self.cut and replying:
            log.info("%s left before its reply to %s %s was complete", self._who(), self.scope["method"],
                     self.scope["path"])
        super().connection_lost(exc)

    def _watch(self) -> None:
        """(Re)start the deadline when what the connection waits for changes: a request's headers (the client
        is IDLE to h11), its body (SEND_BODY), or nothing (the request is whole; the reply is the app's)."""
        state = self.conn.their_state
        waiting = "headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:  # closed, or now a websocket's
            waiting = None
        if waiting != self.waiting:
            self._arm(waiting)

    def _arm(self, waiting: str | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.waiting = waiting
        self.timer = None if waiting is None else self.loop.call_later(self.limits[waiting], self._expired)

    def _begun(self) -> bool:
        """Whether any byte of the next request has arrived (else the connection is only idle)."""
        return bool(self.conn.trailing_data[0])

    def _who(self) -> str:
        return "%s:%d" % self.client if self.client else "a client"

    def _expired(self) -> None:
        waiting, self.timer = self.waiting, None
        if self.transport.is_closing():
            return
        self.cut = True
        if waiting == "headers" and not self._begun():  # an idle connection: closed without a word
            self.transport.close()
            return
        limit, replied = self.limits[waiting], waiting == "body" and self.cycle.response_started
        log.warning("%s: its request's %s did not arrive whole within %g s (%s): %sconnection closed", self._who(),
                    waiting, limit, FLAGS[waiting], "" if replied else "408, ")
        if waiting == "body":
            self.cycle.disconnected = True  # the app's receive() ends; whatever it sends now is dropped
            self.cycle.message_event.set()
        if not replied:
            error = ApiError(408, f"the request's {waiting} did not arrive whole within {limit:g} s ({FLAGS[waiting]})",
                             code="request_timeout")
            body = json.dumps(error.body()).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            response = h11.Response(status_code=408, headers=headers, reason=b"Request Timeout")
            self.transport.write(b"".join(self.conn.send(event) for event in (response, h11.Data(data=body),
                                                                           h11.EndOfMessage())))
        self.transport.close()
