"""Configuration errors of the reward server and the RemoteReward client, raised before anything starts; the
doctests of the reward-pipeline modules (``rewards/`` lies outside the doctest paths of pyproject)."""

import doctest

import pytest

import flowrl.rewards.aggregate
import flowrl.rewards.protocol
import flowrl.rewards.remote
import flowrl.rewards.serve as serve
from flowrl.rewards import RemoteReward


@pytest.mark.parametrize("module", [flowrl.rewards.aggregate, flowrl.rewards.protocol, flowrl.rewards.remote])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_missing_serve_extra_is_named(tmp_path, monkeypatch):
    (tmp_path / "reward.yaml").write_text("rewards:\n  - class_path: flowrl.rewards.JpegCompressibility\n")
    monkeypatch.setattr(serve, "litserve", None)
    with pytest.raises(SystemExit, match=r"pip install 'flowrl\[serve\]'"):
        serve.main(["--config", str(tmp_path / "reward.yaml")])


def test_bad_server_options_and_unknown_reward_class_fail_before_serving(tmp_path, capsys):
    (tmp_path / "reward.yaml").write_text("rewards:\n  - class_path: flowrl.rewards.JpegCompressibility\n"
                                          "  - class_path: flowrl.rewards.JpegCompressibility\n")
    with pytest.raises(SystemExit, match="max_batch_size=0 must be >= 1"):
        serve.main(["--config", str(tmp_path / "reward.yaml"), "--max_batch_size=0"])
    with pytest.raises(SystemExit, match="two rewards share a name"):
        serve.main(["--config", str(tmp_path / "reward.yaml")])
    with pytest.raises(SystemExit):
        serve.main(["--rewards=[{class_path: flowrl.rewards.PickScoreTypo}]"])
    assert "PickScoreTypo" in capsys.readouterr().err


def test_remote_reward_options_are_checked():
    with pytest.raises(ValueError, match="url='localhost:8000' must look like http://host:port"):
        RemoteReward("localhost:8000")
    with pytest.raises(ValueError, match="timeout=0 must be > 0.*encoding='jpeg'"):
        RemoteReward("http://127.0.0.1:8000", timeout=0, encoding="jpeg")
    assert RemoteReward("http://h:1/", reward="pick").name == "pick"
