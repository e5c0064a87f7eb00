"""plot_patching draws an activation-patching table as it is: one heatmap of layers × positions
(or heads), its labels, its normalised values centred at 0, a title naming the point and metric."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_activations import _lm

from qkv.explain import PatchingTable, activation_patching
from qkv.explain.plots import plot_patching


def _table(columns: list[str]) -> PatchingTable:
    values = torch.arange(3 * len(columns), dtype=torch.float32).reshape(3, len(columns))
    return PatchingTable(values, ["layers.0", "layers.1", "layers.2"], columns, "resid_pre", 8.0, 2.0)


def _heatmap(fig):
    maps = [ax for ax in fig.axes if ax.get_images() and ax.get_title()]
    assert len(maps) == 1 and len(fig.axes) == 2  # the heatmap, then its colour bar
    return maps[0]


def test_a_table_by_position_has_layers_down_and_token_labels_across():
    table = _table(["0", "1", "2", "3"])
    fig = plot_patching(table, labels=list("ROM:"), metric="logit difference")
    ax = _heatmap(fig)
    image = ax.get_images()[0]
    np.testing.assert_allclose(image.get_array(), table.normalised().numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == list("ROM:")
    assert [t.get_text() for t in ax.get_yticklabels()] == table.rows
    assert "resid_pre" in ax.get_title() and "logit difference" in ax.get_title()
    low, high = image.get_clim()
    assert low == -high and high >= 1.0  # diverging, centred at 0 (no effect)
    assert ax.get_xlabel() == "position patched"
    assert len(ax.texts) == 12  # each cell's value written in it


def test_a_table_by_head_labels_its_heads_and_can_draw_raw_changes():
    table = _table(["head 0", "head 1"])
    ax = _heatmap(plot_patching(table, normalised=False, annotate=False))
    np.testing.assert_allclose(ax.get_images()[0].get_array(), (table.values - 2.0).numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["head 0", "head 1"]
    assert ax.get_xlabel() == "head patched" and not ax.texts


def test_equal_runs_draw_the_change_and_wrong_labels_are_refused():
    table = PatchingTable(torch.ones(2, 3), ["layers.0", "layers.1"], ["0", "1", "2"], "resid_pre", 1.0, 1.0)
    ax = _heatmap(plot_patching(table))  # nothing to normalise by: the change, all zero
    assert not ax.get_images()[0].get_array().any()
    with pytest.raises(ValueError, match="2 labels for a table of 3 columns"):
        plot_patching(table, labels=["a", "b"])


@torch.no_grad()
def test_a_real_table_from_activation_patching():
    torch.manual_seed(0)
    model, (tokens,) = _lm()
    model.eval()
    corrupted = tokens.clone()
    corrupted[:, 0] = (tokens[:, 0] + 1) % model.config.vocab_size

    def metric(out) -> torch.Tensor:
        return out.logits[:, -1, 0].mean()

    table = activation_patching(model, tokens, corrupted, metric)
    ax = _heatmap(plot_patching(table, labels=[str(t) for t in tokens[0].tolist()]))
    assert ax.get_images()[0].get_array().shape == tuple(table.values.shape)
    assert len(ax.get_yticklabels()) == len(table.rows)
