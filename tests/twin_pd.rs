//! PredictRouting over a prefill/decode pool: pair answers, the decider's decode-only
//! answers, the recommendation (docs/disaggregation.md, "The twin").
#![allow(clippy::unwrap_used)]

use ditto::bench::{pd_snapshot, whatif_question, whatif_snapshot};
use ditto::twin::Limits;
use ditto::twin::predict::{Forking, predict_routing, predict_routing_with};

#[test]
fn a_long_prompt_is_answered_for_every_pair_with_the_best_named() {
    let snapshot = pd_snapshot(3, 2);
    let answer = predict_routing(&snapshot, &whatif_question(1), &Limits::DEFAULT).unwrap();
    assert_eq!(answer.pairs.len(), 6, "3 prefill x 2 decode pods");
    assert_eq!(answer.decider.len(), 2);
    assert!(answer.decider.iter().all(|choice| choice.remote_prefill));
    assert!(answer.decider.iter().all(|c| c.uncached_tokens == 2_000));
    // Prefill pods take no whole request; decode pods answer decode only.
    for candidate in &answer.candidates {
        let prefill = candidate.instance_id.starts_with("prefill");
        assert_eq!(candidate.valid, !prefill, "{}", candidate.instance_id);
    }
    for pair in &answer.pairs {
        let p = &pair.prediction;
        assert!(p.valid, "{pair:?}");
        assert_eq!(p.instance_id, pair.decode_instance_id);
        assert!(pair.transfer_ms > 0.0, "a 2,000-token pull takes time");
        assert!(pair.handover_ms >= pair.transfer_ms, "{pair:?}");
        // TTFT = prefill (queue + compute) + hand-over (pull, alignment, first step).
        let sum = pair.prefill_ttft_ms + pair.handover_ms;
        assert!(
            (p.ttft_ms.mean - sum).abs() < 1e-6,
            "{} vs {sum}",
            p.ttft_ms.mean
        );
        assert!(p.tpot_ms.mean > 0.0);
    }
    let decode = answer.recommended_instance_id.clone().unwrap();
    let prefill = answer.recommended_prefill_instance_id.clone().unwrap();
    assert!(decode.starts_with("decode") && prefill.starts_with("prefill"));
    // The named pair is the best one: no pair has a higher SLO probability, none of the same
    // probability a lower mean E2E.
    let best = answer
        .pairs
        .iter()
        .find(|p| p.prefill_instance_id == prefill && p.decode_instance_id == decode)
        .unwrap();
    for pair in &answer.pairs {
        let (a, b) = (&pair.prediction, &best.prediction);
        assert!(
            a.slo_probability < b.slo_probability
                || (a.slo_probability == b.slo_probability && a.e2e_ms.mean >= b.e2e_ms.mean),
            "{pair:?} beats the named {best:?}"
        );
    }
    // Deterministic: the same question on a fresh copy answers the same.
    let again = predict_routing(&snapshot.clone(), &whatif_question(1), &Limits::DEFAULT).unwrap();
    assert_eq!(answer, again);
}

#[test]
fn a_short_uncached_prompt_stays_decode_only() {
    let snapshot = pd_snapshot(2, 2);
    let mut question = whatif_question(1);
    question.request.prompt_tokens = 12; // below the decider's 16 uncached tokens
    let answer = predict_routing(&snapshot, &question, &Limits::DEFAULT).unwrap();
    assert!(answer.pairs.is_empty(), "{:?}", answer.pairs);
    assert_eq!(answer.decider.len(), 2);
    assert!(answer.decider.iter().all(|c| !c.remote_prefill));
    assert_eq!(answer.recommended_prefill_instance_id, None);
    let decode = answer.recommended_instance_id.unwrap();
    assert!(decode.starts_with("decode"), "{decode}");
}

#[test]
fn a_monolithic_pool_gets_no_pairs() {
    let answer = predict_routing(
        &whatif_snapshot(true),
        &whatif_question(1),
        &Limits::DEFAULT,
    )
    .unwrap();
    assert!(answer.pairs.is_empty() && answer.decider.is_empty());
    assert_eq!(answer.recommended_prefill_instance_id, None);
    assert!(answer.candidates.iter().all(|c| c.valid));
}

#[test]
fn pair_forks_answer_alike_with_and_without_shortcuts() {
    // Closed-form drains (after the pull, each pod alone) and memoised baselines change no
    // answer: the plain path steps every event on a fresh copy.
    let snapshot = pd_snapshot(2, 2);
    for replications in [1, 3] {
        let question = whatif_question(replications);
        let shortcut = predict_routing(&snapshot, &question, &Limits::DEFAULT).unwrap();
        let plain = predict_routing_with(
            &snapshot.clone(),
            &question,
            &Limits::DEFAULT,
            Forking::Plain,
        )
        .unwrap();
        assert_eq!(shortcut.pairs, plain.pairs);
        assert_eq!(
            shortcut.recommended_instance_id,
            plain.recommended_instance_id
        );
        assert_eq!(
            shortcut.recommended_prefill_instance_id,
            plain.recommended_prefill_instance_id
        );
    }
}
