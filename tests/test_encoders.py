"""Observation encoders: which one an observation space gets, and what it computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlpipe.envs.spaces import IMAGE, is_image_space, require_spaces
from rlpipe.errors import RlpipeError
from rlpipe.nets.encoders import ObsEncoder
from rlpipe.nets.networks import GreedyQPolicy, build_policy
from rlpipe.training.env import BOX, DISCRETE, encoder_spec

MINATAR = spaces.Box(0, 1, (10, 10, 4), dtype=bool)
ATARI = spaces.Box(0, 255, (84, 84, 1), dtype=np.uint8)
ATARI_CHANNELS_FIRST = spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8)
VECTOR = spaces.Box(-1, 1, (3,), dtype=np.float32)


def test_image_spaces_are_rank_3_uint8_or_bool_boxes() -> None:
    assert is_image_space(MINATAR) and is_image_space(ATARI) and is_image_space(ATARI_CHANNELS_FIRST)
    assert not is_image_space(VECTOR)
    assert not is_image_space(spaces.Box(0, 1, (10, 10, 4), dtype=np.float32))  # float frames: not stored as images
    require_spaces("dqn", "MinAtar", MINATAR, spaces.Discrete(3), (DISCRETE,), (BOX, IMAGE))
    with pytest.raises(RlpipeError, match="needs a flat Box observation space"):
        require_spaces("td3", "MinAtar", MINATAR, spaces.Discrete(3), (DISCRETE,), (BOX,))


def test_the_frame_size_picks_the_cnn() -> None:
    assert encoder_spec(MINATAR) == {"arch": "minatar", "shape": [10, 10, 4], "frame_stack": 1, "scale": 1.0}
    assert encoder_spec(ATARI, frame_stack=4) == {"arch": "nature", "shape": [84, 84, 1], "frame_stack": 4, "scale": 255.0}
    assert encoder_spec(VECTOR) is None
    assert encoder_spec(VECTOR, frame_stack=3) == {"arch": "flat", "shape": [3], "frame_stack": 3, "scale": 1.0}
    with pytest.raises(RlpipeError, match="at least 36 x 36"):
        encoder_spec(MINATAR, arch="nature")
    with pytest.raises(RlpipeError, match="unknown encoder"):
        encoder_spec(ATARI, arch="resnet")
    with pytest.raises(RlpipeError, match="frame_stack must be 1 or more"):
        encoder_spec(ATARI, frame_stack=0)


def test_the_cnns_have_the_papers_feature_sizes() -> None:
    assert ObsEncoder(**encoder_spec(ATARI, frame_stack=4)).out_dim == 64 * 7 * 7  # Nature DQN: 3136 features before fc 512
    assert ObsEncoder(**encoder_spec(MINATAR)).out_dim == 16 * 8 * 8  # MinAtar: one 3x3 conv, 16 channels


def test_stacked_frames_sit_side_by_side_on_the_channel_axis() -> None:
    """A stack of k H x W x C frames reads as one frame of k*C channels, frames in order."""
    torch.manual_seed(0)
    stacked = ObsEncoder(**encoder_spec(MINATAR, frame_stack=2))
    wide = ObsEncoder(**encoder_spec(spaces.Box(0, 1, (10, 10, 8), dtype=bool)))
    wide.load_state_dict(stacked.state_dict())
    frames = torch.rand(5, 2, 10, 10, 4) > 0.5
    side_by_side = torch.cat([frames[:, 0], frames[:, 1]], dim=-1)
    torch.testing.assert_close(stacked(frames), wide(side_by_side))


def test_channels_first_frames_and_uint8_scaling() -> None:
    torch.manual_seed(0)
    last = ObsEncoder(**encoder_spec(spaces.Box(0, 255, (84, 84, 4), dtype=np.uint8)))
    first = ObsEncoder(**encoder_spec(ATARI_CHANNELS_FIRST))
    first.load_state_dict(last.state_dict())
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(first(frames), last(frames.movedim(1, -1)))
    floats = ObsEncoder(**{**encoder_spec(ATARI_CHANNELS_FIRST), "scale": 1.0})
    floats.load_state_dict(first.state_dict())
    torch.testing.assert_close(first(frames), floats(frames.float() / 255))


def test_flattened_and_unbatched_observations_read_the_same() -> None:
    encoder = ObsEncoder(**encoder_spec(MINATAR, frame_stack=3))
    frames = torch.rand(4, 3, 10, 10, 4) > 0.5
    features = encoder(frames)
    assert features.shape == (4, encoder.out_dim)
    torch.testing.assert_close(encoder(frames.reshape(4, -1)), features)
    torch.testing.assert_close(encoder(frames[1]), features[1])
    vectors = ObsEncoder(**encoder_spec(VECTOR, frame_stack=3))
    stack = torch.randn(4, 3, 3)
    torch.testing.assert_close(vectors(stack), stack.reshape(4, 9))


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("quantiles", [0, 5])
def test_q_network_heads_and_checkpoint_round_trip(dueling: bool, quantiles: int) -> None:
    torch.manual_seed(0)
    q = GreedyQPolicy(400, 6, (32,), encoder=encoder_spec(MINATAR), dueling=dueling, quantiles=quantiles)
    obs = torch.rand(7, 10, 10, 4) > 0.5
    values = q.quantile_values(obs)
    assert values.shape == (7, 6, max(quantiles, 1))
    torch.testing.assert_close(q(obs), values.mean(-1))
    assert q.act(obs).shape == (7,)
    rebuilt = build_policy("greedy_q", q.spec)
    rebuilt.load_state_dict(q.state_dict())
    torch.testing.assert_close(rebuilt(obs), q(obs))


def test_dueling_advantages_are_mean_centred() -> None:
    """Q = V + A - mean(A): the mean over actions of Q is the value stream's output."""
    torch.manual_seed(0)
    q = GreedyQPolicy(3, 4, (16,), dueling=True)
    obs = torch.randn(5, 3)
    torch.testing.assert_close(q(obs).mean(-1), q.value(obs).squeeze(-1))


def test_a_plain_q_network_keeps_its_old_spec() -> None:
    """Checkpoints written before encoders existed hold only these keys, and still load."""
    q = GreedyQPolicy(4, 2, (8, 8))
    assert q.spec == {"obs_dim": 4, "n_actions": 2, "hidden": [8, 8]}
    assert set(q.state_dict()) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "net.4.weight", "net.4.bias"}
