"""Judge comparison: the runner and its statistics with scripted judges (labels never reach a judge), the
report files and their HTML rendered in headless Chromium, `offline-eval report`, and the `compare` command
end to end with the real SmolLM2 judge on a few BEGIN rows."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from offline_eval import evaluate
from offline_eval.comparison.compare import CompareSettings, analyse, run_judges, write_outputs
from offline_eval.dataset import DataError
from offline_eval.comparison.labels import load_labelled
from scripted import ScriptedJudge, user_text
from shared_data import BEGIN

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "offline_eval.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args, page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)


# ---- scripted judges ------------------------------------------------------------------------------------

def grounded_rows(n: int = 12) -> list[dict]:
    """BEGIN-like rows: even rows repeat the knowledge (attributable), odd rows do not."""
    rows = []
    for i in range(n):
        knowledge = f"Fact number {i}: the river Ulm{i} is {i + 3} km long."
        response = knowledge if i % 2 == 0 else f"I think the river Ulm{i} is famous for its fish."
        rows.append({"knowledge": knowledge, "message": f"Tell me about river {i}", "response": response,
                     "label": "Fully attributable" if i % 2 == 0 else ("Generic" if i % 4 == 1 else "Not fully attributable")})
    return rows


def write_begin(path: Path, rows: list[dict]) -> Path:
    lines = ["model_name\tdata_source\tknowledge\tmessage\tresponse\tbegin_label"]
    lines += [f"SECRET-MODEL\twow\t{r['knowledge']}\t{r['message']}\t{r['response']}\t{r['label']}" for r in rows]
    path.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    return path


def oracle(request):
    """Rates a response grounded exactly when the knowledge contains it; one claim per response."""
    text = user_text(request)
    if request.tag == "claims":
        return {"claims": [text.rsplit("Text: ", 1)[1][:150]]}
    said = text.rsplit("Assertion: ", 1)[-1].rsplit("Claim: ", 1)[-1]  # the response, or one of its claims
    grounded = said.startswith("Fact number")
    if request.tag.startswith("judge"):
        return "2" if grounded else "0"
    return "yes" if grounded else "no"


def scripted(answer, name: str, size: int) -> ScriptedJudge:
    judge = ScriptedJudge(answer)
    judge.identity = {"engine": "scripted", "model": name, "weights_size": size}
    return judge


def scripted_judges():
    """A loader for two scripted judges: one that knows the labels' answers, one that always says the same."""
    judges = {"oracle": scripted(oracle, "oracle", 2_000),
              "coin": scripted(lambda r: {"claims": ["x"]} if r.tag == "claims" else ("1" if r.tag.startswith("judge") else "yes"),
                               "coin", 1_000)}
    return judges.__getitem__


def compare_scripted(labels_path: Path, settings: CompareSettings):
    judges = {name: scripted_judges()(name) for name in ("oracle", "coin")}
    labelled = load_labelled(labels_path)
    runs = run_judges(labelled, list(judges), settings, loader=judges.__getitem__)
    return judges, labelled, runs, analyse(labelled, runs, settings)


def test_scripted_comparison_statistics_ranking_and_recommendation(tmp_path):
    settings = CompareSettings(reruns=1, resamples=200)
    judges, labelled, runs, analysis = compare_scripted(write_begin(tmp_path / "b.tsv", grounded_rows()), settings)
    g = analysis["metrics"]["response_groundedness"]
    oracle_stats, coin_stats = g["judges"]["oracle"], g["judges"]["coin"]
    assert oracle_stats["auc"]["value"] == 1.0 and oracle_stats["balanced_accuracy"]["value"] == 1.0
    assert oracle_stats["kappa"]["value"] == 1.0 and oracle_stats["auc"]["ci"] == [1.0, 1.0]
    assert coin_stats["auc"]["value"] == 0.5 and g["ranking"] == ["oracle", "coin"]
    assert oracle_stats["tokens_per_sample"] == 24 and oracle_stats["invalid_calls"] == 0.0  # 2 calls x (10 + 2)
    assert oracle_stats["consistency"] == {"template_pairs": 12, "template_agreement": 1.0,
                                           "template_kappa": 1.0, "rerun_identical": 1.0}
    assert analysis["metrics"]["faithfulness"]["judges"]["oracle"]["auc"]["value"] == 1.0
    assert analysis["overall"]["ranking"] == ["oracle", "coin"] and analysis["overall"]["recommended"] == "oracle"
    judge_rows = {j["name"]: j for j in analysis["judges"]}
    assert judge_rows["coin"]["size_bytes"] == 1_000 and judge_rows["oracle"]["memory"]["peak_rss"] > 0
    # a wide margin makes the smaller judge good enough
    wide = analyse(labelled, runs, CompareSettings(reruns=1, resamples=50, margin=0.6))
    assert wide["overall"]["recommended"] == "coin"


def test_both_scorings_side_by_side_with_calibration(tmp_path):
    """A judge unsure of its ratings: its argmax ties every row, its probabilities still rank them."""
    def hesitant(request):
        if request.tag == "claims":
            return {"claims": [user_text(request).rsplit("Text: ", 1)[1][:150]]}
        grounded = "Fact number" in user_text(request).rsplit("Assertion: ", 1)[-1].rsplit("Claim: ", 1)[-1]
        if request.tag.startswith("judge"):
            return {"0": 0.2, "1": 0.5, "2": 0.3} if grounded else {"0": 0.3, "1": 0.5, "2": 0.2}
        return {"yes": 0.8, "no": 0.2} if grounded else {"yes": 0.6, "no": 0.4}

    labelled = load_labelled(write_begin(tmp_path / "b.tsv", grounded_rows()))
    settings = CompareSettings(resamples=50)
    runs = run_judges(labelled, ["hesitant"], settings, loader={"hesitant": scripted(hesitant, "h", 1)}.__getitem__)
    analysis = analyse(labelled, runs, settings)
    by = analysis["metrics"]["response_groundedness"]["judges"]["hesitant"]["scorings"]
    assert by["argmax"]["auc"]["value"] == 0.5 and by["probability"]["auc"]["value"] == 1.0
    faith = analysis["metrics"]["faithfulness"]["judges"]["hesitant"]["scorings"]
    assert faith["argmax"]["auc"]["value"] == 0.5 and faith["probability"]["auc"]["value"] == 1.0
    # calibration: P(yes) 0.8 on positives and 0.6 on negatives (half of each): ECE = |0.8-1|/2 + |0.6-0|/2
    assert faith["probability"]["calibration"]["ece"] == pytest.approx(0.4)
    assert faith["argmax"]["calibration"]["ece"] == pytest.approx(0.5)  # all 1.0, half of them positive
    from offline_eval.comparison.tables import all_tables

    table = next(t for t in all_tables(analysis) if t.title == "scorings side by side")
    assert {(r[0], r[2]) for r in table.rows} == {(m, s) for m in ("faithfulness", "response_groundedness")
                                                  for s in ("probability", "argmax")}


def test_a_saved_comparison_is_analysed_again_exactly_as_the_live_runs(tmp_path):
    from offline_eval.comparison.compare import json_ready
    from offline_eval.comparison.reuse import load_comparison

    settings = CompareSettings(reruns=1, resamples=100)
    labels = write_begin(tmp_path / "b.tsv", grounded_rows() * 2)
    _, labelled, runs, analysis = compare_scripted(labels, settings)
    half = labelled.subset(len(labelled) // 2, seed=3)  # a --limit subset: its rows come back by number
    runs = run_judges(half, ["oracle", "coin"], settings, loader=scripted_judges())
    write_outputs(analyse(half, runs, settings), runs, tmp_path / "out")

    again_labelled, again_runs, before = load_comparison(tmp_path / "out", load_labelled(labels))
    assert [r.number for r in again_labelled.rows] == [r.number for r in half.rows] and before["reruns"] == 1
    other = CompareSettings(reruns=1, resamples=100, threshold="auto", margin=0.6)
    assert json_ready(analyse(again_labelled, again_runs, other)) == json_ready(analyse(half, runs, other))

    (tmp_path / "out" / "results-coin.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"results-coin.jsonl has no \w+ result for row \d+"):
        load_comparison(tmp_path / "out", load_labelled(labels))


def test_labels_never_reach_a_judge(tmp_path):
    judges, *_ = compare_scripted(write_begin(tmp_path / "b.tsv", grounded_rows(8)), CompareSettings(resamples=10))
    generic = tmp_path / "g.jsonl"
    generic.write_text("\n".join(json.dumps({
        "user_input": f"Tell me about river {i}", "retrieved_contexts": [f"Fact number {i}."],
        "response": f"Fact number {i}.", "reference": f"Fact number {i}.", "note": "SECRET-NOTE",
        "faithfulness_label": i % 2, "answer_accuracy_label": "SECRET-LABEL-1"[-1:] if i % 2 else "0"})
        for i in range(6)) + "\n", encoding="utf-8")
    judge = scripted(oracle, "oracle", 1)
    run_judges(load_labelled(generic), ["oracle"], CompareSettings(resamples=10), loader=lambda name: judge)
    requests = judges["oracle"].requests + judges["coin"].requests + judge.requests
    assert {r.tag for r in judge.requests} >= {"claims", "judge1", "judge2"}  # faithfulness and answer_accuracy ran
    texts = [content for r in requests for _, content in r.messages]
    for secret in ("attributable", "Generic", "begin_label", "SECRET", "_label", "model_name"):
        assert not any(secret in t for t in texts), secret


def test_metrics_without_labels_or_inputs_are_refused_before_any_judge_loads(tmp_path):
    path = write_begin(tmp_path / "b.tsv", grounded_rows(4))
    loads = []
    with pytest.raises(ValueError, match="has no labels for answer_accuracy"):
        run_judges(load_labelled(path), ["x"], CompareSettings(metrics=["answer_accuracy"]), loader=loads.append)
    generic = tmp_path / "g.jsonl"
    generic.write_text(json.dumps({"user_input": "q", "response": "a", "answer_accuracy_label": 1}) + "\n")
    with pytest.raises(ValueError, match="field 'reference' is missing"):
        run_judges(load_labelled(generic), ["x"], CompareSettings(), loader=loads.append)
    assert loads == []


def test_report_files_and_their_html_in_headless_chromium(tmp_path):
    settings = CompareSettings(threshold="auto", reruns=1, resamples=100)
    judges, labelled, runs, analysis = compare_scripted(write_begin(tmp_path / "b.tsv", grounded_rows(16)), settings)
    paths = write_outputs(analysis, runs, tmp_path / "out")
    data = json.loads(paths["json"].read_text())  # strict JSON: NaN became null
    assert data["overall"]["recommended"] == "oracle" and "NaN" not in paths["json"].read_text()
    md = paths["markdown"].read_text()
    assert "### response_groundedness: agreement with the labels" in md and "| oracle |" in md
    records = [json.loads(line) for line in paths["results oracle"].read_text().splitlines()]
    assert len(records) == 16 and set(records[0]["metrics"]) == {"faithfulness", "response_groundedness"}
    html = paths["html"].read_text()
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    dom = chromium(tmp_path, paths["html"], "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    for text in ("Judge comparison", "oracle", "coin", "faithfulness: agreement with the labels",
                 "response_groundedness: agreement with the labels", "cost per judge", "consistency",
                 'class="chart roc"', 'class="roc-curve"', 'class="chart bars"', 'class="ci"', 'class="chart hist"'):
        assert text in dom.stdout, text
    assert dom.stdout.count('class="chart hist"') == 4  # per metric, per judge: scores by label
    shot = tmp_path / "shot.png"
    proc = chromium(tmp_path, paths["html"], f"--screenshot={shot}", "--window-size=1200,1600")
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    assert_not_blank(shot)


def assert_not_blank(png: Path) -> None:
    Image = pytest.importorskip("PIL.Image")
    image = Image.open(png).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    non_white = sum(count for count, rgb in colours if rgb != (255, 255, 255))
    assert len(colours) > 20 and non_white / (image.width * image.height) > 0.02


def test_report_command_renders_a_results_file(tmp_path):
    judge = ScriptedJudge(lambda r: {"claims": ["Ulm is in Germany.", "Ulm has 2 million people."]}
                          if r.tag == "claims" else ("yes" if "Germany" in user_text(r).split("Claim:")[1] else "no"))
    rows = [{"user_input": "Where is Ulm?", "retrieved_contexts": ["Ulm is a city in Germany."],
             "response": "Ulm is in Germany and has 2 million people."},
            {"user_input": "q", "retrieved_contexts": ["x"], "response": ""}]
    result = evaluate(rows, metrics=["faithfulness"], llm=judge, skip_invalid=True, show_progress=False)
    results = tmp_path / "run.results.jsonl"
    result.write_jsonl(results)
    proc = cli("report", str(results), "--worst", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = tmp_path / "run.results.html"
    html = page.read_text()
    assert "faithfulness" in html and "Lowest scores" in html and "2 rows, 1 scored, 1 skipped" in html
    assert '<li class="unsupported">[not supported] Ulm has 2 million people.</li>' in html
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    assert cli("report", str(bad), cwd=tmp_path).returncode == 2
    if CHROMIUM is not None:
        dom = chromium(tmp_path, page, "--dump-dom")
        assert "[supported] Ulm is in Germany." in dom.stdout and 'class="chart hist"' in dom.stdout


# ---- the real command with SmolLM2 ----------------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.skipif(not BEGIN.exists(), reason="the BEGIN dev file is not on this machine")
def test_compare_command_with_smollm2_on_three_begin_rows(tmp_path):
    from offline_eval.models import Registry

    gguf = Registry.load().get("smollm2-135m-instruct").weights_path()
    # The same weights twice (by name and by path): two judges loaded, run and closed in turn.
    proc = cli("compare", "--models", f"smollm2-135m-instruct,{gguf}", "--labels", str(BEGIN), "--limit", "3",
               "--metrics", "response_groundedness", "--bootstrap", "50", "-o", "out",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "response_groundedness: agreement with the labels" in proc.stdout and "recommended judge:" in proc.stdout
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    judges = data["metrics"]["response_groundedness"]["judges"]
    assert set(judges) == {"smollm2-135m-instruct", str(gguf)}
    first = judges["smollm2-135m-instruct"]
    assert first["n"] == 3 and first["calls"] == 6 and first["consistency"]["template_pairs"] == 3
    assert first["scores"] == judges[str(gguf)]["scores"]  # same weights, temperature 0: the same scores
    for j in data["judges"]:
        assert j["size_bytes"] == gguf.stat().st_size and j["engine"] == "llamacpp"
        assert j["memory"]["peak_rss"] >= j["memory"]["baseline_rss"] > 0 and j["tokens_per_sample"] > 0
    assert (tmp_path / "out" / "compare.html").exists()
    # the same comparison with the threshold chosen on a calibration split: from the saved results, no judge
    again = cli("compare", "--from", "out", "--labels", str(BEGIN), "--threshold", "auto", "--bootstrap", "50",
                cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "loading" not in again.stderr and "recommended judge:" in again.stdout
    redone = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert redone["settings"]["threshold"] == "auto" and redone["labels"] == data["labels"]
    assert redone["metrics"]["response_groundedness"]["judges"][str(gguf)]["scores"] == judges[str(gguf)]["scores"]
    report = cli("report", str(tmp_path / "out" / "results-smollm2-135m-instruct.jsonl"), "-o", "r.html", cwd=tmp_path)
    assert report.returncode == 0 and "response_groundedness" in (tmp_path / "r.html").read_text()
