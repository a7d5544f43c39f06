from helpers import rank_lines


def test_two_rank_allreduce_is_exact(horovodrun):
    out = horovodrun("scripts/check_allreduce.py", timeout=180)
    lines = rank_lines(out, "allreduce sum")
    assert sorted(lines) == [0, 1], out
    for line in lines.values():
        assert "[3.0, 30.0], expected [3.0, 30.0]: OK" in line
