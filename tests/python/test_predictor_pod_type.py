"""The predictor API honours `pod_type` as llm-d's EPP sends it (issue 35).

The EPP's latency-predictor plugin (llm-d-router, `predictedlatency/training.go`
`buildPredictionRequest`) puts the value of the pod's role label (`endpointRoleLabel`, llm-d's
`llm-d.ai/role`) into `pod_type` verbatim, or omits it when the pod has none: so a P/D pool's
entries carry `prefill`, `decode`, `prefill-decode`, the deprecated `both`, and the encode
variants; the peer's own load test sends `monolithic`. The EPP neutralises TPOT for prefill
pods itself; ditto answers in kind:

- every role spelling of a pod that prefills or decodes is accepted (a strict bulk call with
  one unknown spelling would fail the whole pool's prediction); an encode-only or unknown
  role is a 422 naming `pod_type`;
- a prefill pod predicts TTFT, its TPOT neutral (0, bounds [0, 0], no spread);
- a decode pod predicts TPOT and the decode side's TTFT: the prompt's KV arrives whole from
  the prefill pod, so a long uncached prompt costs it one token, not its prefill, whatever
  the prefix score says;
- the spellings of one role answer alike, `prefill_tokens_in_flight` and
  `decode_tokens_in_flight` weigh in as before.
"""

import pytest
import requests

from epp_predictor_client import prediction_request
from test_predictor import check_detail, start, stop

TIMEOUT = 60


@pytest.fixture(scope="module")
def predictor():
    server = start("--latency-objective-type", "mean")
    try:
        yield server
    finally:
        stop(server)


def strict(server, entries):
    response = requests.post(server.url + "/predict/bulk/strict", json={"requests": entries}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


def entry(pod_type, input_tokens=4000, prefix=0.0, running=6, waiting=1, prefill_in_flight=0):
    """A `PredictionRequest` as the EPP's client marshals it, for a pod labelled `pod_type`."""
    req = prediction_request(0.2, input_tokens, waiting, running, 1, prefix, pod_type)
    req["prefill_tokens_in_flight"] = prefill_in_flight
    return req


def test_every_role_the_epp_sends_is_accepted_and_spellings_of_one_role_agree(predictor):
    spellings = ["", "monolithic", "both", "prefill-decode", "encode-prefill-decode",
                 "prefill", "encode-prefill", "decode", "encode-decode"]
    answers = dict(zip(spellings, strict(predictor, [entry(s) for s in spellings])))
    for role, same in (("", ("monolithic", "both", "prefill-decode", "encode-prefill-decode")),
                       ("prefill", ("encode-prefill",)), ("decode", ("encode-decode",))):
        for other in same:
            for field in ("ttft_ms", "tpot_ms", "ttft_prediction_bounds", "tpot_prediction_bounds"):
                assert answers[other][field] == answers[role][field], (role, other, field)


@pytest.mark.parametrize("pod_type", ["encode", "gpu", "Prefill"])
def test_a_role_without_a_prefill_or_decode_is_a_422_naming_pod_type(predictor, pod_type):
    response = requests.post(predictor.url + "/predict/bulk/strict",
                             json={"requests": [entry("prefill"), entry(pod_type)]}, timeout=TIMEOUT)
    detail = check_detail(response, 422)
    assert [d["loc"] for d in detail] == [["body", "requests", 1, "pod_type"]], detail
    assert detail[0]["type"] == "literal_error" and "prefill-decode" in detail[0]["msg"], detail


def test_a_prefill_pod_predicts_ttft_with_a_neutral_tpot(predictor):
    [prefill, monolithic] = strict(predictor, [entry("prefill"), entry("")])
    assert prefill["ttft_ms"] > 0, prefill
    assert prefill["tpot_ms"] == 0 and prefill["tpot_uncertainty"] == 0, prefill
    assert prefill["tpot_prediction_bounds"] == [0, 0], prefill
    assert monolithic["tpot_ms"] > 0, monolithic
    assert prefill["source"] == "aggregates"


def test_a_decode_pod_pays_for_one_token_of_a_pulled_prompt_not_its_prefill(predictor):
    decode_cold, decode_warm, monolithic_cold, monolithic_warm = strict(predictor, [
        entry("decode", prefix=0.0), entry("decode", prefix=0.9),
        entry("", prefix=0.0), entry("", prefix=0.9),
    ])
    # On a monolithic pod the prefix cache matters; on a decode pod the KV is pulled whole.
    assert monolithic_warm["ttft_ms"] < monolithic_cold["ttft_ms"], (monolithic_warm, monolithic_cold)
    assert decode_cold["ttft_ms"] == decode_warm["ttft_ms"], (decode_cold, decode_warm)
    # A 4000-token prompt prefilled costs far more than its last token.
    assert decode_cold["ttft_ms"] < 0.5 * monolithic_cold["ttft_ms"], (decode_cold, monolithic_cold)
    assert decode_cold["tpot_ms"] > 0, decode_cold


def test_prefill_tokens_in_flight_weigh_on_a_prefill_pods_ttft(predictor):
    light, heavy = strict(predictor, [
        entry("prefill", running=0, waiting=4, prefill_in_flight=4 * 500),
        entry("prefill", running=0, waiting=4, prefill_in_flight=4 * 6000),
    ])
    assert heavy["ttft_ms"] > light["ttft_ms"], (light, heavy)
    assert light["tpot_ms"] == heavy["tpot_ms"] == 0
