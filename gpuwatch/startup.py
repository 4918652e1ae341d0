"""What a start needs that a restart cannot give: checked by `gpuwatch run` before it serves
anything and by `gpuwatch check`, with the same words. Every file the configuration names is
read and validated here (the thresholds override, the web config with its certificates, the
Kubernetes API credentials, the exec hook's program); a problem is one line, exit status 2.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from gpuwatch.config import Config


class SetupError(ValueError):
    """One line naming the setting, the file and the reason."""


def _readable_file(key: str, path: str) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SetupError(f"{key}: {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SetupError(f"{key}: {path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise SetupError(f"{key}: {path} is not readable by this user")


def validate_files(cfg: Config):
    """Read and check every file the configuration names; the web config (or None).
    Raises SetupError."""
    if cfg.thresholds.file:
        from gpuwatch.thresholds import ThresholdsError, load_table

        try:
            load_table(cfg.thresholds.file)
        except ThresholdsError as exc:
            raise SetupError(f"thresholds.file: {exc}") from None
    web = None
    if cfg.web_config:
        from gpuwatch import webconfig

        try:
            web = webconfig.load(cfg.web_config)
        except webconfig.WebConfigError as exc:
            raise SetupError(str(exc)) from None
    k8s = cfg.attribution.kubernetes_api
    if cfg.attribution.enabled and k8s.enabled:
        _readable_file("attribution.kubernetes_api.token_file", k8s.token_file)
        _readable_file("attribution.kubernetes_api.ca_file", k8s.ca_file)
    hook = cfg.remediation.exec
    if hook.enabled and hook.argv and _which(hook.argv[0]) is None:
        raise SetupError(f"remediation.exec.argv[0]: {hook.argv[0]!r} is not an executable "
                         "file (give its absolute path)")
    return web


def _which(name: str) -> str | None:
    import shutil  # only with an exec hook: shutil brings bz2 and lzma into the daemon

    return shutil.which(name)


@dataclass(frozen=True)
class ProbeDirVerdict:
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def probe_dir_verdict(probe_dir: str) -> ProbeDirVerdict:
    """Whether the daemon can serve the probes in probe_dir. As root it owns the directory
    (0755) and makes each user's inside it; as another user it reads only that user's probes,
    which is a narrower daemon, not a broken one."""
    try:
        st = os.lstat(probe_dir)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return ProbeDirVerdict("fail", f"{probe_dir}: {exc.strerror}", f"fix {probe_dir}")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return ProbeDirVerdict("fail", f"{probe_dir} is not a directory",
                               f"remove {probe_dir}: the daemon makes it")
    if os.geteuid() == 0:
        if st is None:
            return ProbeDirVerdict("ok", f"{probe_dir} (created at start, mode 755)")
        if st.st_uid != 0:
            return ProbeDirVerdict("fail", f"{probe_dir} is owned by uid {st.st_uid}, not root: "
                                   "no user's probe directory is made in it",
                                   f"remove {probe_dir}: the daemon recreates it (root, 755)")
        mode = stat.S_IMODE(st.st_mode)
        note = ", closed to 755 at start" if mode != 0o755 else ""
        return ProbeDirVerdict("ok", f"{probe_dir} (mode {mode:o}{note})")
    uid = os.geteuid()
    own = os.path.join(probe_dir, str(uid))
    if st is None:
        parent = os.path.dirname(os.path.abspath(probe_dir))
        if os.access(parent, os.W_OK | os.X_OK):
            return ProbeDirVerdict("ok", f"{probe_dir} (created at start, this user's only)")
        return ProbeDirVerdict("warn", f"{probe_dir} does not exist and uid {uid} cannot make "
                               "it: no probe is read", "run gpuwatch as root, or set "
                               "[probe] dir to a directory of this user's")
    if st.st_uid == uid:
        return ProbeDirVerdict("ok", f"{probe_dir} (this user's, mode "
                               f"{stat.S_IMODE(st.st_mode):o})")
    return ProbeDirVerdict("warn", f"{probe_dir} is root's: as uid {uid} only this user's "
                           f"probes are read ({own})", "run gpuwatch as root to read every "
                           "user's probes")
