"""The chart's NOTES.txt, printed after `helm install`, shows a TrainingRun to start from: it must be
one the operator accepts, and it points to nothing outside what the user has."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from asyncdapo.services.operator.spec import parse_spec

NOTES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "asyncdapo" / "templates" / "NOTES.txt"


def test_the_example_trainingrun_in_the_notes_is_valid() -> None:
    text = NOTES.read_text()
    block = re.search(r"\n(  apiVersion: .*?)\n\n", text, re.S)
    assert block is not None, "NOTES.txt shows no TrainingRun"
    doc = yaml.safe_load("\n".join(line[2:] for line in block.group(1).splitlines()))
    assert doc["kind"] == "TrainingRun" and doc["apiVersion"] == "asyncdapo.io/v1alpha1"
    parse_spec(doc["spec"], doc["metadata"]["name"])  # raises SpecError naming each problem


def test_the_notes_link_no_placeholder_repository() -> None:
    assert "github.com/asyncdapo" not in NOTES.read_text()
