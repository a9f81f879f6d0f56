"""benchmarks.grading's bookkeeping between sessions: runs made apart are compared only when one grader made both."""
import json

from benchmarks import grading


def test_a_run_with_other_code_is_dropped_not_compared(tmp_path, monkeypatch):
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "manifest.json").write_text("{}")
    (tmp_path / "timings.json").write_text(json.dumps({"interrupted": dict(digest="old", killed_after_s=1.0)}))
    monkeypatch.setattr(grading, "_digest", lambda: "new")
    monkeypatch.setattr(grading, "_commit", lambda: "abc1234")
    monkeypatch.setattr(grading, "_grade", lambda subs, out, workers: None)
    assert grading.run(1, 1, 0, None, 0.5, tmp_path, runs=("uninterrupted",)) is None  # nothing to compare yet
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert set(timings) == {"uninterrupted"} and timings["uninterrupted"]["digest"] == "new"
    # The same code, but the class regenerated differently: dropped too.
    timings["interrupted"] = dict(timings["uninterrupted"], killed_after_s=1.0)
    (tmp_path / "timings.json").write_text(json.dumps(timings))
    (tmp_path / "class" / "s").mkdir()
    (tmp_path / "class" / "s" / "00_first_kernel.ipynb").write_text("{}")
    assert grading.run(1, 1, 0, None, 0.5, tmp_path, runs=("uninterrupted",)) is None
    assert set(json.loads((tmp_path / "timings.json").read_text())) == {"uninterrupted"}
