"""`rlpipe export RUN`: ship a run's deterministic policy as ONNX, a torch.export program and/or TorchScript."""

from __future__ import annotations

from pathlib import Path

import typer

from rlpipe.cli.app import app


@app.command("export")
def export(
    run_dir: Path = typer.Argument(..., help="Run directory (rlpipe train ... --out RUN)."),
    onnx: Path | None = typer.Option(
        None,
        "--onnx",
        help="Write the policy as ONNX to this file (input `obs`, output `action`; a recurrent policy's also `state` -> `next_state`).",
    ),
    torchscript: Path | None = typer.Option(
        None, "--torchscript", help="Write the policy as TorchScript to this file (deprecated by torch 2.13: prefer --program)."
    ),
    program: Path | None = typer.Option(
        None, "--program", help="Write the policy as a torch.export program (.pt2) to this file: torch.export.load(FILE).module()."
    ),
    force: bool = typer.Option(False, "--force", help="Replace existing output files."),
) -> None:
    """Export a run's policy as ONNX, torch.export or TorchScript.

    Observation normalisation and action scaling are included; the file's metadata holds the spaces and the checkpoint's sha256.
    """
    from rlpipe.commands.deploy import export_policy

    metadata = export_policy(run_dir, onnx=onnx, torchscript=torchscript, program=program, force=force)  # all files or none
    for path in (onnx, torchscript, program):
        if path is not None:
            typer.echo(
                f"wrote {path} ({metadata['algo']} policy for {metadata['env_id'] or 'data with no environment'}, checkpoint {metadata['checkpoint_sha256'][:16]})"
            )
