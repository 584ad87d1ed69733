"""`k3 doctor`: the JSON document's structure, that every warn/fail carries a fix, refusals of bad
usage, and the verdicts under monkeypatched machines (scalar-only CPU, inexact build flags, flush-to-zero,
low MemAvailable, no native module, a model installed or not). Reads 4 MiB or less; no timing assertions."""
import argparse
import json
import os
import sys

import pytest

import k3core
from k3core import _native
from k3core.plan import budget
from k3core.cli import doctor as doctor_command
from k3core.machine import checks as doctor
from k3core.errors import K3Error

NAMES = ["cpu -> kernels", "build", "fp environment", "ram -> preset", "disk space", "disk read", "O_DIRECT",
         "threads", "tuning"]


def run(argv) -> int:
    """`k3 doctor ARGV` through doctor's own parser, with the exit code cli.main would return."""
    parser = argparse.ArgumentParser(prog="k3")
    doctor_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["doctor", *argv])
    try:
        return args.func(args)
    except K3Error as exc:
        return exc.exit_code


def doctor_json(path, capsys, read_mb="4"):
    code = run([str(path), "--read-mb", read_mb, "--json"])
    doc = json.loads(capsys.readouterr().out)
    return code, doc, {c["name"]: c for c in doc["checks"]}


def test_json_structure_statuses_and_fixes(tmp_path, capsys):
    code, doc, checks = doctor_json(tmp_path, capsys)
    assert [c["name"] for c in doc["checks"]] == NAMES
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "finding", "fix", "data"}
        assert c["status"] in ("ok", "warn", "fail") and c["finding"] and isinstance(c["data"], dict)
        if c["status"] != "ok":
            assert c["fix"].strip(), f"{c['name']}: {c['status']} without a fix"
    s = doc["summary"]
    assert [s[k] for k in ("ok", "warn", "fail")] == [sum(c["status"] == k for c in doc["checks"])
                                                      for k in ("ok", "warn", "fail")]
    assert code == s["exit_code"] == (1 if s["fail"] else 0)
    assert s["path"] == str(tmp_path)
    read = checks["disk read"]["data"]
    assert read["bytes"] == 4 << 20 and read["bytes_per_s"] > 0 and isinstance(read["direct"], bool)
    assert checks["O_DIRECT"]["data"]["direct"] == read["direct"]
    assert checks["threads"]["data"]["available"] == len(os.sched_getaffinity(0))
    assert checks["cpu -> kernels"]["data"]["default"] == _native.available_backends()[0]
    assert list(tmp_path.iterdir()) == []  # the test file is gone


def test_text_output_puts_a_fix_under_every_warn_and_fail(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "mem_available", lambda: 1 << 30)  # at least one warn
    assert run([str(tmp_path), "--read-mb", "1"]) in (0, 1)
    lines = capsys.readouterr().out.splitlines()
    verdicts = [i for i, line in enumerate(lines) if line.split(" ", 1)[0] in ("ok", "warn", "fail")]
    assert len(verdicts) == len(NAMES)
    for i in verdicts:
        if not lines[i].startswith("ok"):
            assert lines[i + 1].lstrip().startswith("fix: ")
    assert "ok," in lines[-1] and "-> exit" in lines[-1]


def test_bad_usage_is_refused_with_exit_2(tmp_path, capsys):
    assert run([str(tmp_path / "missing"), "--read-mb", "4", "--json"]) == 2
    (tmp_path / "file").write_bytes(b"x")
    assert run([str(tmp_path / "file"), "--read-mb", "4"]) == 2
    assert run([str(tmp_path), "--read-mb", "0"]) == 2
    assert capsys.readouterr().out == ""
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]


def test_unwritable_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor.os, "access", lambda path, mode: False)  # as root, chmod would not stop a write
    assert run([str(tmp_path), "--read-mb", "1"]) == 2
    assert list(tmp_path.iterdir()) == []


def test_o_direct_refused_falls_back_to_buffered(tmp_path, capsys, monkeypatch):
    real = doctor._read_back

    def refuse_direct(name, size, direct):
        if direct:
            raise OSError(22, "Invalid argument")
        return real(name, size, direct)

    monkeypatch.setattr(doctor, "_read_back", refuse_direct)
    _, _, checks = doctor_json(tmp_path, capsys, "1")
    assert "buffered" in checks["disk read"]["finding"] and checks["disk read"]["data"]["direct"] is False
    direct = checks["O_DIRECT"]
    assert direct["status"] == "warn" and "Invalid argument" in direct["finding"] and direct["fix"]
    assert list(tmp_path.iterdir()) == []


def test_only_scalar_warns_naming_the_missing_feature(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(doctor.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(_native, "available_backends", lambda: ["scalar"])
    monkeypatch.setattr(_native, "cpu_features", lambda: {"avx2": False, "fma": True, "avx512f": False,
                                                          "avx512bw": False, "avx512vl": False, "neon": False})
    _, _, checks = doctor_json(tmp_path, capsys, "1")
    cpu = checks["cpu -> kernels"]
    assert cpu["status"] == "warn" and "lacks avx2" in cpu["finding"] and cpu["fix"]
    assert cpu["data"]["default"] == "scalar" and cpu["data"]["missing"] == "avx2"


def test_scalar_only_build_on_a_simd_cpu_says_rebuild(monkeypatch):
    monkeypatch.setattr(doctor.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(_native, "available_backends", lambda: ["scalar"])
    monkeypatch.setattr(_native, "cpu_features", lambda: {"avx2": True, "fma": True, "neon": False})
    cpu = doctor.check_cpu(_native)
    assert cpu.status == "warn" and "make install" in cpu.fix


@pytest.mark.parametrize("flags, culprit", [("-O2", "-ffp-contract=off"),
                                            ("-O2 -ffp-contract=off -ffast-math", "-ffast-math"),
                                            ("-Ofast -ffp-contract=off", "-Ofast")])
def test_inexact_build_flags_fail(tmp_path, capsys, monkeypatch, flags, culprit):
    monkeypatch.setattr(_native, "build_info", lambda: {"compiler": "g++ 12.2.0", "flags": flags})
    code, doc, checks = doctor_json(tmp_path, capsys, "1")
    build = checks["build"]
    assert build["status"] == "fail" and culprit in build["finding"] and "make install" in build["fix"]
    assert code == 1 and doc["summary"]["exit_code"] == 1


def test_exact_build_flags_pass(monkeypatch):
    exact = {"compiler": "clang 17", "flags": "-O2 -ffp-contract=off -fno-fast-math"}
    monkeypatch.setattr(_native, "build_info", lambda: exact)
    check = doctor.check_build(_native)
    assert check.status == "ok" and "numpy" in check.finding and check.data["python"]


def test_flush_to_zero_fails(monkeypatch):
    class Refusing:
        def __init__(self, name, threads):
            pass

        def sigmoid(self, x):
            raise RuntimeError("k3 kernels refuse to run: flush-to-zero (MXCSR.FTZ) is on in this process")

    monkeypatch.setattr(_native, "Kernels", Refusing)
    check = doctor.check_fp(_native)
    assert check.status == "fail" and "flush-to-zero" in check.finding and check.fix


def test_fp_environment_is_sane_here():
    check = doctor.check_fp(_native)
    assert check.status == "ok" and check.data["sigmoid0"] == 0.5


def test_low_mem_available_warns(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "mem_available", lambda: 2 * 10**9)
    _, _, checks = doctor_json(tmp_path, capsys, "1")
    ram = checks["ram -> preset"]
    assert ram["status"] == "warn" and "laptop" in ram["finding"] and ram["fix"]
    assert ram["data"]["auto"] is None and ram["data"]["mem_available"] == 2 * 10**9


def test_ram_names_the_auto_preset(monkeypatch):
    monkeypatch.setattr(budget, "mem_available", lambda: 130 * 10**9)
    ram = doctor.check_ram()
    assert ram.status == "ok" and ram.data["auto"] == "server" and "server" in ram.finding
    assert set(ram.data["needs"]) == set(budget.PRESETS)


def test_missing_native_module_fails_with_rebuild(tmp_path, capsys, monkeypatch):
    monkeypatch.delattr(k3core, "_native")
    monkeypatch.setitem(sys.modules, "k3core._native", None)
    code, _, checks = doctor_json(tmp_path, capsys, "1")
    assert code == 1
    for name in ("cpu -> kernels", "build", "fp environment"):
        assert checks[name]["status"] == "fail" and "make install" in checks[name]["fix"]


# the disk check right after `make demo` (issue 42): what the installed model still needs, K3's need for reference

@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A profile directory and prompt cache of this test's own, and every filesystem `free` bytes free."""
    import shutil
    from types import SimpleNamespace

    monkeypatch.setenv("K3_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    free = {"bytes": 81.1e9}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=int(free["bytes"])))
    return free


def test_with_a_model_installed_the_disk_check_judges_what_it_still_needs(tmp_path, disk):
    from k3core.plan.profile import Profile, save_profile

    model, trunk = tmp_path / "demo-model", tmp_path / "demo-model" / "trunk"
    trunk.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (trunk / "trunk.bin").write_bytes(b"packed")
    save_profile(Profile(model=str(model), trunk=str(trunk), source="demo"))
    check = doctor.check_space(str(tmp_path))
    assert (check.status, check.finding) == ("ok", (
        f"81.1 GB free; the profile's model {model} is on disk, its trunk packed, and still needs at most 20 GB for "
        f"prompt cache files ({tmp_path}/cache/prompt-cache), 81.1 GB free there: room for it. For reference, Kimi K3 "
        "itself takes 1.56 TB for its checkpoint and 114 GB for a packed trunk"))


def test_an_installed_model_with_its_trunk_still_to_pack_warns_when_it_does_not_fit(tmp_path, tiny_model, disk):
    from k3core.io.pack import packed_trunk_bytes
    from k3core.plan.profile import Profile, save_profile

    save_profile(Profile(model=str(tiny_model), trunk=str(tmp_path / "trunk")))
    disk["bytes"] = 5e9
    check = doctor.check_space(str(tmp_path))
    trunk = doctor.human(packed_trunk_bytes(tiny_model))
    assert (check.status, check.finding) == ("warn", (
        f"5 GB free; the profile's model {tiny_model} is on disk and still needs at most {trunk} for its packed trunk "
        f"({tmp_path}/trunk) + 20 GB for prompt cache files ({tmp_path}/cache/prompt-cache) = 20 GB, 5 GB free there: "
        "too little. For reference, Kimi K3 itself takes 1.56 TB for its checkpoint and 114 GB for a packed trunk"))
    assert check.fix == (f"free space on {tmp_path}/trunk, give the prompt cache less disk (--prompt-cache-disk-gb GB, "
                         "or --prompt-cache off), or pack the trunk onto another drive: k3 pack MODEL_DIR /other/trunk")


def test_with_no_model_installed_the_disk_check_is_for_kimi_k3(tmp_path, disk):
    check = doctor.check_space(str(tmp_path))
    assert (check.status, check.finding) == ("warn", "81.1 GB free: too little for the checkpoint (1.56 TB) or a "
                                                     "packed trunk (114 GB)")


def test_with_a_model_installed_that_fits_in_ram_a_slow_disk_is_enough_and_k3_s_need_is_information(
        tmp_path, tiny_model, disk, monkeypatch):
    from k3core.plan.profile import Profile, save_profile

    slow = {"bytes": 64 << 20, "seconds": 0.2, "bytes_per_s": 0.3e9, "direct": True, "direct_refusal": None}
    assert doctor.check_read(slow, "ext4").status == "warn"  # no profile: the machine is checked for K3
    save_profile(Profile(model=str(tiny_model)))
    monkeypatch.setattr(budget, "mem_available", lambda: 8 << 30)
    check = doctor.check_read(slow, "ext4")
    size = doctor.human(sum(f.stat().st_size for f in tiny_model.glob("*.safetensors")))
    assert (check.status, check.finding) == ("ok", (
        f"0.30 GB/s reading 64 MiB back, sequential, O_DIRECT; enough: the profile's model {tiny_model.name} ({size}) "
        "is read once, then runs from RAM. For reference, Kimi K3 streams: at this speed a token reading ~25.8 GB of "
        f"experts would wait ~{doctor.EXPERT_BYTES / 0.3e9:.0f} s on the disk alone (NVMe: 3-6 GB/s)"))
    monkeypatch.setattr(budget, "mem_available", lambda: 1 << 10)  # it would not fit in RAM: streaming, a warning
    assert doctor.check_read(slow, "ext4").status == "warn"
