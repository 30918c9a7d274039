"""The command line's parser writes the config it parsed (the hyperparameters, ``config.yaml``) without validating it
a second time, as the same text, and validates every other config it writes (:mod:`flowrl.cli.parsed_config`)."""

import jsonargparse
from lightning.pytorch.cli import LightningArgumentParser
import pytest

from flowrl.cli import main
from flowrl.cli.parsed_config import ParsedConfigParser
from tests.cli.test_fit import fit_args


def parsed(*args: str):
    parser = ParsedConfigParser()
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--name", type=str, default="run")
    parser.validated = parser.parse_args(list(args))
    return parser, parser.validated


def test_the_parsed_config_is_written_as_the_validating_dump_writes_it(tmp_path):
    parser, config = parsed("--steps=3")
    text = LightningArgumentParser.dump(parser, config)
    assert text == parser.dump(config) == "steps: 3\nname: run\n"
    parser.save(config, tmp_path / "config.yaml", multifile=False)
    assert (tmp_path / "config.yaml").read_text() == text


def test_only_the_parsed_config_skips_the_validation(tmp_path):
    parser, config = parsed()
    copy = config.clone()
    copy.steps = "three"
    with pytest.raises(TypeError, match="steps"):  # any other namespace, a copy included, is validated
        parser.dump(copy)
    with pytest.raises(TypeError, match="steps"):
        parser.save(copy, tmp_path / "copy.yaml", multifile=False)
    config.steps = "three"  # the parsed one is not validated again (its parse did), unless asked
    assert parser.dump(config) == "steps: three\nname: run\n"
    with pytest.raises(TypeError, match="steps"):
        parser.dump(config, skip_validation=False)


def test_a_fit_validates_its_config_once(tiny_model_dir, tmp_path, monkeypatch):
    # the parse validates the whole config (the fit subcommand's part as it parses it, then all): writing the
    # hyperparameters and config.yaml (logger on) validated both again, and the subcommand's part a third time
    whole, validate = [], jsonargparse.ArgumentParser.validate

    def counted(self, namespace, *args, **kwargs):
        if "trainer" in namespace or "fit" in namespace:  # the whole config, or the fit subcommand's part
            whole.append((type(self).__name__, "fit" in namespace))
        return validate(self, namespace, *args, **kwargs)

    monkeypatch.setattr(jsonargparse.ArgumentParser, "validate", counted)
    main(fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=1", "--trainer.logger=true"))
    assert list(tmp_path.rglob("config.yaml"))
    assert whole == [("ParsedConfigParser", True), ("ParsedConfigParser", False)]
