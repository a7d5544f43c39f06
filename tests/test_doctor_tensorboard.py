"""`kfast doctor` on TensorBoard: its version, or what to install (kept apart from test_doctor.py's CLI tests)."""

import importlib.metadata

from kfast.env import doctor


def test_doctor_reports_the_installed_tensorboard():
    report = doctor.collect()
    assert report["tensorboard"]["version"] == importlib.metadata.version("tensorboard")
    assert f"\n  tensorboard   {report['tensorboard']['version']}\n" in doctor.format_report(report)
    assert not [p for p in report["problems"] if "TensorBoard" in p["problem"]]


def test_missing_or_mismatched_tensorboard_is_a_warning_with_the_matching_pin(monkeypatch):
    versions = {"tensorboard": None}
    monkeypatch.setattr(doctor, "_dist_version", versions.get)
    report = {"problems": []}
    doctor._check_tensorboard(report, "2.21.0")
    (problem,) = report["problems"]
    assert report["tensorboard"] == {"version": None}
    assert problem["severity"] == "warning" and "not installed" in problem["problem"]
    assert problem["fix"] == "pip install 'tensorboard==2.21.*'"

    versions["tensorboard"] = "2.19.0"
    report = {"problems": []}
    doctor._check_tensorboard(report, "2.21.0")
    (problem,) = report["problems"]
    assert "TensorBoard 2.19.0" in problem["problem"] and problem["fix"] == "pip install 'tensorboard==2.21.*'"
    assert not doctor.has_errors(report)
