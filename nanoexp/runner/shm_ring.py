"""A shared-memory broadcast ring: the control plane writes each message once and every worker reads it,
so sending a step costs the same at any tensor-parallel size. One segment: int64 counters, then `slots`
fixed-size slots. Message n (from 1) goes to slot (n - 1) % slots: the writer copies payload and length,
then publishes n as the slot's sequence number; a reader copies the payload once the slot shows n, then
records n as read. A slot is reused once every reader has read past it; a message larger than a slot is
published as OVERFLOW and travels over the readers' pipes instead."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

OVERFLOW = -1
DATA_ALIGN = 64
SLEEP_MIN_S = 20e-6
SLEEP_MAX_S = 1e-3
CHECK_EVERY_S = 0.5

_fence_lock = threading.Lock()


def memory_fence() -> None:
    """A full barrier between the payload and its sequence number (acquiring a lock is one)."""
    _fence_lock.acquire()
    _fence_lock.release()


@dataclass(frozen=True)
class RingHandle:
    """What a reader needs to attach (picklable)."""

    name: str
    num_readers: int
    slots: int
    slot_bytes: int


class ShmRing:
    def __init__(self, handle: RingHandle, shm: shared_memory.SharedMemory, reader: int | None):
        self.handle, self.shm, self.reader = handle, shm, reader
        slots, readers = handle.slots, handle.num_readers
        num_counters = 2 * slots + readers
        self.counters = np.ndarray((num_counters,), dtype=np.int64, buffer=shm.buf)
        self.slot_seq = self.counters[0 : 2 * slots : 2]
        self.slot_len = self.counters[1 : 2 * slots : 2]
        self.reader_done = self.counters[2 * slots :]
        self.data_offset = -(-num_counters * 8 // DATA_ALIGN) * DATA_ALIGN
        self.next_seq = 1  # the next message to write (writer) or read (reader)

    @classmethod
    def create(cls, num_readers: int, slots: int = 8, slot_bytes: int = 1 << 20) -> ShmRing:
        size = -(-(2 * slots + num_readers) * 8 // DATA_ALIGN) * DATA_ALIGN + slots * slot_bytes
        name = f"nanoexp-ring-{os.getpid()}-{os.urandom(4).hex()}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)  # zero-filled
        return cls(RingHandle(shm.name, num_readers, slots, slot_bytes), shm, None)

    @classmethod
    def attach(cls, handle: RingHandle, reader: int) -> ShmRing:
        return cls(handle, shared_memory.SharedMemory(name=handle.name), reader)

    def write(self, data: bytes | memoryview, check: Callable[[], None]) -> bool:
        """Publishes one message; False when too large for a slot (OVERFLOW: the caller sends it another way).
        `check` runs now and then while every slot is unread and may raise to give up."""
        seq = self.next_seq
        slot = (seq - 1) % self.handle.slots
        wait_until(lambda: int(self.reader_done.min()) >= seq - self.handle.slots, check, spin_s=0.0)
        fits = len(data) <= self.handle.slot_bytes
        if fits:
            start = self.data_offset + slot * self.handle.slot_bytes
            assert self.shm.buf is not None  # open until close()
            self.shm.buf[start : start + len(data)] = data
        self.slot_len[slot] = len(data) if fits else OVERFLOW
        memory_fence()
        self.slot_seq[slot] = seq
        self.next_seq = seq + 1
        return fits

    def read(self, check: Callable[[], None], spin_s: float) -> bytes | None:
        """The next message (None: OVERFLOW, read it from the pipe). Spins `spin_s`, then sleeps
        with backoff; `check` runs about every CHECK_EVERY_S and may raise to stop waiting."""
        seq = self.next_seq
        slot = (seq - 1) % self.handle.slots
        wait_until(lambda: int(self.slot_seq[slot]) == seq, check, spin_s)
        memory_fence()
        length = int(self.slot_len[slot])
        data = None
        if length != OVERFLOW:
            start = self.data_offset + slot * self.handle.slot_bytes
            assert self.shm.buf is not None  # open until close()
            data = bytes(self.shm.buf[start : start + length])
        memory_fence()
        self.reader_done[self.reader] = seq
        self.next_seq = seq + 1
        return data

    def close(self) -> None:
        """Detaches; the writer, which owns the segment, also removes it."""
        self.slot_seq = self.slot_len = self.reader_done = self.counters = None
        with contextlib.suppress(BufferError):
            self.shm.close()
        if self.reader is None:
            unlink(self.handle.name)


def unlink(name: str) -> None:
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    segment.close()
    with contextlib.suppress(FileNotFoundError):
        segment.unlink()


def wait_until(ready: Callable[[], bool], check: Callable[[], None], spin_s: float) -> None:
    """Polls `ready`: busy for `spin_s`, then sleeping with exponential backoff up to SLEEP_MAX_S."""
    if ready():
        return
    start = last_check = time.monotonic()
    sleep = SLEEP_MIN_S
    while not ready():
        now = time.monotonic()
        if now - last_check >= CHECK_EVERY_S:
            check()
            last_check = now
        if now - start < spin_s:
            os.sched_yield()
            continue
        time.sleep(sleep)
        sleep = min(sleep * 2, SLEEP_MAX_S)
