"""Bad settings fail before any weight loads, with one message that names the key and the fix: numbers that make
training NaN or meaningless, a batch that cannot be split as asked, a model or checkpoint that cannot load."""

from pathlib import Path

import pytest
from torch.distributed import DistStoreError

from flowrl.cli import main
from tests.rewards.server_process import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONFIG = str(HERE / "fit_tiny.yaml")
MISSING = "/no/such/model/folder"  # every case below must fail before this path is ever opened


def fails(*extra, model=MISSING) -> str:
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", CONFIG, f"--model.init_args.policy.init_args.model={model}", *extra])
    return str(err.value)


@pytest.mark.parametrize("extra, message", [
    (["--model.init_args.noise_level=0"], "model.noise_level=0.0 must be > 0"),
    (["--model.init_args.noise_level=-0.7"], "model.noise_level=-0.7 must be > 0"),
    (["--model.init_args.beta=-0.1"], "model.beta=-0.1 must be >= 0"),
    (["--model.init_args.optimizer.init_args.lr=-1e-3"], "model.optimizer.init_args.lr=-0.001 must be > 0"),
    (["--model.init_args.optimizer.init_args.lr=0"], "model.optimizer.init_args.lr=0.0 must be > 0"),
    (["--model.init_args.max_nonfinite_steps=0"], "model.max_nonfinite_steps=0 must be >= 1"),
    (["--model.init_args.num_minibatches=1000"], "model.num_minibatches=1000 exceeds the at most 24 trained"),
    (["--model.init_args.num_minibatches=2", "--trainer.max_steps=3"],
     "trainer.max_steps=3 is not a multiple of the 2 optimizer steps each batch takes"),
    (["--data.prompts=no_such_prompts.txt"], "data.prompts='no_such_prompts.txt' does not exist"),
    # issue 38: 0 sampled without the prompt, -1 against it, and the run exited 0 having learned nothing
    (["--model.init_args.guidance_scale=0"], "model.guidance_scale=0.0: below 1, classifier-free guidance"),
    (["--model.init_args.guidance_scale=-1"], "1 disables guidance"),
])
def test_bad_numbers_fail_before_loading(extra, message):
    assert message in fails(*extra)


def test_a_shipped_config_run_from_elsewhere_names_where_its_prompts_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a new user's own folder: the config's relative prompt files are not there
    out = fails("--data.prompts=configs/prompts/digits_train.txt")
    assert "data.prompts='configs/prompts/digits_train.txt' does not exist" in out
    assert f"run from {ROOT} or pass --data.prompts={ROOT / 'configs/prompts/digits_train.txt'}" in out
    assert "data.prompts='no_such.txt' does not exist" in fails("--data.prompts=no_such.txt")  # not shipped: no hint
    assert "run from" not in fails("--data.prompts=no_such.txt")


def test_a_missing_local_model_is_named_without_a_parser_dump():
    out = fails()
    assert f"model.init_args.policy.init_args.model='{MISSING}'" in out and "does not exist" in out
    assert "Union" not in out and "Namespace(" not in out


def test_empty_or_truncated_checkpoint_is_named(tmp_path, tiny_model_dir):
    empty = tmp_path / "empty.ckpt"
    empty.touch()
    assert f"ckpt_path='{empty}' is empty (0 bytes" in fails(f"--ckpt_path={empty}", model=tiny_model_dir)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(b"PK\x03\x04 not the rest of a zip")
    assert "is not a complete checkpoint" in fails(f"--ckpt_path={cut}", model=tiny_model_dir)
    assert "does not exist" in fails(f"--ckpt_path={tmp_path / 'none.ckpt'}", model=tiny_model_dir)


def test_an_unreachable_hub_model_is_named_at_once(tmp_path, monkeypatch, capfd, caplog):
    # in this process: huggingface_hub reads HF_ENDPOINT when it is imported, into its constants and the client its
    # model_info calls, so setting both is what the variable does; nothing listens there, so the one quick request
    # is refused at once; an empty cache of the test's own
    from huggingface_hub import constants, hf_api

    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = fails(model="someorg/no-such-model")
    assert f"model.init_args.policy.init_args.model='someorg/no-such-model': the hub ({endpoint})" in out
    assert "did not give this model" in out and "hf download someorg/no-such-model" in out
    assert "refused" in out  # the request went to the port nothing listens on
    # the build after the check reads the cache alone: no backoff waited for (huggingface_hub logs its retries)
    assert "Retrying in" not in capfd.readouterr().err + caplog.text


def test_a_hub_model_outside_the_cache_under_hf_hub_offline_is_named_at_once(tmp_path, monkeypatch):
    # in this process: HF_HUB_OFFLINE=1 is read into huggingface_hub.constants at import, so setting the constant is
    # what the variable does; an empty cache of the test's own
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = fails(model="someorg/no-such-model")
    assert "model.init_args.policy.init_args.model='someorg/no-such-model'" in out
    assert "is not in the local hub cache and HF_HUB_OFFLINE is set" in out
    assert f"`hf download someorg/no-such-model`, into HF_HOME={tmp_path}" in out


def test_a_function_reward_that_does_not_import_is_one_line_before_loading(tmp_path, monkeypatch):
    package = tmp_path / "flowrl_probe_rewards"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text("def brightness(images, prompts, metadata, gamma=1.0):\n"
                                        "    return images.mean((1, 2, 3)) ** gamma\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = ["--trainer.callbacks+=flowrl.rewards.FunctionReward"]
    out = fails(*reward, "--trainer.callbacks.function=flowrl_probe_rewards.rewards.brightnes")
    assert out.splitlines()[1] == ("  trainer.callbacks: FunctionReward function='flowrl_probe_rewards.rewards."
                                   "brightnes': module 'flowrl_probe_rewards.rewards' has no callable 'brightnes'; "
                                   "did you mean flowrl_probe_rewards.rewards.brightness?")
    out = fails(*reward, "--trainer.callbacks.function=flowrl_probe_rewards.rewards.brightness",
                "--trainer.callbacks.options={gama: 2.2}")
    assert "FunctionReward function='flowrl_probe_rewards.rewards.brightness'" in out and "'gama'" in out


def test_switching_the_quickstarts_method_names_what_the_switch_needs_at_once(capsys):
    out = fails("--config", str(ROOT / "configs/quickstart.yaml"), "--model.class_path=flowrl.methods.TreeRPO")
    assert "  data.group_size=8 is not a multiple of the 16 samples one TreeRPO rollout scores" in out
    assert "LoraOptions" not in out and "timestep_fraction" not in out  # the config's Flow-GRPO option: left out
    notice = "has no option sde_window, tail_compress, timestep_fraction, window_range, which the config sets: left out"
    assert notice in capsys.readouterr().out


def test_a_misspelt_key_is_one_line_with_the_nearest_name(capsys):
    out = fails("--data.gruop_size=8", "--trainer.max_stpes=4")
    assert out.splitlines()[1:3] == [
        "  --data.gruop_size=8: the data module (flowrl.data.PromptDataModule) has no option gruop_size; did you mean "
        "--data.group_size?",
        "  --trainer.max_stpes=4: Lightning's Trainer has no option max_stpes; did you mean --trainer.max_steps?"]
    assert "usage:" not in out + capsys.readouterr().err
    out = fails("--model.init_args.policy.init_args.lorra=null")
    assert out.splitlines()[1] == ("  --model.init_args.policy.init_args.lorra=null: flowrl.policies.TinyFlowPolicy has "
                                   "no option lorra; did you mean --model.init_args.policy.init_args.lora?")


def test_a_misspelt_top_level_key_is_one_line_not_the_usage(capsys):
    out = fails("--ckpt_pth", "runs/x/last.ckpt", "--seed_everythin=3")
    assert out.splitlines()[1:3] == [
        "  --ckpt_pth runs/x/last.ckpt: `fit` has no option ckpt_pth; did you mean --ckpt_path?",
        "  --seed_everythin=3: `fit` has no option seed_everythin; did you mean --seed_everything?"]
    assert "usage:" not in out + capsys.readouterr().err


def test_a_second_node_that_never_comes_is_announced_once(tmp_path, monkeypatch, capsys):
    # in this process, with a 3-second rendezvous timeout (the strategy's option; 30 minutes by default): the notice
    # comes once before the wait, then the run gives up after the timeout it named, with torch's rendezvous error
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("NODE_RANK", "0")
    with pytest.raises(DistStoreError, match=r"Timed out after \d+ seconds waiting for clients. 1/2 clients joined"):
        main(["fit", "--config", CONFIG, "--trainer.num_nodes=2", "--trainer.devices=1",
              f"--trainer.default_root_dir={tmp_path}", "--trainer.strategy=lightning.pytorch.strategies.DDPStrategy",
              "--trainer.strategy.timeout=0:00:03"])
    out = capsys.readouterr().out
    notices = [line for line in out.splitlines() if line.startswith("flowrl: rank 0 waits")]
    assert len(notices) == 1, out[-3000:]
    assert f"for 2 nodes x 1 process (world size 2) to join at 127.0.0.1:{port}" in notices[0]
    assert "NODE_RANK=1 " in notices[0] and "gives up after 0:00:03" in notices[0]


def test_rewards_that_cannot_score_the_policys_images_fail_before_loading(tmp_path):
    # an edit reward, a reward of clips and a reward whose model folder is missing, on the tiny text-to-image policy
    message = fails("--trainer.callbacks+=flowrl.rewards.EditConsistency",
                    "--trainer.callbacks+=flowrl.rewards.TemporalConsistency",
                    "--trainer.callbacks+=flowrl.rewards.PickScore", f"--trainer.callbacks.model={tmp_path}/no_model")
    assert ("trainer.callbacks: EditConsistency compares each sample with its prompt record's source image, but "
            "TinyFlowPolicy makes images from text alone; train an editing policy") in message, message
    assert ("trainer.callbacks: TemporalConsistency compares frames of a clip (at least 2), but TinyFlowPolicy "
            "makes single images; use it with a video policy") in message, message
    assert (f"trainer.callbacks: PickScore model='{tmp_path}/no_model': model path '{tmp_path}/no_model' does not "
            "exist") in message, message


def test_a_gpu_config_on_a_machine_without_one_is_refused_before_loading(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # this machine, whatever runs the test
    out = fails("--config", str(ROOT / "configs/wan21_flow_grpo.yaml"))
    gpu, = [line for line in out.splitlines() if line.startswith("  trainer.accelerator=")]
    assert gpu.startswith("  trainer.accelerator=gpu: this machine has no GPU that torch can use")
    assert "--trainer.accelerator=cpu (or auto: whatever this machine has), --trainer.devices=1" in gpu
    assert "No supported gpu backend" not in out


def test_a_batch_far_beyond_memory_is_refused_before_the_first_batch(tiny_model_dir, tmp_path, monkeypatch):
    import psutil

    from flowrl.methods.base import BaseModule

    # 1 GiB free, whatever machine runs the test; were the check to let it through, no rollout of it may start
    small = psutil.virtual_memory()._replace(available=2**30)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: small)
    monkeypatch.setattr(BaseModule, "on_train_start", lambda self: pytest.fail("the first batch started"))
    out = fails("--data.group_size=100000", f"--trainer.default_root_dir={tmp_path}", model=tiny_model_dir)
    # 2 prompts x 100000 samples x (3 steps + 1) states x (3 x 16 x 16) latent values x 4 bytes = 2.29 GiB
    assert out.splitlines()[1] == (
        "  a batch of 200,000 samples per process needs at least 2.3 GiB for its rollout alone (200,000 samples x 4 "
        "states x 768 latent values (3, 16, 16) x 4 bytes; activations and images come on top), and this machine has "
        "1.0 GiB free; lower data.group_size x data.num_groups per process below 87,381 (fewer samples per prompt, "
        "fewer prompts, or more processes)")
