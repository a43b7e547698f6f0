//! Summaries: percentiles of latency samples, min/median/max over repeats.

use serde::{Deserialize, Serialize};

/// One GiB: CPU cost is reported per GiB moved.
pub const GIB: f64 = (1u64 << 30) as f64;

/// Min, median and max of a cell's repeats.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Smallest value.
    pub min: f64,
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (`None` when empty or any value is not finite).
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }
}

/// The `q`-quantile (0..=1) of sorted samples, nearest-rank.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_quantiles() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 2.0, 3.0, 4.0]).unwrap().median, 2.5);
        assert!(Spread::of(&[]).is_none());
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(quantile(&v, 0.5), 500);
        assert_eq!(quantile(&v, 0.99), 990);
        assert_eq!(quantile(&v, 0.999), 999);
        assert_eq!(quantile(&v, 1.0), 1000);
    }
}
