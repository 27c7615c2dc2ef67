"""Loading datasets from every supported source, column aliases, and validation before any judge call."""

import csv
import json

import datasets
import pandas as pd
import pytest

from offline_eval import DataError, EvaluationDataset, SingleTurnSample, ValidationError, evaluate
from offline_eval.dataset import load_rows, to_sample
from offline_eval.metrics.collections import AnswerAccuracy, Faithfulness
from scripted import ScriptedJudge

RECORDS = [
    {"user_input": "Who wrote Hamlet?",
     "retrieved_contexts": ["Hamlet is a tragedy by William Shakespeare.", "It was written around 1600."],
     "response": "Shakespeare wrote it.", "reference": "William Shakespeare wrote Hamlet.", "id": "q-1"},
    {"user_input": "北京是哪个国家的首都？", "retrieved_contexts": ["北京是中华人民共和国首都。"],
     "response": "北京是中国的首都。", "reference": "中国。", "id": "q-2"},
]

EXPECTED = [SingleTurnSample(**{k: v for k, v in r.items() if k != "id"}) for r in RECORDS]


def columns(records: list[dict]) -> dict[str, list]:
    return {key: [r[key] for r in records] for key in records[0]}


def write_lines(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def as_jsonl(tmp_path):
    return write_lines(tmp_path / "data.jsonl", [json.dumps(r, ensure_ascii=False) for r in RECORDS])


def as_json_list(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(RECORDS, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


def as_json_columns(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(columns(RECORDS), ensure_ascii=False), encoding="utf-8")
    return path


def as_csv_with_json_contexts(tmp_path):
    path = tmp_path / "data.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(RECORDS[0]))
        writer.writeheader()
        for r in RECORDS:
            writer.writerow({**r, "retrieved_contexts": json.dumps(r["retrieved_contexts"], ensure_ascii=False)})
    return path


def as_csv_from_pandas(tmp_path):
    path = tmp_path / "data.csv"
    pd.DataFrame(RECORDS).to_csv(path, index=False)  # writes list cells as Python reprs: ['a', 'b']
    return path


def as_parquet(tmp_path):
    path = tmp_path / "data.parquet"
    pd.DataFrame(RECORDS).to_parquet(path)
    return path


SOURCES = {
    "jsonl": as_jsonl,
    "json-list": as_json_list,
    "json-columns": as_json_columns,
    "csv-json-contexts": as_csv_with_json_contexts,
    "csv-from-pandas": as_csv_from_pandas,
    "parquet": as_parquet,
    "list-of-dicts": lambda tmp_path: [dict(r) for r in RECORDS],
    "dict-of-columns": lambda tmp_path: columns(RECORDS),
    "pandas": lambda tmp_path: pd.DataFrame(RECORDS),
    "hf-dataset": lambda tmp_path: datasets.Dataset.from_list(RECORDS),
}


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_gives_the_same_samples(source, tmp_path):
    rows = load_rows(SOURCES[source](tmp_path))
    assert [to_sample(r) for r in rows] == EXPECTED
    assert [r.number for r in rows] == [1, 2]
    assert [r.extra for r in rows] == [{"id": "q-1"}, {"id": "q-2"}]  # unscored columns are kept


def test_evaluation_dataset_constructors():
    assert EvaluationDataset.from_list(RECORDS).samples == EXPECTED
    assert EvaluationDataset.from_pandas(pd.DataFrame(RECORDS)).samples == EXPECTED
    assert EvaluationDataset.from_hf_dataset(datasets.Dataset.from_list(RECORDS)).samples == EXPECTED
    assert [to_sample(r) for r in load_rows(EvaluationDataset(EXPECTED))] == EXPECTED
    assert [to_sample(r) for r in load_rows(EXPECTED)] == EXPECTED  # a list of SingleTurnSample


def test_file_rows_remember_their_lines(tmp_path):
    jsonl = tmp_path / "data.jsonl"
    lines = [json.dumps(r, ensure_ascii=False) for r in RECORDS]
    jsonl.write_bytes("\ufeff".encode() + "\n\n".join(lines).encode() + b"\n")  # a BOM and a blank line
    assert [(r.number, r.line) for r in load_rows(jsonl)] == [(1, 1), (2, 3)]
    assert [(r.number, r.line) for r in load_rows(as_csv_with_json_contexts(tmp_path))] == [(1, 2), (2, 3)]


# ---- aliases ------------------------------------------------------------------------------------------

def test_ragas_01_column_names_are_aliases():
    # The shape of the article's `Dataset.from_dict(eval_data)`, plus a ground truth.
    rows = load_rows({
        "question": ["公司的远程办公申请审批流是怎样的？"],
        "contexts": [["员工需在 OA 系统提交远程办公申请，由直属 Leader 审批后抄送 HR 备案。"]],
        "answer": ["您需要在 OA 提单，直属主管审批通过并抄送 HR 即可生效。"],
        "ground_truth": ["在 OA 提交申请，直属 Leader 审批，抄送 HR。"],
    })
    assert to_sample(rows[0]) == SingleTurnSample(
        user_input="公司的远程办公申请审批流是怎样的？",
        retrieved_contexts=["员工需在 OA 系统提交远程办公申请，由直属 Leader 审批后抄送 HR 备案。"],
        response="您需要在 OA 提单，直属主管审批通过并抄送 HR 即可生效。",
        reference="在 OA 提交申请，直属 Leader 审批，抄送 HR。",
    )
    assert rows[0].extra == {}


@pytest.mark.parametrize("make", [list, pd.DataFrame, datasets.Dataset.from_list])
def test_a_ground_truths_list_becomes_one_reference(make):
    (row,) = load_rows(make([{"question": "q", "answer": "a", "ground_truths": ["First fact.", "Second fact."]}]))
    assert row.data["reference"] == "First fact.\nSecond fact."


@pytest.mark.parametrize("record", [
    {"response": "canonical", "answer": "alias"},
    {"answer": "alias", "response": "canonical"},
    {"answer": "alias", "response": "canonical", "ground_truth": "alias", "reference": "canonical"},
])
def test_the_canonical_name_wins_over_its_alias(record):
    (row,) = load_rows([record])
    assert row.data["response"] == "canonical"
    assert row.data.get("reference", "canonical") == "canonical"


def test_a_missing_canonical_value_falls_back_to_the_alias():
    (row,) = load_rows(pd.DataFrame([{"response": None, "answer": "alias"}]))
    assert row.data["response"] == "alias"


# ---- data that cannot be read -------------------------------------------------------------------------

def test_malformed_jsonl_line_is_named(tmp_path):
    path = write_lines(tmp_path / "data.jsonl", [json.dumps(RECORDS[0]), "", '{"user_input": "q", "response": '])
    with pytest.raises(DataError, match=r"data\.jsonl line 3\b"):
        load_rows(path)


def test_jsonl_line_that_is_not_an_object_is_named(tmp_path):
    path = write_lines(tmp_path / "data.jsonl", [json.dumps(RECORDS[0]), '["q", "a"]'])
    with pytest.raises(DataError, match=r"row 2 \(line 2\)"):
        load_rows(path)


def test_malformed_json_file_names_the_line(tmp_path):
    path = write_lines(tmp_path / "data.json", ["[", '  {"user_input": "q"},', '  {"user_input": }', "]"])
    with pytest.raises(DataError, match=r"line 3\b"):
        load_rows(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_non_utf8_file_names_the_line(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    first = b'{"user_input": "q", "response": "r"}\n' if suffix == ".jsonl" else b"user_input,response\n"
    path.write_bytes(first + "caf\u00e9,ok\n".encode("latin-1"))  # line 2 fails to decode, before parsing
    with pytest.raises(DataError, match=r"line 2\b.*UTF-8"):
        load_rows(path)


@pytest.mark.parametrize("source, problem", [
    ("no/such/file.jsonl", "no such file"),
    ({"user_input": ["a", "b"], "response": ["x"]}, "different lengths"),
    ({"user_input": "a", "response": ["x"]}, "not a list: user_input"),
    (42, "cannot read"),
])
def test_unreadable_sources(source, problem):
    with pytest.raises(DataError, match=problem):
        load_rows(source)


def test_unknown_file_type(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("hello", encoding="utf-8")
    with pytest.raises(DataError, match="unknown file type"):
        load_rows(path)


# ---- validation before any judge call -----------------------------------------------------------------

def good(**changes) -> dict:
    return {**RECORDS[0], **changes}


# JSONL lines (None: a blank line) and the errors each bad row must produce: (row, line, field).
CHECKED_LINES = [
    good(),  # row 1, line 1
    None,  # line 2
    {k: v for k, v in good().items() if k != "response"},  # row 2, line 3: missing
    good(user_input="   "),  # row 3, line 4: empty
    good(retrieved_contexts="Hamlet is a tragedy."),  # row 4, line 5: a string, not a list
    good(retrieved_contexts=["", " "], response=42),  # row 5, line 6: no non-empty context; not a string
    good(id="q-6"),  # row 6, line 7
    good(retrieved_contexts=["fine", 7]),  # row 7, line 8: an item is not a string
    good(rubrics={"score1_description": "only one level"}),  # row 8, line 9: rubric keys
    good(reference=None),  # row 9, line 10: null counts as missing
]
EXPECTED_ERRORS = {
    (2, 3, "response"), (3, 4, "user_input"), (4, 5, "retrieved_contexts"), (5, 6, "retrieved_contexts"),
    (5, 6, "response"), (7, 8, "retrieved_contexts"), (8, 9, "rubrics"), (9, 10, "reference"),
}
BAD_ROWS = {row for row, _, _ in EXPECTED_ERRORS}


def checked_file(tmp_path):
    lines = ["" if rec is None else json.dumps(rec, ensure_ascii=False) for rec in CHECKED_LINES]
    return write_lines(tmp_path / "checked.jsonl", lines)


def agreeable_judge() -> ScriptedJudge:
    """Every claim is "The answer is right." and supported; every rating is the top one."""
    answers = {"claims": {"claims": ["The answer is right."]}, "judge1": "4", "judge2": "4"}
    return ScriptedJudge(lambda request: answers.get(request.tag, "yes"))


def run(source, judge, **options):
    return evaluate(source, metrics=[Faithfulness(), AnswerAccuracy()], llm=judge, show_progress=False, **options)


def test_every_invalid_field_is_reported_before_any_judge_call(tmp_path):
    judge = agreeable_judge()
    with pytest.raises(ValidationError) as info:
        run(checked_file(tmp_path), judge)
    assert {(e.row.number, e.row.line, e.field) for e in info.value.errors} == EXPECTED_ERRORS
    message = str(info.value)
    for row, line, field in EXPECTED_ERRORS:
        assert f"row {row} (line {line}): field '{field}'" in message
    assert judge.requests == []


def test_in_memory_rows_are_reported_by_row_number():
    judge = agreeable_judge()
    with pytest.raises(ValidationError, match=r"row 2: field 'reference' is missing"):
        run([good(), good(reference=None)], judge)
    assert judge.requests == []


def test_skip_invalid_scores_the_other_rows(tmp_path):
    judge = agreeable_judge()
    result = run(checked_file(tmp_path), judge, skip_invalid=True)
    records = result.records()
    skipped = {r["row"]: r["skipped"] for r in records if "skipped" in r}
    assert set(skipped) == BAD_ROWS
    for row, _, field in EXPECTED_ERRORS:
        assert any(f"field '{field}'" in message for message in skipped[row])
    scored = [r for r in records if "metrics" in r]
    assert [(r["row"], r["line"]) for r in scored] == [(1, 1), (6, 7)]
    assert scored[1]["id"] == "q-6"
    assert result["faithfulness"] == 1.0 and result["answer_accuracy"] == 1.0
    frame = result.to_pandas()
    assert len(frame) == len(BAD_ROWS) + 2
    assert frame["faithfulness"].isna().tolist() == [r["row"] in BAD_ROWS for r in records]


def test_extra_columns_are_kept_in_the_output(tmp_path):
    source = write_lines(tmp_path / "data.jsonl",
                         [json.dumps({**r, "notes": f"note {i}"}, ensure_ascii=False) for i, r in enumerate(RECORDS)])
    result = run(source, agreeable_judge())
    assert [(r["id"], r["notes"]) for r in result.records()] == [("q-1", "note 0"), ("q-2", "note 1")]
    assert result.to_pandas()[["id", "notes"]].values.tolist() == [["q-1", "note 0"], ["q-2", "note 1"]]


def test_ground_truths_lists_in_a_pandas_csv_are_joined_like_everywhere_else(tmp_path):
    rows = {"question": ["q"], "answer": ["a"], "contexts": [["c1", "c2"]], "ground_truths": [["r1", "r2"]]}
    pd.DataFrame(rows).to_csv(tmp_path / "d.csv", index=False)
    from_csv = load_rows(tmp_path / "d.csv")[0].data
    assert from_csv == load_rows(rows)[0].data == {"user_input": "q", "response": "a",
                                                    "retrieved_contexts": ["c1", "c2"], "reference": "r1\nr2"}


# ---- the default metric set on rows with different fields ----------------------------------------------

RETRIEVAL_ROWS = [
    dict(user_input="q1", retrieved_contexts=["c1"], reference="r1"),
    dict(user_input="q2", retrieved_contexts=["c2"]),
    dict(user_input="q3", retrieved_contexts=["c3"], reference="  "),  # blank: lacks it too
]


def yes_judge() -> ScriptedJudge:
    return ScriptedJudge(lambda r: {"claims": ["A claim."]} if r.tag == "reference_claims" else r.constraint.options[0])


def test_default_metrics_score_each_metric_on_the_rows_that_have_its_fields():
    judge = yes_judge()
    result = evaluate(RETRIEVAL_ROWS, llm=judge, show_progress=False)
    assert result.metric_names == ["context_relevance", "context_precision", "context_recall"]
    assert None not in result.values("context_relevance")  # one row with a reference invalidates no other row
    for name in ("context_precision", "context_recall"):
        assert result.values(name)[0] is not None and result.values(name)[1:] == [None, None]
        assert [res[name].reason for n, res in result.results.items() if n > 1] == ["row lacks reference"] * 2
        assert result.summary()[name]["coverage"] == pytest.approx(1 / 3)
    # the judge never saw a reference-less row for a metric that needs one
    assert {r.tag for r in judge.requests if "q2" in r.messages[-1][1] or "q3" in r.messages[-1][1]} == {
        "judge1", "judge2"}


def test_a_row_with_the_fields_of_no_default_metric_is_invalid():
    with pytest.raises(ValidationError, match=r"row 2: field 'retrieved_contexts' is missing"):
        evaluate([RETRIEVAL_ROWS[0], dict(user_input="q2")], llm=yes_judge(), show_progress=False)


def test_named_metrics_still_need_their_fields_on_every_row():
    with pytest.raises(ValidationError, match=r"row 2: field 'reference' is missing"):
        evaluate(RETRIEVAL_ROWS, metrics=["context_recall"], llm=yes_judge(), show_progress=False)
