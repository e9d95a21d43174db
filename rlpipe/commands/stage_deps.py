"""The rlpipe code each DVC stage runs, and ``dvc.yaml`` written from ``dvc.template.yaml``
with it, so that an edit reruns only the stages that run the edited module.

A stage's code is the import closure of what ``rlpipe COMMAND ...`` executes: the modules
the console script loads at start-up (every command module's top level), everything the
stage's own command module reaches (imports inside functions and ``"rlpipe.x:NAME"`` strings
such as gymnasium entry points included; ``TYPE_CHECKING`` imports excluded, they never run) and, for a stage that runs an algorithm, the modules its
registry entry names (``"rlpipe.algos.cql"``, its policy loader). The registry resolves
those by name, so the other algorithms' modules are not part of the closure.

DVC cannot splice a list into a templated ``deps:``, so stages whose code depends on the
algorithm are grouped by it: the template's ``train_offline`` becomes ``train_offline-cql``,
``train_offline-bc``, ... (stage names ``train_offline-cql@cql-cartpole``), each listing the
params.yaml entries it runs. Regenerate after an edit that changes imports, or a new entry
in params.yaml::

    python -m rlpipe.commands.stage_deps --write    # make deps; without --write: check only
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from rlpipe.algos.registry import AlgoSpec, get_algo
from rlpipe.errors import RlpipeError

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parent
ENTRY = "rlpipe.cli.main"  # the `rlpipe` console script ([project.scripts] in pyproject.toml)
DISPATCHER = AlgoSpec.__module__  # its module names resolve per algorithm, not for every stage
PACKAGE_NAME, PACKAGE_API = "rlpipe", "rlpipe.api"  # `rlpipe.train` etc. import rlpipe.api on first use
ALGO_FIELDS = ("algo", "expert")  # params fields that name the algorithm a stage runs
TEMPLATE, OUTPUT, PARAMS = "dvc.template.yaml", "dvc.yaml", "params.yaml"
# The pipelines written from a template (directories from the repository root): the root one
# and the D4RL-style benchmark's two profiles (paper size, and the one a 2-core CPU finishes).
PIPELINES = (".", "suites/d4rl", "suites/d4rl-cpu")
WRITE_COMMAND = "python -m rlpipe.commands.stage_deps --write"


def module_paths(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = (package.name,) + path.relative_to(package).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


@dataclass(frozen=True)
class ModuleImports:
    """The package modules one module refers to, by when the reference runs."""

    at_import: frozenset[str]  # module-level imports: run when the module is imported
    deferred: frozenset[str]  # imports inside functions: run when the function is called
    typing: frozenset[str]  # under `if TYPE_CHECKING:`: never at run time
    named: frozenset[str]  # "rlpipe.x.y" / "rlpipe.x.y:NAME" strings, imported by whoever reads them


def scan_imports(path: Path, known: Mapping[str, Path]) -> ModuleImports:
    """Every module of ``known`` that the source at ``path`` imports or names, sorted by when."""
    module = next((name for name, file in known.items() if file == path), path.stem)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, set[str]] = {"at_import": set(), "deferred": set(), "typing": set(), "named": set()}

    def visit(node: ast.AST, when: str) -> None:
        child: ast.AST
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "typing")
            for child in node.orelse:
                visit(child, when)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "typing" if when == "typing" else "deferred"
            body = node.body if isinstance(node.body, list) else [node.body]
            for child in ast.iter_child_nodes(node):  # decorators and defaults run with the definition
                visit(child, inner if any(child is part for part in body) else when)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found[when].update(_imported_modules(node, package, known))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and when != "typing" and node.value.partition(":")[0] in known:
            found["named"].add(node.value.partition(":")[0])
        for child in ast.iter_child_nodes(node):
            visit(child, when)

    visit(ast.parse(path.read_text(), str(path)), "at_import")
    return ModuleImports(**{when: frozenset(names) for when, names in found.items()})


def _nearest_module(name: str, known: Mapping[str, Path]) -> str | None:
    """The module ``name`` lies in: `import a.b.C` where C is a class imports a.b."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_modules(node: ast.Import | ast.ImportFrom, package: str, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` an import statement in ``package`` loads."""
    if isinstance(node, ast.Import):
        return set(filter(None, (_nearest_module(alias.name, known) for alias in node.names)))
    base = node.module or ""
    if node.level:  # relative: `from . import x`, `from ..y import z`
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    # `from rlpipe.algos import sac` imports the submodule
    subs = (f"{base}.{alias.name}" for alias in node.names)
    return set(filter(None, (sub if sub in known else _nearest_module(base, known) for sub in subs)))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def command_modules(known: Mapping[str, Path]) -> dict[str, str]:
    """``rlpipe`` command word -> the module that adds it to the app (``@app.command`` or
    ``app.add_typer(..., name=...)``)."""
    words = {}
    for module, path in known.items():
        if not module.startswith("rlpipe.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for decorator in node.decorator_list:
                    if isinstance(decorator, ast.Call) and _is_app_method(decorator, "command"):
                        words[_first_string(decorator.args) or node.name.replace("_", "-")] = module
            elif isinstance(node, ast.Call) and _is_app_method(node, "add_typer"):
                words[_first_string([k.value for k in node.keywords if k.arg == "name"])] = module
    return words


def _is_app_method(call: ast.Call, method: str) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == method and isinstance(func.value, ast.Name) and func.value.id == "app"


def _first_string(nodes: list[ast.expr]) -> str:
    return next((node.value for node in nodes if isinstance(node, ast.Constant) and isinstance(node.value, str)), "")


def _closure(roots: Iterable[str], edges: Mapping[str, Iterable[str]]) -> set[str]:
    """``roots`` and every module they reach, with the packages above each (their
    ``__init__`` runs first)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += edges[module]
    return seen


def algorithm_modules(name: str, known: Mapping[str, Path]) -> set[str]:
    """The modules an algorithm's registry entry names (its module, policy loader, space kinds)."""
    spec = get_algo(name)
    references = (getattr(spec, field.name) for field in fields(spec))
    return {ref.partition(":")[0] for ref in references if isinstance(ref, str) and ref.partition(":")[0] in known}


class CodeGraph:
    """The package's modules, what each refers to and which module holds each command."""

    def __init__(self, package: Path = PACKAGE) -> None:
        self.package = package
        self.known = module_paths(package)
        self.scans = {module: scan_imports(path, self.known) for module, path in self.known.items()}
        self.commands = command_modules(self.known)

    def stage_files(self, command: str, algos: Iterable[str] = (), root: str = "") -> list[str]:
        """The source files (paths from the repository root, each prefixed by ``root``, e.g.
        ``../../`` for a pipeline two levels down; sorted) that ``rlpipe COMMAND`` runs, for a
        stage that runs the algorithms ``algos``."""
        if command not in self.commands:
            raise RlpipeError(f"`rlpipe {command}` is no command; the app has {', '.join(sorted(self.commands))}")
        loaded = _closure([ENTRY], {module: scan.at_import for module, scan in self.scans.items()})
        edges = {
            module: scan.at_import | scan.deferred | (scan.named if module != DISPATCHER else frozenset())
            for module, scan in self.scans.items()
        }
        edges[ENTRY] = edges[ENTRY] - (set(self.commands.values()) - {self.commands[command]})  # the app runs one command
        edges[PACKAGE_NAME] = edges[PACKAGE_NAME] - {PACKAGE_API}  # the package's lazy API attributes: no command reads them
        roots = {ENTRY, self.commands[command]}.union(*(algorithm_modules(algo, self.known) for algo in algos))
        modules = loaded | _closure(roots, edges)
        return sorted(root + self.known[module].relative_to(self.package.parent).as_posix() for module in modules)


STAGE_LINE = re.compile(r"^  ([A-Za-z_][\w-]*):\s*$")


@dataclass
class _Block:
    """One stage of the template: its leading comment lines, name and body lines."""

    lead: list[str]
    name: str
    body: list[str]


def _split_template(text: str) -> tuple[list[str], list[_Block]]:
    lines = text.splitlines()
    start = lines.index("stages:") + 1
    blocks: list[_Block] = []
    pending: list[str] = []  # blank lines and stage-level comments: the next stage's lead
    for line in lines[start:]:
        if match := STAGE_LINE.match(line):
            blocks.append(_Block(pending, match.group(1), []))
            pending = []
        elif not line.strip() or line.startswith("  #"):
            pending.append(line)
        else:
            blocks[-1].body += pending + [line]
            pending = []
    return lines[:start], blocks


def _with_deps(body: list[str], files: list[str], where: str) -> list[str]:
    """``body`` with ``files`` appended to its ``deps:`` list."""
    at = next((i for i, line in enumerate(body) if line.strip() == "deps:"), None)
    if at is None:
        raise RlpipeError(f"{TEMPLATE}: stage {where} has no `deps:` list")
    indent = len(body[at]) - len(body[at].lstrip()) + 2
    end = at + 1
    while end < len(body) and body[end].startswith(" " * indent + "- "):
        end += 1
    return body[:end] + [" " * indent + f"- {file}" for file in files] + body[end:]


def _command(cmd: str, where: str) -> str:
    words = shlex.split(cmd)
    if len(words) < 2 or words[0] != "rlpipe":
        raise RlpipeError(f"{TEMPLATE}: stage {where} runs {cmd!r}, not `rlpipe COMMAND`")
    return words[1]


def _named_algorithms(cmd: str) -> set[str]:
    """The algorithms a command names literally (``--expert sac``, ``rlpipe train sac``), not
    through a ``${item...}`` field."""
    words = shlex.split(cmd)
    named = {value for flag, value in zip(words, words[1:]) if flag == "--expert"}
    if words[1] in ("train", "sweep") and len(words) > 2:
        named.add(words[2])
    return {name for name in named if "${" not in name}


def _by_algorithm(
    block: _Block, stage: Mapping[str, Any], params: Mapping[str, Any], algo_fields: list[str]
) -> list[tuple[str, list[str], set[str]]]:
    """One (name, body, algorithms) per algorithm of a stage that runs one per item: its
    ``foreach`` lists that algorithm's params entries."""
    group = re.fullmatch(r"\$\{(\w+)\}", str(stage.get("foreach", "")))
    if group is None:
        raise RlpipeError(f"{TEMPLATE}: stage {block.name} runs an algorithm per item, so it needs `foreach: ${{GROUP}}`")
    entries = params[group.group(1)]
    keys_of: dict[str, list[str]] = {}
    for key, item in entries.items():
        if algo_fields[0] not in item:
            raise RlpipeError(f"{PARAMS}: {group.group(1)}.{key} has no `{algo_fields[0]}`")
        keys_of.setdefault(item[algo_fields[0]], []).append(key)
    at = next(i for i, line in enumerate(block.body) if line.strip().startswith("foreach:"))
    indent = block.body[at][: len(block.body[at]) - len(block.body[at].lstrip())]
    split = []
    for algo, keys in keys_of.items():
        foreach = [f"{indent}foreach:"] + [f"{indent}  {key}: ${{{group.group(1)}.{key}}}" for key in keys]
        algos = {entries[key][field] for key in keys for field in algo_fields}
        split.append((f"{block.name}-{algo}", block.body[:at] + foreach + block.body[at + 1 :], algos))
    return split


def render(template: str, params: Mapping[str, Any], graph: CodeGraph | None = None, root: str = "") -> str:
    """The ``dvc.yaml`` text for ``template`` (dvc.yaml with data deps only), ``params`` and
    the package's code (``graph``, default: this package), for a pipeline whose paths reach
    the repository root through ``root`` (``""`` at the root, ``../../`` two levels down)."""
    graph = graph or CodeGraph()
    head, blocks = _split_template(template)
    stages = yaml.safe_load(template)["stages"]
    out = [f"# Written by `{WRITE_COMMAND}` (make deps) from {TEMPLATE}: edit that file, not this one.", *head]
    for block in blocks:
        stage = stages[block.name]
        cmd = stage.get("do", stage)["cmd"]
        command = _command(cmd, block.name)
        algo_fields = [field for field in ALGO_FIELDS if "${item." + field + "}" in cmd]
        split = _by_algorithm(block, stage, params, algo_fields) if algo_fields else [(block.name, block.body, set())]
        for n, (name, body, algos) in enumerate(split):
            out += (block.lead if n == 0 else [""]) + [f"  {name}:"]
            out += _with_deps(body, graph.stage_files(command, sorted(algos | _named_algorithms(cmd)), root), name)
    return "\n".join(out) + "\n"


def expected_dvc_yaml(repo: Path = REPO, pipeline: str = ".") -> str:
    """``pipeline``'s ``dvc.yaml`` (a directory of ``repo``) as its template, its
    params.yaml and the package in ``repo`` make it."""
    where = repo / pipeline
    params = yaml.safe_load((where / PARAMS).read_text())
    root = "../" * len(Path(pipeline).parts) if pipeline != "." else ""
    return render((where / TEMPLATE).read_text(), params, CodeGraph(repo / "rlpipe"), root)


def stale_stages(repo: Path = REPO, pipeline: str = ".") -> dict[str, list[str]]:
    """The stages of ``pipeline`` whose recorded run (its ``dvc.lock``) no longer matches the
    tree: stage name -> what changed (a code file's content, a parameter's value, the stage
    gone from ``dvc.yaml``). Data dependencies are not compared: they are the outputs of
    other stages, whose own code and parameters are."""
    where = repo / pipeline
    lock_path = where / "dvc.lock"
    if not lock_path.is_file():
        return {}
    lock = yaml.safe_load(lock_path.read_text()) or {}
    params = yaml.safe_load((where / PARAMS).read_text()) or {}
    current = set((yaml.safe_load((where / OUTPUT).read_text()) or {}).get("stages", {}))
    stale = {}
    for stage, recorded in (lock.get("stages") or {}).items():
        if stage.partition("@")[0] not in current:
            stale[stage] = [f"stage {stage.partition('@')[0]} is no longer in {OUTPUT}"]
            continue
        changes = [dep["path"] for dep in recorded.get("deps", []) if _code_changed(where / dep["path"], dep, repo)]
        for values in (recorded.get("params") or {}).values():
            changes += [f"{key} in {PARAMS}" for key, value in values.items() if _dotted(params, key) != value]
        if changes:
            stale[stage] = changes
    return stale


def _code_changed(path: Path, dep: Mapping[str, Any], repo: Path) -> bool:
    """Whether a recorded rlpipe source file differs from the tree (or is gone)."""
    inside = path.resolve().is_relative_to(repo / "rlpipe")
    if not inside or "md5" not in dep:
        return False
    return not path.is_file() or hashlib.md5(path.read_bytes()).hexdigest() != dep["md5"]


def _dotted(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlpipe.commands.stage_deps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {OUTPUT} (default: check it, exit 1 if stale)")
    parser.add_argument("--stale-results", action="store_true", help="list the stages whose dvc.lock predates their code or params")
    args = parser.parse_args(argv)
    if args.stale_results:
        return _print_stale_results()
    stale = 0
    for pipeline in PIPELINES:
        output = REPO / pipeline / OUTPUT
        try:
            expected = expected_dvc_yaml(REPO, pipeline)
        except RlpipeError as exc:
            print(f"error: {pipeline}: {exc}", file=sys.stderr)
            return 2
        current = output.read_text() if output.exists() else ""
        if current == expected:
            continue
        if args.write:
            output.write_text(expected)
            continue
        name = (Path(pipeline) / OUTPUT).as_posix()
        diff = difflib.unified_diff(current.splitlines(), expected.splitlines(), name, "expected", lineterm="", n=1)
        print("\n".join(list(diff)[:40]), file=sys.stderr)
        print(f"error: {name} is stale; run `{WRITE_COMMAND}` (make deps)", file=sys.stderr)
        stale = 1
    return stale


def _print_stale_results() -> int:
    """Each pipeline's stages whose recorded results predate the tree; exit 1 if any."""
    found = 0
    for pipeline in PIPELINES:
        stale = stale_stages(REPO, pipeline)
        recorded = yaml.safe_load((REPO / pipeline / "dvc.lock").read_text()) if (REPO / pipeline / "dvc.lock").is_file() else {}
        total = len((recorded or {}).get("stages") or {})
        print(f"{(Path(pipeline) / 'dvc.lock').as_posix()}: {len(stale)} of {total} recorded stages stale")
        for stage, changes in stale.items():
            shown = ", ".join(changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")
            print(f"  {stage}: {shown}")
        found += len(stale)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
