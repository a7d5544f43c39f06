"""Diagnosis: where a training step's time goes (`diagnose`), its result (`Diagnosis`) and its picture.

`measure` times the data alone, the model alone and real training; `report` holds the verdict and what
to change; `plot` draws it.
"""

from kfast.diagnosis.measure import diagnose
from kfast.diagnosis.report import Diagnosis

__all__ = ["Diagnosis", "diagnose"]
