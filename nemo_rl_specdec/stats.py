"""Statistical checks that speculation did not change what the policy samples.

- `two_sample_chi2`: homogeneity of two samples of categorical outcomes (e.g. the joint of the
  first generated tokens with and without speculation), rare categories pooled.
- `pooled_chi2`: several independent tables (one per prompt) combined by summing statistics
  and degrees of freedom.
- `reward_comparison`: Welch's t-test on two reward samples (spec vs baseline RL runs).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence


def two_sample_chi2(a: Iterable[Hashable], b: Iterable[Hashable], min_expected: float = 5.0):
    """(statistic, dof) of a 2 x C contingency table; categories whose pooled expected count is
    below `min_expected` in either row are merged into one 'other' column."""
    ca, cb = Counter(a), Counter(b)
    na, nb = sum(ca.values()), sum(cb.values())
    if na == 0 or nb == 0:
        raise ValueError("both samples must be non-empty")
    cats = sorted(set(ca) | set(cb), key=repr)
    frac_a = na / (na + nb)
    keep, other_a, other_b = [], 0, 0
    for c in cats:
        tot = ca[c] + cb[c]
        if min(tot * frac_a, tot * (1 - frac_a)) >= min_expected:
            keep.append((ca[c], cb[c]))
        else:
            other_a, other_b = other_a + ca[c], other_b + cb[c]
    if other_a + other_b > 0:
        keep.append((other_a, other_b))
    stat = 0.0
    for xa, xb in keep:
        tot = xa + xb
        ea, eb = tot * frac_a, tot * (1 - frac_a)
        stat += (xa - ea) ** 2 / ea + (xb - eb) ** 2 / eb
    return stat, max(len(keep) - 1, 0)


def pooled_chi2(tables: Sequence[tuple[Iterable[Hashable], Iterable[Hashable]]], min_expected: float = 5.0) -> dict:
    """Sum of per-table chi-square statistics and dofs -> p-value (independent tables)."""
    from scipy.stats import chi2

    stat, dof = 0.0, 0
    for a, b in tables:
        s, d = two_sample_chi2(a, b, min_expected)
        stat, dof = stat + s, dof + d
    p = float(chi2.sf(stat, dof)) if dof > 0 else 1.0
    return {"statistic": stat, "dof": dof, "p_value": p}


def reward_comparison(spec: Sequence[float], baseline: Sequence[float]) -> dict:
    """Welch's t-test: do mean rewards differ between the speculative and baseline runs?"""
    from scipy.stats import ttest_ind

    spec, baseline = [float(x) for x in spec], [float(x) for x in baseline]
    ms, mb = sum(spec) / len(spec), sum(baseline) / len(baseline)
    if len(set(spec)) <= 1 and len(set(baseline)) <= 1:  # no variance: the t-test is undefined
        return {"mean_spec": ms, "mean_baseline": mb, "t": 0.0 if ms == mb else float("inf"),
                "p_value": 1.0 if ms == mb else 0.0}
    res = ttest_ind(spec, baseline, equal_var=False)
    return {"mean_spec": ms, "mean_baseline": mb, "t": float(res.statistic), "p_value": float(res.pvalue)}
