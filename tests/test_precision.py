"""Mixed precision (``--set precision=bf16``, rlpipe.training.optim.autocast): the networks'
hidden products in bfloat16, their outputs, weights and optimiser state in float32, and a
policy that learns as it does in float32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlpipe.nets.networks import EnsembleQ, mlp
from rlpipe.training.optim import adam, autocast, mixed_precision, optimizer_step
from tests.test_envfree import import_logs, logs, train  # noqa: F401  (logs: the module fixture)

CPU = torch.device("cpu")


def dtypes_of_linear_outputs(net: torch.nn.Module, run: object) -> list[torch.dtype]:
    """The dtype of each linear layer's output while ``run()`` runs, in call order."""
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype)) for m in net.modules() if isinstance(m, torch.nn.Linear)]
    try:
        run()  # type: ignore[operator]
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_bf16_runs_hidden_layers_in_bfloat16_and_outputs_in_float32() -> None:
    torch.manual_seed(0)
    net, obs = mlp(3, 2, (64, 64)), torch.randn(32, 3)
    with autocast("bf16", CPU):
        assert dtypes_of_linear_outputs(net, lambda: net(obs)) == [torch.bfloat16, torch.bfloat16, torch.float32]
        critics = EnsembleQ(3, 1, (64, 64), n=2)
        assert critics(obs, torch.randn(32, 1)).dtype == torch.float32
    assert dtypes_of_linear_outputs(net, lambda: net(obs)) == [torch.float32] * 3
    with autocast("fp32", CPU):
        assert net(obs).dtype == torch.float32


def test_fp32_leaves_the_update_as_it_is_and_bf16_steps_float32_weights() -> None:
    torch.manual_seed(0)
    net = mlp(3, 1, (64, 64))
    optimizer = adam(net.parameters(), 1e-3)
    obs, target = torch.randn(256, 3), torch.randn(256, 1)

    def update(_batch: object, _index: int) -> dict[str, torch.Tensor]:
        loss = ((net(obs) - target) ** 2).mean()
        optimizer_step(optimizer, loss)
        return {"loss": loss.detach()}

    assert mixed_precision(update, "fp32", CPU) is update
    before = [p.detach().clone() for p in net.parameters()]
    diagnostics = mixed_precision(update, "bf16", CPU)(None, 0)
    assert diagnostics["loss"].dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in net.parameters())
    assert all(not torch.equal(p, old) for p, old in zip(net.parameters(), before))
    assert all(state["exp_avg"].dtype == torch.float32 for state in optimizer.state.values())


def test_an_unknown_precision_is_refused_in_one_line(cli, store: Path, tmp_path: Path) -> None:
    result = cli("train", "bc", "--env", "Pendulum-v1", "--set", "precision=fp16", "--out", tmp_path / "run", "--no-progress")
    assert result.code != 0
    assert "precision='fp16'" in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "run").exists()


def test_bc_in_bf16_learns_the_logging_policy_and_not_from_shuffled_actions(
    cli, store: Path, tmp_path: Path, logs: dict[str, Path], learning_seed: int, record_property
) -> None:
    """test_envfree's learning test in bfloat16, with its bars: held-out action error below
    0.05 on the controller's logs, above 0.2 on the same actions shuffled across rows."""
    import_logs(cli, store, logs["controller"], "controller")
    import_logs(cli, store, logs["shuffled"], "shuffled")
    settings = ("--select-by", "val_loss", "--seed", str(learning_seed), "--set", "precision=bf16")
    learned = train(cli, store, tmp_path / "learned", "controller", *settings)
    control = train(cli, store, tmp_path / "control", "shuffled", *settings)
    errors = [row["val_action_error"] for row in learned["checkpoints"]]
    record_property("learned_error", min(errors))
    record_property("control_error", control["val_action_error"])
    assert min(errors) < 0.05 < 0.2 < control["val_action_error"], (errors, control["val_action_error"])
    saved = json.loads((tmp_path / "learned" / "checkpoint.json").read_text())
    assert saved["config"]["precision"] == "bf16"


@pytest.mark.parametrize("algo", ["td3bc", "iql", "cql"])
def test_critic_algorithms_train_in_bf16_with_finite_diagnostics(
    cli, store: Path, tmp_path: Path, logs: dict[str, Path], algo: str
) -> None:
    import_logs(cli, store, logs["controller"], "controller")
    result = cli(
        "train", algo, "--dataset", "controller", "--store", store, "--out", tmp_path / algo, "--updates", "60",
        "--set", "eval_every=30", "--set", "fqe_updates=0", "--set", "precision=bf16", "--no-progress",
    )  # fmt: skip
    assert result.code == 0, result.err
    curve = (tmp_path / algo / "dvclive" / "plots" / "metrics" / "train").glob("*.tsv")
    values = [float(line.split("\t")[-1]) for path in curve for line in path.read_text().splitlines()[1:]]
    assert values and all(torch.isfinite(torch.tensor(values))), values
