"""Figures checked on ``fig.to_dict()``: trace types, values worked out by hand, axis titles."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

from steerlab import plots
from steerlab.plots import theme
from steerlab.plots._data import parse_site


class FakeCache(dict):
    """A mapping with the attributes the engine's cache carries."""

    def __init__(self, acts, str_tokens, attention_mask):
        super().__init__(acts)
        self.str_tokens = str_tokens
        self.attention_mask = attention_mask


def _axis(fig_dict: dict, name: str) -> dict:
    return fig_dict["layout"][name]


def _title(axis: dict) -> str:
    return axis["title"]["text"]


@pytest.fixture
def padded_cache() -> FakeCache:
    # 2 rows, 3 positions, d_model 2; row 1 is left-padded by one position.
    # resid_pre at layer L: every vector is (3, 4) * (L + 1), norm 5 (L + 1);
    # resid_post at layer L: every vector is (0, 1) * (L + 2), norm L + 2; pad vectors are huge.
    acts = {}
    for layer in range(2):
        pre = torch.tensor([3.0, 4.0]).repeat(2, 3, 1) * (layer + 1)
        post = torch.tensor([0.0, 1.0]).repeat(2, 3, 1) * (layer + 2)
        pre[1, 0] = post[1, 0] = 1000.0  # the pad position must never show up
        acts[f"blocks.{layer}.hook_resid_pre"] = pre
        acts[f"blocks.{layer}.hook_resid_post"] = post
    tokens = [["<s>", " the", " cat"], ["<pad>", "<s>", "\nhi"]]
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    return FakeCache(acts, tokens, mask)


def test_parse_site_reads_layer_and_kind():
    site = parse_site("blocks.12.hook_resid_mid")
    assert (site.layer, site.kind) == (12, "resid_mid")
    assert parse_site("blocks.3.attn.hook_z").kind == "attn.z"
    assert parse_site("hook_embed") is None


def test_residual_norms_lines_and_heatmap(padded_cache):
    fig = plots.residual_norms(padded_cache, row=1).to_dict()
    lines = [t for t in fig["data"] if t["type"] == "scatter"]
    heat = [t for t in fig["data"] if t["type"] == "heatmap"]
    assert [t["name"] for t in lines] == ["resid_pre", "resid_post"]
    assert list(lines[0]["x"]) == [0, 1]
    assert list(lines[0]["y"]) == pytest.approx([5.0, 10.0])  # pads excluded from the mean
    assert list(lines[1]["y"]) == pytest.approx([2.0, 3.0])
    assert len(heat) == 1
    # Row 1 without its pad: two positions, layers 0 and 1 of resid_post.
    assert [list(r) for r in heat[0]["z"]] == [[2.0, 2.0], [3.0, 3.0]]
    assert list(heat[0]["y"]) == [0, 1]
    assert list(_axis(fig, "xaxis2")["ticktext"]) == ["&lt;s&gt;", "↵hi"]
    assert _title(_axis(fig, "xaxis")) == "layer"
    assert _title(_axis(fig, "xaxis2")) == "token"
    assert _title(_axis(fig, "yaxis2")) == "layer"


def test_residual_norms_with_steered_dashes_and_differences(padded_cache):
    steered = {k: v * 2 for k, v in padded_cache.items()}
    fig = plots.residual_norms(padded_cache, steered=steered, row=0).to_dict()
    lines = [t for t in fig["data"] if t["type"] == "scatter"]
    assert [t["name"] for t in lines] == [
        "resid_pre",
        "resid_pre (steered)",
        "resid_post",
        "resid_post (steered)",
    ]
    assert lines[1]["line"]["dash"] == "dash"
    assert lines[1]["line"]["color"] == lines[0]["line"]["color"]
    assert list(lines[1]["y"]) == pytest.approx([10.0, 20.0])
    heat = next(t for t in fig["data"] if t["type"] == "heatmap")
    # Steered minus baseline at resid_post: (L + 2) per token, all three tokens of row 0.
    assert [list(r) for r in heat["z"]] == [[2.0, 2.0, 2.0], [3.0, 3.0, 3.0]]
    assert heat["zmid"] == 0


def test_residual_norms_explicit_tokens_and_mask_on_a_plain_dict(padded_cache):
    fig = plots.residual_norms(
        dict(padded_cache), tokens=[["a", "b", "c"]] * 2, mask=torch.ones(2, 3)
    ).to_dict()
    assert list(fig["layout"]["xaxis2"]["ticktext"]) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="no blocks"):
        plots.residual_norms({"embed": torch.zeros(1, 1, 2)})


def test_activation_heatmap_full_and_top_k():
    acts = torch.tensor([[[1.0, -5.0, 2.0, 0.0], [1.0, 3.0, -4.0, 0.0]]])  # [1, 2, 4]
    cache = {"blocks.0.hook_resid_post": acts}
    full = plots.activation_heatmap(cache, "blocks.0.hook_resid_post").to_dict()
    (heat,) = full["data"]
    assert heat["type"] == "heatmap"
    assert [list(r) for r in heat["z"]] == acts[0].tolist()
    assert list(heat["x"]) == [0, 1, 2, 3]
    assert _title(full["layout"]["xaxis"]) == "dimension"
    assert _title(full["layout"]["yaxis"]) == "token"
    assert list(full["layout"]["yaxis"]["ticktext"]) == ["0", "1"]  # no tokens: positions

    # Mean |activation| per dim: 1, 4, 3, 0 -> top 2 are dims 1 then 2.
    top = plots.activation_heatmap(
        cache, "blocks.0.hook_resid_post", top_k=2, tokens=[["x", "y"]]
    ).to_dict()
    (heat,) = top["data"]
    assert list(heat["x"]) == ["1", "2"]
    assert [list(r) for r in heat["z"]] == [[-5.0, 2.0], [3.0, -4.0]]
    assert "top 2" in _title(top["layout"]["xaxis"])
    assert list(top["layout"]["yaxis"]["ticktext"]) == ["x", "y"]


def test_activation_heatmap_drops_pads_and_names_missing_site(padded_cache):
    fig = plots.activation_heatmap(padded_cache, "blocks.1.hook_resid_pre", row=1).to_dict()
    assert [list(r) for r in fig["data"][0]["z"]] == [[6.0, 8.0], [6.0, 8.0]]
    with pytest.raises(KeyError, match="blocks.9.hook_resid_pre"):
        plots.activation_heatmap(padded_cache, "blocks.9.hook_resid_pre")


def test_projection_heatmap_single_direction(padded_cache):
    # Unit direction (0.6, 0.8): resid_post (0, L + 2) projects to 0.8 (L + 2).
    fig = plots.projection_heatmap(padded_cache, torch.tensor([3.0, 4.0]), row=1).to_dict()
    (heat,) = fig["data"]
    assert heat["type"] == "heatmap"
    assert list(heat["y"]) == [0, 1]
    assert [list(r) for r in heat["z"]] == [
        pytest.approx([1.6, 1.6]),
        pytest.approx([2.4, 2.4]),
    ]
    assert list(fig["layout"]["xaxis"]["ticktext"]) == ["&lt;s&gt;", "↵hi"]
    assert _title(fig["layout"]["xaxis"]) == "token"
    assert _title(fig["layout"]["yaxis"]) == "layer"


def test_projection_heatmap_per_site_directions(padded_cache):
    directions = {
        "blocks.1.hook_resid_pre": torch.tensor([0.0, -2.0]),  # (6, 8) -> -8
        "blocks.0.hook_resid_pre": torch.tensor([1.0, 0.0]),  # (3, 4) -> 3
        "blocks.7.hook_resid_pre": torch.tensor([1.0, 0.0]),  # not cached: left out
    }
    fig = plots.projection_heatmap(padded_cache, directions, row=0).to_dict()
    (heat,) = fig["data"]
    assert list(heat["y"]) == [0, 1]
    assert [list(r) for r in heat["z"]] == [[3.0, 3.0, 3.0], [-8.0, -8.0, -8.0]]
    with pytest.raises(ValueError, match="zero norm"):
        plots.projection_heatmap(padded_cache, torch.zeros(2))


def test_token_comparison_marks_differences_and_changes():
    fig = plots.token_comparison(
        [" I", " feel", " sad"], [" I", " feel", " happy", "!"], [0.0, -0.5, 2.0, 1.0]
    ).to_dict()
    (heat,) = fig["data"]
    assert heat["type"] == "heatmap"
    assert list(heat["y"]) == ["baseline", "steered"]
    assert list(heat["z"][1]) == [0.0, -0.5, 2.0, 1.0]
    assert list(heat["z"][0]) == [0.0] * 4
    assert [list(r) for r in heat["text"]] == [
        ["␣I", "␣feel", "␣sad", ""],
        ["␣I", "␣feel", "␣happy", "!"],
    ]
    assert heat["zmin"] == -2.0 and heat["zmax"] == 2.0
    # Positions 2 (sad/happy) and 3 (nothing/"!") differ, and only those are outlined.
    assert [(s["x0"], s["x1"]) for s in fig["layout"]["shapes"]] == [(1.5, 2.5), (2.5, 3.5)]
    assert fig["layout"]["title"]["text"] == "2 of 4 tokens differ"
    assert "Δ log p = +2.000" in heat["hovertext"][1][2]


def test_token_comparison_rejects_misaligned_changes():
    with pytest.raises(ValueError, match="2 log-prob changes for 3 steered tokens"):
        plots.token_comparison(["a"], ["a", "b", "c"], [0.0, 1.0])


def _sweep_records() -> list[dict]:
    records = []
    for alpha in (0.0, 2.0):
        for layer in (1, 3):
            for score in (alpha + layer, alpha + layer + 1):  # two repeats: mean + 0.5
                records.append(
                    {
                        "alpha": alpha,
                        "layer": layer,
                        "site": f"blocks.{layer}.hook_resid_pre",  # one site per layer
                        "score": score,
                        "perplexity": 10 * alpha + layer,
                        "kl": 0.0,
                    }
                )
    return records


@pytest.mark.parametrize("as_frame", [False, True], ids=["records", "dataframe"])
def test_sweep_heatmaps_grid(as_frame):
    records = _sweep_records()
    fig = plots.sweep_heatmaps(pd.DataFrame(records) if as_frame else records).to_dict()
    score, perplexity = fig["data"]
    assert score["type"] == perplexity["type"] == "heatmap"
    assert list(score["y"]) == [0.0, 2.0] and list(score["x"]) == [1, 3]
    assert [list(r) for r in score["z"]] == [[1.5, 3.5], [3.5, 5.5]]
    assert [list(r) for r in perplexity["z"]] == [[1.0, 3.0], [21.0, 23.0]]
    assert score["xaxis"] == "x" and perplexity["xaxis"] == "x2"
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert titles == ["score", "perplexity"]
    assert _title(fig["layout"]["xaxis"]) == _title(fig["layout"]["xaxis2"]) == "layer"
    assert _title(fig["layout"]["yaxis"]) == "alpha"
    # Each colourbar sits right of its own subplot.
    assert score["colorbar"]["x"] > fig["layout"]["xaxis"]["domain"][1]
    assert score["colorbar"]["x"] < fig["layout"]["xaxis2"]["domain"][0]


def test_sweep_heatmaps_sites_and_gaps():
    records = _sweep_records()
    other = {**records[0], "site": "blocks.5.hook_resid_post", "layer": 5, "score": 9.0}
    with pytest.raises(ValueError, match="several hook kinds"):
        plots.sweep_heatmaps([*records, other])
    fig = plots.sweep_heatmaps([*records, other], site="hook_resid_post", metrics=["score"])
    (heat,) = fig.to_dict()["data"]
    assert [list(r) for r in heat["z"]] == [[9.0]]
    gappy = plots.sweep_heatmaps(records[:2] + records[-2:], metrics=["score"]).to_dict()
    z = gappy["data"][0]["z"]
    assert z[0][1] is None or math.isnan(z[0][1])  # (alpha 0, layer 3) never ran


def test_paper_theme_registers_and_applies():
    previous = pio.templates.default
    try:
        plots.use_paper_theme()
        assert pio.templates.default == theme.TEMPLATE_NAME
        fig = go.Figure(go.Scatter(y=[1, 2]))
        assert fig.layout.template.layout.colorway == tuple(theme.PALETTE)
    finally:
        pio.templates.default = previous
    fig = theme.apply(go.Figure())
    assert fig.layout.template.layout.font.size == 14
    assert set(theme.PALETTE) <= set(theme.OKABE_ITO)


def test_steering_comparison_scores_the_change_against_the_unsteered_model():
    import steerlab as sl
    from steerlab.testing import char_tokenizer, tiny_model

    lm = sl.wrap(tiny_model("gpt2"), char_tokenizer())
    steer = sl.Steer("blocks.1.hook_resid_pre", torch.randn(lm.d_model), alpha=[0.0, 6.0])
    out = lm.generate("Hello there", steer, max_new_tokens=8, stop_at_eos=False)
    same = plots.steering_comparison(lm, out, baseline_row=0, steered_row=0).to_dict()
    # alpha 0 against the unsteered model: every token's log-prob change is ~0
    changes = [z for z in same["data"][0]["z"][-1] if z is not None]
    assert len(changes) == 8 and max(abs(z) for z in changes) < 1e-4
    steered = plots.steering_comparison(lm, out).to_dict()
    assert max(abs(z) for z in steered["data"][0]["z"][-1] if z is not None) > 1e-3
    assert "alpha 6" in steered["layout"]["title"]["text"]


def test_residual_norms_with_no_difference_says_so_instead_of_a_blank_box(padded_cache):
    fig = plots.residual_norms(padded_cache, steered=dict(padded_cache)).to_dict()
    heat = next(t for t in fig["data"] if t["type"] == "heatmap")
    assert heat["visible"] is False and heat["showscale"] is False
    notes = [a["text"] for a in fig["layout"]["annotations"]]
    assert "no difference: steered = baseline" in notes
    assert fig["layout"]["xaxis2"]["visible"] is False
    assert not any("row" in note for note in notes)  # no "row 0" in the titles
    different = plots.residual_norms(
        padded_cache, steered={k: 2 * v for k, v in padded_cache.items()}
    )
    assert next(t for t in different.data if t.type == "heatmap").visible is True


def test_long_token_axes_are_thinned_shortened_and_turned():
    from steerlab.plots._data import token_ticks

    labels = [f"token{i}_with_a_long_tail" for i in range(100)]
    ticks = token_ticks(labels)
    assert len(ticks["tickvals"]) <= 24 and ticks["tickvals"][0] == 0
    assert all(len(t) <= 8 and t.endswith("…") for t in ticks["ticktext"])
    assert ticks["tickangle"] == -45
    # Cut on the visible text ("<s><s><s>" -> "<s>…"), never inside an entity such as "&lt;".
    assert token_ticks(["&lt;s&gt;" * 3], max_chars=4)["ticktext"] == ["&lt;s&gt;…"]


def test_residual_norms_legend_sits_below_the_axis_titles(padded_cache):
    legend = plots.residual_norms(padded_cache).layout.legend
    assert (legend.yref, legend.y, legend.yanchor) == ("container", 0, "bottom")


def _perplexity_records(worst: float) -> list[dict]:
    return [
        {"alpha": a, "layer": layer, "site": f"blocks.{layer}.hook_resid_pre", "score": 0.5,
         "perplexity": worst if (a, layer) == (8.0, 2) else 5.0 + layer + a}
        for a in (0.0, 8.0) for layer in (1, 2)
    ]  # fmt: skip


def test_sweep_heatmaps_write_values_in_cells_and_log_scale_a_wide_perplexity():
    fig = plots.sweep_heatmaps(_perplexity_records(600.0))
    score, perplexity = fig.data
    assert [list(r) for r in score.text] == [["0.50", "0.50"], ["0.50", "0.50"]]
    assert score.texttemplate == "%{text}"
    assert [list(r) for r in perplexity.text] == [["6.00", "7.00"], ["14.0", "600"]]
    # Colours follow log10(perplexity); the colour bar is labelled in perplexity.
    assert perplexity.z[1][1] == pytest.approx(math.log10(600))
    assert perplexity.z[0][0] == pytest.approx(math.log10(6))
    ticks = dict(zip(perplexity.colorbar.ticktext, perplexity.colorbar.tickvals))
    assert ticks["100"] == pytest.approx(2.0) and ticks["10"] == pytest.approx(1.0)
    assert "log" in perplexity.colorbar.title.text
    assert list(perplexity.customdata[1]) == [14.0, 600.0]  # hover shows real values
    linear = plots.sweep_heatmaps(_perplexity_records(600.0), log_scale=()).data[1]
    assert linear.z[1][1] == 600.0
    narrow = plots.sweep_heatmaps(_perplexity_records(20.0)).data[1]
    assert narrow.z[1][1] == 20.0  # a narrow range stays linear


def test_leaderboard_keeps_tied_concepts_side_by_side():
    """Two concepts with the same score in a row: their markers sit at different heights
    inside the method's row, each under the method's own tick."""
    from types import SimpleNamespace

    board = [{"method": m, "score": s, "low": s, "high": s, "concepts": 2}
             for m, s in (("reft", 2.0), ("random", 1.0))]  # fmt: skip
    table = [{"method": m, "concept": c, "score": s, "factor": 1.0}
             for m, s in (("reft", 2.0), ("random", 1.0)) for c in ("happiness", "the sea")]  # fmt: skip
    fig = plots.leaderboard(SimpleNamespace(leaderboard=board, table=table))
    ticks = dict(zip(fig.layout.yaxis.ticktext, fig.layout.yaxis.tickvals))
    assert ticks["reft"] > ticks["random"]  # best on top
    markers = {trace.name: trace for trace in fig.data[1:]}
    for i, method in enumerate(["random", "reft"]):  # rows bottom to top
        ys = [markers[c].y[i] for c in ("happiness", "the sea")]
        assert [markers[c].x[i] for c in ("happiness", "the sea")][0] == markers["the sea"].x[i]
        assert ys[0] != ys[1]
        assert all(abs(y - ticks[method]) < 0.5 for y in ys)  # still in the method's row
