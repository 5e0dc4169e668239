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
