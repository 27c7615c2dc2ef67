"""Labelled sets: the BEGIN loader on the real file, generic label columns, subsets, the positive class."""

import json
from pathlib import Path

import numpy as np
import pytest

from offline_eval.dataset import DataError
from offline_eval.comparison.labels import is_begin, load_labelled, positive
from shared_data import BEGIN

needs_begin = pytest.mark.skipif(not BEGIN.exists(), reason="the BEGIN dev file is not on this machine")


@needs_begin
def test_begin_file_is_detected_and_its_first_rows_map_to_metric_inputs():
    assert is_begin(BEGIN)
    labelled = load_labelled(BEGIN)
    assert labelled.format == "begin" and labelled.metrics == ["faithfulness", "response_groundedness"]
    first = labelled.rows[0]
    assert first.data["retrieved_contexts"][0].startswith("originally an industrial pigment supply company, crayola")
    assert first.data["user_input"].startswith("strange name, but it makes sense")
    assert first.data["response"].startswith("crayola shifted its focus to art products")
    assert first.extra == {"model_name": "t5", "data_source": "wow"} and first.line == 2
    assert labelled.labels["faithfulness"][:3] == [1.0, 0.0, 1.0]  # Fully / Not fully / Fully attributable
    assert len(labelled) == 430 and sum(labelled.labels["faithfulness"]) == 180


def test_begin_generic_maps_to_negative_and_unknown_labels_fail(tmp_path):
    header = "model_name\tdata_source\tknowledge\tmessage\tresponse\tbegin_label\r\n"
    path = tmp_path / "begin.tsv"
    path.write_text(header + 'gpt2\twow\tK "quoted"\tM\tR\tGeneric\r\nt5\twow\tK2\tM2\tR2\tFully attributable',
                    encoding="utf-8")
    labelled = load_labelled(path)
    assert labelled.labels["response_groundedness"] == [0.0, 1.0]
    assert labelled.rows[0].data["retrieved_contexts"] == ['K "quoted"']  # quotes are literal in BEGIN
    path.write_text(header + "gpt2\twow\tK\tM\tR\tmaybe\r\n", encoding="utf-8")
    with pytest.raises(DataError, match="unknown begin_label 'maybe'"):
        load_labelled(path)


def test_generic_jsonl_label_columns_aliases_and_unlabelled_rows(tmp_path):
    rows = [
        {"question": "q1", "contexts": ["c1"], "answer": "a1", "faithfulness_label": 1, "groundedness_label": 2, "id": "x"},
        {"question": "q2", "contexts": ["c2"], "answer": "a2", "faithfulness_label": None, "groundedness_label": 0},
        {"question": "q3", "contexts": ["c3"], "answer": "a3", "faithfulness_label": 0, "groundedness_label": 1},
    ]
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    labelled = load_labelled(path)
    assert labelled.format == "generic"
    assert labelled.labels == {"faithfulness": [1.0, None, 0.0], "response_groundedness": [2.0, 0.0, 1.0]}
    assert labelled.rows[0].data == {"user_input": "q1", "retrieved_contexts": ["c1"], "response": "a1"}
    assert labelled.rows[0].extra == {"id": "x"}  # label columns are kept apart from the rows
    rows_f, y = labelled.labelled("faithfulness")
    assert [r.number for r in rows_f] == [1, 3] and y.tolist() == [1.0, 0.0]


def test_generic_csv_labels_are_numbers_and_bad_ones_name_the_row(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text("user_input,response,reference,answer_accuracy_label\nq,a,r,1\nq2,a2,r2,\n", encoding="utf-8")
    assert load_labelled(path).labels == {"answer_accuracy": [1.0, None]}
    path.write_text("user_input,response,reference,answer_accuracy_label\nq,a,r,yes\n", encoding="utf-8")
    with pytest.raises(DataError, match="row 1 \\(line 2\\): label 'answer_accuracy_label' must be a number"):
        load_labelled(path)
    path.write_text("user_input,response,label\nq,a,1\n", encoding="utf-8")
    with pytest.raises(DataError, match="no label columns"):
        load_labelled(path)


@needs_begin
def test_subset_is_seeded_and_matches_the_script_order():
    pd = pytest.importorskip("pandas")
    labelled = load_labelled(BEGIN)
    sub = labelled.subset(6, seed=3)
    df = pd.read_csv(BEGIN, sep="\t", quoting=3, keep_default_na=False, dtype=str).sample(frac=1.0, random_state=3)
    assert [r.number for r in sub.rows] == (df.index[:6] + 1).tolist()
    assert [r.number for r in labelled.subset(3, seed=3, offset=3).rows] == [r.number for r in sub.rows[3:]]
    assert sub.labels["faithfulness"] == [1.0 if x.strip() == "Fully attributable" else 0.0 for x in df.begin_label[:6]]


def test_positive_class_binary_and_graded():
    assert positive([0, 1, 1]).tolist() == [False, True, True]
    assert positive([0, 1, 2]).tolist() == [False, False, True]  # above the middle of the scale only
    assert positive(np.array([1, 3, 4, 5])).tolist() == [False, False, True, True]
