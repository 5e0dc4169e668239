"""Tests of spmlkit.labels (encoding, validation, regimes, k estimation) and the Cole protocol
split helpers of spmlkit.data.protocol (cole_split, make_splits)."""
from __future__ import annotations

import math
import re
import statistics
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spmlkit.data.protocol import Dataset, LabelledSet, cole_split, make_splits
from spmlkit.labels import (NEGATIVE, OFFICIAL_SEED, POSITIVE, UNOBSERVED, estimate_k,
                            make_observed, parse_regime, sample_single_positive,
                            validate_full_labels, validate_observed)


# --------------------------------------------------------------------------------------------
# An independent re-implementation of the official observation procedure (Cole et al. 2021,
# docs/spec.md#regimes), written from the specification: fresh RandomState(seed); per row, in
# order, shuffle the positive indices (np.nonzero) and keep the first num_pos, then the same for
# the negatives with num_neg; -1 keeps them all. The official code works on a -1/+1 matrix.
# --------------------------------------------------------------------------------------------
def reference_observe(y, num_pos, num_neg, seed):
    y = np.asarray(y)
    signed = np.where(y == 1, 1.0, -1.0)
    rng = np.random.RandomState(seed)
    out = np.zeros(signed.shape, dtype=np.int64)
    for i in range(signed.shape[0]):
        for value, count in ((1.0, num_pos), (-1.0, num_neg)):
            cand = np.nonzero(signed[i] == value)[0]
            rng.shuffle(cand)
            chosen = cand if count == -1 else cand[:count]
            out[i, chosen] = 1 if value == 1.0 else -1
    return out


Y_FIXED = np.array([[1, 1, 0, 1, 0],
                    [0, 1, 1, 0, 0],
                    [1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1],   # no negative
                    [0, 0, 0, 0, 0],   # no positive (NUS-WIDE has such rows)
                    [0, 1, 1, 1, 0],
                    [1, 0, 1, 0, 1]])

# Computed once with reference_observe above and written out literally.
PINNED = {
    (1200, 1, 0): [[1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0],
                   [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 1]],
    (1200, 1, 1): [[1, 0, 0, 0, -1], [-1, 0, 1, 0, 0], [1, 0, 0, -1, 0], [1, 0, 0, 0, 0],
                   [0, 0, -1, 0, 0], [0, 0, 1, 0, -1], [0, -1, 0, 0, 1]],
    (1200, 1, -1): [[1, 0, -1, 0, -1], [-1, 0, 1, -1, -1], [1, -1, -1, -1, -1],
                    [1, 0, 0, 0, 0], [-1, -1, -1, -1, -1], [-1, 0, 1, 0, -1],
                    [0, -1, 0, -1, 1]],
    (7, 1, 0): [[0, 0, 0, 1, 0], [0, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 1, 0],
                [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0]],
    (7, 1, 1): [[0, 0, 0, 1, -1], [0, 1, 0, 0, -1], [1, 0, 0, 0, -1], [0, 0, 0, 1, 0],
                [0, -1, 0, 0, 0], [-1, 0, 1, 0, 0], [0, -1, 1, 0, 0]],
    (7, 1, -1): [[0, 0, -1, 1, -1], [-1, 1, 0, -1, -1], [1, -1, -1, -1, -1], [0, 0, 0, 1, 0],
                 [-1, -1, -1, -1, -1], [-1, 0, 1, 0, -1], [0, -1, 1, -1, 0]],
}


def test_encoding_constants():
    assert (POSITIVE, UNOBSERVED, NEGATIVE) == (1, 0, -1)
    assert OFFICIAL_SEED == 1200


# ------------------------------------------------------------------ validation -------------
class TestValidateFullLabels:
    def test_accepts_and_returns_uint8(self):
        out = validate_full_labels([[0, 1], [1, 1]])
        assert out.dtype == np.uint8
        assert out.tolist() == [[0, 1], [1, 1]]

    def test_bool_and_float_01_accepted(self):
        assert validate_full_labels(np.array([[True, False]])).tolist() == [[1, 0]]
        assert validate_full_labels(np.array([[1.0, 0.0]])).tolist() == [[1, 0]]

    @pytest.mark.parametrize("bad", [[0, 1, 1], [[[0, 1]]], 1])
    def test_wrong_ndim_names_shape(self, bad):
        shape = np.asarray(bad).shape
        with pytest.raises(ValueError, match=re.escape(str(shape))) as err:
            validate_full_labels(bad, where="train.npy")
        assert "2-D" in str(err.value) and "train.npy" in str(err.value)

    def test_value_outside_01_names_value_and_row(self):
        y = [[0, 1, 0], [1, 0, 1], [0, 2, 1], [7, 0, 0]]
        with pytest.raises(ValueError) as err:
            validate_full_labels(y, where="labels.csv")
        msg = str(err.value)
        assert "2.0" in msg and "7.0" in msg
        assert "row 2" in msg
        assert "labels.csv" in msg

    def test_negative_one_is_not_a_full_label(self):
        with pytest.raises(ValueError, match=r"-1\.0.*row 1"):
            validate_full_labels([[0, 1], [-1, 1]])

    def test_nan_names_nan_and_row(self):
        y = np.array([[0.0, 1.0], [1.0, 0.0], [np.nan, 1.0]])
        with pytest.raises(ValueError, match=r"nan.*row 2"):
            validate_full_labels(y)

    def test_string_dtype_rejected(self):
        with pytest.raises(ValueError, match="dtype"):
            validate_full_labels([["1", "0"], ["0", "1"]])

    @pytest.mark.parametrize("bad, value, row", [([["1", "0"], ["0", "x"]], "x", 1),
                                                 ([[1, 0], [0, None]], "None", 1)])
    def test_non_numeric_names_value_and_row(self, bad, value, row):
        with pytest.raises(ValueError) as err:
            validate_full_labels(bad)
        assert value in str(err.value) and f"row {row}" in str(err.value)


class TestValidateObserved:
    def test_accepts_and_returns_int8(self):
        out = validate_observed([[1, 0, -1]])
        assert out.dtype == np.int8 and out.tolist() == [[1, 0, -1]]
        assert validate_observed(np.array([[1.0, -1.0]])).tolist() == [[1, -1]]

    def test_wrong_ndim_names_shape(self):
        with pytest.raises(ValueError, match=re.escape("(3,)")):
            validate_observed([1, 0, -1])

    def test_value_outside_names_value_and_row(self):
        z = [[1, 0, -1], [0, 1, 0], [1, 2, 0], [-2, 0, 1]]
        with pytest.raises(ValueError) as err:
            validate_observed(z, where="obs.npy")
        msg = str(err.value)
        assert "2.0" in msg and "-2.0" in msg and "row 2" in msg and "obs.npy" in msg

    def test_full_style_zero_one_is_fine_but_fraction_is_not(self):
        with pytest.raises(ValueError, match=r"0\.5.*row 1"):
            validate_observed([[1, 0], [0.5, 1]])

    def test_nan_named(self):
        with pytest.raises(ValueError, match=r"nan.*row 1"):
            validate_observed(np.array([[1.0, 0.0], [0.0, np.nan]]))

    def test_strings_rejected(self):
        with pytest.raises(ValueError, match="numeric"):
            validate_observed([["1", "0"]])

    def test_strings_name_value_and_row(self):
        with pytest.raises(ValueError) as err:
            validate_observed([["1", "0"], ["0", "pos"]])
        assert "pos" in str(err.value) and "row 1" in str(err.value)

    def test_require_positive_names_rows(self):
        z = [[1, 0, 0], [0, -1, 0], [0, 1, 0], [0, 0, 0], [-1, -1, 1]]
        validate_observed(z)  # fine without the flag
        with pytest.raises(ValueError) as err:
            validate_observed(z, require_positive=True)
        msg = str(err.value)
        assert "2 row(s)" in msg and "[1, 3]" in msg

    def test_require_positive_passes(self):
        out = validate_observed([[1, 0], [0, 1]], require_positive=True)
        assert out.tolist() == [[1, 0], [0, 1]]


# ------------------------------------------------------------------ the sampler ------------
@pytest.mark.parametrize("seed, num_pos, num_neg", sorted(PINNED))
def test_single_positive_sampler_pinned(seed, num_pos, num_neg):
    expected = np.array(PINNED[(seed, num_pos, num_neg)])
    # the literal is what the independent re-implementation gives
    np.testing.assert_array_equal(reference_observe(Y_FIXED, num_pos, num_neg, seed), expected)
    got = sample_single_positive(Y_FIXED, num_pos, num_neg, seed=seed)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, expected)


def test_sampler_none_equals_minus_one():
    np.testing.assert_array_equal(sample_single_positive(Y_FIXED, 1, None, seed=1200),
                                  sample_single_positive(Y_FIXED, 1, -1, seed=1200))


def test_sampler_default_is_official_1p():
    np.testing.assert_array_equal(sample_single_positive(Y_FIXED),
                                  np.array(PINNED[(1200, 1, 0)]))


def test_sampler_rejects_negative_counts_other_than_minus_one():
    with pytest.raises(ValueError):
        sample_single_positive([[1, 1, 0, 0]], num_pos=-2)


@settings(max_examples=60, deadline=None)
@given(y=hnp.arrays(np.uint8, st.tuples(st.integers(0, 12), st.integers(1, 9)),
                    elements=st.integers(0, 1)),
       counts=st.sampled_from([(1, 0), (1, 1), (1, -1)]),
       seed=st.integers(0, 2**31 - 1))
def test_sampler_equals_reference_property(y, counts, seed):
    num_pos, num_neg = counts
    np.testing.assert_array_equal(sample_single_positive(y, num_pos, num_neg, seed=seed),
                                  reference_observe(y, num_pos, num_neg, seed))


# ------------------------------------------------------------------ regimes ----------------
def _random_full(n=400, L=20, seed=0, rate=0.2):
    rng = np.random.RandomState(seed)
    y = (rng.random_sample((n, L)) < rate).astype(np.uint8)
    y[:5] = 0          # some rows without positives
    y[5:8] = 1         # some rows without negatives
    return y


class TestRegimes:
    y = _random_full()

    def test_full(self):
        z = make_observed(self.y, "full", seed=3)
        np.testing.assert_array_equal(z, np.where(self.y == 1, 1, -1))
        assert z.dtype == np.int8

    @pytest.mark.parametrize("regime, n_neg", [("1p", 0), ("1p_1n", 1), ("1p_alln", None)])
    def test_single_positive_regimes_counts(self, regime, n_neg):
        y = self.y
        z = make_observed(y, regime, seed=11)
        n_pos_true = y.sum(1)
        n_neg_true = y.shape[1] - n_pos_true
        obs_pos = (z == POSITIVE).sum(1)
        obs_neg = (z == NEGATIVE).sum(1)
        np.testing.assert_array_equal(obs_pos, np.minimum(n_pos_true, 1))
        want_neg = n_neg_true if n_neg is None else np.minimum(n_neg_true, n_neg)
        np.testing.assert_array_equal(obs_neg, want_neg)
        # observed labels are correct labels
        assert np.all(y[z == POSITIVE] == 1)
        assert np.all(y[z == NEGATIVE] == 0)
        assert set(np.unique(z)) <= {-1, 0, 1}

    def test_regime_equals_reference(self):
        for regime, (p, n) in (("1p", (1, 0)), ("1p_1n", (1, 1)), ("1p_alln", (1, -1))):
            np.testing.assert_array_equal(make_observed(self.y, regime, seed=1200),
                                          reference_observe(self.y, p, n, 1200))

    @pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
    def test_mlml_drop_fraction(self, rate):
        y = _random_full(n=1000, L=40, seed=1)
        z = make_observed(y, f"mlml:{rate}", seed=5)
        dropped = (z == UNOBSERVED).mean()
        # 40,000 Bernoulli draws: sd of the fraction < 0.0026
        assert abs(dropped - rate) < 0.015
        kept = z != UNOBSERVED
        np.testing.assert_array_equal(z[kept], np.where(y == 1, 1, -1)[kept])

    def test_mlml_zero_rate_is_full(self):
        np.testing.assert_array_equal(make_observed(self.y, "mlml:0", seed=1),
                                      make_observed(self.y, "full"))

    @pytest.mark.parametrize("regime", ["1p", "1p_1n", "1p_alln", "mlml:0.5"])
    def test_purity(self, regime):
        np.random.seed(123)
        before = np.random.get_state()[1].copy()
        a = make_observed(self.y, regime, seed=42)
        b = make_observed(self.y.copy(), regime, seed=42)
        c = make_observed(self.y, regime, seed=43)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        # the global numpy RNG was neither read into nor advanced
        np.testing.assert_array_equal(np.random.get_state()[1], before)
        # the input is not modified
        np.testing.assert_array_equal(self.y, _random_full())

    def test_default_seed_is_official(self):
        np.testing.assert_array_equal(make_observed(self.y, "1p"),
                                      make_observed(self.y, "1p", seed=1200))


class TestParseRegime:
    @pytest.mark.parametrize("regime, out", [("1p", ("1p", None)), ("full", ("full", None)),
                                             ("1p_1n", ("1p_1n", None)),
                                             ("1p_alln", ("1p_alln", None)),
                                             ("mlml:0.25", ("mlml", 0.25))])
    def test_ok(self, regime, out):
        assert parse_regime(regime) == out

    @pytest.mark.parametrize("regime", ["2p", "1P", "", "1p:3", "full:1", "mlmlx"])
    def test_unknown(self, regime):
        with pytest.raises(ValueError, match="unknown regime") as err:
            parse_regime(regime)
        assert "1p_alln" in str(err.value)  # lists the choices

    @pytest.mark.parametrize("regime", ["mlml", "mlml:", "mlml:abc"])
    def test_mlml_needs_rate(self, regime):
        with pytest.raises(ValueError, match="drop rate"):
            parse_regime(regime)

    @pytest.mark.parametrize("rate", ["1.0", "1.5", "-0.1", "nan"])
    def test_mlml_rate_out_of_range(self, rate):
        with pytest.raises(ValueError, match="rate"):
            make_observed([[1, 0]], f"mlml:{rate}")


# ------------------------------------------------------------------ estimate_k -------------
class TestEstimateK:
    def test_value_and_interval_by_hand(self):
        y = _random_full(n=37, L=10, seed=4, rate=0.3)
        counts = [int(r.sum()) for r in y]
        k = sum(counts) / len(counts)
        sd = statistics.stdev(counts)
        z = NormalDist().inv_cdf(0.975)
        half = z * sd / math.sqrt(len(counts))
        est = estimate_k(y)
        assert est.m == 37 and est.confidence == 0.95
        assert est.k == pytest.approx(k, rel=1e-12)
        assert est.low == pytest.approx(max(0.0, k - half), rel=1e-12)
        assert est.high == pytest.approx(k + half, rel=1e-12)

    def test_other_confidence(self):
        y = _random_full(n=25, L=8, seed=9, rate=0.4)
        counts = y.sum(1).tolist()
        z = NormalDist().inv_cdf(0.5 + 0.8 / 2)
        half = z * statistics.stdev(counts) / math.sqrt(25)
        est = estimate_k(y, confidence=0.8)
        assert est.high - est.k == pytest.approx(half, rel=1e-12)
        assert est.high - est.low < estimate_k(y, confidence=0.99).high - \
            estimate_k(y, confidence=0.99).low

    def test_interval_shrinks_with_m(self):
        y = _random_full(n=2000, L=15, seed=2, rate=0.2)[10:]
        widths = [estimate_k(y[:m]).high - estimate_k(y[:m]).low for m in (20, 80, 320, 1280)]
        assert all(a > b for a, b in zip(widths, widths[1:]))
        # ~ 1/sqrt(M): quadrupling M roughly halves the width
        assert widths[-1] / widths[-2] == pytest.approx(0.5, rel=0.2)

    def test_clipped_at_zero(self):
        y = np.zeros((10, 5), dtype=np.uint8)
        y[0, 0] = 1
        est = estimate_k(y)
        assert est.k == pytest.approx(0.1)
        assert est.low == 0.0 and est.high > 0.1

    def test_constant_counts_zero_width(self):
        est = estimate_k([[1, 1, 0], [0, 1, 1], [1, 0, 1]])
        assert est.k == 2.0 and est.low == est.high == 2.0

    def test_errors(self):
        with pytest.raises(ValueError, match="at least one"):
            estimate_k(np.zeros((0, 3)))
        with pytest.raises(ValueError, match=r"row 1"):
            estimate_k([[1, 0], [2, 0]])


# ------------------------------------------------------------------ protocol splits --------
class TestColeSplit:
    def test_yeast_sizes(self):
        pool, test = cole_split(2417, 0.3)
        assert (len(pool), len(test)) == (1692, 725)
        train, val = cole_split(1692, 0.2)
        assert (len(train), len(val)) == (1354, 338)

    @pytest.mark.parametrize("n, frac, seed", [(2417, 0.3, 1200), (1692, 0.2, 1200),
                                               (101, 0.2, 3), (10, 0.25, 0)])
    def test_equals_permutation_logic(self, n, frac, seed):
        n_b = int(np.round(frac * n))
        perm = np.random.RandomState(seed).permutation(n)
        a, b = cole_split(n, frac, seed)
        np.testing.assert_array_equal(a, np.sort(perm[:n - n_b]))
        np.testing.assert_array_equal(b, np.sort(perm[-n_b:]))
        assert np.intersect1d(a, b).size == 0
        np.testing.assert_array_equal(np.sort(np.r_[a, b]), np.arange(n))

    def test_default_seed(self):
        a1, b1 = cole_split(500, 0.2)
        a2, b2 = cole_split(500, 0.2, 1200)
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(b1, b2)

    @pytest.mark.parametrize("frac", [0.0, 1.0, -0.1, 1.5])
    def test_bad_fraction(self, frac):
        with pytest.raises(ValueError, match="fraction"):
            cole_split(10, frac)

    def test_yeast_load_splits(self):
        pytest.importorskip("river")
        from spmlkit.loading import load_splits

        s = load_splits("yeast")
        assert (len(s.train), len(s.val), len(s.test)) == (1354, 338, 725)
        assert s.observed.shape == (1354, 14)
        assert np.all((s.observed == POSITIVE).sum(1) == np.minimum(s.train.y.sum(1), 1))


def _toy_dataset(n=50, L=6, shipped=True):
    y = _random_full(n=n, L=L, seed=8, rate=0.4)
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    pool = LabelledSet(x, y)
    test = LabelledSet(x[:10].copy(), y[:10].copy())
    observed = None
    if shipped:
        # something the sampler would not draw: the LAST positive of every row
        observed = np.zeros_like(y, dtype=np.int8)
        for i, row in enumerate(y):
            pos = np.flatnonzero(row)
            if pos.size:
                observed[i, pos[-1]] = POSITIVE
    return Dataset("toy", pool, test, pool_observed=observed)


class TestMakeSplits:
    def test_shipped_observed_used_for_official_1p(self):
        ds = _toy_dataset()
        s = make_splits(ds, "1p", seed=OFFICIAL_SEED)
        tr, va = cole_split(50, 0.2, OFFICIAL_SEED)
        np.testing.assert_array_equal(s.observed, ds.pool_observed[tr])
        np.testing.assert_array_equal(s.val_observed, ds.pool_observed[va])
        np.testing.assert_array_equal(s.train.y, ds.pool.y[tr])
        np.testing.assert_array_equal(s.val.y, ds.pool.y[va])
        assert s.meta["train_rows"] == tr.tolist() and s.meta["val_rows"] == va.tolist()
        assert s.k == pytest.approx(ds.pool.y[tr].sum(1).mean())
        # the shipped matrix really differs from a fresh draw, so the check above means something
        assert not np.array_equal(ds.pool_observed, make_observed(ds.pool.y, "1p", 1200))

    def test_shipped_ignored_for_other_seed(self):
        ds = _toy_dataset()
        s = make_splits(ds, "1p", seed=5)
        tr, _ = cole_split(50, 0.2, OFFICIAL_SEED)
        np.testing.assert_array_equal(s.observed, make_observed(ds.pool.y, "1p", 5)[tr])

    @pytest.mark.parametrize("regime", ["1p_1n", "1p_alln", "full", "mlml:0.3"])
    def test_shipped_ignored_for_other_regimes(self, regime):
        ds = _toy_dataset()
        s = make_splits(ds, regime, seed=OFFICIAL_SEED)
        tr, va = cole_split(50, 0.2, OFFICIAL_SEED)
        z = make_observed(ds.pool.y, regime, OFFICIAL_SEED)
        np.testing.assert_array_equal(s.observed, z[tr])
        np.testing.assert_array_equal(s.val_observed, z[va])
        assert s.regime == regime

    def test_without_shipped_draws_official(self):
        ds = _toy_dataset(shipped=False)
        s = make_splits(ds, "1p")
        tr, _ = cole_split(50, 0.2, OFFICIAL_SEED)
        np.testing.assert_array_equal(s.observed, make_observed(ds.pool.y, "1p", 1200)[tr])

    def test_split_seed(self):
        ds = _toy_dataset(shipped=False)
        s = make_splits(ds, "1p", split_seed=3)
        tr, _ = cole_split(50, 0.2, 3)
        np.testing.assert_array_equal(s.train.y, ds.pool.y[tr])

    def test_shipped_wrong_shape_raises(self):
        ds = _toy_dataset()
        ds.pool_observed = ds.pool_observed[:, :-1]
        with pytest.raises(ValueError, match=r"\(50, 5\).*\(50, 6\)"):
            make_splits(ds, "1p")

    def test_shipped_invalid_values_raise(self):
        ds = _toy_dataset()
        ds.pool_observed = ds.pool_observed.copy()
        ds.pool_observed[4, 0] = 3
        with pytest.raises(ValueError, match=r"row 4"):
            make_splits(ds, "1p")


def test_observed_counts_tell_rows_without_a_positive_from_rows_without_any_label():
    """A row with only negatives has no positive but is labelled; a row of zeros is neither
    (the counts the protocol reports for a ``given`` or ``1p_1n`` train split)."""
    from spmlkit.labels import observed_counts

    counts = observed_counts([[0, 0, -1], [0, 0, 0], [1, -1, 0], [-1, -1, -1]])
    assert counts == {"rows": 4, "positives": 1, "negatives": 5, "unobserved": 6,
                      "rows_without_positive": 3, "rows_without_label": 1}


def test_val_variant_observed_scores_val_on_the_drawn_labels(tmp_path, capsys):
    """``val_variant="observed"`` (Cole et al.'s ``val_set_variant 'observed'``): the val rows
    keep their features and get the regime's observed labels as 0 / 1 (unobserved counted as
    negatives); train, test and the draw are those of the default run; a val set with labels
    of its own refuses it; ``spml train --data val_variant=observed`` selects on them and says
    so."""
    from spmlkit.cli import main
    from spmlkit.loading import load_splits

    full = load_splits("yeast")
    obs = load_splits("yeast", val_variant="observed")
    assert np.array_equal(obs.val.y, (full.val_observed == POSITIVE).astype(np.uint8))
    assert obs.val.y.sum(axis=1).tolist() == [1] * len(obs.val)  # one positive a row (1p)
    assert np.array_equal(obs.val.x, full.val.x) and np.array_equal(obs.test.y, full.test.y)
    assert np.array_equal(obs.observed, full.observed) and obs.meta["val_variant"] == "observed"
    with pytest.raises(ValueError, match="val_variant must be one of"):
        load_splits("yeast", val_variant="clean")
    y = np.eye(3, dtype=np.uint8)[np.arange(30) % 3]
    part = LabelledSet(np.zeros((30, 2), np.float32), y)
    with pytest.raises(ValueError, match="this val set is given apart with its own labels"):
        make_splits(Dataset("d", part, part, val=part), val_variant="observed")

    assert main(["train", "--dataset", "yeast", "--loss", "an", "--epochs", "2",
                 "--data", "val_variant=observed", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "val (338 rows split from the training rows) scored on its observed labels " \
           "(unobserved as negatives); test (725 rows) fully labelled" in out


def test_no_source_option_shares_a_protocol_options_name():
    """A protocol option (`PROTOCOL_OPTIONS`, taken by every source) never shadows a source's
    own option of the same name (``val_labels`` is the csv / arrays sources' val label file)."""
    from spmlkit.data import DATASETS, PROTOCOL_OPTIONS, source_parameters

    for entry in DATASETS.entries():
        assert not set(source_parameters(entry.name)) & set(PROTOCOL_OPTIONS), entry.name
