"""bench/*_published.json: every published figure says where it was read
or why it is unverified, and the tables mark the unverified ones."""

from __future__ import annotations

from benchscripts import load_bench

published = load_bench("published")


def test_every_figure_has_a_source_or_a_reason():
    for name in ("ogbg", "pooling"):
        for source, (protocol, table) in published.load(name).items():
            assert protocol, source
            for model, by_set in table.items():
                for dataset, figure in by_set.items():
                    where = (name, source, model, dataset)
                    assert " ± " in figure["value"] or \
                        figure["value"].replace(".", "").isdigit(), where
                    key = "source" if figure["verified"] else "reason"
                    assert figure.get(key), where


def test_unverified_figures_are_marked_and_explained():
    table = {"paper": ["10-fold CV", {"gin": {
        "NCI1": {"value": "80.0 ± 1.4", "verified": True, "source": "x"},
        "PROTEINS": {"value": "73.3 ± 4.0", "verified": False,
                     "reason": "y"}}}]}
    figures = table["paper"][1]["gin"]
    assert published.cell(figures["NCI1"]) == "80.0 ± 1.4"
    assert published.cell(figures["PROTEINS"]) == "73.3 ± 4.0 †"
    notes = published.notes(table)
    assert notes[0] == "- **paper**: 10-fold CV."
    assert notes[-1].startswith("- †: not verified")
    table["paper"][1]["gin"].pop("PROTEINS")
    assert len(published.notes(table)) == 1
