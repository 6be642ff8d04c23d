"""A plan's export confinement holds at write time (issue 30, defect 3).

Before: `plan_output_path` resolved the folder when the plan was loaded; a sub-folder swapped
for a symbolic link while a long plan ran carried the export outside the plan's folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capplan.errors import InputError
from capplan.export.json_export import write_json
from capplan.plan.load import plan_output_path


def test_folder_swapped_for_a_symlink_after_load_writes_nothing_outside(tmp_path: Path) -> None:
    plan_dir, outside = tmp_path / "plan", tmp_path / "outside"
    (plan_dir / "sub").mkdir(parents=True)
    outside.mkdir()
    path = plan_output_path("sub/report.json", plan_dir)  # checked at load: inside
    (plan_dir / "sub").rmdir()  # ... then, while the plan runs, swapped for a link
    (plan_dir / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InputError, match="resolves outside"):
        write_json({"recommendations": []}, path)
    assert list(outside.iterdir()) == []  # not even a temporary file


def test_unswapped_folder_is_written(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = plan_output_path("sub/report.json", tmp_path)
    write_json({"recommendations": []}, path)
    assert (tmp_path / "sub" / "report.json").is_file()


@pytest.mark.parametrize("name", ["x\0.json", "a\nb.json", "\x1b[2J.json", ""])
def test_export_names_with_control_characters_are_refused(tmp_path: Path, name: str) -> None:
    """Before: `export: ["x\\0.json"]` raised an internal ValueError."""
    with pytest.raises(InputError, match="control characters"):
        plan_output_path(name, tmp_path)


def test_write_errors_name_the_target_not_the_temporary_file(tmp_path: Path) -> None:
    from capplan.export.atomic import atomic_write

    def full(tmp: Path) -> None:
        raise OSError(28, "No space left on device", str(tmp))

    target = tmp_path / "plan.xlsx"
    with pytest.raises(InputError) as e:
        atomic_write(target, full)
    assert str(e.value) == f"{target}: cannot write (No space left on device)"
    assert not list(tmp_path.glob(".plan.xlsx*")) and not target.exists()
