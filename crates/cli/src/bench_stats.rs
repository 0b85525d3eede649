//! The statistics of `hugelab bench`: a summary of one setting's runs (the
//! rows of an mmtests table: Amean, Stddev, CoeffVar, Min, Max), Welch's
//! t-test of a setting against the baseline, and the confidence interval of a
//! mean for the plot.
//!
//! Welch's test rather than Student's: the settings under test change the
//! spread of the runs as well as their mean (a huge-page setting can make
//! faults rarer but each one slower), so equal variances cannot be assumed.

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// The significance level of the tables' `*`: a two-sided test at 95%.
pub const ALPHA: f64 = 0.05;

/// One setting's measured values of one metric.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    /// Arithmetic mean (mmtests' Amean).
    pub mean: f64,
    /// Sample standard deviation (n - 1 in the denominator); NaN for one
    /// value, from which no spread can be estimated.
    pub stddev: f64,
    /// 100 * stddev / mean, in %; NaN with the stddev, or when the mean is
    /// 0.
    pub coeff_var: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// The summary of `xs`; None for no values.
    pub fn of(xs: &[f64]) -> Option<Summary> {
        if xs.is_empty() {
            return None;
        }
        let (mean, var) = mean_var(xs);
        let stddev = var.sqrt();
        let coeff_var = if mean == 0.0 {
            f64::NAN
        } else {
            100.0 * stddev / mean
        };
        Some(Summary {
            n: xs.len(),
            mean,
            stddev,
            coeff_var,
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }

    /// Half the width of the two-sided `level` (e.g. 0.95) confidence
    /// interval of the mean: t_{(1+level)/2, n-1} * stddev / sqrt(n). None
    /// for fewer than two values.
    pub fn confidence_half_width(&self, level: f64) -> Option<f64> {
        if self.n < 2 {
            return None;
        }
        let t = StudentsT::new(0.0, 1.0, (self.n - 1) as f64).ok()?;
        Some(t.inverse_cdf((1.0 + level) / 2.0) * self.stddev / (self.n as f64).sqrt())
    }
}

/// Mean and sample variance (NaN for one value). Two passes: the one-pass
/// sum of squares loses the variance of large values with small spread
/// (peak kB), which is what a bench measures.
fn mean_var(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, f64::NAN);
    }
    let ss: f64 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
    (mean, ss / (n - 1.0))
}

fn constant(xs: &[f64]) -> bool {
    xs.iter().all(|&x| x == xs[0])
}

/// Welch's unequal-variances t-test of `a` against `b`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Welch {
    /// (mean(a) - mean(b)) / sqrt(var(a)/n_a + var(b)/n_b): positive when
    /// `a`'s mean is the larger.
    pub t: f64,
    /// Degrees of freedom by the Welch–Satterthwaite formula.
    pub df: f64,
    /// Two-sided p-value.
    pub p: f64,
}

/// Welch's t-test of `a` against `b`. None when it cannot be made: fewer
/// than two values on a side (no variance to estimate), or both sides
/// constant (zero standard error: t would be 0/0 or infinite).
pub fn welch(a: &[f64], b: &[f64]) -> Option<Welch> {
    if a.len() < 2 || b.len() < 2 || (constant(a) && constant(b)) {
        return None;
    }
    let (ma, va) = mean_var(a);
    let (mb, vb) = mean_var(b);
    let sa = va / a.len() as f64;
    let sb = vb / b.len() as f64;
    let se2 = sa + sb;
    // Written to be false for NaN too (a NaN among the values).
    if se2.is_nan() || se2 <= 0.0 {
        return None;
    }
    let t = (ma - mb) / se2.sqrt();
    let df = se2 * se2 / (sa * sa / (a.len() - 1) as f64 + sb * sb / (b.len() - 1) as f64);
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    // The lower tail, doubled: 1 - cdf(|t|) would round small p to 0.
    let p = (2.0 * dist.cdf(-t.abs())).min(1.0);
    Some(Welch { t, df, p })
}

/// Whether `a` and `b` differ at level `alpha` (p < alpha; [`ALPHA`] for the
/// tables' 95%).
///
/// When Welch's test cannot be made ([`welch`] is None):
/// - fewer than two values on a side: not significant, nothing is known of
///   that side's spread;
/// - both sides constant and equal (e.g. no major fault under either
///   setting): not significant;
/// - both sides constant and different (e.g. a THP counter that is 0 under
///   the baseline and 512 in every run of the setting): significant. Every
///   run agreed, so the difference is not noise; it is the limit of Welch's
///   t as both variances go to 0 (|t| → ∞, p → 0).
pub fn significant(a: &[f64], b: &[f64], alpha: f64) -> bool {
    match welch(a, b) {
        Some(w) => w.p < alpha,
        None => a.len() >= 2 && b.len() >= 2 && constant(a) && constant(b) && a[0] != b[0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(x: f64, want: f64, tol: f64) {
        assert!((x - want).abs() <= tol, "{x} is not {want} ± {tol}");
    }

    #[test]
    fn summary_by_hand() {
        // a = [1, 2, 3, 4]: mean 10/4 = 2.5; squared deviations 2.25, 0.25,
        // 0.25, 2.25 sum to 5, sample variance 5/3, stddev sqrt(5/3) =
        // 1.2909944; CoeffVar 100 * 1.2909944 / 2.5 = 51.639778%.
        let s = Summary::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(s.n, 4);
        close(s.mean, 2.5, 1e-12);
        close(s.stddev, 1.2909944487358056, 1e-12);
        close(s.coeff_var, 51.63977794943222, 1e-10);
        assert_eq!((s.min, s.max), (1.0, 4.0));
        // b = [2, 4, 6, 8, 10] (unordered): mean 6; deviations² 16, 4, 0, 4,
        // 16 sum to 40, variance 40/4 = 10, stddev 3.1622777.
        let s = Summary::of(&[8.0, 2.0, 10.0, 4.0, 6.0]).unwrap();
        close(s.mean, 6.0, 1e-12);
        close(s.stddev, 10f64.sqrt(), 1e-12);
        assert_eq!((s.min, s.max), (2.0, 10.0));
    }

    #[test]
    fn summary_of_one_or_no_value() {
        assert_eq!(Summary::of(&[]), None);
        let s = Summary::of(&[7.0]).unwrap();
        assert_eq!((s.n, s.mean, s.min, s.max), (1, 7.0, 7.0, 7.0));
        assert!(s.stddev.is_nan() && s.coeff_var.is_nan());
        assert_eq!(s.confidence_half_width(0.95), None);
        assert!(Summary::of(&[0.0, 0.0]).unwrap().coeff_var.is_nan());
    }

    #[test]
    fn large_values_with_small_spread_keep_their_variance() {
        // 1e9 + [1, 2, 3]: variance 1 exactly, whatever the offset.
        let s = Summary::of(&[1e9 + 1.0, 1e9 + 2.0, 1e9 + 3.0]).unwrap();
        close(s.stddev, 1.0, 1e-9);
    }

    #[test]
    fn confidence_interval_by_hand() {
        // a = [1, 2, 3, 4]: t_{0.975, 3} = 3.1824463 (t-table; scipy
        // stats.t.ppf(0.975, 3) = 3.1824463052837078), s/sqrt(n) =
        // 1.2909944/2 = 0.6454972, half width 2.0542603 (scipy
        // stats.t.interval(0.95, 3, loc=2.5, scale=0.6454972) =
        // (0.4457397, 4.5542603)).
        let s = Summary::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        close(
            s.confidence_half_width(0.95).unwrap(),
            2.054260256760521,
            1e-7,
        );
    }

    #[test]
    fn welch_by_hand() {
        // a = [1, 2, 3, 4]: mean 2.5, var 5/3, n 4; b = [2, 4, 6, 8, 10]:
        // mean 6, var 10, n 5.
        // var/n: 5/12 = 0.4166667 and 10/5 = 2; se² = 2.4166667, se =
        // 1.5545632.
        // t = (2.5 - 6) / 1.5545632 = -2.2514363.
        // df = se⁴ / ((5/12)²/3 + 2²/4) = 5.8402778 / (0.0578704 + 1)
        //    = 5.5207877.
        // p: two-sided, t distribution with 5.52 df at |t| = 2.2514: a
        // t-table puts it between 0.05 (t = 2.447 at 6 df) and 0.10 (1.943);
        // scipy stats.ttest_ind(a, b, equal_var=False) gives
        // t = -2.2514363231593695, df = 5.520787746170677,
        // p = 0.06913359319239237.
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [2.0, 4.0, 6.0, 8.0, 10.0];
        let w = welch(&a, &b).unwrap();
        close(w.t, -2.2514363231593695, 1e-9);
        close(w.df, 5.520787746170677, 1e-9);
        close(w.p, 0.06913359319239237, 1e-7);
        // Symmetric: the sign of t follows the order, p does not.
        let r = welch(&b, &a).unwrap();
        close(r.t, 2.2514363231593695, 1e-9);
        close(r.p, w.p, 1e-12);
        assert!(!significant(&a, &b, ALPHA));
        assert!(significant(&a, &b, 0.10));
    }

    #[test]
    fn welch_with_one_constant_side() {
        // a = [5, 5, 5]: mean 5, var 0; b = [1, 2, 3]: mean 2, var 1.
        // se² = 0/3 + 1/3, t = 3 / sqrt(1/3) = 5.1961524; df = (1/3)² /
        // (0 + (1/3)²/2) = 2, b's n - 1. p: scipy ttest_ind(a, b,
        // equal_var=False) = 0.03509871864598465 (t-table, 2 df: t = 4.303
        // at 0.05, 9.925 at 0.01).
        let w = welch(&[5.0, 5.0, 5.0], &[1.0, 2.0, 3.0]).unwrap();
        close(w.t, 5.196152422706632, 1e-9);
        close(w.df, 2.0, 1e-12);
        close(w.p, 0.03509871864598465, 1e-7);
        assert!(significant(&[5.0, 5.0, 5.0], &[1.0, 2.0, 3.0], ALPHA));
    }

    #[test]
    fn impossible_tests() {
        // One value on a side: no variance there.
        assert_eq!(welch(&[1.0], &[2.0, 3.0]), None);
        assert!(!significant(&[1.0], &[5.0, 6.0, 7.0], ALPHA));
        assert!(!significant(&[], &[5.0, 6.0], ALPHA));
        // Both constant: equal is not significant, different is (see
        // `significant`).
        assert_eq!(welch(&[3.0, 3.0], &[3.0, 3.0, 3.0]), None);
        assert!(!significant(&[3.0, 3.0], &[3.0, 3.0, 3.0], ALPHA));
        assert_eq!(welch(&[0.0, 0.0], &[512.0, 512.0]), None);
        assert!(significant(&[0.0, 0.0], &[512.0, 512.0], ALPHA));
        // ... but not from a single run each.
        assert!(!significant(&[0.0], &[512.0], ALPHA));
        // A NaN value makes no test.
        assert_eq!(welch(&[1.0, f64::NAN], &[1.0, 2.0]), None);
        assert!(!significant(&[1.0, f64::NAN], &[1.0, 2.0], ALPHA));
    }
}
