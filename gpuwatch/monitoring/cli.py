"""`gpuwatch dashboards` and `gpuwatch alerts`: write the generated artefacts.

grafanalib and PyYAML are imported inside the commands so the daemon never loads them.
"""

from __future__ import annotations

from pathlib import Path

import click


def _write(out_dir: Path, files: dict[str, str]) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = out_dir / name
            path.write_text(text)
            click.echo(str(path))
    except OSError as exc:  # a misuse, told in one line (no traceback)
        raise click.BadParameter(f"cannot write {exc.filename or out_dir}: {exc.strerror}",
                                 param_hint="-o/--output") from None


@click.command("dashboards")
@click.option("-o", "--output", "output", default="dashboards", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory the dashboard JSON files are written to.")
def dashboards(output: Path) -> None:
    """Generate the Grafana dashboards (grafanalib) as JSON files."""
    from gpuwatch.monitoring import dashboards as gen

    _write(output, gen.render())


@click.command("alerts")
@click.option("-o", "--output", "output", default="alerts", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory the rule files are written to.")
@click.option("--format", "fmt", type=click.Choice(["rules", "prometheusrule"]),
              default="rules", show_default=True,
              help="Prometheus rule files, or one Prometheus Operator PrometheusRule.")
@click.option("--job", default="gpuwatch", show_default=True,
              help="The Prometheus job label the gpuwatch targets carry.")
@click.option("--runbook-url", default=None, metavar="URL",
              help="Where the runbook lives (each alert links to its #anchor there); "
                   "default: the project's docs/runbook.md.")
def alerts(output: Path, fmt: str, job: str, runbook_url: str | None) -> None:
    """Generate the Prometheus recording and alerting rules."""
    from gpuwatch.monitoring import rules

    extra = {"runbook_url": runbook_url} if runbook_url else {}
    try:
        params = rules.RuleParams(job=job, **extra)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--job") from None
    _write(output, rules.render(params, fmt))
