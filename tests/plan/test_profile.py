"""The saved profile: written atomically, read back, used by `k3 run` without MODEL_DIR; a damaged
one is refused naming the file; no profile and no MODEL_DIR is a clear usage error."""
import pytest

from k3core.cli.main import main
from k3core.plan.profile import Profile, ProfileError, load_profile, save_profile


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "config"


def test_a_saved_profile_round_trips(tiny_model):
    path = save_profile(Profile(str(tiny_model), preset="laptop", source="demo"))
    assert load_profile() == Profile(str(tiny_model), preset="laptop", source="demo") and path.exists()


def test_run_without_model_dir_uses_the_profile(tiny_model, capsys):
    save_profile(Profile(str(tiny_model)))
    assert main(["run", "--ids", "1,2", "--gen", "2"]) == 0
    assert len(capsys.readouterr().out.split()) == 2


def test_no_profile_and_no_model_dir_says_what_to_do(capsys):
    assert main(["run", "--ids", "1"]) == 2
    assert "k3 setup" in capsys.readouterr().err


def test_a_damaged_profile_is_refused_naming_the_file(config_dir, capsys):
    config_dir.mkdir()
    (config_dir / "profile.json").write_text("{broken")
    with pytest.raises(ProfileError, match="profile.json"):
        load_profile()
    assert main(["run", "--ids", "1"]) == 2
