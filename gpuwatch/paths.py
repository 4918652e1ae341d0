"""Checks of the files gpuwatch writes, before it writes them: a bad path is a clear message
naming the path and the reason, not an exception halfway through a run."""

from __future__ import annotations

import os
import stat


def writable_file_problem(path: str) -> str | None:
    """Why `path` cannot be created or appended to by this process, or None."""
    if not path:
        return "empty path"
    if "\0" in path:
        return "the path contains a NUL byte"
    parent = os.path.dirname(os.path.abspath(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    else:
        if stat.S_ISDIR(st.st_mode):
            return f"{path} is a directory"
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        if not os.access(path, os.W_OK):
            return f"{path} is not writable by this user"
        return None
    return writable_dir_problem(parent)


def writable_dir_problem(path: str) -> str | None:
    """Why files cannot be created in directory `path` by this process, or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"directory {path} does not exist"
    except OSError as exc:
        return f"directory {path}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"directory {path} is not writable by this user"
    return None


def creatable_file_problem(path: str) -> str | None:
    """As writable_file_problem, but a missing directory is fine when it can be made in its
    parent (the events log's /var/log/gpuwatch, made at start like the unit's LogsDirectory=)."""
    parent = os.path.dirname(os.path.abspath(path)) if path else ""
    if parent and not os.path.lexists(parent) and not writable_dir_problem(
            os.path.dirname(parent)):
        return None
    return writable_file_problem(path)
