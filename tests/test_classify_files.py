"""``qkv.inference.classify``: the library's one door to every classifier run (the command
line's ``qkv classify`` is tested end to end beside each recipe)."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.errors import QkvError
from qkv.inference.classify import Predictions, classify_files


def test_labels_are_the_most_likely_class_per_input_or_per_residue():
    probs = [np.array([0.2, 0.8]), np.array([0.6, 0.4])]
    assert Predictions("id", ["a", "b"], ("neg", "pos"), probs).labels() == ["pos", "neg"]
    residues = [np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]])]
    assert Predictions("id", ["a"], ("C", "H"), residues, per_residue=True).labels() == ["CHC"]


def test_a_text_or_protein_classifier_takes_one_file_and_an_unknown_kind_is_a_bug(tmp_path):
    with pytest.raises(QkvError, match="one text file"):
        classify_files(tmp_path, ["a.txt", "b.txt"], "text")
    with pytest.raises(QkvError, match="one FASTA file"):
        classify_files(tmp_path, [], "protein")
    with pytest.raises(ValueError, match="no classifier reads 'audio' inputs"):
        classify_files(tmp_path, ["a.wav"], "audio")


def test_a_text_file_is_read_before_the_model_loads(tmp_path):
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(QkvError, match="holds no text"):
        classify_files(tmp_path / "no-run", [str(tmp_path / "empty.txt")], "text")
