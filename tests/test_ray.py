"""The Ray backends: collection equal to the local backend's bytes, a small Tune sweep, and
collection on a real `ray start --head` cluster joined through RAY_ADDRESS."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the rlpipe[ray] extra: pip install -e '.[ray]'")

from rlpipe.pipeline.collect import collect_dataset  # noqa: E402
from rlpipe.pipeline.sweep import SweepSpec, run_sweep  # noqa: E402

pytestmark = pytest.mark.ray
RAY_BIN = Path(sys.executable).parent / "ray"


def _dataset_files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for the module: starting one takes ~8 s."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_collection_is_byte_identical_to_local_workers(local_ray, tmp_path: Path) -> None:
    budget = dict(episodes=60, num_envs=2, seed=3, name="cartpole", fmt="both", progress=False)
    on_ray = collect_dataset("CartPole-v1", store=tmp_path / "ray", backend="ray", workers=2, **budget)
    local = collect_dataset("CartPole-v1", store=tmp_path / "local", backend="local", workers=1, **budget)
    assert on_ray.metadata["producer"]["params"]["tasks"] == 2  # 60 episodes: two tasks of TASK_EPISODES
    assert _dataset_files(on_ray.path) == _dataset_files(local.path)
    control = collect_dataset("CartPole-v1", store=tmp_path / "control", backend="ray", workers=2,
                              **{**budget, "seed": 4})
    assert _dataset_files(control.path) != _dataset_files(on_ray.path)  # the comparison can fail


def test_ray_sweep_reports_every_seed(local_ray, tmp_path: Path) -> None:
    spec = SweepSpec("ppo", env_id="CartPole-v1", fixed={"env_steps": 256, "num_steps": 64, "num_envs": 2,
                                                         "eval_every": 256, "eval_episodes": 2})
    summary = run_sweep(spec, {"learning_rate": [1e-3, 3e-4]}, [0, 1], tmp_path / "sweep", backend="ray", workers=2)
    settings = summary["settings"]
    assert set(settings) == {"learning_rate=0.001", "learning_rate=0.0003"}
    for stats in settings.values():
        assert set(stats["returns"]) == {"seed-0", "seed-1"}
        assert stats["return_ci95_low"] <= stats["return_mean"] <= stats["return_ci95_high"]
    for run in (tmp_path / "sweep" / "runs").glob("*/seed-*"):
        assert (run / "metrics.json").is_file()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_collection_on_a_started_cluster(tmp_path: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rlpipe-ray-", dir="/tmp")  # Ray's socket paths must stay short
    # A HOME of its own: a ~/.ray/auth_token left by an earlier local Ray makes the head demand a token
    # and no RAY_* variables: the module's ray.init leaves RAY_AUTH_MODE=token in os.environ
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "RAY_USAGE_STATS_ENABLED": "0", "HOME": temp_dir}
    start = subprocess.run([str(RAY_BIN), "start", "--head", "--num-cpus", "2", "--port", str(port), "--include-dashboard=false",
                            "--node-ip-address", "127.0.0.1", f"--temp-dir={temp_dir}"], env=env, capture_output=True, text=True)
    assert start.returncode == 0, start.stderr[-3000:]
    try:
        script = ("from rlpipe.pipeline.collect import collect_dataset; import sys; "
                  "r = collect_dataset('CartPole-v1', episodes=60, num_envs=2, seed=3, name='cartpole', store=sys.argv[1], "
                  "backend='ray', workers=2, progress=False); print(r.metadata['content_hash'])")
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cluster")], capture_output=True, text=True,
                             env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        subprocess.run([str(RAY_BIN), "stop"], env=env, capture_output=True)
        shutil.rmtree(temp_dir, ignore_errors=True)
    local = collect_dataset("CartPole-v1", episodes=60, num_envs=2, seed=3, name="cartpole", store=tmp_path / "local",
                            backend="local", workers=2, progress=False)
    assert run.stdout.split()[-1] == local.metadata["content_hash"]
