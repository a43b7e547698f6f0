//! When an idle engine stops spinning: the spin-then-sleep decision, sans-IO.
//!
//! A busy-polled engine answers a request within a poll but burns a core while
//! nothing arrives. [`IdlePolicy`] keeps the latency and drops the idle cost:
//! it says *spin* while work keeps arriving and for a budget after the last
//! activity, then *sleep* (the [`Waiter`](super::Waiter) sleeps on the
//! engine's readiness until its next deadline). Time is passed in, so the
//! decision is tested with made-up instants.
//!
//! Adaptation (when `spin_min < spin_max`): each idle gap — from the last
//! activity to the next — tunes the budget for the next one:
//! - caught while spinning: the budget drifts down towards twice the gap
//!   (one eighth of the way per gap), so short request gaps keep it short;
//! - slept, but the gap was within `spin_max`: spinning a little longer would
//!   have answered at busy-poll latency, so the budget grows to cover the gap
//!   (at least doubling);
//! - slept and the gap exceeded `spin_max`: no affordable spin catches such
//!   gaps, so the budget halves (an idle engine settles at `spin_min`).

use std::time::{Duration, Instant};

/// How long an idle engine spins before it sleeps (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleConfig {
    /// The budget to start with: spin this long after the last activity.
    pub spin: Duration,
    /// The smallest budget adaptation may choose.
    pub spin_min: Duration,
    /// The largest budget adaptation may choose (equal to `spin_min`: a fixed budget).
    pub spin_max: Duration,
}

impl IdleConfig {
    /// Always spin: the pure busy-poll of a core given to the engine.
    pub const BUSY_POLL: IdleConfig = IdleConfig {
        spin: Duration::MAX,
        spin_min: Duration::MAX,
        spin_max: Duration::MAX,
    };

    /// Sleep as soon as a poll finds nothing to do.
    pub const SLEEP: IdleConfig = IdleConfig::fixed(Duration::ZERO);

    /// A fixed budget (no adaptation).
    pub const fn fixed(spin: Duration) -> IdleConfig {
        IdleConfig {
            spin,
            spin_min: spin,
            spin_max: spin,
        }
    }

    /// Adapt between `min` and `max`, starting at the middle of them.
    pub fn adaptive(min: Duration, max: Duration) -> IdleConfig {
        let (min, max) = (min.min(max), min.max(max));
        IdleConfig {
            spin: (min + max) / 2,
            spin_min: min,
            spin_max: max,
        }
    }

    /// Whether the budget adapts to the gaps seen.
    pub fn is_adaptive(&self) -> bool {
        self.spin_min < self.spin_max
    }
}

impl Default for IdleConfig {
    /// Adaptive between 25 and 200 µs, starting at 100 µs: a request within
    /// that long after the last one is met by a spinning poll; an engine idle
    /// for longer sleeps.
    fn default() -> Self {
        IdleConfig {
            spin: Duration::from_micros(100),
            spin_min: Duration::from_micros(25),
            spin_max: Duration::from_micros(200),
        }
    }
}

/// What to do after a poll (see [`IdlePolicy::after_poll`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Poll again now.
    Spin,
    /// The budget is spent: arm the engine and sleep on its readiness.
    Sleep,
}

/// The spin-then-sleep decision (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct IdlePolicy {
    cfg: IdleConfig,
    budget: Duration,
    /// When the last poll that moved something ran.
    last_activity: Option<Instant>,
    /// Some poll since then moved nothing (an idle gap is open).
    gap_open: bool,
    /// The open gap included a sleep.
    slept: bool,
}

impl IdlePolicy {
    /// A policy with `cfg` (its `spin` clamped into `spin_min..=spin_max`).
    pub fn new(cfg: IdleConfig) -> Self {
        let lo = cfg.spin_min.min(cfg.spin_max);
        IdlePolicy {
            budget: cfg.spin.clamp(lo, cfg.spin_max.max(lo)),
            cfg,
            last_activity: None,
            gap_open: false,
            slept: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> IdleConfig {
        self.cfg
    }

    /// The current spin budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// A poll ran at `now`; `busy` if it moved anything (a packet in or out,
    /// a timer, an event). Says whether to spin on or to sleep.
    pub fn after_poll(&mut self, now: Instant, busy: bool) -> Idle {
        let last = *self.last_activity.get_or_insert(now);
        if busy {
            if self.gap_open {
                self.adapt(now.saturating_duration_since(last));
            }
            self.last_activity = Some(now);
            self.gap_open = false;
            self.slept = false;
            return Idle::Spin;
        }
        self.gap_open = true;
        if now.saturating_duration_since(last) < self.budget {
            Idle::Spin
        } else {
            Idle::Sleep
        }
    }

    /// The caller is about to sleep (it decided on [`Idle::Sleep`] and the
    /// engine had nothing waiting): the open gap is one that spinning missed.
    pub fn sleeping(&mut self) {
        self.slept = true;
    }

    /// Tune the budget to an idle gap of length `gap` that just ended.
    fn adapt(&mut self, gap: Duration) {
        if !self.cfg.is_adaptive() {
            return;
        }
        let (min, max) = (self.cfg.spin_min, self.cfg.spin_max);
        let b = self.budget;
        self.budget = if !self.slept {
            let target = gap.saturating_mul(2).max(min);
            if target < b {
                b - (b - target) / 8
            } else {
                b
            }
        } else if gap <= max {
            b.saturating_mul(2).max(gap + gap / 4).min(max)
        } else {
            (b / 2).max(min)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Drive `p` through an idle gap of `gap` polled every `step`, ending with
    /// a busy poll; returns whether it asked to sleep during the gap.
    fn gap(p: &mut IdlePolicy, t: &mut Instant, gap: Duration, step: Duration) -> bool {
        let end = *t + gap;
        let mut slept = false;
        *t += step;
        while *t < end {
            if p.after_poll(*t, false) == Idle::Sleep && !slept {
                slept = true;
                p.sleeping();
            }
            *t += step;
        }
        *t = end;
        assert_eq!(p.after_poll(*t, true), Idle::Spin);
        slept
    }

    #[test]
    fn fixed_budget_spins_then_sleeps() {
        let t0 = Instant::now();
        let mut p = IdlePolicy::new(IdleConfig::fixed(50 * US));
        assert_eq!(p.after_poll(t0, true), Idle::Spin);
        assert_eq!(p.after_poll(t0 + 49 * US, false), Idle::Spin);
        assert_eq!(p.after_poll(t0 + 50 * US, false), Idle::Sleep);
        p.sleeping();
        // Work arrives: spin again, and the budget counts from the new activity.
        assert_eq!(p.after_poll(t0 + 900 * US, true), Idle::Spin);
        assert_eq!(p.after_poll(t0 + 940 * US, false), Idle::Spin);
        assert_eq!(p.after_poll(t0 + 951 * US, false), Idle::Sleep);
        assert_eq!(p.budget(), 50 * US, "a fixed budget never adapts");
    }

    #[test]
    fn busy_poll_never_sleeps_and_sleep_never_spins() {
        let t0 = Instant::now();
        let mut busy = IdlePolicy::new(IdleConfig::BUSY_POLL);
        let mut sleep = IdlePolicy::new(IdleConfig::SLEEP);
        busy.after_poll(t0, true);
        sleep.after_poll(t0, true);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(busy.after_poll(later, false), Idle::Spin);
        assert_eq!(sleep.after_poll(t0, false), Idle::Sleep);
    }

    #[test]
    fn a_fresh_policy_counts_its_budget_from_the_first_poll() {
        let t0 = Instant::now();
        let mut p = IdlePolicy::new(IdleConfig::fixed(10 * US));
        assert_eq!(p.after_poll(t0, false), Idle::Spin);
        assert_eq!(p.after_poll(t0 + 10 * US, false), Idle::Sleep);
    }

    #[test]
    fn gaps_just_beyond_the_budget_grow_it_until_they_are_caught() {
        let cfg = IdleConfig::adaptive(20 * US, 400 * US);
        let mut p = IdlePolicy::new(cfg);
        assert_eq!(p.budget(), 210 * US);
        let mut t = Instant::now();
        p.after_poll(t, true);
        // Requests every 300 µs: the first gap is slept through...
        assert!(gap(&mut p, &mut t, 300 * US, US));
        assert!(p.budget() >= 300 * US, "grown to cover: {:?}", p.budget());
        // ...and later ones are caught while spinning.
        for _ in 0..20 {
            assert!(!gap(&mut p, &mut t, 300 * US, US));
        }
        assert!(p.budget() >= 300 * US && p.budget() <= 400 * US);
    }

    #[test]
    fn long_gaps_shrink_the_budget_to_its_minimum() {
        let mut p = IdlePolicy::new(IdleConfig::adaptive(25 * US, 200 * US));
        let mut t = Instant::now();
        p.after_poll(t, true);
        for _ in 0..8 {
            assert!(gap(&mut p, &mut t, Duration::from_millis(300), 50 * US));
        }
        assert_eq!(p.budget(), 25 * US);
    }

    #[test]
    fn short_gaps_let_the_budget_drift_down_towards_twice_the_gap() {
        let mut p = IdlePolicy::new(IdleConfig::adaptive(10 * US, 200 * US));
        let mut t = Instant::now();
        p.after_poll(t, true);
        let start = p.budget();
        for _ in 0..100 {
            assert!(!gap(&mut p, &mut t, 15 * US, US));
        }
        let b = p.budget();
        assert!(b < start && b >= 30 * US && b <= 35 * US, "{b:?}");
        // Busy polls back to back open no gap and change nothing.
        for _ in 0..10 {
            t += US;
            p.after_poll(t, true);
        }
        assert_eq!(p.budget(), b);
    }
}
