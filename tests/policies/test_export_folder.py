"""The folder an export writes holds exactly that export: ``--out`` an existing file is refused before anything
loads (it once printed ``LoRA weights -> FILE`` and wrote nothing), and an export into a folder holding an earlier
one removes, naming them, the earlier files it does not write (a stale second expert's file was once left for the
Video page's snippet to load into ``transformer_2``)."""

import pytest

from flowrl.cli import export as export_command
from flowrl.cli import main
from flowrl.policies.export import export_lora
from tests.policies.test_export import trained_policy
from tests.policies.test_wan_export import SECOND, trained

MAIN = "pytorch_lora_weights.safetensors"


def test_export_to_an_existing_file_is_refused_before_the_weights_load(sd3_dir, tmp_path, monkeypatch, capsys):
    loads = []
    monkeypatch.setattr(export_command, "load_policy", lambda *a: loads.append(a) or trained_policy("sd3", sd3_dir))
    target = tmp_path / "weights.safetensors"
    target.write_bytes(b"the user's own file")
    with pytest.raises(SystemExit, match=f"flowrl export: --out {target} is a file, not a folder: .* give a folder's "
                                         "path"):
        main(["export", "--ckpt", str(tmp_path / "run.ckpt"), "--out", str(target)])
    assert loads == [] and target.read_bytes() == b"the user's own file"
    assert "LoRA weights ->" not in capsys.readouterr().out


def test_an_export_over_an_earlier_one_leaves_only_its_own_files(wan_dirs, tmp_path, capsys):
    out = tmp_path / "lora"
    out.mkdir()
    (out / "notes.txt").write_text("kept: no export writes it")
    export_lora(trained(wan_dirs["wan22_euler"]), out)  # both experts
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", MAIN, SECOND]
    export_lora(trained(wan_dirs["wan22_euler"], trained_experts=["transformer"]), out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", MAIN]  # the old second expert's file is gone
    assert f"flowrl export: removed {out / SECOND} (an earlier export's; this export does not write it)" in \
        capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["lora"]  # no staging folder left
