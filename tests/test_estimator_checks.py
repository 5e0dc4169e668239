"""scikit-learn's own estimator checks on SPMLClassifier (every check of the installed
scikit-learn; those that cannot apply to partial labels are declared, with their reason, by
spmlkit.estimator.expected_failed_checks and must fail: xfail_strict)."""
from sklearn.utils.estimator_checks import parametrize_with_checks

from spmlkit.estimator import SPMLClassifier, expected_failed_checks

# few epochs and larger batches keep the ~60 checks fast; every code path is the default one
CHECKED = SPMLClassifier(epochs=3, batch_size=16, lr=1e-2)


@parametrize_with_checks([CHECKED], expected_failed_checks=expected_failed_checks,
                         xfail_strict=True)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def test_the_array_api_check_skipped_above_passes_with_scipy_array_api():
    """scikit-learn skips check_array_api_input unless SCIPY_ARRAY_API=1 was set before scipy
    was imported: run it in a fresh interpreter with it set."""
    import os
    import subprocess
    import sys

    code = ("from sklearn.utils.estimator_checks import check_array_api_input\n"
            "from spmlkit.estimator import SPMLClassifier\n"
            "check_array_api_input('SPMLClassifier', SPMLClassifier(epochs=3, batch_size=16, "
            "lr=1e-2), array_namespace='numpy', expect_only_array_outputs=False)\n"
            "print('passed')\n")
    env = {**os.environ, "SCIPY_ARRAY_API": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("passed"), out.stderr[-2000:]
