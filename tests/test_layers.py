"""The package's layering: each layer imports only the ones below it, with no import loop,
and the data layer, the algorithm registry and the CLI's start-up run without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rlpipe
from rlpipe.commands.stage_deps import module_paths, scan_imports

PACKAGE = Path(rlpipe.__file__).parent
# Lower rank = lower layer. Peers (same rank, different package) must not import each other.
RANKS = {
    "errors": 0,
    "version": 0,
    "storage": 1,
    "limits": 1,
    "envs": 2,
    "nets": 2,
    "datasets": 3,
    "training": 4,
    "algos": 5,
    "commands": 6,
    "api": 7,
    "cli": 7,
    "__main__": 8,
}


def module_names() -> dict[str, Path]:
    return module_paths(PACKAGE)


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """Every rlpipe module `path` imports, at any depth (function bodies and TYPE_CHECKING too)."""
    scan = scan_imports(path, known)
    return set(scan.at_import | scan.deferred | scan.typing)


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package root (version, env registration)


def test_no_import_runs_up_a_layer_or_across_peers() -> None:
    known = module_names()
    assert set(filter(None, map(layer, known))) == set(RANKS)  # every package has a rank
    wrong = []
    for module, path in known.items():
        for target in imports_of(path, known):
            here, there = layer(module), layer(target)
            if here is None or there is None or here == there:
                continue
            if RANKS[there] >= RANKS[here]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports that run up (or across) a layer:\n" + "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """Control: an import from datasets up into training is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from rlpipe.training.buffer import Batch\n")
    targets = imports_of(bad, module_names())
    assert targets == {"rlpipe.training.buffer"} and RANKS[layer("rlpipe.training.buffer")] > RANKS["datasets"]


def test_no_import_loop() -> None:
    known = module_names()
    graph = {module: imports_of(path, known) & set(known) for module, path in known.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path + [module, target]
            if target not in state and (loop := visit(target, path + [module])):
                return loop
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            loop = visit(module, [])
            assert loop is None, " -> ".join(loop[loop.index(loop[-1]) :])


def torch_modules_after(code: str) -> list[str]:
    """The torch modules (first three) a fresh interpreter holds after running ``code``."""
    code += "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
    return eval(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


def test_data_layer_and_random_collection_import_no_torch() -> None:
    modules = sorted(m for m in module_names() if layer(m) in ("datasets", "envs", "errors", "files"))
    modules.append("rlpipe.commands.collect")
    assert torch_modules_after("".join(f"import {m}\n" for m in modules)) == [], "importing the data layer imported torch"


def test_cli_and_registry_start_without_torch() -> None:
    """Every `rlpipe` command imports the whole app and `train --help` lists the registry;
    an algorithm's module (torch) loads only when its spec's config or train is read."""
    assert torch_modules_after("import rlpipe.cli.main, rlpipe.algos.registry") == []
    # control: reading one spec's train does import torch
    assert torch_modules_after("from rlpipe.algos.registry import get_algo\nget_algo('bc').train") != []
