"""`offline-eval view`: the results index (paging, sort, filter), the labels store (crash-safe, in the format
`compare --labels` reads), the messages at start, and the real app in headless Chromium (Playwright driving
Debian's Chromium): filter, open a sample, label with the keyboard, reload, and hand the labels to compare."""

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from offline_eval import evaluate
from offline_eval.comparison.compare import CompareSettings, analyse, run_judges
from offline_eval.dataset import DataError
from offline_eval.engines.base import JudgeOutput
from offline_eval.comparison.labels import load_labelled
from offline_eval.viewer.index import Query, ResultsIndex
from offline_eval.viewer.labels_store import LabelsStore
from offline_eval.viewer.server import Viewer, make_server
from scripted import ScriptedJudge, user_text
from test_compare import CHROMIUM, assert_not_blank, cli, needs_chromium, oracle, scripted

METRICS = ["faithfulness", "response_groundedness"]


class RiverJudge(ScriptedJudge):
    """Sample i: one claim (true for even i, false for odd), two ratings that disagree on every third sample,
    probabilities throughout, and a failed second rating on sample 4 (as an input too long would give)."""

    def __init__(self, shift: int = 0):
        super().__init__(self.answer_for)
        self.shift = shift  # another judge: moves every rating by `shift`

    @staticmethod
    def number(request) -> int:
        return int(user_text(request).split("river Ulm")[1].split()[0].rstrip("."))

    def answer_for(self, request):
        i = self.number(request)
        if request.tag == "claims":
            return {"claims": [f"The river Ulm{i} is {i + 3 if i % 2 == 0 else 99} km long."]}
        if request.tag.startswith("judge"):
            top = str(min(2, (i % 3 if request.tag == "judge1" else 2) + self.shift))
            return {k: (0.8 if k == top else 0.1) for k in "012"}
        return {"yes": 0.9, "no": 0.1} if i % 2 == 0 else {"yes": 0.2, "no": 0.8}

    def generate(self, requests, progress=None):
        outputs = []
        for r in requests:
            if r.tag == "judge2" and self.number(r) == 4:
                self.requests.append(r)
                outputs.append(JudgeOutput(text="", value=None, finish_reason="length", meta={"error": "input too long"}))
            else:
                outputs += super().generate([r])
        return outputs


def river_rows(n: int) -> list[dict]:
    return [{"user_input": f"How long is the river Ulm{i} ?", "retrieved_contexts": [f"The river Ulm{i} is {i + 3} km long."],
             "response": f"The river Ulm{i} is {i + 3 if i % 2 == 0 else 99} km long.", "reference": f"{i + 3} km"}
            for i in range(n)]


def write_results(path: Path, n: int = 12, shift: int = 0, rows: list[dict] | None = None) -> Path:
    result = evaluate(rows or river_rows(n), metrics=METRICS, llm=RiverJudge(shift), show_progress=False)
    result.write_jsonl(path)
    return path


# ---- the index ------------------------------------------------------------------------------------------

def test_index_pages_sorts_and_filters(tmp_path):
    index = ResultsIndex.build(write_results(tmp_path / "run.jsonl"))
    assert len(index) == 12 and index.metrics == METRICS and index.rows.tolist() == list(range(1, 13))
    faith = index.values["faithfulness"]
    by_score = index.select(Query("faithfulness", sort="score"))
    assert faith[by_score].tolist() == sorted(faith.tolist())
    down = index.select(Query("faithfulness", sort="score", descending=True))
    assert faith[down].tolist() == sorted(faith.tolist(), reverse=True)
    low = index.select(Query("faithfulness", lo=0.0, hi=0.5))
    assert len(low) == 6 and all(index.rows[p] % 2 == 0 for p in low)  # rows 2, 4, ...: sample 1, 3, ... (odd)
    assert index.rows[index.select(Query("response_groundedness", failed=True))].tolist() == [5]  # sample 4
    disagree = index.select(Query("response_groundedness", disagree=True))
    assert 5 not in index.rows[disagree].tolist() and len(disagree) == 7  # every i % 3 != 0, but i == 4 (failed)
    # the judge's confidence: its least sure choice; P(yes) 0.9 on even samples, P(no) 0.8 on odd ones
    unsure = index.select(Query("faithfulness", unsure=0.85))
    assert index.rows[unsure].tolist() == [2, 4, 6, 8, 10, 12]
    assert len(index.select(Query("faithfulness", unsure=0.8))) == 0  # strictly below the cut
    assert len(index.select(Query(unsure=0.85))) == 12  # any metric: every rating's top option has 0.8
    grounded = index.values["response_groundedness"]
    order = grounded[index.select(Query("response_groundedness", sort="score"))]
    assert [v for v in order.tolist() if v == v] == sorted(v for v in grounded.tolist() if v == v)
    assert index.record(int(by_score[0]))["row"] == int(index.rows[by_score[0]])  # read back from disk by offset

    viewer = Viewer(index, LabelsStore(tmp_path / "labels.jsonl", index))
    first, second = (viewer.rows({"offset": str(o), "limit": "5", "metric": "faithfulness", "sort": "score"})
                     for o in (0, 5))
    assert first["total"] == 12 and [r["row"] for r in first["rows"] + second["rows"]] == index.rows[by_score[:10]].tolist()
    assert first["rows"][0]["inputs"]["user_input"].startswith("How long is the river")


def test_index_of_a_large_file_is_small_and_fast(tmp_path):
    """20,000 rows (from one real record, renumbered): indexed in seconds; a sorted, filtered page in ms."""
    line = write_results(tmp_path / "one.jsonl", 1).read_text().splitlines()[0]
    record = json.loads(line)
    big = tmp_path / "big.jsonl"
    with open(big, "w") as f:
        for row in range(1, 20_001):
            record["row"] = row
            record["metrics"]["faithfulness"]["value"] = (row * 7919 % 1000) / 1000
            f.write(json.dumps(record) + "\n")
    start = time.perf_counter()
    index = ResultsIndex.build(big)
    built = time.perf_counter() - start
    viewer = Viewer(index, LabelsStore(tmp_path / "labels.jsonl", index))
    start = time.perf_counter()
    page = viewer.rows({"offset": "10000", "limit": "50", "metric": "faithfulness", "sort": "score", "lo": "0.2"})
    paged = time.perf_counter() - start
    assert page["total"] == 16_000 and len(page["rows"]) == 50
    assert built < 20 and paged < 0.5, (built, paged)
    assert index.offsets.nbytes + sum(v.nbytes for v in index.values.values()) < 2_000_000  # numbers, no records


# ---- the labels store -----------------------------------------------------------------------------------

def two_labels(tmp_path: Path) -> tuple[ResultsIndex, Path, LabelsStore]:
    """A 12-row run and its labels store, with faithfulness labelled on rows 1 (supported) and 2 (not)."""
    index = ResultsIndex.build(write_results(tmp_path / "run.jsonl"))
    path = tmp_path / "labels.jsonl"
    store = LabelsStore(path, index)
    store.set_label(1, "faithfulness", 1)
    store.set_label(2, "faithfulness", 0)
    return index, path, store


def test_labels_are_saved_at_once_in_the_format_compare_reads(tmp_path):
    index, path, store = two_labels(tmp_path)
    store.set_label(2, "response_groundedness", 1)
    store.set_note(3, "unclear question")
    store.set_label(4, "faithfulness", 1)
    store.set_label(4, "faithfulness", None)  # unlabelled again: the row leaves the file
    with pytest.raises(ValueError, match="one of 0, 1"):
        store.set_label(1, "faithfulness", 2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["results_row"] for e in lines] == [1, 2, 3] and not (tmp_path / "labels.jsonl.tmp").exists()
    labelled = load_labelled(path)  # compare's own reader
    assert labelled.labels == {"faithfulness": [1.0, 0.0, None], "response_groundedness": [None, 1.0, None]}
    assert labelled.rows[0].data["user_input"] == "How long is the river Ulm0 ?"
    assert labelled.rows[2].extra["note"] == "unclear question"

    again = LabelsStore(path, index)  # reopened: resumes
    assert again.labels(2) == {"faithfulness": 0, "response_groundedness": 1} and again.note(3) == "unclear question"
    assert again.labelled_rows() == {1, 2}


def test_labels_store_tolerates_a_cut_last_line_and_refuses_other_data(tmp_path):
    index, path, store = two_labels(tmp_path)
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:40])  # a crash while something appended a line
    cut = LabelsStore(path, index)
    assert cut.labelled_rows() == {1, 2} and "line 3 is cut short" in cut.warning
    cut.set_label(3, "faithfulness", 1)  # the next save writes whole lines again
    assert len(load_labelled(path).rows) == 3

    path.write_text(whole.splitlines()[0][:40] + "\n" + whole)
    with pytest.raises(DataError, match="line 1: not valid JSON"):
        LabelsStore(path, index)

    other = ResultsIndex.build(write_results(tmp_path / "other.jsonl", rows=[
        {**r, "user_input": r["user_input"].replace("river", "lake")} for r in river_rows(12)]))
    path.write_text(whole)
    with pytest.raises(DataError, match="not labels for .*other.jsonl: 2 of its 2 rows.*another data set"):
        LabelsStore(path, other)


# ---- messages at start ----------------------------------------------------------------------------------

def test_bad_inputs_get_a_clear_message_and_exit_2(tmp_path):
    good = write_results(tmp_path / "run.jsonl")
    lines = good.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:2] + ['{"row": 3, "metrics": {'] + lines[3:]) + "\n")
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(lines[:5]) + "\n")
    twice = tmp_path / "twice.jsonl"
    twice.write_text("\n".join(lines[:3] + [""] + lines[1:2]) + "\n")  # row 2 again, after a blank line
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"results_row": 1, "user_input": "something else", "faithfulness_label": 1}) + "\n")
    cases = [((str(bad),), "bad.jsonl line 3: not valid JSON"),
             ((str(tmp_path / "none.jsonl"),), "cannot read"),
             ((str(good), str(other)), "the two runs are not over the same rows: 7 row(s) only in"),
             ((str(good), "--labels", str(labels)), "is not labels for"),
             ((str(tmp_path / "x.parquet"),), "`view` reads JSONL results"),
             ((str(twice),), "twice.jsonl line 5: row 2 again (first on line 2)")]
    for args, message in cases:
        proc = cli("view", *args, "--port", "0", cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


# ---- the real app in Chromium ---------------------------------------------------------------------------

@pytest.fixture
def serve():
    """serve(viewer) -> its URL; the servers stop after the test."""
    servers = []

    def start(viewer: Viewer) -> str:
        server = make_server(viewer, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def browser(tmp_path):
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = chromium.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(10_000)
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.requests = requests
        yield page
        chromium.close()


def labels_in_list(page) -> dict[int, str]:
    return page.eval_on_selector_all("tr.sample", "rows => Object.fromEntries(rows.map(r => "
                                     "[r.dataset.row, r.querySelector('td.labels').textContent.trim()]))")


@needs_chromium
def test_browse_filter_explain_label_reload_and_compare(tmp_path, serve, browser):
    results = write_results(tmp_path / "run.jsonl")
    labels = tmp_path / "run.labels.jsonl"
    url = serve(Viewer.open(results, labels=labels))
    page = browser
    page.goto(url)
    page.wait_for_selector("tr.sample.current")
    assert page.locator("tr.sample").count() == 12
    assert page.locator("tr.sample.current").get_attribute("data-row") == "1"  # nothing labelled: the first row

    # filter: faithfulness from 0 to 0.5 -> the six unfaithful samples; sorted by score
    page.fill("#lo", "0")
    page.fill("#hi", "0.5")
    page.locator("#hi").dispatch_event("change")
    page.wait_for_function("document.querySelectorAll('tr.sample').length === 6")
    assert page.text_content("#page") == "1–6 of 6"
    page.check("#failed")
    page.select_option("#metric", "response_groundedness")
    page.wait_for_function("document.querySelectorAll('tr.sample').length === 1")
    page.fill("#lo", "")
    page.fill("#hi", "")
    page.locator("#hi").dispatch_event("change")
    page.wait_for_function("document.querySelectorAll('tr.sample').length === 1")
    assert page.locator("tr.sample").get_attribute("data-row") == "5"  # the failed call
    assert "1 failed call(s)" in page.text_content("#detail")
    page.uncheck("#failed")
    page.select_option("#metric", "faithfulness")
    page.wait_for_function("document.querySelectorAll('tr.sample').length === 12")
    page.fill("#unsure-below", "0.85")
    page.check("#unsure")  # the judge was unsure of a verdict: the odd samples' P(no) 0.8
    page.wait_for_function("document.querySelectorAll('tr.sample').length === 6")
    assert [page.locator("tr.sample").nth(i).get_attribute("data-row") for i in range(6)] == ["2", "4", "6", "8", "10", "12"]
    page.uncheck("#unsure")
    page.wait_for_function("document.querySelectorAll('tr.sample').length === 12")

    # open a sample: its reason, claim with verdict and probability, ratings and raw judge calls
    page.click('tr.sample[data-row="2"]')
    page.wait_for_selector("#detail h2:has-text('Row 2')")
    detail = page.locator("#detail")
    assert "[not supported] The river Ulm1 is 99 km long." in detail.text_content()
    assert "P(yes 0.20, no 0.80)" in detail.text_content() and "ratings: 1, 2" in detail.text_content()
    assert page.locator("details.calls").count() == 2
    shot = tmp_path / "view.png"
    page.screenshot(path=str(shot))
    assert_not_blank(shot)
    for selector in ("#controls", "tr.sample", "#detail .metric", "#detail pre.reason"):
        assert page.locator(selector).first.is_visible(), selector

    # label three rows with the keyboard: 1 (supported), 0, 1; each moves to the next row
    page.click('tr.sample[data-row="1"]')
    page.wait_for_selector("#detail h2:has-text('Row 1')")
    for key in "101":
        page.keyboard.press(key)
        time.sleep(0.05)
    page.wait_for_selector("tr.sample.current[data-row='4']")
    page.keyboard.press("n")
    page.keyboard.type("check the length")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelector('tr.sample.current td.labels').textContent.includes('✎')")
    assert labels_in_list(page)["1"] == "✓" and labels_in_list(page)["2"] == "✗"
    saved = [json.loads(line) for line in labels.read_text().splitlines()]
    assert [(e["results_row"], e.get("faithfulness_label")) for e in saved] == [(1, 1), (2, 0), (3, 1), (4, None)]

    # reload: the labels come back and the page opens at the first row without a label
    page.reload()
    page.wait_for_selector("tr.sample.current")
    assert page.locator("tr.sample.current").get_attribute("data-row") == "4"
    shown = labels_in_list(page)
    assert (shown["1"], shown["2"], shown["3"], shown["4"], shown["5"]) == ("✓", "✗", "✓", "✎", "")
    assert page.input_value("#note") == "check the length"
    assert "3 of 12 samples labelled" in page.text_content("#progress")
    assert all(u.startswith(url) for u in page.requests)  # nothing fetched from anywhere else

    # the labels file goes to compare as it is
    labelled = load_labelled(labels)
    assert labelled.labels["faithfulness"] == [1.0, 0.0, 1.0, None]
    settings = CompareSettings(resamples=20, metrics=["faithfulness"])
    judge = scripted(oracle, "oracle", 1)
    analysis = analyse(labelled, run_judges(labelled, ["oracle"], settings, loader=lambda name: judge), settings)
    assert analysis["metrics"]["faithfulness"]["judges"]["oracle"]["n"] == 3


@needs_chromium
def test_two_runs_side_by_side_largest_differences_first(tmp_path, serve, browser):
    a = write_results(tmp_path / "a.jsonl")
    b = write_results(tmp_path / "b.jsonl", shift=1)
    viewer = Viewer.open(a, b)
    url = serve(viewer)
    page = browser
    page.goto(url)
    page.wait_for_selector("tr.sample.current")
    assert page.input_value("#sort") == "diff" and page.is_checked("#desc")
    page.select_option("#metric", "response_groundedness")
    page.wait_for_selector("tr.sample.current")
    diffs = [abs(float(t.replace("+", ""))) for t in page.locator("td.diff").all_text_contents() if t != "–"]
    assert diffs == sorted(diffs, reverse=True) and diffs[0] > 0
    assert page.locator("#detail .runs").count() == 2  # A and B per metric
    shot = tmp_path / "compare.png"
    page.screenshot(path=str(shot))
    assert_not_blank(shot)


def test_only_loopback_requests_and_json_posts_are_answered(tmp_path, serve):
    """On loopback the viewer refuses another Host (DNS rebinding) and a POST that a web form could send."""
    import urllib.error
    import urllib.request

    from offline_eval.viewer.server import is_loopback

    url = serve(Viewer.open(write_results(tmp_path / "run.jsonl", 2)))
    assert json.loads(urllib.request.urlopen(url + "api/meta").read())["rows"] == 2
    requests = [urllib.request.Request(url + "api/meta", headers={"Host": "rebound.example:80"}),
                urllib.request.Request(url + "api/label", data=b"row=1&metric=faithfulness&value=1",
                                       headers={"Content-Type": "application/x-www-form-urlencoded"})]
    for request, status in zip(requests, (403, 415)):
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request)
        assert error.value.code == status
    assert not (tmp_path / "run.labels.jsonl").exists()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
