"""The command line: `adaptive-verify calibrate` on .npz / .pt dumps, its errors, and the older subcommands."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from adaptive_verify import cli
from adaptive_verify.calibration import fit_sts, load_temperatures

S = [2.0, 0.5, 1.5]


def dump_data(N=6000, seed=0):
    """Logits reported at temperatures S of true logits z; accepted sequentially; a third of rows verify fewer."""
    g = torch.Generator().manual_seed(seed)
    K = len(S)
    z = torch.randn(N, K, generator=g, dtype=torch.float64) * 1.5 + 2.0
    passes = torch.rand(N, K, generator=g, dtype=torch.float64) < torch.sigmoid(z)
    verified = torch.full((N,), K, dtype=torch.int32)
    verified[: N // 3] = torch.randint(1, K, (N // 3,), generator=g, dtype=torch.int32)
    ok = passes & (torch.arange(K)[None, :] < verified[:, None])
    accepted = torch.cumprod(ok.int(), 1).sum(1).int()
    return {"logits": (z * torch.tensor(S, dtype=torch.float64)).float(), "accepted": accepted, "verified": verified}


@pytest.fixture(scope="module")
def data():
    return dump_data()


def write_npz(path, d):
    np.savez(path, **{k: v.numpy() for k, v in d.items()})
    return str(path)


def run(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_calibrate_npz(tmp_path, data, capsys):
    dump = write_npz(tmp_path / "held_out.npz", data)
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    rc, out, err = run(["calibrate", dump, *(["--plot", tmp_path / "rel.png"] if has_matplotlib else [])], capsys)
    assert rc == 0, err
    # Default output: next to the dump.
    written = json.loads((tmp_path / "held_out.temperatures.json").read_text())
    temps = written["temperatures"]
    assert temps == pytest.approx(fit_sts(data["logits"], data["accepted"], data["verified"]).tolist())
    assert load_temperatures(tmp_path / "held_out.temperatures.json").tolist() == pytest.approx(temps)
    meta = written["metadata"]
    assert (meta["num_rows"], meta["num_positions"]) == (6000, 3)
    assert meta["after"]["ece_overall"] < meta["before"]["ece_overall"]
    assert len(meta["before"]["ece"]) == 3 and len(meta["after"]["auc"]) == 3 and "date" in meta
    if has_matplotlib:
        assert (tmp_path / "rel.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The table: a header, one line per position with T, then overall.
    lines = out.splitlines()
    assert any("ECE before" in l and "AUC after" in l for l in lines)
    for j, t in enumerate(temps):
        row = next(l.split() for l in lines if l.split()[:1] == [str(j)])
        assert float(row[3]) == pytest.approx(t, abs=5e-4)
    assert any(l.split()[:1] == ["overall"] for l in lines)


def test_calibrate_pt_without_verified(tmp_path, data, capsys):
    full = {"logits": data["logits"], "accepted": torch.where(data["verified"] == 3, data["accepted"], 0)}
    dump = tmp_path / "d.pt"
    torch.save(full, dump)
    out_json = tmp_path / "t.json"
    grid = ["--grid-min", 0.5, "--grid-max", 4, "--grid-points", 50]
    rc, _, err = run(["calibrate", dump, "--out", out_json, *grid], capsys)
    assert rc == 0, err
    temps = json.loads(out_json.read_text())["temperatures"]
    assert all(0.5 <= t <= 4.0 for t in temps)
    assert json.loads(out_json.read_text())["metadata"]["grid"] == {"min": 0.5, "max": 4.0, "points": 50}


def test_calibrate_as_a_process(tmp_path, data):
    dump = write_npz(tmp_path / "d.npz", data)
    out_json = tmp_path / "t.json"
    proc = subprocess.run(
        [sys.executable, "-m", "adaptive_verify.cli", "calibrate", dump, "--out", str(out_json)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(out_json.read_text())["temperatures"]) == 3
    proc = subprocess.run(
        [sys.executable, "-m", "adaptive_verify.cli", "calibrate", str(tmp_path / "missing.npz")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1 and "missing.npz: no such file" in proc.stderr


def _bad_dumps(tmp_path, data):
    n = len(data["accepted"])

    def npz(name, **change):
        return write_npz(tmp_path / name, {**data, **change})

    cases = {
        "missing file": (str(tmp_path / "nope.npz"), "nope.npz: no such file"),
        "unknown extension": (tmp_path / "d.csv", "unknown extension '.csv'"),
        "missing key": (write_npz(tmp_path / "k.npz", {"logits": data["logits"]}), "missing key(s) 'accepted'"),
        "wrong shape": (npz("s.npz", accepted=data["accepted"][:, None]), "accepted must have shape"),
        "wrong length": (npz("l.npz", verified=data["verified"][: n - 1]), "verified must have shape"),
        "logits 1-D": (npz("o.npz", logits=data["logits"][:, 0]), "logits must have shape [N, K]"),
        "float accepted": (npz("f.npz", accepted=data["accepted"].float()), "accepted must have an integer dtype"),
        "accepted > verified": (npz("v.npz", verified=0 * data["verified"]), "accepted must be <= verified"),
        "too few rows": (write_npz(tmp_path / "r.npz", {k: v[:30] for k, v in data.items()}), "position 0: only"),
    }
    (tmp_path / "d.csv").write_text("logits,accepted\n")
    torch.save([data["logits"]], tmp_path / "list.pt")
    cases["pt not a dict"] = (tmp_path / "list.pt", "expected a dict")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    cases["corrupt pt"] = (tmp_path / "junk.pt", "cannot read as a torch.save file")
    return cases


def test_calibrate_errors(tmp_path, data, capsys):
    for what, (dump, message) in _bad_dumps(tmp_path, data).items():
        rc, out, err = run(["calibrate", dump, "--out", tmp_path / "t.json"], capsys)
        assert rc == 1, what
        assert message in err and os.path.basename(str(dump)) in err, (what, err)
        assert not (tmp_path / "t.json").exists(), what


def test_calibrate_bad_options(tmp_path, data, capsys):
    dump = write_npz(tmp_path / "d.npz", data)
    for opts, message in (
        (["--grid-min", "0"], "--grid-min"),
        (["--grid-min", "3", "--grid-max", "2"], "--grid-max"),
        (["--grid-points", "0"], "--grid-points"),
        (["--bins", "0"], "--bins"),
    ):
        rc, _, err = run(["calibrate", dump, *opts], capsys)
        assert rc == 1 and message in err, (opts, err)
    with pytest.raises(SystemExit) as e:
        cli.main(["calibrate", dump, "--no-such-option"])
    assert e.value.code == 2
    assert "--no-such-option" in capsys.readouterr().err


def test_older_subcommands_still_work(capsys):
    assert cli.main(["info"]) == 0
    assert "with_cuda" in json.loads(capsys.readouterr().out)
    for area in ("planner", "confidence"):
        with pytest.raises(SystemExit) as e:  # each benchmark's own --help: the arguments reach it
            cli.main(["bench", area, "--help"])
        assert e.value.code == 0
        assert f"adaptive-verify bench {area}" in capsys.readouterr().out
