//! A short-horizon forecast of a pool's arrival rate from what was observed: Holt's linear
//! trend (double exponential smoothing) on one rate observation per step, turned into
//! additive Holt-Winters with a daily season once a full day has been observed. Its error is
//! measured as it goes: each step's forecast for `error_horizon_steps` ahead is kept and
//! compared with the rate then observed.
//!
//! Why this method (docs/autoscaling.md): autoscaling needs the next few minutes (a pod's
//! warm-up, 100 s to over 2 min), where the level and its trend carry most of the signal and
//! cost O(1) per step; LLM traffic's strongest cycle is the day, which a trend alone
//! mistakes for a ramp at every turn of the curve, so the daily season is added as soon as
//! there is a day to learn it from. Pure: the caller supplies the observations and the step.

use std::collections::VecDeque;

/// How a forecaster smooths and measures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadForecastSettings {
    /// Seconds between observations.
    pub step_s: f64,
    /// Level smoothing, in (0, 1].
    pub alpha: f64,
    /// Trend smoothing, in [0, 1].
    pub beta: f64,
    /// Season smoothing, in [0, 1].
    pub gamma: f64,
    /// Observations per season (a day); 0 turns seasonality off.
    pub season_steps: usize,
    /// The error is measured on forecasts this many steps ahead (at least 1).
    pub error_horizon_steps: usize,
    /// Errors kept for the mean error.
    pub error_window: usize,
}

/// The longest season kept (a day at a step under ~4.3 s would exceed it: seasonality off).
pub const SEASON_STEPS_MAX: usize = 20_000;

impl LoadForecastSettings {
    /// Defaults for one observation every `step_s` seconds: alpha 0.5, beta 0.1, gamma
    /// 0.2, a daily season when a day fits [`SEASON_STEPS_MAX`], the error measured on
    /// forecasts 120 s ahead (at least one step) over the last 360 of them.
    pub fn for_step(step_s: f64) -> Self {
        let step_s = if step_s.is_finite() && step_s > 0.0 {
            step_s
        } else {
            10.0
        };
        let day = (86_400.0 / step_s).round();
        let season_steps = if day >= 2.0 && day <= SEASON_STEPS_MAX as f64 {
            day as usize
        } else {
            0
        };
        Self {
            step_s,
            alpha: 0.5,
            beta: 0.1,
            gamma: 0.2,
            season_steps,
            error_horizon_steps: ((120.0 / step_s).round() as usize).max(1),
            error_window: 360,
        }
    }
}

/// The forecast's measured error over the recent window.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct ForecastError {
    /// Forecasts compared with what was then observed.
    pub samples: usize,
    /// The last one's error, forecast minus observed (requests per second).
    pub last: f64,
    /// Mean absolute error (requests per second).
    pub mean_abs: f64,
    /// Sum of absolute errors over the sum of observed rates (0 when nothing was observed).
    pub relative: f64,
}

/// One pool's arrival-rate forecaster.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadForecaster {
    settings: LoadForecastSettings,
    observed: u64,
    last: f64,
    level: f64,
    trend: f64,
    /// Season offsets by step within the day (empty until a day has been observed).
    season: Vec<f64>,
    /// The first day's observations, to start the season from.
    first_day: Vec<f64>,
    /// (observation index due, forecast) for the error.
    pending: VecDeque<(u64, f64)>,
    /// (absolute error, observed) of the last forecasts compared.
    errors: VecDeque<(f64, f64)>,
    last_error: f64,
}

impl LoadForecaster {
    /// A forecaster that has observed nothing.
    pub fn new(settings: LoadForecastSettings) -> Self {
        Self {
            settings,
            observed: 0,
            last: 0.0,
            level: 0.0,
            trend: 0.0,
            season: Vec::new(),
            first_day: Vec::new(),
            pending: VecDeque::new(),
            errors: VecDeque::new(),
            last_error: 0.0,
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &LoadForecastSettings {
        &self.settings
    }

    /// Observations so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// The last observed rate.
    pub fn last_observed(&self) -> f64 {
        self.last
    }

    /// Whether the daily season is in use.
    pub fn seasonal(&self) -> bool {
        !self.season.is_empty()
    }

    /// Takes the rate observed over the step just ended (requests per second; a negative or
    /// non-finite value counts as 0).
    pub fn observe(&mut self, rate: f64) {
        let y = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        let index = self.observed;
        while let Some(&(due, predicted)) = self.pending.front() {
            if due > index {
                break;
            }
            self.pending.pop_front();
            if due == index {
                self.record_error(predicted - y, y);
            }
        }
        let m = self.settings.season_steps;
        if index == 0 {
            self.level = y;
            self.trend = 0.0;
        } else if self.season.is_empty() {
            let previous = self.level;
            self.level =
                self.settings.alpha * y + (1.0 - self.settings.alpha) * (previous + self.trend);
            self.trend = self.settings.beta * (self.level - previous)
                + (1.0 - self.settings.beta) * self.trend;
        } else {
            let slot = (index % m as u64) as usize;
            let offset = self.season[slot];
            let previous = self.level;
            self.level = self.settings.alpha * (y - offset)
                + (1.0 - self.settings.alpha) * (previous + self.trend);
            self.trend = self.settings.beta * (self.level - previous)
                + (1.0 - self.settings.beta) * self.trend;
            self.season[slot] =
                self.settings.gamma * (y - self.level) + (1.0 - self.settings.gamma) * offset;
        }
        self.last = y;
        self.observed += 1;
        if m > 0 && self.season.is_empty() {
            self.first_day.push(y);
            if self.first_day.len() == m {
                self.start_season();
            }
        }
        let ahead = self.settings.error_horizon_steps.max(1);
        let predicted = self.forecast_steps(ahead as f64);
        self.pending
            .push_back((self.observed - 1 + ahead as u64, predicted));
    }

    /// The season from the first day: each step's offset from the day's mean; the level
    /// restarts at the last hour's deseasonalised mean, the trend at 0.
    fn start_season(&mut self) {
        let m = self.first_day.len();
        let mean = self.first_day.iter().sum::<f64>() / m as f64;
        self.season = self.first_day.iter().map(|&y| y - mean).collect();
        let hour = ((3_600.0 / self.settings.step_s).round() as usize).clamp(1, m);
        let recent = &self.first_day[m - hour..];
        let offsets = &self.season[m - hour..];
        self.level = recent.iter().zip(offsets).map(|(y, s)| y - s).sum::<f64>() / hour as f64;
        self.trend = 0.0;
        self.first_day = Vec::new();
    }

    fn record_error(&mut self, error: f64, observed: f64) {
        self.last_error = error;
        self.errors.push_back((error.abs(), observed));
        while self.errors.len() > self.settings.error_window.max(1) {
            self.errors.pop_front();
        }
    }

    /// The forecast rate `steps` observations after the last one (0 before any; never
    /// negative).
    pub fn forecast_steps(&self, steps: f64) -> f64 {
        if self.observed == 0 {
            return 0.0;
        }
        let steps = if steps.is_finite() {
            steps.max(0.0)
        } else {
            0.0
        };
        let mut value = self.level + steps * self.trend;
        if !self.season.is_empty() {
            let m = self.season.len() as u64;
            let at = self.observed - 1 + steps.round() as u64;
            value += self.season[(at % m) as usize];
        }
        value.max(0.0)
    }

    /// The forecast rate `seconds` after the last observation.
    pub fn forecast_at(&self, seconds: f64) -> f64 {
        self.forecast_steps(seconds / self.settings.step_s)
    }

    /// The horizon cut into `pieces` equal stages of (rate, seconds), each at the forecast
    /// for its end (the busier end while the trend rises, so a ramp is met, not trailed),
    /// or its start when that is higher.
    pub fn stages(&self, horizon_s: f64, pieces: usize) -> Vec<(f64, f64)> {
        let pieces = pieces.max(1);
        let length = horizon_s.max(0.0) / pieces as f64;
        (0..pieces)
            .map(|piece| {
                let start = self.forecast_at(length * piece as f64);
                let end = self.forecast_at(length * (piece + 1) as f64);
                (start.max(end), length)
            })
            .collect()
    }

    /// The highest forecast rate within `horizon_s` (sampled per step, at most 1,000 points).
    pub fn peak_within(&self, horizon_s: f64) -> f64 {
        let steps = (horizon_s.max(0.0) / self.settings.step_s)
            .ceil()
            .min(1_000.0) as usize;
        (0..=steps)
            .map(|step| self.forecast_steps(step as f64))
            .fold(0.0, f64::max)
    }

    /// The measured error so far.
    pub fn error(&self) -> ForecastError {
        let samples = self.errors.len();
        if samples == 0 {
            return ForecastError::default();
        }
        let abs: f64 = self.errors.iter().map(|&(e, _)| e).sum();
        let observed: f64 = self.errors.iter().map(|&(_, y)| y).sum();
        ForecastError {
            samples,
            last: self.last_error,
            mean_abs: abs / samples as f64,
            relative: if observed > 0.0 { abs / observed } else { 0.0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic noise in [-1, 1] (xorshift), so the traces are the same on every run.
    struct Noise(u64);

    impl Noise {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            crate::sim::rng::unit_from_bits(self.0) * 2.0 - 1.0
        }
    }

    /// A rate with Poisson-sized noise: counts over a step have sd sqrt(rate * step).
    fn noisy(rate: f64, step_s: f64, noise: &mut Noise) -> f64 {
        let sd = (rate / step_s).sqrt();
        (rate + sd * noise.next() * 3f64.sqrt()).max(0.0)
    }

    #[test]
    fn a_linear_ramp_is_followed_with_a_small_error() {
        let settings = LoadForecastSettings::for_step(10.0);
        let mut forecaster = LoadForecaster::new(settings);
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        // 5 -> 95 req/s over 30 minutes (180 steps of 10 s), then flat for 10 minutes.
        let rate = |step: usize| 5.0 + 0.5 * step.min(180) as f64;
        for step in 0..240 {
            forecaster.observe(noisy(rate(step), 10.0, &mut noise));
        }
        let error = forecaster.error();
        assert!(error.samples > 200, "{error:?}");
        // Forecasts 120 s ahead against the noisy rates then observed.
        assert!(error.relative < 0.08, "{error:?}");
        assert!(!forecaster.seasonal());
        // On the flat end, the forecast stays at the level (the trend has decayed).
        let ahead = forecaster.forecast_at(120.0);
        assert!((ahead - 95.0).abs() < 8.0, "{ahead}");
    }

    #[test]
    fn the_trend_anticipates_a_ramp_a_level_alone_would_trail() {
        let mut forecaster = LoadForecaster::new(LoadForecastSettings::for_step(10.0));
        for step in 0..60 {
            forecaster.observe(10.0 + step as f64);
        }
        // The rate rises 0.1 req/s per second: 2 minutes ahead is 12 req/s above the last.
        let ahead = forecaster.forecast_at(120.0);
        assert!((ahead - (69.0 + 12.0)).abs() < 1.5, "{ahead}");
        let stages = forecaster.stages(120.0, 4);
        assert_eq!(stages.len(), 4);
        assert!(stages.windows(2).all(|w| w[1].0 > w[0].0), "{stages:?}");
        assert!((stages.iter().map(|s| s.1).sum::<f64>() - 120.0).abs() < 1e-9);
        assert!((forecaster.peak_within(120.0) - ahead).abs() < 1e-9);
    }

    #[test]
    fn a_daily_cycle_is_learnt_after_a_day_and_beats_the_trend_alone() {
        // 5-minute steps: 288 a day; a diurnal curve between 5 and 45 req/s over three days.
        let step_s = 300.0;
        let seasonal = LoadForecastSettings::for_step(step_s);
        assert_eq!(seasonal.season_steps, 288);
        let seasonal = LoadForecastSettings {
            error_horizon_steps: 6,
            error_window: 288,
            ..seasonal
        };
        let plain = LoadForecastSettings {
            season_steps: 0,
            ..seasonal
        };
        let rate = |step: usize| {
            let phase = (step % 288) as f64 / 288.0 * std::f64::consts::TAU;
            25.0 - 20.0 * phase.cos()
        };
        let mut with_season = LoadForecaster::new(seasonal);
        let mut without = LoadForecaster::new(plain);
        let mut noise = Noise(7);
        for step in 0..288 * 3 {
            let observed = noisy(rate(step), step_s, &mut noise);
            with_season.observe(observed);
            without.observe(observed);
        }
        assert!(with_season.seasonal());
        let (a, b) = (with_season.error(), without.error());
        // Over the third day, 30 minutes ahead.
        assert!(a.relative < 0.05, "seasonal {a:?}");
        assert!(
            a.relative < b.relative,
            "seasonal {a:?} vs trend only {b:?}"
        );
    }

    #[test]
    fn nothing_observed_forecasts_nothing_and_zero_stays_zero() {
        let mut forecaster = LoadForecaster::new(LoadForecastSettings::for_step(1.0));
        assert_eq!(forecaster.forecast_at(60.0), 0.0);
        assert_eq!(forecaster.error(), ForecastError::default());
        for _ in 0..10 {
            forecaster.observe(0.0);
        }
        forecaster.observe(f64::NAN);
        assert_eq!(forecaster.peak_within(300.0), 0.0);
        assert_eq!(forecaster.error().relative, 0.0);
        // A second's step: a day does not fit the season's bound, so no season.
        assert_eq!(forecaster.settings().season_steps, 0);
    }

    #[test]
    fn a_drop_to_zero_is_never_forecast_below_zero() {
        let mut forecaster = LoadForecaster::new(LoadForecastSettings::for_step(10.0));
        for rate in [50.0, 40.0, 30.0, 20.0, 10.0, 0.0, 0.0] {
            forecaster.observe(rate);
        }
        assert!(forecaster.forecast_at(600.0) >= 0.0);
        assert_eq!(forecaster.stages(600.0, 3).last().map(|s| s.0), Some(0.0));
    }
}
