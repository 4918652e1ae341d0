"""`gpuwatch config`: the effective configuration as TOML, secrets masked, and where each
value came from (default, file, environment, flag)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from gpuwatch import config as config_mod
from gpuwatch.redact import config_for_display
from gpuwatch.tomlfile import read_toml

ORIGINS = ("default", "file", "environment", "flag")


def display_config(cfg: config_mod.Config) -> dict[str, Any]:
    """The configuration as plain data with every secret masked (redact's one list of
    secret-bearing fields): what `gpuwatch config` prints."""
    return config_for_display(cfg)


def _leaves(data: Any, prefix: tuple = ()) -> set[tuple]:
    """Key paths of a raw layer; a list (of engines, rules...) counts as one value."""
    if isinstance(data, dict) and data:
        out: set[tuple] = set()
        for k, v in data.items():
            out |= _leaves(v, (*prefix, k))
        return out
    return {prefix}


def origins(path: str | None, environ: dict[str, str], flags: dict[str, Any]) -> dict[tuple, str]:
    """Key path -> the layer that set it last (paths no layer sets are defaults)."""
    if path is None and environ.get(config_mod.ENV_PREFIX + "CONFIG"):
        path = environ[config_mod.ENV_PREFIX + "CONFIG"]
    layers = [("file", read_toml(path, config_mod.ConfigError) if path else {}),
              ("environment", config_mod._env_to_dict(environ)),
              ("flag", {k: v for k, v in flags.items() if v is not None})]
    out: dict[tuple, str] = {}
    for name, raw in layers:
        for leaf in _leaves(raw):
            if leaf:
                out[leaf] = name
    return out


def _origin(key: tuple, table: dict[tuple, str]) -> str:
    for n in range(len(key), 0, -1):  # a layer that set a whole table sets what is in it
        if key[:n] in table:
            return table[key[:n]]
    return "default"


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_scalar(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() and k.isascii() else json.dumps(k)


def _is_table(v: Any) -> bool:
    return isinstance(v, dict) and bool(v)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def to_toml(data: dict[str, Any], table: dict[tuple, str], prefix: tuple = ()) -> list[str]:
    """TOML lines of data, each value followed by `# origin`; None values are left out."""
    lines: list[str] = []
    width = max((len(_key(k)) for k in data), default=0)
    for k, v in data.items():
        if _is_table(v) or _is_table_array(v):
            continue
        origin = _origin((*prefix, k), table)
        if v is None:  # TOML has no null: unset, e.g. taken from the threshold table
            lines.append(f"# {_key(k):<{width - 2}} (unset)  # {origin}")
        else:
            lines.append(f"{_key(k):<{width}} = {_scalar(v)}  # {origin}")
    for k, v in data.items():
        name = ".".join(_key(p) for p in (*prefix, k))
        if _is_table(v):
            lines += ["", f"[{name}]", *to_toml(v, table, (*prefix, k))]
        elif _is_table_array(v):
            origin = _origin((*prefix, k), table)
            for item in v:
                lines += ["", f"[[{name}]]  # {origin}",
                          *to_toml(item, {(*prefix, k, *kk): origin for kk in
                                          _leaves(item)}, (*prefix, k))]
    return lines


def render(path: str | None, flags: dict[str, Any], environ: dict[str, str] | None = None
           ) -> str:
    """The effective configuration as TOML with origins; raises ConfigError."""
    environ = dict(os.environ) if environ is None else environ
    cfg = config_mod.load(path, environ=environ, overrides=flags)
    table = origins(path, environ, flags)
    head = ["# gpuwatch effective configuration; after each value, where it came from",
            f"# ({', '.join(ORIGINS)}). Secrets are masked as \"***\"."]
    return "\n".join([*head, "", *to_toml(display_config(cfg), table)]) + "\n"
