"""Read exactly one gzip member (RFC 1952) and nothing after it: ``gzip.GzipFile`` silently reads on into
appended members and ignores trailing garbage, which a bundle must not carry. Lean: standard library only."""

from __future__ import annotations

import struct
import zlib

from edgeopt.errors import BadInputError

_FTEXT, _FHCRC, _FEXTRA, _FNAME, _FCOMMENT = 1, 2, 4, 8, 16
_CHUNK = 1 << 16
_MAX_OUT = 1 << 20


class SingleGzip:
    """A read-only stream of one gzip member's decompressed bytes. ``finish()`` checks the CRC-32 and length
    trailer and that the file ends right after it."""

    def __init__(self, raw, source: str):
        self._raw, self._source = raw, source
        self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
        self._buffer = b""
        self._crc = 0
        self._size = 0
        self._header()

    def read(self, size: int = -1) -> bytes:
        while (size < 0 or len(self._buffer) < size) and not self._inflate.eof:
            compressed = self._inflate.unconsumed_tail or self._raw.read(_CHUNK)
            if not compressed:
                raise EOFError("compressed data ended before the end-of-stream marker")
            self._buffer += self._inflate.decompress(compressed, _MAX_OUT)  # bounded: no zip-bomb bursts
        data, self._buffer = (self._buffer, b"") if size < 0 else (self._buffer[:size], self._buffer[size:])
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        return data

    def finish(self) -> None:
        """Read what is left (tar padding) and check the trailer; anything after the member is refused."""
        while self.read(_CHUNK):
            pass
        trailer = self._inflate.unused_data
        trailer += self._raw.read(max(0, 8 - len(trailer)))
        if len(trailer) < 8:
            raise EOFError("the gzip trailer is missing")
        crc, size = struct.unpack("<II", trailer[:8])
        if crc != self._crc or size != self._size & 0xFFFFFFFF:
            raise BadInputError(f"{self._source}: gzip CRC or length check failed (corrupt bundle)")
        if trailer[8:] or self._raw.read(1):
            raise BadInputError(f"{self._source}: data after the end of the archive (an appended gzip member or "
                                f"trailing bytes); refused")

    def _header(self) -> None:
        head = self._exact(10)
        if head[:3] != b"\x1f\x8b\x08":
            raise BadInputError(f"{self._source}: truncated or corrupt bundle (not gzip data)")
        flags = head[3]
        if flags & _FEXTRA:
            (length,) = struct.unpack("<H", self._exact(2))
            self._exact(length)
        for flag in (_FNAME, _FCOMMENT):
            if flags & flag:
                while self._exact(1) != b"\0":
                    pass
        if flags & _FHCRC:
            self._exact(2)

    def _exact(self, count: int) -> bytes:
        data = self._raw.read(count)
        if len(data) != count:
            raise EOFError("the gzip header is truncated")
        return data
