//! Calibration math, pure: a bounded Nelder-Mead minimiser (the offline fit, whose loss
//! replays whole runs) and an exponentially weighted least-squares estimator (the online fit,
//! one measurement at a time in O(k²) memory, numerically safe however long it runs).
//!
//! Knows nothing about what the parameters mean or where the measurements come from.

/// Options of [`nelder_mead`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NelderMeadOptions {
    /// Most loss evaluations.
    pub evaluations_max: usize,
    /// Initial simplex step, relative to each start value (absolute when the value is 0).
    pub step: f64,
    /// Stop when the simplex's losses differ by less than this.
    pub tolerance: f64,
}

impl Default for NelderMeadOptions {
    fn default() -> Self {
        Self {
            evaluations_max: 400,
            step: 0.25,
            tolerance: 1e-7,
        }
    }
}

/// Minimises `loss` from `start` with the Nelder-Mead simplex method; returns the best
/// point and its loss. Deterministic; never evaluates more than `evaluations_max` times.
pub fn nelder_mead<F>(start: &[f64], options: NelderMeadOptions, mut loss: F) -> (Vec<f64>, f64)
where
    F: FnMut(&[f64]) -> f64,
{
    let n = start.len();
    let mut evaluations = 0usize;
    let mut eval = |x: &[f64], evaluations: &mut usize| {
        *evaluations += 1;
        let value = loss(x);
        if value.is_nan() { f64::INFINITY } else { value }
    };
    let mut simplex: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    let first = eval(start, &mut evaluations);
    simplex.push((start.to_vec(), first));
    for i in 0..n {
        let mut point = start.to_vec();
        point[i] = if point[i] == 0.0 {
            options.step
        } else {
            point[i] * (1.0 + options.step)
        };
        let value = eval(&point, &mut evaluations);
        simplex.push((point, value));
    }
    while evaluations < options.evaluations_max {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (simplex[0].1, simplex[n].1);
        if (worst - best).abs() <= options.tolerance * (1.0 + best.abs()) {
            break;
        }
        let centroid: Vec<f64> = (0..n)
            .map(|j| simplex[..n].iter().map(|p| p.0[j]).sum::<f64>() / n as f64)
            .collect();
        let toward = |t: f64| -> Vec<f64> {
            (0..n)
                .map(|j| centroid[j] + t * (simplex[n].0[j] - centroid[j]))
                .collect()
        };
        let reflected = toward(-1.0);
        let reflected_loss = eval(&reflected, &mut evaluations);
        if reflected_loss < simplex[0].1 {
            let expanded = toward(-2.0);
            let expanded_loss = eval(&expanded, &mut evaluations);
            simplex[n] = if expanded_loss < reflected_loss {
                (expanded, expanded_loss)
            } else {
                (reflected, reflected_loss)
            };
        } else if reflected_loss < simplex[n - 1].1 {
            simplex[n] = (reflected, reflected_loss);
        } else {
            let contracted = if reflected_loss < simplex[n].1 {
                toward(-0.5)
            } else {
                toward(0.5)
            };
            let contracted_loss = eval(&contracted, &mut evaluations);
            if contracted_loss < simplex[n].1.min(reflected_loss) {
                simplex[n] = (contracted, contracted_loss);
            } else {
                let best_point = simplex[0].0.clone();
                for point in simplex.iter_mut().skip(1) {
                    for (x, best) in point.0.iter_mut().zip(&best_point) {
                        *x = best + 0.5 * (*x - best);
                    }
                    point.1 = eval(&point.0, &mut evaluations);
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (point, value) = simplex.swap_remove(0);
    (point, value)
}

/// Exponentially weighted least squares with a ridge floor: fits `y ≈ θ·x` one observation
/// at a time, in O(k²) memory whatever the number of observations. With forgetting factor
/// λ < 1 old observations weigh λ^age, so the fit follows a drifting system.
///
/// It keeps the information form (`A = Σ λ^age w x xᵀ`, `b = Σ λ^age w x y`) and solves
/// `(A + F) θ = b + F θ₀` after every observation, where `F` is a constant diagonal floor
/// pulling θ toward the anchor θ₀. Why not the textbook covariance update
/// (`P = (P − g xᵀ P) / λ`): under forgetting, `P` grows as λ^-n along any direction the
/// inputs do not excite, and its subtraction loses positive definiteness to rounding; after
/// ~17,000 samples at λ = 0.999 the estimate jumped to nonsense and never recovered. Here `A`
/// only ever adds positive semi-definite terms and shrinks by λ, so it stays bounded
/// (by `max w xxᵀ / (1 − λ)`), and the floor keeps the solve well posed where `A` is singular
/// (one input value repeated: the fit is then exact there and the anchor picks the rest).
#[derive(Clone, Debug, PartialEq)]
pub struct ForgettingLeastSquares {
    theta: Vec<f64>,
    /// `Σ λ^age w x xᵀ` plus the decaying prior, row-major k×k.
    information: Vec<f64>,
    /// `Σ λ^age w x y` plus the decaying prior's pull.
    moment: Vec<f64>,
    /// The constant diagonal of `F`.
    floor: Vec<f64>,
    /// θ₀, where the floor pulls.
    anchor: Vec<f64>,
    lambda: f64,
    observations: u64,
}

impl ForgettingLeastSquares {
    /// Starts at `anchor` with a decaying diagonal prior of precision `prior` (as if that much
    /// information had been seen at the anchor; forgotten like observations), a constant
    /// diagonal floor `floor` toward the anchor (every entry > 0), and forgetting factor
    /// `lambda` in (0, 1]. All three slices have the length k of θ.
    pub fn new(anchor: &[f64], prior: &[f64], floor: &[f64], lambda: f64) -> Self {
        let k = anchor.len();
        let mut information = vec![0.0; k * k];
        let mut moment = vec![0.0; k];
        for i in 0..k {
            let precision = prior.get(i).copied().unwrap_or(0.0).max(0.0);
            information[i * k + i] = precision;
            moment[i] = precision * anchor[i];
        }
        Self {
            theta: anchor.to_vec(),
            information,
            moment,
            floor: (0..k)
                .map(|i| floor.get(i).copied().unwrap_or(1.0).max(f64::MIN_POSITIVE))
                .collect(),
            anchor: anchor.to_vec(),
            lambda: lambda.clamp(1e-6, 1.0),
            observations: 0,
        }
    }

    /// The current estimate.
    pub fn theta(&self) -> &[f64] {
        &self.theta
    }

    /// Observations absorbed so far.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// The prediction `θ·x`.
    pub fn predict(&self, x: &[f64]) -> f64 {
        self.theta.iter().zip(x).map(|(t, v)| t * v).sum()
    }

    /// Absorbs one observation `y` at features `x` (same length as θ), with weight
    /// `weight` > 0. Non-finite inputs, and an observation whose solve is not finite, are
    /// ignored (nothing changes) and reported as `false`.
    pub fn update(&mut self, x: &[f64], y: f64, weight: f64) -> bool {
        let k = self.theta.len();
        if x.len() != k || !y.is_finite() || !(weight > 0.0 && weight.is_finite()) {
            return false;
        }
        if x.iter().any(|v| !v.is_finite()) {
            return false;
        }
        let mut information = self.information.clone();
        let mut moment = self.moment.clone();
        for i in 0..k {
            moment[i] = self.lambda * moment[i] + weight * x[i] * y;
            for j in 0..k {
                information[i * k + j] =
                    self.lambda * information[i * k + j] + weight * x[i] * x[j];
            }
        }
        let Some(theta) = self.solve(&information, &moment) else {
            return false;
        };
        self.information = information;
        self.moment = moment;
        self.theta = theta;
        self.observations += 1;
        true
    }

    /// The least-squares estimate with parameter `index` held at `value` (the others
    /// re-solved on the same information), or `None` if it is not finite: the constrained
    /// optimum when the free one falls outside a bound.
    pub fn theta_with_fixed(&self, index: usize, value: f64) -> Option<Vec<f64>> {
        let k = self.theta.len();
        if index >= k || !value.is_finite() {
            return None;
        }
        // Move the fixed column to the right-hand side, and pin its own row: the floor
        // weighted by a huge factor is numerically a constraint in a Cholesky solve; the
        // explicit reduction below is exact.
        let free: Vec<usize> = (0..k).filter(|&i| i != index).collect();
        let n = free.len();
        let mut information = vec![0.0; n * n];
        let mut moment = vec![0.0; n];
        let mut floor = vec![0.0; n];
        let mut anchor = vec![0.0; n];
        for (r, &i) in free.iter().enumerate() {
            moment[r] = self.moment[i] - self.information[i * k + index] * value;
            floor[r] = self.floor[i];
            anchor[r] = self.anchor[i];
            for (c, &j) in free.iter().enumerate() {
                information[r * n + c] = self.information[i * k + j];
            }
        }
        let reduced = ForgettingLeastSquares {
            theta: vec![0.0; n],
            information: information.clone(),
            moment: moment.clone(),
            floor,
            anchor,
            lambda: self.lambda,
            observations: self.observations,
        };
        let solved = reduced.solve(&information, &moment)?;
        let mut theta = Vec::with_capacity(k);
        let mut rest = solved.into_iter();
        for i in 0..k {
            theta.push(if i == index { value } else { rest.next()? });
        }
        Some(theta)
    }

    /// `(A + F)⁻¹ (b + F θ₀)` by Cholesky (A + F is symmetric positive definite), or `None`
    /// if it is not finite.
    fn solve(&self, information: &[f64], moment: &[f64]) -> Option<Vec<f64>> {
        let k = self.theta.len();
        let mut l = vec![0.0; k * k];
        for i in 0..k {
            for j in 0..=i {
                let mut sum = information[i * k + j];
                if i == j {
                    sum += self.floor[i];
                }
                for m in 0..j {
                    sum -= l[i * k + m] * l[j * k + m];
                }
                if i == j {
                    if !(sum > 0.0 && sum.is_finite()) {
                        return None;
                    }
                    l[i * k + i] = sum.sqrt();
                } else {
                    l[i * k + j] = sum / l[j * k + j];
                }
            }
        }
        let rhs: Vec<f64> = (0..k)
            .map(|i| moment[i] + self.floor[i] * self.anchor[i])
            .collect();
        // L z = rhs, then Lᵀ θ = z.
        let mut z = vec![0.0; k];
        for i in 0..k {
            let sum: f64 = (0..i).map(|m| l[i * k + m] * z[m]).sum();
            z[i] = (rhs[i] - sum) / l[i * k + i];
        }
        let mut theta = vec![0.0; k];
        for i in (0..k).rev() {
            let sum: f64 = (i + 1..k).map(|m| l[m * k + i] * theta[m]).sum();
            theta[i] = (z[i] - sum) / l[i * k + i];
        }
        theta.iter().all(|t| t.is_finite()).then_some(theta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_parameter_re_solves_the_others() {
        // y = 3 + 0·x: with the slope held at 0.5 the intercept is the mean of y − 0.5x.
        let mut fit = ForgettingLeastSquares::new(&[0.0, 1.0], &[0.0, 0.0], &[1e-9, 1e-9], 1.0);
        for x in [1.0, 2.0, 3.0, 4.0, 5.0] {
            assert!(fit.update(&[1.0, x], 3.0, 1.0));
        }
        assert!(fit.theta()[1].abs() < 1e-6);
        let fixed = fit.theta_with_fixed(1, 0.5).expect("solves");
        assert_eq!(fixed[1], 0.5);
        assert!((fixed[0] - (3.0 - 0.5 * 3.0)).abs() < 1e-6, "{fixed:?}");
        assert_eq!(fit.theta_with_fixed(2, 0.0), None);
    }

    #[test]
    fn nelder_mead_finds_a_quadratic_minimum() {
        let (x, value) = nelder_mead(&[0.0, 0.0], NelderMeadOptions::default(), |p| {
            (p[0] - 3.0).powi(2) + 10.0 * (p[1] + 1.5).powi(2)
        });
        assert!(
            (x[0] - 3.0).abs() < 1e-2 && (x[1] + 1.5).abs() < 1e-2,
            "{x:?}"
        );
        assert!(value < 1e-3);
    }

    #[test]
    fn nelder_mead_respects_its_budget() {
        let mut calls = 0;
        let options = NelderMeadOptions {
            evaluations_max: 10,
            ..NelderMeadOptions::default()
        };
        let _ = nelder_mead(&[1.0, 1.0, 1.0], options, |p| {
            calls += 1;
            p.iter().map(|v| v.sin()).sum()
        });
        // The last iteration may shrink the whole simplex (n more calls).
        assert!(calls <= 10 + 3, "{calls}");
    }

    #[test]
    fn least_squares_recovers_a_line_and_ignores_garbage() {
        let mut rls = ForgettingLeastSquares::new(&[0.0, 1.0], &[0.0, 0.0], &[1e-9, 1e-9], 1.0);
        for i in 0..200 {
            let x = f64::from(i) / 10.0;
            assert!(rls.update(&[1.0, x], 5.0 + 1.3 * x, 1.0));
        }
        assert!(!rls.update(&[1.0, f64::NAN], 1.0, 1.0));
        assert!(!rls.update(&[1.0, 2.0], f64::INFINITY, 1.0));
        let theta = rls.theta();
        assert!(
            (theta[0] - 5.0).abs() < 1e-6 && (theta[1] - 1.3).abs() < 1e-6,
            "{theta:?}"
        );
        assert_eq!(rls.observations(), 200);
    }
}
