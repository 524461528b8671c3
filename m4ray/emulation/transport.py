"""A small TCP transport between rank processes: real bytes, checked on arrival.

Full mesh: every rank listens on ``(address, port)``; a sender opens one connection per peer on
first use (kept for the run). A frame is a fixed header ``(src, dst, tag, seq, nbytes, crc32)``
followed by ``nbytes`` of payload whose content is a function of ``(src, tag, seq)`` — meaningless,
but the receiver recomputes the CRC and the expected sequence number per ``(src, tag)``, so
corruption, loss and reordering are detected (:class:`TransportError`). A receiver thread per
connection puts frames into per-``(src, tag)`` FIFO queues that :meth:`Transport.recv` drains.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass

HEADER = struct.Struct("!iiqqqI")  # src, dst, tag, seq, nbytes, crc32
CHUNK = 1 << 16


class TransportError(RuntimeError):
    """A frame arrived damaged, out of order or for another rank."""


def payload(src: int, tag: int, seq: int, nbytes: int) -> bytes:
    """Deterministic filler bytes of a message (cheap: one block repeated)."""
    block = struct.pack("!iqq", src, tag, seq) * 16  # 320 bytes
    reps, rest = divmod(nbytes, len(block))
    return block * reps + block[:rest]


@dataclass(slots=True)
class Message:
    src: int
    tag: int
    seq: int
    nbytes: int
    arrived_s: float  # time.time() at the last byte


class Transport:
    """One rank's end of the mesh. ``addresses[r] = (host, port)`` for every rank."""

    def __init__(self, rank: int, addresses: list[tuple[str, int]]) -> None:
        self.rank = rank
        self.addresses = addresses
        self._out: dict[int, socket.socket] = {}
        self._send_seq: dict[tuple[int, int], int] = defaultdict(int)
        self._recv_seq: dict[tuple[int, int], int] = defaultdict(int)
        self._queues: dict[tuple[int, int], queue.Queue] = defaultdict(queue.Queue)
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []
        self._closing = False
        host, port = addresses[rank]
        self._listener = socket.create_server((host, port), backlog=len(addresses) + 4)
        accept = threading.Thread(target=self._accept, daemon=True, name=f"accept-{rank}")
        accept.start()
        self._threads.append(accept)

    # ------------------------------------------------------------------ sending
    def _connection(self, dst: int) -> socket.socket:
        conn = self._out.get(dst)
        if conn is None:
            deadline = time.monotonic() + 30
            while True:
                try:
                    conn = socket.create_connection(self.addresses[dst], timeout=30)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(None)
            self._out[dst] = conn
        return conn

    def send(self, dst: int, tag: int, nbytes: int) -> None:
        """Send ``nbytes`` to ``dst`` under ``tag`` (returns when the kernel took the bytes)."""
        key = (dst, tag)
        seq = self._send_seq[key]
        self._send_seq[key] = seq + 1
        body = payload(self.rank, tag, seq, nbytes)
        header = HEADER.pack(self.rank, dst, tag, seq, nbytes, zlib.crc32(body))
        self._connection(dst).sendall(header + body)

    # ------------------------------------------------------------------ receiving
    def recv(self, src: int, tag: int, timeout: float | None = 600.0) -> Message:
        """The next message from ``src`` under ``tag`` (FIFO)."""
        self._raise()
        try:
            message = self._queues[(src, tag)].get(timeout=timeout)
        except queue.Empty:
            self._raise()
            raise TransportError(
                f"rank {self.rank}: no message from rank {src} tag {tag} in {timeout} s"
            ) from None
        if isinstance(message, BaseException):
            raise message
        return message

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            reader = threading.Thread(target=self._read, args=(conn,), daemon=True)
            reader.start()
            self._threads.append(reader)

    def _read(self, conn: socket.socket) -> None:
        try:
            with conn:
                while True:
                    head = _read_exact(conn, HEADER.size)
                    if head is None:
                        return
                    src, dst, tag, seq, nbytes, crc = HEADER.unpack(head)
                    body = _read_exact(conn, nbytes)
                    arrived = time.time()
                    if body is None:
                        raise TransportError(f"rank {self.rank}: connection from {src} cut")
                    self._check(src, dst, tag, seq, body=body, crc=crc)
                    self._queues[(src, tag)].put(Message(src, tag, seq, nbytes, arrived))
        except BaseException as err:  # surfaced to the next recv
            if not self._closing:
                with self._lock:
                    self._errors.append(err)
                for q in list(self._queues.values()):
                    q.put(err)

    def _check(self, src, dst, tag, seq, *, body, crc) -> None:
        if dst != self.rank:
            raise TransportError(f"rank {self.rank}: frame for rank {dst} from {src}")
        if zlib.crc32(body) != crc:
            raise TransportError(f"rank {self.rank}: corrupt payload from {src} tag {tag}")
        expected = self._recv_seq[(src, tag)]
        if seq != expected:
            raise TransportError(
                f"rank {self.rank}: from {src} tag {tag} got seq {seq}, expected {expected}"
            )
        self._recv_seq[(src, tag)] = expected + 1

    def _raise(self) -> None:
        with self._lock:
            if self._errors:
                raise self._errors[0]

    def close(self) -> None:
        self._closing = True
        for conn in self._out.values():
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._listener.close()


def _read_exact(conn: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = conn.recv(min(CHUNK, n - got))
        if not chunk:
            if got == 0:
                return None
            raise TransportError(f"connection closed {got} bytes into a {n}-byte read")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


__all__ = ["Message", "Transport", "TransportError", "payload"]
