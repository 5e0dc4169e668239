"""Dataset options: documented for every source (``spml list datasets --details``, generated
from signatures and docstrings), and a misspelt key refused with 'did you mean' on every path
(``spml train --data``, a study's dataset options, ``load_splits``, ``load_dataset``)."""
import inspect

import pytest

from spmlkit.cli import main
from spmlkit.data import DATASETS
from spmlkit.loading import load_dataset, load_splits
from spmlkit.data.options import args_section, describe_options, source_parameters
from spmlkit.experiments.study import load_study
from spmlkit.loading import feature_option_rows

SOURCES = DATASETS.names()


def _misspelt(name: str) -> tuple[str, str]:
    """``(option, misspelling)``: the source's first option and a near miss of it."""
    option = next(iter(source_parameters(name)))
    return option, option[:-1] + ("x" if option[-1] != "x" else "y")


@pytest.mark.parametrize("name, test, val", [("tabular", "test_path", "val_path"),
                                             ("folder", "test_csv", "val_csv")])
def test_a_sources_val_option_says_what_val_is_for(name, test, val):
    # val_path's help repeated test_path's ("fully labelled test / val rows")
    rows = {r["name"]: r["help"] for r in describe_options(name)}
    assert rows[val] != rows[test]
    assert rows[val].startswith("fully labelled validation ") and "chosen on" in rows[val]
    assert rows[test].startswith("fully labelled test ") and "validation" not in rows[test]


@pytest.mark.parametrize("name", SOURCES)
def test_every_option_of_every_source_is_described(name):
    rows = {r["name"]: r for r in describe_options(name, feature_option_rows())}
    params = source_parameters(name)
    for key, p in params.items():
        row = rows[key]
        if key == "seed":  # --data seed=N is load_splits' (the observed labels' draw)
            assert row["group"] == "protocol" and "observed-label draw" in row["help"]
            continue
        assert row["group"] == "source"
        assert row["help"], f"{name}: option {key!r} has no entry in the docstring's Args"
        assert row["required"] == (p.default is p.empty)
        assert row["default"] == (None if row["required"] else repr(p.default))
    assert {"subsample", "subsample_seed", "class_order"} <= set(rows)
    assert ({"backbone", "features"} <= set(rows)) == ("images" in DATASETS.get(name).tags)
    assert all(r["help"] for r in rows.values())


def test_list_datasets_details(capsys):
    assert main(["list", "datasets", "voc", "--details"]) == 0
    out = capsys.readouterr().out
    assert "  root (str | os.PathLike, required)\n      the folder that holds VOCdevkit/" in out
    assert "  year (str | int, default 2012)" in out
    assert "  skip_corrupt (bool, default False)\n      drop and count unusable images" in out
    assert "  subsample (float | None, default None)" in out and "  backbone (" in out
    assert "yeast:" not in out
    assert main(["list", "datasets", "--details"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{name}: " in f"\n{out}" for name in SOURCES)
    assert main(["list", "datasets", "vocc"]) == 2
    assert "unknown dataset 'vocc' (did you mean voc?)" in capsys.readouterr().err
    assert main(["list", "losses", "an"]) == 2


@pytest.mark.parametrize("name", SOURCES)
def test_a_misspelt_option_says_did_you_mean_on_every_path(name, capsys, tmp_path):
    option, wrong = _misspelt(name)
    expect = f"unknown option {wrong!r} for dataset {name!r}; did you mean {option!r}?"
    for load in (load_splits, load_dataset):
        with pytest.raises(ValueError, match=inspect.cleandoc(expect).replace("?", r"\?")):
            load(name, **{wrong: "x"})
    assert main(["train", "--dataset", name, "--data", f"{wrong}=x", "--quiet", "--out",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expect in err and f"spml list datasets {name} --details" in err
    assert "Traceback" not in err and "TypeError" not in err
    with pytest.raises(ValueError, match=r"datasets\[0\]\.options: unknown option"):
        load_study({"name": "t", "datasets": [{"name": name, "options": {wrong: "x"}}],
                    "methods": ["an"]})


def test_args_section_parser():
    def f(a, b, c):
        """Do it.

        Args:
            a, b: shared
                text.
            c: one (``x``).

        Returns:
            nothing: not an arg.
        """
    assert args_section(f.__doc__) == {"a": "shared text.", "b": "shared text.",
                                       "c": "one (``x``)."}
    assert args_section(None) == {} and args_section("No args here.") == {}
