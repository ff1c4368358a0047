"""bench/batching_sim.py: the worker's real Batcher on a virtual clock, rule 3f against the two
rules it replaced (docs/design/batching.md, rule 6)."""

from __future__ import annotations

from bench import batching_sim as S


def test_every_request_is_counted_once() -> None:
    for rule in S.RULES:
        out = S.simulate(rule, "gpu", 300.0, 0.050, 800, seed=1, priorities=True)
        assert sum(out.values()) == 800, (rule, out)


def test_same_seed_same_answer() -> None:
    assert S.simulate("rule 3f", "cpu", 30.0, 0.150, 500, 2, False) == S.simulate("rule 3f", "cpu", 30.0, 0.150, 500, 2,
                                                                                  False)


def test_where_batching_pays_rule_3f_answers_more_in_time_than_either_rule_it_replaced() -> None:
    # the first cut (every member makes it) shrank every batch under load: no more answered in
    # time than with no cut at all; on a CPU profile any cut beats none by far (by 2x before the
    # worker refused at submit what its queue would make miss the deadline, 1.4x since)
    gpu = {r: S.simulate(r, "gpu", 350.0, 0.100, 3000, seed=0, priorities=False)["in_time"] for r in S.RULES}
    assert gpu["rule 3f"] > 1.05 * max(gpu["no cut"], gpu["all make it"]), gpu
    cpu = {r: S.simulate(r, "cpu", 30.0, 0.150, 1500, seed=0, priorities=False)["in_time"] for r in S.RULES}
    assert min(cpu["rule 3f"], cpu["all make it"]) > 1.3 * cpu["no cut"], cpu


def test_the_table_prints_every_row(capsys) -> None:
    assert S.main(["--requests", "200", "--seeds", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "ms |" in line]
    assert len(lines) == 2 * len(S.ROWS)
