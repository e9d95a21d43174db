"""`rlpipe export RUN`: ship a run's deterministic policy as ONNX and/or TorchScript."""

from __future__ import annotations

from pathlib import Path

import typer

from rlpipe.cli.app import app
from rlpipe.errors import RlpipeError


@app.command("export")
def export(
    run_dir: Path = typer.Argument(..., help="Run directory (rlpipe train ... --out RUN)."),
    onnx: Path | None = typer.Option(None, "--onnx", help="Write the policy as ONNX to this file (input `obs`, output `action`)."),
    torchscript: Path | None = typer.Option(None, "--torchscript", help="Write the policy as TorchScript to this file."),
    force: bool = typer.Option(False, "--force", help="Replace existing output files."),
) -> None:
    """Export a run's deterministic policy (observation normalisation and action scaling
    included) with its spaces and checkpoint sha256 as metadata."""
    from rlpipe.pipeline.deploy import export_onnx, export_torchscript

    if onnx is None and torchscript is None:
        raise RlpipeError("nothing to export: give --onnx FILE and/or --torchscript FILE")
    for path, write in ((onnx, export_onnx), (torchscript, export_torchscript)):
        if path is not None:
            metadata = write(run_dir, path, force=force)
            typer.echo(
                f"wrote {path} ({metadata['algo']} policy for {metadata['env_id']}, checkpoint {metadata['checkpoint_sha256'][:16]})"
            )
