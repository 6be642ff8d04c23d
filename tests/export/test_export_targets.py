"""Export targets are checked before the plan runs, and a run's exports are written all or none.

Before: `--export err/a.json --export /proc/x.json --export err/c.md` planned, wrote a.json,
then failed on /proc; a plan of two models wrote its JSON, then refused its llm-d values; a
TensorRT-LLM replica over hosts wrote the JSON, then refused the `.k8s.yaml`; a day plan wrote
day.csv, then found its `day.schedule.csv` a folder; `--export x.schedule.csv` wrote
`x.schedule.schedule.csv` beside; `--export DIR/.json` wrote a hidden `.json`; `--plot DIR`
made a missing folder where `--export` refuses one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from capplan.errors import InputError
from tests.cli._asserts import assert_answer_then_refusal, assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]
FAST = ["recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1",
        "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--rate", "5",
        "--verify-top", "0", "--no-disagg"]
DAY_PLAN = {"model": "llama-3.1-70b", "candidates": {"gpus": ["h100-sxm"], "tp": [4]},
            "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
            "workloads": [{"name": "chat", "input_len": "lognormal:mean=1000,p99=6000",
                           "output_len": "lognormal:mean=250,p99=1000",
                           "rate_curve": [{"at": "04:00", "rate_per_s": 0.6},
                                          {"at": "15:00", "rate_per_s": 3}],
                           "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.05}}],
            "verify": {"top": 0}, "day": {"replay": "none"}}


@pytest.fixture
def no_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planners fail the test if called: the refusal must come before any planning."""
    def planned(*_a: object, **_k: object) -> None:
        raise AssertionError("planned before the export targets were checked")

    import capplan.plan.day_run
    import capplan.plan.planner

    monkeypatch.setattr(capplan.plan.planner, "run_plan", planned)
    monkeypatch.setattr(capplan.plan.day_run, "run_day_plan", planned)


def _files(folder: Path) -> list[str]:
    """What is in folder (the test's own CAPPLAN_HOME left out)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if "capplan-home" not in p.relative_to(folder).parts)


def test_unwritable_export_refused_before_planning_nothing_written(run_cli, tmp_path,
                                                                   no_planning) -> None:
    (tmp_path / "out").mkdir()
    old = tmp_path / "out" / "c.md"
    old.write_text("the user's own notes")
    for bad in (tmp_path / "missing" / "x.json", Path("/proc/x.json")):
        res = run_cli(*FAST, "--export", str(tmp_path / "out" / "a.json"), "--export", str(bad),
                      "--export", str(old))
        assert_one_line_error(res, str(bad))
        assert _files(tmp_path / "out") == ["c.md"]  # no a.json, no temporary file
        assert old.read_text() == "the user's own notes"


@pytest.mark.parametrize("name", ["x.json", "x.schedule.csv"])
def test_folder_at_the_target_refused_before_planning(run_cli, tmp_path, no_planning,
                                                      name) -> None:
    (tmp_path / name).mkdir()
    res = run_cli(*FAST, "--export", str(tmp_path / "a.md"), "--export", str(tmp_path / name))
    assert_one_line_error(res, "is a folder")
    assert _files(tmp_path) == [name]


@pytest.mark.parametrize("name", [".json", ".k8s.yaml", ".HTML"])
def test_export_name_without_a_stem_is_refused(run_cli, tmp_path, no_planning, name) -> None:
    res = run_cli(*FAST, "--export", str(tmp_path / name))
    assert_one_line_error(res, "the file name is only its suffix")
    assert _files(tmp_path) == []


def test_llmd_of_several_models_refused_before_planning(run_cli, tmp_path, no_planning) -> None:
    res = run_cli("plan", str(ROOT / "examples" / "day" / "two-models.yaml"),
                  "--export", str(tmp_path / "two.json"),
                  "--export", str(tmp_path / "two.llm-d.yaml"))
    assert_one_line_error(res, "an llm-d values file serves one model; this plan has 2")
    assert _files(tmp_path) == []


def test_llmd_of_another_engine_refused_before_planning(run_cli, tmp_path, no_planning) -> None:
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine",
                  "sglang", "--rate", "5", "--export", str(tmp_path / "a.json"),
                  "--export", str(tmp_path / "a.llm-d.yaml"))
    assert_one_line_error(res, "llm-d-modelservice runs vLLM only")
    assert _files(tmp_path) == []


def test_day_csv_whose_schedule_is_a_folder_refused_before_planning(run_cli, tmp_path,
                                                                    no_planning) -> None:
    plan = tmp_path / "day.yaml"
    plan.write_text(yaml.safe_dump(DAY_PLAN))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "day.schedule.csv").mkdir()
    res = run_cli("plan", str(plan), "--export", str(tmp_path / "out" / "day.json"),
                  "--export", str(tmp_path / "out" / "day.csv"))
    assert_one_line_error(res, "day.schedule.csv is a folder")
    assert _files(tmp_path / "out") == ["day.schedule.csv"]


def test_day_csv_named_like_a_schedule_is_refused(run_cli, tmp_path, no_planning) -> None:
    plan = tmp_path / "day.yaml"
    plan.write_text(yaml.safe_dump({**DAY_PLAN, "export": ["x.schedule.csv"]}))
    res = run_cli("plan", str(plan))
    assert_one_line_error(res, "name the export x.csv (its schedule goes to x.schedule.csv)")
    assert _files(tmp_path) == ["day.yaml"]


def test_schedule_csv_name_of_a_plan_without_a_day_is_written_alone(run_cli, tmp_path) -> None:
    res = run_cli(*FAST, "--export", str(tmp_path / "x.schedule.csv"))
    assert res.exit_code == 0, res.stderr
    assert _files(tmp_path) == ["x.schedule.csv"]


def test_day_csv_writes_its_schedule_beside(run_cli, tmp_path) -> None:
    plan = tmp_path / "day.yaml"
    plan.write_text(yaml.safe_dump(DAY_PLAN))
    res = run_cli("plan", str(plan), "--export", str(tmp_path / "d.csv"),
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "d.csv").read_text().startswith("rank,GPU,")
    sched = (tmp_path / "d.schedule.csv").read_text().splitlines()
    assert sched[0].startswith("start (h in UTC),end (h in UTC),")
    assert len([ln for ln in sched[1:] if ln and ln[0].isdigit()]) >= 96
    assert not (tmp_path / "d.schedule.schedule.csv").exists()
    assert res.stderr.splitlines() == [f"wrote {tmp_path / 'd.csv'}",
                                       f"wrote {tmp_path / 'd.schedule.csv'}"]


def test_refusal_found_while_rendering_writes_nothing(run_cli, tmp_path) -> None:
    """A TensorRT-LLM replica over two hosts: its manifests are refused once the plan says so;
    the JSON asked beside them is not written either (every export is rendered first). The
    plan is still the answer: printed as without the exports, its mpirun line included, then
    the refusal."""
    old = tmp_path / "ds.json"
    old.write_text("{}")
    res = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--engine",
                  "trtllm", "--rate", "2", "--verify-top", "0", "--no-disagg",
                  "--export", str(old), "--export", str(tmp_path / "ds.k8s.yaml"),
                  "--export", str(tmp_path / "ds.md"))
    assert_answer_then_refusal(res, "TensorRT-LLM over several hosts runs under MPI")
    assert _files(tmp_path) == ["ds.json"] and old.read_text() == "{}"
    assert "TensorRT-LLM: any node: mpirun " in res.stdout
    assert "capplan verify PLAN.json" in res.stdout and str(old) not in res.stdout


def test_same_export_given_twice_is_written_once(run_cli, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    res = run_cli(*FAST, "--export", "sub/a.json", "--export", "./sub/a.json",
                  "--export", str(tmp_path / "sub" / "a.json"), "--export", "sub/../sub/a.json",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert res.stderr.splitlines() == ["wrote sub/a.json"]
    assert json.loads((tmp_path / "sub" / "a.json").read_text()) == res.json()
    assert _files(tmp_path / "sub") == ["a.json"]


def test_missing_plot_folder_refused_before_planning(run_cli, tmp_path, no_planning) -> None:
    res = run_cli(*FAST, "--export", str(tmp_path / "a.json"), "--plot", str(tmp_path / "c"))
    assert_one_line_error(res, f"chart folder {tmp_path / 'c'} does not exist")
    assert _files(tmp_path) == []


def test_plot_file_that_is_a_folder_refused_before_planning(run_cli, tmp_path,
                                                            no_planning) -> None:
    (tmp_path / "c" / "pareto.svg").mkdir(parents=True)
    res = run_cli(*FAST, "--export", str(tmp_path / "a.json"), "--plot", str(tmp_path / "c"))
    assert_one_line_error(res, "pareto.svg is a folder")
    assert _files(tmp_path) == ["c", "c/pareto.svg"]


def test_simulate_and_speed_refuse_a_missing_plot_folder(run_cli, tmp_path) -> None:
    for cmd in (["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
                 "--requests", "50"],
                ["speed", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "1"]):
        res = run_cli(*cmd, "--plot", str(tmp_path / "charts"))
        assert_one_line_error(res, "does not exist")
        assert not (tmp_path / "charts").exists()


def test_write_all_or_none_when_a_later_file_fails(tmp_path) -> None:
    """Every temporary file is written before the first rename: the second file failing leaves
    the first target as it was and no temporary file behind."""
    from capplan.export.atomic import atomic_write_all, text_file

    first = tmp_path / "a.json"
    first.write_text("old")

    def full(tmp: Path) -> None:
        raise OSError(28, "No space left on device", str(tmp))

    with pytest.raises(InputError, match=r"b\.md: cannot write \(No space left on device\)"):
        atomic_write_all([text_file(first, "new"), (tmp_path / "b.md", full)])
    assert first.read_text() == "old" and _files(tmp_path) == ["a.json"]
    assert atomic_write_all([text_file(first, "new"), text_file(tmp_path / "b.md", "b")]) == [
        first, tmp_path / "b.md"]
    assert first.read_text() == "new" and _files(tmp_path) == ["a.json", "b.md"]
