"""The Helm chart's generated parts: the rule groups, dashboards and NPD monitor it ships
(charts/gpuwatch/files/), its README (the values table from values.yaml's `# --` comments),
and the raw manifests in exporters/kubernetes/ (what the chart renders with default values).

    python -m gpuwatch.monitoring.chart [REPO_ROOT]

Rendering the raw manifests needs Helm's engine (helm-python-sdk, the test extra); the rest
needs only PyYAML. tests/test_chart.py fails when any of these drift.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

CHART = Path("charts/gpuwatch")
RAW = Path("exporters/kubernetes")
NPD_FILE = Path("exporters/npd/gpuwatch-custom-plugin-monitor.json")
RELEASE = NAMESPACE = "gpuwatch"
RAW_HEADER = (
    "# Generated from charts/gpuwatch with its default values (release and namespace\n"
    "# gpuwatch) by `python -m gpuwatch.monitoring.chart`; edit the chart instead.\n"
    "#   kubectl create namespace gpuwatch && kubectl apply -f exporters/kubernetes/\n")
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")


def files() -> dict[str, str]:
    """Chart-relative path -> text of the files the chart carries from the generators."""
    from gpuwatch.monitoring import dashboards, rules
    from gpuwatch.nodehealth.npd import monitor_json

    out = {}
    for group in rules.prometheus_rule(rules.RuleParams())["spec"]["groups"]:
        out[f"files/rules/{group['name']}.yaml"] = rules.dump_yaml([group])
    for name, text in dashboards.render().items():
        out[f"files/dashboards/{name}"] = text
    out["files/npd/gpuwatch-custom-plugin-monitor.json"] = monitor_json()
    return out


def values_table(values_text: str) -> list[tuple[str, str, str]]:
    """(dotted key, default as JSON, description) of every key a `# --` comment documents."""
    import yaml

    values = yaml.safe_load(values_text)
    stack: list[tuple[int, str]] = []
    comment: list[str] | None = None
    rows = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped == "# --" or stripped.startswith("# -- "):  # not "# --web-config"
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and comment is not None:
            comment.append(stripped[1:].strip())
            continue
        m = _KEY.match(line)
        if m is None:
            if stripped and not stripped.startswith("-"):
                comment = None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m["key"]))
        if comment is not None:
            path = [k for _, k in stack]
            rows.append((".".join(path), _default(values, path), " ".join(comment)))
        comment = None
    return rows


def _default(values: Any, path: list[str]) -> str:
    for key in path:
        values = values[key]
    return json.dumps(values)


def readme(chart_dir: Path) -> str:
    head = (chart_dir / "README.md.gotmpl").read_text()
    rows = values_table((chart_dir / "values.yaml").read_text())
    table = ["| Key | Default | Description |", "|---|---|---|"]
    for key, default, text in rows:
        shown = default.replace("|", "\\|")
        table.append(f"| `{key}` | `{shown}` | {text.replace('|', chr(92) + '|')} |")
    return head.replace("{{ values }}", "\n".join(table)) + (
        "" if head.endswith("\n") else "\n")


def render(chart_dir: Path, values: dict | None = None, *, name: str = RELEASE,
           namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered manifest, by Helm's own engine."""
    import helm_python

    chart = helm_python.Chart.load(str(chart_dir))
    try:
        return chart.render(values or {}, name=name, namespace=namespace)
    finally:
        chart.close()


def raw_manifests(chart_dir: Path) -> dict[str, str]:
    """exporters/kubernetes/ file name -> text: the default render, one file per template."""
    out = {}
    for path, text in sorted(render(chart_dir).items()):
        body = text.strip()
        if not body or path.endswith("NOTES.txt"):
            continue
        out[Path(path).name] = RAW_HEADER + body + "\n"
    return out


def write(root: Path, *, raw: bool = True) -> list[Path]:
    chart_dir = root / CHART
    written = []
    generated = {chart_dir / k: v for k, v in files().items()}
    generated[chart_dir / "README.md"] = readme(chart_dir)
    generated[root / NPD_FILE] = files()["files/npd/gpuwatch-custom-plugin-monitor.json"]
    for path, text in generated.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    if raw:
        raw_dir = root / RAW
        for old in raw_dir.glob("*.yaml"):
            old.unlink()
        for name, text in raw_manifests(chart_dir).items():
            (raw_dir / name).write_text(text)
            written.append(raw_dir / name)
    return written


if __name__ == "__main__":
    for p in write(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print(p)
