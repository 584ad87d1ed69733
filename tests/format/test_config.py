"""config.json: both layouts, every problem listed at once, MODEL.md §2 rules, the bad fixtures."""
import json

import pytest

from k3core.format.config import load_config, parse_config
from k3core.errors import ConfigError
from k3core.testmodel.make import COMMON, SHAPES, config_json, shape_config

from ..conftest import K3_IN_C


def tiny_flat():
    return {**SHAPES["tiny"], **COMMON}


def test_nested_and_flat_layouts_give_the_same_config():
    c = shape_config("tiny")
    nested = parse_config(config_json(c, "nested"))
    flat = parse_config(config_json(c, "flat"))
    assert nested.layout == "nested" and flat.layout == "flat"
    assert {**nested.to_dict(), "layout": None} == {**flat.to_dict(), "layout": None}


def test_nested_reads_kda_fields_from_linear_attn_config_only():
    raw = config_json(shape_config("tiny"), "nested")
    raw["text_config"]["kda_num_heads"] = 99  # a flat alias at the wrong level must be ignored
    assert parse_config(raw).kda_num_heads == 4
    del raw["text_config"]["linear_attn_config"]["num_heads"]
    with pytest.raises(ConfigError, match=r"text_config\.linear_attn_config\.num_heads"):
        parse_config(raw)


def test_three_missing_fields_are_all_listed_in_one_error():
    raw = tiny_flat()
    for name in ("hidden_size", "situ_beta", "full_attn_layers"):
        del raw[name]
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert len(err.value.problems) == 3
    for name in ("hidden_size", "situ_beta", "full_attn_layers"):
        assert name in str(err.value)


def test_situ_betas_are_never_defaulted():
    raw = tiny_flat()
    del raw["situ_linear_beta"]
    with pytest.raises(ConfigError, match="situ_linear_beta"):
        parse_config(raw)


def test_ill_typed_fields_are_named():
    raw = {**tiny_flat(), "hidden_size": "128", "moe_renormalize": "yes", "full_attn_layers": [4, "8"]}
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    text = str(err.value)
    assert "hidden_size" in text and "moe_renormalize" in text and "full_attn_layers" in text
    assert len(err.value.problems) == 3


def test_optional_bools_default_to_true():
    raw = tiny_flat()
    for name in ("mla_use_output_gate", "moe_renormalize", "latent_moe_use_norm"):
        raw.pop(name)
    c = parse_config(raw)
    assert c.mla_use_output_gate and c.moe_renormalize and c.latent_moe_use_norm


@pytest.mark.parametrize("change, needle", [
    ({"full_attn_layers": []}, "full_attn_layers is empty"),
    ({"full_attn_layers": [4, 4]}, "duplicates"),
    ({"full_attn_layers": [0, 4]}, "ONE-based"),
    ({"full_attn_layers": list(range(1, 14))}, "no KDA layer"),
    ({"num_experts_per_token": 0}, "num_experts_per_token"),
    ({"attn_res_block_size": 0}, "attn_res_block_size"),
    ({"short_conv_kernel_size": 0}, "short_conv_kernel_size"),
    ({"moe_intermediate_size": 48}, "multiple of 32"),
    ({"hidden_size": -1}, "hidden_size must be > 0"),
])
def test_validation_rules_refuse_with_the_field_named(change, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config({**tiny_flat(), **change})


def test_layer_map_is_one_based():
    c = shape_config("tiny")
    assert [L for L in range(13) if c.is_mla(L)] == [3, 7, 11, 12]
    assert c.is_dense(0) and not c.is_dense(1)


@pytest.mark.parametrize("name, field", [
    ("no_layermap", "full_attn_layers"),
    ("bad_layer_index", "full_attn_layers"),
    ("bad_topk", "num_experts_per_token"),
])
def test_k3_in_c_bad_configs_are_refused_naming_the_field(tmp_path, name, field):
    (tmp_path / "config.json").write_text((K3_IN_C / "cfg" / f"{name}.json").read_text())
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert field in str(err.value) and str(tmp_path) in str(err.value)


def test_unreadable_and_malformed_config_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match="not a JSON object"):
        load_config(tmp_path)


@pytest.mark.parametrize("field, value, says", [
    ("rms_norm_eps", float("inf"), "rms_norm_eps must be a finite number, got inf"),
    ("rms_norm_eps", 2.0, "rms_norm_eps must be in (0, 1), got 2.0"),
    ("situ_beta", float("nan"), "situ_beta must be a finite number, got nan"),
    ("routed_scaling_factor", float("-inf"), "routed_scaling_factor must be a finite number"),
    ("routed_scaling_factor", 0.0, "routed_scaling_factor must be > 0"),
    ("gate_lower_bound", float("nan"), "gate_lower_bound must be a finite number"),
    ("gate_lower_bound", 5.0, "gate_lower_bound must be <= 0"),
    ("hidden_size", 10**400, "hidden_size is 10000000000000000000…, past the limit of 2147483647"),
])
def test_numbers_must_be_finite_and_in_range(tmp_path, field, value, says):
    raw = {**SHAPES["tiny"], **COMMON, field: value}
    (tmp_path / "config.json").write_text(json.dumps(raw))  # json writes Infinity / NaN as the released files could
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path)
    assert says in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("data, says", [(b"\xff\xfe{}", "not UTF-8 text"), (b"1" * 5000, "not valid JSON")])
def test_a_config_that_is_not_json_text_is_named(tmp_path, data, says):
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(ConfigError, match=says) as e:
        load_config(tmp_path)
    assert e.value.exit_code == 2


def test_a_missing_model_directory_is_a_named_checkpoint_error(tmp_path):
    from k3core.errors import CheckpointError
    from k3core.format.checkpoint import open_checkpoint

    with pytest.raises(CheckpointError, match="no such directory"):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        open_checkpoint(tmp_path / "file")
