"""The fixed mutants: guards whose removal a test must notice, named, beside the random sample.

Each one is a file, an exact snippet of its code and what replaces it (not a line number,
so that it survives unrelated edits). A snippet that no longer occurs exactly once is an
error that names the mutant: the guard moved or changed, and the mutant must be updated
with it, never skipped. Each mutant runs the test files that cover its module (COVER), its
own bite tests first, so that a killed mutant costs little more than a pytest start.

Groups: `security` (what other local users, clients on the network and engines control),
`policy` (what remediation does), `thresholds`, `signals`. CI runs the security and policy
groups (tests/test_mutation_fixed.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# module -> the test files that cover it, the bite tests first
COVER: dict[str, tuple[str, ...]] = {
    "gpuwatch/probe_channel/requests.py": (
        "tests/test_bite_probe_channel.py", "tests/test_bite_oom_records.py",
        "tests/test_probe_agent.py", "tests/test_remediation_probe.py"),
    "gpuwatch/probe_channel/protocol.py": (
        "tests/test_bite_probe_channel.py", "tests/test_bite_probe_reader.py",
        "tests/test_probe_reader.py", "tests/test_probe_agent.py"),
    "gpuwatch/sources/probes.py": (
        "tests/test_bite_probe_reader.py", "tests/test_probe_reader.py"),
    "gpuwatch/sources/oom_records.py": (
        "tests/test_bite_oom_records.py", "tests/test_oom_daemon.py"),
    "gpuwatch/probe_agent/agent.py": (
        "tests/test_bite_probe_agent.py", "tests/test_probe_agent.py"),
    "gpuwatch/webconfig.py": (
        "tests/test_bite_webconfig.py", "tests/test_webconfig.py"),
    "gpuwatch/redact.py": (
        "tests/test_bite_redaction.py", "tests/test_redact.py"),
    "gpuwatch/remediation/policy.py": (
        "tests/test_bite_policy.py", "tests/test_remediation_remediator.py"),
    "gpuwatch/remediation/guardrails.py": (
        "tests/test_bite_policy.py", "tests/test_bite_guardrails.py",
        "tests/test_remediation_remediator.py"),
    "gpuwatch/thresholds/table.py": (
        "tests/test_bite_table.py", "tests/test_bite_thresholds.py", "tests/test_thresholds.py"),
    "gpuwatch/signals/leak/series.py": (
        "tests/test_bite_signal_guards.py", "tests/test_bite_signals.py", "tests/test_leak.py"),
    "gpuwatch/signals/memory.py": (
        "tests/test_bite_signal_guards.py", "tests/test_bite_signals.py"),
    "gpuwatch/signals/pools.py": (
        "tests/test_bite_signal_guards.py", "tests/test_engine_memory.py"),
    "gpuwatch/signals/engine.py": (
        "tests/test_bite_signal_guards.py", "tests/test_bite_engine_signals.py"),
}

SECURITY_MODULES = (
    "gpuwatch/probe_channel/requests.py", "gpuwatch/probe_channel/protocol.py",
    "gpuwatch/sources/probes.py", "gpuwatch/sources/oom_records.py",
    "gpuwatch/probe_agent/agent.py", "gpuwatch/webconfig.py", "gpuwatch/redact.py",
)


@dataclass(frozen=True)
class Fixed:
    name: str
    path: str
    old: str
    new: str
    what: str  # what the mutant lets through

    @property
    def group(self) -> str:
        if self.path in SECURITY_MODULES:
            return "security"
        if self.path.startswith("gpuwatch/remediation/"):
            return "policy"
        if self.path.startswith("gpuwatch/thresholds/"):
            return "thresholds"
        return "signals"

    @property
    def tests(self) -> tuple[str, ...]:
        return COVER[self.path]


class SnippetError(ValueError):
    """A fixed mutant's snippet does not occur exactly once in its file."""


def apply(m: Fixed, source: str) -> str:
    n = source.count(m.old)
    if n != 1:
        where = "no longer occurs in" if n == 0 else f"occurs {n} times in"
        raise SnippetError(f"fixed mutant {m.name!r}: its snippet {where} {m.path}; update "
                           "the mutant to the guard as the code has it now")
    return source.replace(m.old, m.new)


R, P, S, A = ("gpuwatch/probe_channel/requests.py", "gpuwatch/probe_channel/protocol.py",
              "gpuwatch/sources/probes.py", "gpuwatch/probe_agent/agent.py")
W, X = "gpuwatch/webconfig.py", "gpuwatch/redact.py"
OR = "gpuwatch/sources/oom_records.py"
PO, G = "gpuwatch/remediation/policy.py", "gpuwatch/remediation/guardrails.py"
T = "gpuwatch/thresholds/table.py"

FIXED: tuple[Fixed, ...] = (
    # -- the daemon's side of the probe channel ------------------------------------------------
    Fixed("requests.dir-owner", R,
          "            if st.st_uid == uid:\n                rec = os.stat(",
          "            if True:\n                rec = os.stat(",
          "a request is written into a user directory that another uid owns"),
    Fixed("requests.record-owner", R,
          "if stat.S_ISREG(rec.st_mode) and rec.st_uid == uid:",
          "if stat.S_ISREG(rec.st_mode):",
          "the probe is located by a stats record that another uid owns"),
    Fixed("requests.answer-owner", R,
          "        if st.st_uid != uid:\n            raise ValueError(f\"answer for pid",
          "        if False:\n            raise ValueError(f\"answer for pid",
          "an answer file owned by another uid is believed"),
    Fixed("requests.snapshot-name", R,
          "        if name is not None and name != protocol.snapshot_name(pid, request_id):",
          "        if False:",
          "a probe's answer naming a snapshot file of its choice is taken as it is"),
    Fixed("requests.copy-owner", R,
          "        if st.st_uid != uid:\n            raise ValueError(f\"{name}: owned by",
          "        if False:\n            raise ValueError(f\"{name}: owned by",
          "copy_out copies a snapshot file that another uid owns"),
    Fixed("requests.copy-hardlink", R,
          "        if st.st_nlink != 1:",
          "        if False:",
          "copy_out copies a hard link to another file"),
    Fixed("requests.user-dir-owner", R,
          "        if owner != uid:\n            raise ValueError(f\"{probe_dir}/{uid}: owned by",
          "        if False:\n            raise ValueError(f\"{probe_dir}/{uid}: owned by",
          "an OOM record is adopted from a user directory that another uid owns"),
    Fixed("protocol.regular-only", P,
          "        if not stat.S_ISREG(st.st_mode):\n            raise ValueError(f\"{name}: not a",
          "        if False:\n            raise ValueError(f\"{name}: not a",
          "open_regular accepts a FIFO (or a device)"),
    Fixed("protocol.dir-nofollow", P,
          "    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC",
          "    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC",
          "open_dir follows a symlinked directory"),
    # -- the daemon's reader of probe records --------------------------------------------------
    Fixed("probes.named-dir-owner", S,
          "        if owner != uid:\n            notes.append(f\"{where}: owned by uid {owner}, "
          "not {uid}: ignored\")\n            return []\n        spent = 0",
          "        spent = 0",
          "the daemon's reader believes a user directory that another uid owns"),
    Fixed("probes.listed-dir-owner", S,
          "        if owner != uid:\n            notes.append(f\"{where}: owned by uid {owner}, "
          "not {uid}: ignored\")\n            return []\n        with os.scandir(fd)",
          "        with os.scandir(fd)",
          "the listing reader believes a user directory that another uid owns"),
    Fixed("probes.sample-pid", S,
          "        if s.pid != pid:\n            raise _Refused(",
          "        if False:\n            raise _Refused(",
          "a record carries samples for another pid"),
    Fixed("probes.base-writable", S,
          "if st.st_uid != os.geteuid() or st.st_mode & 0o022:",
          "if st.st_uid != os.geteuid():",
          "root makes user directories inside a group- or world-writable probe directory"),
    Fixed("probes.base-owner", S,
          "if st.st_uid != os.geteuid() or st.st_mode & 0o022:",
          "if st.st_mode & 0o022:",
          "root makes user directories inside a probe directory another uid owns"),
    Fixed("probes.user-dir-kept", S,
          "                if st.st_uid == uid:\n                    if st.st_mode & 0o077:",
          "                if True:\n                    if st.st_mode & 0o077:",
          "root keeps a user directory that another uid owns (a squatter's)"),
    Fixed("probes.listed-regular", S,
          "                if not entry.is_file(follow_symlinks=False):",
          "                if False:",
          "the listing reader passes symlinked entries on"),
    # -- the daemon's adoption of OOM records
    Fixed("oom.record-owner", OR,
          "        if st.st_uid != proc.uid:\n            raise ValueError(",
          "        if False:\n            raise ValueError(",
          "an OOM record that another uid owns is adopted"),
    Fixed("oom.record-links", OR,
          "        if st.st_nlink != 1:\n            raise ValueError(f\"{st.st_nlink} links\")",
          "        if False:\n            raise ValueError(f\"{st.st_nlink} links\")",
          "an OOM record hard-linked under its name is adopted"),
    Fixed("oom.record-pid", OR,
          "rec.format != fmt.FORMAT or rec.pid != pid or rec.seq != seq:",
          "rec.format != fmt.FORMAT or rec.seq != seq:",
          "an OOM record naming another pid is adopted for this one"),
    Fixed("oom.record-create-time", OR,
          "            raise ValueError(\"the record of an earlier process under this pid\")",
          "            pass",
          "the OOM record of an earlier process under the same pid is adopted"),
    # -- the probe in the user's process -------------------------------------------------------
    Fixed("agent.stale-request", A,
          "        if time.time() - req.t > self.config.request_max_age_seconds:",
          "        if False:",
          "the probe carries out a request the daemon stopped waiting for long ago"),
    Fixed("agent.request-pid", A,
          "        if req.id != request_id or req.pid != self.pid:",
          "        if req.id != request_id:",
          "the probe obeys a request naming another pid"),
    Fixed("agent.request-uid", A,
          "        if st.st_uid not in self.allowed_uids:",
          "        if False:",
          "the probe obeys a request written by an untrusted uid"),
    Fixed("agent.own-dir-owner", A,
          "    if st.st_uid != uid:\n        os.close(fd)\n        raise PermissionError(",
          "    if False:\n        os.close(fd)\n        raise PermissionError(",
          "the probe publishes into a directory someone else owns"),
    # -- web authentication and TLS ------------------------------------------------------------
    Fixed("web.bearer-paths", W,
          "                request.path in self.bearer and header[:7].lower() == \"bearer \")",
          "                header[:7].lower() == \"bearer \")",
          "any `Authorization: Bearer x` passes basic auth on every path"),
    Fixed("web.bearer-header", W,
          "                request.path in self.bearer and header[:7].lower() == \"bearer \")",
          "                request.path in self.bearer)",
          "the webhook path passes basic auth without a bearer header"),
    Fixed("web.unknown-user", W,
          "        return ok and known",
          "        return ok",
          "an unknown user is let in when its password matches the dummy hash"),
    Fixed("web.basic-scheme", W,
          "    if scheme.lower() != \"basic\" or len(value) > 4096:",
          "    if len(value) > 4096:",
          "any auth scheme is parsed as Basic"),
    Fixed("web.min-version", W,
          "    ctx.minimum_version = TLS_VERSIONS[t.min_version]\n",
          "",
          "min_version is not applied: older TLS versions are accepted"),
    Fixed("web.max-version", W,
          "        ctx.maximum_version = TLS_VERSIONS[t.max_version]",
          "        pass",
          "max_version is not applied"),
    Fixed("web.header-crlf", W,
          " or \"\\r\" in value or \"\\n\" in value:",
          ":",
          "CR/LF in configured header values are accepted"),
    Fixed("web.user-colon", W,
          "        if not name or \":\" in name:",
          "        if not name:",
          "a user name with `:` is accepted"),
    Fixed("web.size-cap", W,
          "        data = read_regular(path, MAX_FILE_BYTES)",
          "        data = read_regular(path, 1 << 62)",
          "the web configuration's size cap is dropped"),
    # -- redaction -----------------------------------------------------------------------------
    Fixed("redact.percent-encoded", X,
          "    return [userinfo, user, password, unquote(user), unquote(password)]",
          "    return [userinfo, user, password]",
          "percent-encoded URL credentials are not scrubbed in their decoded form"),
    Fixed("redact.reload-keeps", X,
          "    _known = _known | secret_values(config)",
          "    _known = secret_values(config)",
          "a reload forgets the old configuration's secrets"),
    # -- remediation policy and guardrails -----------------------------------------------------
    Fixed("policy.firing-only", PO,
          "        if event.state != \"firing\":\n            return None\n",
          "",
          "resolved events are planned as if firing"),
    Fixed("policy.rule-scope", PO,
          "                    and rule.severity in (\"*\", event.severity)\n"
          "                    and rule.scope in (\"*\", scope)):",
          "                    and rule.severity in (\"*\", event.severity)):",
          "an escalation rule's scope filter is ignored"),
    Fixed("policy.rule-severity", PO,
          "                    and rule.severity in (\"*\", event.severity)\n",
          "",
          "an escalation rule's severity filter is ignored"),
    Fixed("policy.table-on-red-only", PO,
          "        if (self.config.table_actions and event.signal == \"memory_zone\"\n"
          "                and event.severity == \"critical\"):",
          "        if (self.config.table_actions and event.signal == \"memory_zone\"):",
          "a row's on-red actions run on a warning zone"),
    Fixed("policy.table-actions-off", PO,
          "        if (self.config.table_actions and event.signal == \"memory_zone\"",
          "        if (event.signal == \"memory_zone\"",
          "`table_actions = false` is ignored"),
    Fixed("guardrails.abandon-slot", G,
          "            self._admitted.remove(admitted_at)",
          "            pass",
          "an abandoned action keeps its rate-limit slot"),
    # -- threshold table -----------------------------------------------------------------------
    Fixed("table.tolerance-edge", T,
          "        if abs(total / MIB - row_total_mib) > tol * row_total_mib:",
          "        if abs(total / MIB - row_total_mib) >= tol * row_total_mib:",
          "a GPU exactly at the memory tolerance does not match its row"),
    Fixed("table.ignore-case", T,
          "        return any(re.search(p, name, re.IGNORECASE) for p in patterns)",
          "        return any(re.search(p, name) for p in patterns)",
          "row patterns match case-sensitively"),
    Fixed("table.critical-cap", T,
          "        crit = min(crit, mib)\n",
          "",
          "a derived critical start is not capped at the total memory"),
    Fixed("table.warning-cap", T,
          "        warn = min(warn, crit)\n",
          "",
          "a derived warning start is not capped at the critical start"),
    # -- signals -------------------------------------------------------------------------------
    Fixed("leak.reload-ends-episode", "gpuwatch/signals/leak/series.py",
          "            self.verdict.end()\n            self._start(t)",
          "            self._start(t)",
          "a reload no longer ends a firing leak episode"),
    Fixed("memory.ttoom-judged-rate", "gpuwatch/signals/memory.py",
          "        ttoom_rate = max(sum(judged), proj.rate",
          "        ttoom_rate = max(g_rate, proj.rate",
          "time to OOM runs at the noisy current rate instead of the judged leak rate"),
    Fixed("memory.gpu-held-asleep", "gpuwatch/signals/memory.py",
          "            if any(e.quiet for e in pools):\n                return state",
          "            if False:\n                return state",
          "a GPU series is not held while an engine sleeps"),
    Fixed("memory.process-held-asleep", "gpuwatch/signals/memory.py",
          "        if pool is not None and pool.quiet:\n            return state, False",
          "        if False:\n            return state, False",
          "a process series is not held while its engine sleeps"),
    Fixed("pools.kv-bytes-cap", "gpuwatch/signals/pools.py",
          "    if fixed and 0 < fixed <= total:",
          "    if fixed and 0 < fixed:",
          "a kv_cache_memory_bytes larger than the GPU is taken as the pool"),
    Fixed("engine.mean-without-histogram", "gpuwatch/signals/engine.py",
          "cfg.judge_mean_without_histogram and tr and not tr.has_histogram:",
          "cfg.judge_mean_without_histogram and tr:",
          "the mean queue time is judged even for an engine that has a histogram"),
)


def by_name() -> dict[str, Fixed]:
    return {m.name: m for m in FIXED}
