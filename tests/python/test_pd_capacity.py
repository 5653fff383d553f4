"""ForecastCapacity over gRPC names a P:D split for a P/D pool (docs/disaggregation.md).

The real `ditto serve` mirrors a pool of prefill and decode pods (roles as llm-d labels
them); a question that searches both templates' replica counts answers with one desired
count per role: the first split meeting the target, found by growing each role from one,
then each role trimmed to the fewest pods that still meet it.
A prompt-heavy workload gets more prefill pods than decode pods and an output-heavy one the
reverse; two searched templates of the same role are refused, naming `variants`.
"""

import grpc

from ditto.v1 import twin_pb2 as pb

# A step costs 5 ms + 20 us a prefill token + 100 us a decode token (blackbox), so the
# prompt-heavy load needs several prefill pods and the output-heavy one several decode pods.
COEFFICIENTS = pb.BlackboxCoefficients(alpha=[0, 0, 0], beta=[5000, 20, 100])


def pod(pod_id, role, cost, max_num_seqs=256):
    return pb.InstanceSpec(
        id=pod_id,
        address=f"{pod_id}-addr",
        role=role,
        latency_model="blackbox",
        coefficients=COEFFICIENTS,
        engine=pb.EngineLimits(num_gpu_blocks=20000, max_num_seqs=max_num_seqs),
        cost_per_hour=cost,
    )


def sync(server, roles=("prefill", "prefill", "decode")):
    ids = ["llm-d/prefill-0:8000", "llm-d/prefill-1:8000", "llm-d/decode-0:8000"]
    pods = [pod(i, role, 1.0 if role == "prefill" else 4.0) for i, role in zip(ids, roles)]
    server.twin.SyncClusterConfig(pb.ClusterConfig(instances=pods), timeout=10)
    return ids[0], ids[2]


def split_question(prefill, decode, prompt, output):
    return pb.ForecastCapacityRequest(
        start=pb.FORECAST_START_EMPTY,
        stages=[pb.RateStage(rate_rps=40.0, duration_s=5.0)],
        input_tokens=pb.LengthDistribution(constant=prompt),
        output_tokens=pb.LengthDistribution(constant=output),
        variants=[
            pb.VariantCandidates(template_instance_id=prefill),
            pb.VariantCandidates(template_instance_id=decode),
        ],
        slo=pb.SloTargets(ttft_ms=250.0, tpot_ms=15.0),
        target_attainment=0.9,
        replications=1,
        seed=11,
    )


def split_of(answer, prefill, decode):
    desired = {v.template_instance_id: v.replicas for v in answer.desired_replicas}
    assert set(desired) == {prefill, decode}, answer
    return desired[prefill], desired[decode]


def counts_of(candidate, prefill, decode):
    replicas = {v.template_instance_id: v.replicas for v in candidate.replicas}
    return replicas[prefill], replicas[decode]


def test_forecast_capacity_names_the_p_d_split(server):
    prefill, decode = sync(server)
    prompt_heavy = server.twin.ForecastCapacity(split_question(prefill, decode, 2000, 20), timeout=120)
    p, d = split_of(prompt_heavy, prefill, decode)
    assert p >= 2 and d == 1, (p, d)
    # The search starts from one pod of each role and grows them until a split meets the
    # target; the trim then evaluates fewer pods of one role at a time, the other held.
    candidates = [counts_of(c, prefill, decode) for c in prompt_heavy.candidates]
    assert candidates[0] == (1, 1)
    first_met = next(i for i, c in enumerate(prompt_heavy.candidates) if c.slo_attainment >= 0.9)
    search, trim = candidates[: first_met + 1], candidates[first_met + 1 :]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(search, search[1:])), search
    met_p, met_d = search[-1]
    # The desired split is the trimmed one: met, and no more pods of either role than the
    # search's.
    desired = next(c for c in prompt_heavy.candidates if counts_of(c, prefill, decode) == (p, d))
    assert desired.slo_attainment >= 0.9 and p <= met_p and d <= met_d, (search, (p, d))
    assert all(c[0] < met_p and c[1] == met_d or c[0] <= met_p and c[1] < met_d for c in trim), trim

    output_heavy = server.twin.ForecastCapacity(split_question(prefill, decode, 100, 400), timeout=120)
    p, d = split_of(output_heavy, prefill, decode)
    assert p == 1 and d >= 2, (p, d)
    # Reproducible from the same snapshot and seed.
    again = server.twin.ForecastCapacity(split_question(prefill, decode, 100, 400), timeout=120)
    assert again.SerializeToString() == output_heavy.SerializeToString()


def test_two_searched_templates_of_one_role_are_refused(server):
    # Two prefill pools (configured differently, so two variants), both searched.
    server.twin.SyncClusterConfig(
        pb.ClusterConfig(
            instances=[
                pod("llm-d/prefill-a-0:8000", "prefill", 1.0),
                pod("llm-d/prefill-b-0:8000", "prefill", 1.0, max_num_seqs=128),
            ]
        ),
        timeout=10,
    )
    question = split_question("llm-d/prefill-a-0:8000", "llm-d/prefill-b-0:8000", 100, 10)
    try:
        server.twin.ForecastCapacity(question, timeout=60)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert err.details().startswith("variants"), err.details()
    else:
        raise AssertionError("two prefill templates searched together were accepted")
