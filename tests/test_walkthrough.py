"""The walk-through of docs/own-data.md, end to end, as written there: a CSV of features with
partially observed training labels and a fully labelled test CSV -> ``spml train`` -> ``spml
predict`` on new rows -> the same probabilities as the Python API on standardised features.

The commands, the file layout, the printed summary and the Python snippet are read from the
page's section, so the two cannot drift apart silently.
"""
from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
torch = pytest.importorskip("torch")

README = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"
SECTION = "## Your own data: a walk-through"
CLASSES = ["cat", "dog", "bird"]


def section_blocks() -> dict[str, list[str]]:
    """The fenced blocks of the README's walk-through section, by language."""
    text = README.read_text(encoding="utf-8")
    assert SECTION in text, "the README lost its walk-through section"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for lang, code in re.findall(r"```(\w+)\n(.*?)```", body, flags=re.S):
        blocks.setdefault(lang, []).append(code)
    return blocks


def readme_commands() -> list[list[str]]:
    """The ``spml`` commands of the section's bash block (continuation lines joined)."""
    (code,) = section_blocks()["bash"]
    joined = code.replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in joined.splitlines()
            if line.strip().startswith("spml ")]


def write_files(folder: Path) -> None:
    """train.csv (partial labels: one tagged positive per row that has one, a known negative on
    about 30 % of the rows), test.csv (full labels), new.csv (features only)."""
    rng = np.random.RandomState(0)
    weights = rng.normal(size=(4, 3)) * 2

    def rows(n, prefix):
        x = rng.normal(size=(n, 4))
        y = (x @ weights + rng.normal(scale=0.5, size=(n, 3)) > 0.3).astype(int)
        df = pd.DataFrame(x.round(4), columns=["f1", "f2", "f3", "f4"])
        df.insert(0, "id", [f"{prefix}{i}" for i in range(n)])
        return df, y

    train, y_train = rows(300, "a")
    test, y_test = rows(200, "t")
    new, _ = rows(20, "n")
    observed = np.full(y_train.shape, np.nan)
    for i in range(len(y_train)):
        pos = np.flatnonzero(y_train[i])
        if len(pos):
            observed[i, rng.choice(pos)] = 1
        neg = np.flatnonzero(y_train[i] == 0)
        if len(neg) and rng.rand() < 0.3:
            observed[i, rng.choice(neg)] = -1
    for j, c in enumerate(CLASSES):
        train[c] = pd.array(observed[:, j], dtype="Int64")
        test[c] = y_test[:, j]
    train.to_csv(folder / "train.csv", index=False)
    test.to_csv(folder / "test.csv", index=False)
    new.to_csv(folder / "new.csv", index=False)


@pytest.fixture
def walk(tmp_path, monkeypatch, capsys):
    """The files written and the README's commands run in ``tmp_path``; returns the folder and
    what ``spml train`` printed."""
    from spmlkit.cli import main

    torch.set_num_threads(1)
    write_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    commands = readme_commands()
    assert [c[0] for c in commands] == ["train", "predict"]
    assert main(commands[0]) == 0
    printed = capsys.readouterr().out
    assert main(commands[1]) == 0
    return tmp_path, printed, commands


def test_readme_layout_is_what_the_files_hold(tmp_path):
    """Every row the README shows for train.csv / test.csv / new.csv is a row of the files the
    walk-through test writes (header included)."""
    write_files(tmp_path)
    layout = section_blocks()["text"][0]
    current = None
    shown: dict[str, list[str]] = {}
    for line in layout.splitlines():
        head = re.match(r"(\w+\.csv): ", line)
        if head:
            current = head.group(1)
        elif line.strip():
            shown.setdefault(current, []).append(line.strip())
    assert set(shown) == {"train.csv", "test.csv", "new.csv"}
    for name, lines in shown.items():
        actual = (tmp_path / name).read_text().splitlines()
        assert lines[0] == actual[0], name
        for line in lines[1:]:
            assert line in actual, (name, line)


def test_walkthrough_train_then_predict_matches_the_python_api(walk):
    folder, printed, commands = walk
    run = folder / commands[1][1]
    blocks = section_blocks()

    # what spml train printed is what the README shows (labels line exactly, scores closely)
    shown = blocks["text"][1].splitlines()
    out = printed.splitlines()
    assert out[0] == shown[0]
    assert out[0].startswith("labels: regime given: observed training labels from train.csv")
    numbers = [re.findall(r"\d+\.\d+", line.split("[")[0]) for line in (out[1], shown[1])]
    assert out[1].split(":")[0] == shown[1].split(":")[0]
    assert np.allclose(np.array(numbers[0], float), np.array(numbers[1], float), atol=0.5)
    # the classic metrics of the test set: the same names, values close
    names = [re.findall(r"([a-z_0-9@]+) \d", line) for line in (out[2], shown[2])]
    assert out[2].startswith("test: ") and names[0] == names[1]
    values = [re.findall(r" (\d+\.\d+)", line) for line in (out[2], shown[2])]
    assert np.allclose(np.array(values[0], float), np.array(values[1], float), atol=0.05)
    assert out[3] == shown[3]

    # the run folder records which labels were used
    config = json.loads((run / "config.json").read_text())
    final = json.loads((run / "final.json").read_text())
    assert config["regime"] == "given" and config["labels"]["train_labels"] == "observed"
    assert config["labels"]["k_from"] == "val" and config["labels"]["observed_from"] == \
        "train.csv"
    assert final["labels"] == config["labels"]["summary"] == out[0][len("labels: "):]
    assert final["train_recovery_map"] is None

    # predictions.csv: one row per new item, by id
    with open(folder / "predictions.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["item", "labels", *CLASSES]
    new = pd.read_csv(folder / "new.csv")
    assert [r[0] for r in rows[1:]] == list(new["id"])
    from_cli = np.array([[float(v) for v in r[2:]] for r in rows[1:]])

    # the README's Python snippet, run as written
    scope: dict = {}
    exec(compile(blocks["python"][0], "README walk-through", "exec"), scope)
    assert np.abs(scope["probs"] - from_cli).max() < 1e-6

    # and independently: standardise with the training rows' statistics, then the model
    from spmlkit.methods import load_run_model

    train = pd.read_csv(folder / "train.csv")
    cols = ["f1", "f2", "f3", "f4"]
    x_train = train[cols].to_numpy(np.float32)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    x = ((new[cols].to_numpy(np.float32) - mean) / std).astype(np.float32)
    model, info = load_run_model(run)
    assert info["feature_columns"] == cols
    np.testing.assert_allclose(info["preprocess"]["mean"].numpy(), mean, atol=1e-6)
    np.testing.assert_allclose(info["preprocess"]["std"].numpy(), std, atol=1e-6)
    with torch.no_grad():
        probs = torch.sigmoid(model(torch.from_numpy(x))).numpy()
    assert np.abs(probs - from_cli).max() < 1e-6
    assert probs.std() > 0.05  # a trained model, not a constant
