//! The HPA arithmetic against the controller's documented behaviour.

use super::*;

fn rules(stabilization_s: u64, policies: Vec<RatePolicy>) -> ScalingRules {
    ScalingRules {
        stabilization_us: stabilization_s * 1_000_000,
        policies,
        select: SelectPolicy::Max,
    }
}

/// No window and a rate too high to bind (the controller needs a policy per direction: with
/// none, a direction never moves).
fn free(min: u32, max: u32) -> HpaConfig {
    let any = || {
        vec![RatePolicy::Pods {
            pods: 1_000,
            period_us: 1,
        }]
    };
    HpaConfig {
        min_replicas: min,
        max_replicas: max,
        tolerance: 0.1,
        scale_up: rules(0, any()),
        scale_down: rules(0, any()),
    }
}

const S: u64 = 1_000_000;

#[test]
fn tolerance_holds_and_average_value_rounds_up() {
    let hpa = Hpa::new(free(1, 20));
    // 10 replicas, 10.5 against target 1: ratio 1.05 within 0.1: hold.
    assert_eq!(hpa.metric_desired(10, 10.5, 1.0), 10);
    assert_eq!(hpa.metric_desired(10, 11.5, 1.0), 12);
    assert_eq!(hpa.metric_desired(4, 12.0, 5.0), 3);
    assert_eq!(hpa.metric_desired(4, 0.0, 5.0), 0);
}

#[test]
fn bounds_clamp_without_rate_policies() {
    let mut hpa = Hpa::new(free(2, 6));
    assert_eq!(hpa.sync(0, 3, 10), 6);
    assert_eq!(hpa.sync(S, 6, 0), 2);
}

#[test]
fn scale_down_stabilization_takes_the_highest_recent_recommendation() {
    let mut config = free(1, 20);
    config.scale_down.stabilization_us = 180 * S;
    let mut hpa = Hpa::new(config);
    assert_eq!(hpa.sync(0, 8, 8), 8);
    // Lower recommendations within 180 s of the 8 are held at 8.
    assert_eq!(hpa.sync(60 * S, 8, 3), 8);
    assert_eq!(hpa.sync(120 * S, 8, 4), 8);
    // At 180 s the 8 has left the window; the highest left is 4.
    assert_eq!(hpa.sync(180 * S, 8, 2), 4);
    // Scaling up is not held back by the down window.
    assert_eq!(hpa.sync(181 * S, 4, 9), 9);
}

#[test]
fn scale_up_stabilization_takes_the_lowest_recent_recommendation() {
    let mut config = free(1, 20);
    config.scale_up.stabilization_us = 30 * S;
    let mut hpa = Hpa::new(config);
    assert_eq!(hpa.sync(0, 4, 4), 4);
    assert_eq!(hpa.sync(15 * S, 4, 10), 4);
    // The 4 is 30 s old now: out of the window; the lowest left is 10.
    assert_eq!(hpa.sync(30 * S, 4, 12), 10);
}

#[test]
fn a_direction_without_policies_never_moves() {
    let mut config = free(1, 20);
    config.scale_up.policies.clear();
    let mut hpa = Hpa::new(config);
    assert_eq!(hpa.sync(0, 3, 10), 3);
    assert_eq!(hpa.sync(S, 3, 1), 1);
}

#[test]
fn scale_up_rate_takes_the_larger_policy_and_counts_the_period() {
    let mut config = free(1, 100);
    config.scale_up = rules(
        0,
        vec![
            RatePolicy::Percent {
                percent: 100.0,
                period_us: 60 * S,
            },
            RatePolicy::Pods {
                pods: 4,
                period_us: 60 * S,
            },
        ],
    );
    let mut hpa = Hpa::new(config.clone());
    // From 2: max(2·2, 2 + 4) = 6.
    assert_eq!(hpa.sync(0, 2, 50), 6);
    // Within the same 60 s, the period started at 2: still at most 6.
    assert_eq!(hpa.sync(15 * S, 6, 50), 6);
    // After the period: from 6, max(12, 10) = 12.
    assert_eq!(hpa.sync(61 * S, 6, 50), 12);
    // selectPolicy Min: min(4, 6) from 2.
    config.scale_up.select = SelectPolicy::Min;
    let mut hpa = Hpa::new(config.clone());
    assert_eq!(hpa.sync(0, 2, 50), 4);
    config.scale_up.select = SelectPolicy::Disabled;
    let mut hpa = Hpa::new(config);
    assert_eq!(hpa.sync(0, 2, 50), 2);
}

#[test]
fn scale_down_rate_walks_one_pod_per_period() {
    let mut config = free(1, 100);
    config.scale_down = rules(
        0,
        vec![RatePolicy::Pods {
            pods: 1,
            period_us: 120 * S,
        }],
    );
    let mut hpa = Hpa::new(config);
    assert_eq!(hpa.sync(0, 8, 2), 7);
    assert_eq!(hpa.sync(60 * S, 7, 2), 7);
    assert_eq!(hpa.sync(120 * S, 7, 2), 6);
    // A percent policy truncates toward zero: 50 % of 5 → 2.
    let mut config = free(1, 100);
    config.scale_down = rules(
        0,
        vec![RatePolicy::Percent {
            percent: 50.0,
            period_us: 60 * S,
        }],
    );
    let mut hpa = Hpa::new(config);
    assert_eq!(hpa.sync(0, 5, 1), 2);
}
