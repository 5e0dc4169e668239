"""scikit-learn's own estimator checks on SPMLClassifier (every check of the installed
scikit-learn; those that cannot apply to partial labels are declared, with their reason, by
spmlkit.estimator.expected_failed_checks and must fail: xfail_strict)."""
import inspect

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from spmlkit.estimator import SPMLClassifier, expected_failed_checks

# the default estimator (the solver); the Adam mode's checks below keep the ~60 checks fast with
# few epochs and larger batches
CHECKED = SPMLClassifier()
TRAINED = SPMLClassifier(solver="adam", epochs=3, batch_size=16, lr=1e-2)


def _strict_checks():
    """scikit-learn's parametrization with its expected failures strict (each must fail):
    its own ``xfail_strict`` (scikit-learn 1.8 and later), else (1.6, 1.7) the same made here
    from the xfail marks it puts on them."""
    kw = {"expected_failed_checks": expected_failed_checks}
    if "xfail_strict" in inspect.signature(parametrize_with_checks).parameters:
        return parametrize_with_checks([CHECKED, TRAINED], xfail_strict=True, **kw)
    mark = parametrize_with_checks([CHECKED, TRAINED], **kw)
    params = []
    for param in mark.args[1]:
        if hasattr(param, "marks"):  # a pytest.param: an expected failure
            marks = [pytest.mark.xfail(strict=True, **m.kwargs) if m.name == "xfail" else m
                     for m in param.marks]
            param = pytest.param(*param.values, marks=marks, id=param.id)
        params.append(param)
    return pytest.mark.parametrize(mark.args[0], params, **mark.kwargs)


@_strict_checks()
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def test_the_array_api_check_skipped_above_passes_with_scipy_array_api():
    """scikit-learn skips check_array_api_input unless SCIPY_ARRAY_API=1 was set before scipy
    was imported: run it in a fresh interpreter with it set."""
    import os
    import subprocess
    import sys

    code = ("import inspect\n"
            "from sklearn.utils.estimator_checks import check_array_api_input\n"
            "from spmlkit.estimator import SPMLClassifier\n"
            "kw = {'expect_only_array_outputs': False} if 'expect_only_array_outputs' in "
            "inspect.signature(check_array_api_input).parameters else {}  # (from 1.7)\n"
            "check_array_api_input('SPMLClassifier', SPMLClassifier(), "
            "array_namespace='numpy', **kw)\n"
            "print('passed')\n")
    env = {**os.environ, "SCIPY_ARRAY_API": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    if "No module named 'array_api_compat'" in out.stderr:  # scikit-learn 1.6 (1.7 vendors it)
        pytest.skip("scikit-learn's array API check needs array_api_compat before 1.7")
    assert out.returncode == 0 and out.stdout.strip().endswith("passed"), out.stderr[-2000:]
