"""Reading TOML files into msgspec structs with errors that name the key and the reason.

Shared by the configuration and the threshold table, whose authors see the same messages.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

import msgspec

# A configuration or threshold file is a few KiB; anything far larger is a mistake.
MAX_BYTES = 1 << 20
_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFDIR: "directory", stat.S_IFSOCK: "socket",
          stat.S_IFCHR: "character device", stat.S_IFBLK: "block device"}


def read_regular(path: str | Path, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file (symlinks followed). A FIFO, device or directory is an
    OSError instead of a read that may never return: it is opened non-blocking and checked
    before anything is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "special file")
            raise OSError(f"not a regular file (a {kind})")
        if st.st_size > max_bytes:
            raise OSError(f"larger than {max_bytes} bytes")
        chunks, total = [], 0
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # grew while being read
                raise OSError(f"larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_toml(path: str | Path, error: type[Exception]) -> dict[str, Any]:
    """The file's data; `error` with the path and the reason when it cannot be read."""
    try:
        return tomllib.loads(read_regular(path).decode())
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc.args[0]}") from None


def explain(exc: msgspec.ValidationError) -> tuple[str, str]:
    """(key, reason) of a validation error: 'nvml.fast' and 'unknown key', or
    'engines[0].url' and msgspec's own reason."""
    msg = str(exc)
    m = re.match(r"(?s)(.*) - at `\$(.*)`$", msg)
    reason, loc = (m.group(1), m.group(2).lstrip(".")) if m else (msg, "")
    for pattern, what in ((r"Object contains unknown field `(.+)`", "unknown key"),
                          (r"Object missing required field `(.+)`", "required key missing")):
        field = re.match(pattern, reason)
        if field:
            return (f"{loc}.{field.group(1)}" if loc else field.group(1)), what
    return loc, reason
