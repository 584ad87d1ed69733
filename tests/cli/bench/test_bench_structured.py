"""`k3 bench structured` on the demo model with two schemas: the JSON document's fields, every reply
validated, a positive mask/forward ratio, and bad usage. No timing assertions."""
import json

from k3core.cli.main import main

from ...conftest import DEMO_MODEL

ROW_FIELDS = {"schema", "tokens", "compile_ms", "mask_ms", "mask_p99_ms", "advance_ms", "forward_ms", "decode_passes",
              "mask_vs_forward", "reply", "validation", "seconds"}


def test_two_schemas_on_the_demo_model(capsys):
    assert main(["bench", "structured", str(DEMO_MODEL), "--schemas", "enum_top,integer_bounds", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["vocabulary"] == 768 and doc["vocabulary_ms"] > 0 and doc["llguidance"]
    assert [r["schema"] for r in doc["schemas"]] == ["enum_top", "integer_bounds"]
    for r in doc["schemas"]:
        assert ROW_FIELDS <= set(r)
        assert r["validation"] == "valid" and r["reason"] == "stop id", r
        assert len(r["seconds"]["mask"]) == len(r["seconds"]["advance"]) == r["tokens"]
        assert len(r["seconds"]["forward"]) == r["decode_passes"] == r["tokens"] - 1
        assert r["compile_ms"] > 0 and r["mask_vs_forward"] > 0
    t = doc["totals"]
    assert t["valid"] == t["schemas"] == 2 and t["tokens"] == sum(r["tokens"] for r in doc["schemas"])
    assert t["mask_vs_forward"] > 0 and t["constraint_share"] > 0


def test_without_json_it_prints_the_table(capsys):
    assert main(["bench", "structured", str(DEMO_MODEL), "--schemas", "enum_top"]) == 0
    table = capsys.readouterr().out
    assert "| enum_top |" in table and "1 of 1 valid" in table


def test_an_unknown_schema_is_bad_usage(capsys):
    assert main(["bench", "structured", str(DEMO_MODEL), "--schemas", "enum_top,nosuch"]) == 2
    err = capsys.readouterr().err
    assert "nosuch" in err and "integer_bounds" in err
