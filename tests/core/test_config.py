import pytest

from dgl_rsc import ConfigError, RSCConfig


def test_defaults_are_valid():
    cfg = RSCConfig()
    assert 0 < cfg.budget <= 1
    assert cfg.switch_step is None


def test_from_dict_roundtrip():
    cfg = RSCConfig.from_dict({"budget": 0.3, "total_steps": 100, "switch_at": 0.5})
    assert cfg.budget == 0.3 and cfg.switch_step == 50
    assert RSCConfig.from_dict(cfg.to_dict()) == cfg


def test_unknown_key_lists_allowed_and_nearest():
    with pytest.raises(ConfigError) as err:
        RSCConfig.from_dict({"budjet": 0.3})
    msg = str(err.value)
    assert "budjet" in msg and "Did you mean 'budget'" in msg and "cache_interval" in msg


@pytest.mark.parametrize(
    "key,value",
    [
        ("budget", 0.0),
        ("budget", 1.5),
        ("budget", -0.1),
        ("cache_interval", 0),
        ("tune_interval", 0),
        ("switch_at", 1.2),
        ("total_steps", 0),
        ("min_k", -1),
        ("min_width", -1),
        ("min_width", 2.5),
        ("ema", 0.0),
        ("cache_interval", 2.5),
        ("budget", "0.1"),
        ("budget", True),
    ],
)
def test_out_of_range_names_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        RSCConfig(**{key: value})


def test_bad_choice_suggests():
    with pytest.raises(ConfigError, match="Did you mean 'cupy'"):
        RSCConfig(backend="cupyy")
    with pytest.raises(ConfigError, match="rule"):
        RSCConfig(rule="random")


def test_integer_floats_are_normalised():
    cfg = RSCConfig(cache_interval=10.0, budget=1)
    assert isinstance(cfg.cache_interval, int) and isinstance(cfg.budget, float)


def test_rescale_modes_and_the_older_boolean_form():
    assert RSCConfig().rescale == "ls" and RSCConfig().diagonal == "sample"
    assert RSCConfig(rescale=False).rescale == "none" and RSCConfig(rescale=True).rescale == "ls"
    assert RSCConfig(rescale="mass").rescale == "mass"
    with pytest.raises(ConfigError, match="RSCConfig.rescale='yes' is not one of ls, mass"):
        RSCConfig(rescale="yes")
    with pytest.raises(ConfigError, match="Did you mean 'exact'"):
        RSCConfig(diagonal="exakt")
    with pytest.raises(ConfigError, match="probe_rows"):
        RSCConfig(probe_rows=0)
