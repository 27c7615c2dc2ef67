"""The two judge stages that claim-based metrics share: split a text into atomic claims, and check one
claim against a source text. Faithfulness, ContextRecall and AnswerCorrectness all use them, so identical
requests from different metrics are deduplicated by the scheduler."""

from __future__ import annotations

from typing import Optional, Sequence

from ..constraints import JsonSchema, array, copyable, obj, string
from ..engines.base import JudgeOutput, JudgeRequest
from .base import YES_NO, MetricResult, Plan, mean_of_valid, p_yes, request, verdict

MAX_CLAIMS = 8
MAX_CLAIM_CHARS = 150

CLAIMS = JsonSchema.of(obj(claims=array(string(MAX_CLAIM_CHARS, min_length=1), MAX_CLAIMS)), "claims")

_EXTRACT = {
    "en": f"""You list the factual claims that a Text makes.
A claim is one short, self-contained statement of fact that the Text itself states. Take claims only from the Text. The Question only shows what the Text replies to: nothing in the Question is a claim unless the Text states it too.
Write each claim as a full sentence. Where the Text says "he", "it" or "they" and the Question or the Text names what is meant, write that name instead; if nothing names it, keep the pronoun. Keep names, numbers, dates and units exactly as written, and add nothing the Text does not say.
Greetings, thanks, words of agreement such as "yes", questions and refusals are not claims.
Write the claims in the language of the Text. Give at most {MAX_CLAIMS} claims; if the Text states no facts, give an empty list.
Reply with JSON: {{"claims": ["...", "..."]}}

Example
Question: I love rivers. What do you know about the Danube?
Text: Sure! It flows through ten countries and ends in the Black Sea. Have you ever seen it?
{{"claims":["The Danube flows through ten countries.","The Danube ends in the Black Sea."]}}""",
    "zh": f"""你的任务是列出一段文本所陈述的事实声明（claims）。
每条声明是文本本身陈述的一个简短、独立的事实。只从文本中提取声明。问题只说明文本在回应什么：问题中的内容都不是声明，除非文本也陈述了它。
每条声明写成完整的句子。如果文本用了"他""它""他们"等代词，而问题或文本给出了所指对象的名称，就写出该名称；如果都没有给出，保留代词。名称、数字、日期和单位保持原样，不要添加文本没有说的内容。
问候、感谢、"是的"之类表示赞同的话、提问和拒答都不是声明。
声明使用与文本相同的语言。最多 {MAX_CLAIMS} 条；如果文本没有陈述任何事实，返回空列表。
只输出 JSON：{{"claims": ["...", "..."]}}

示例
问题：我很喜欢河流。你了解长江吗？
文本：当然！它是中国最长的河流，最终注入东海。你去过吗？
{{"claims":["长江是中国最长的河流。","长江最终注入东海。"]}}""",
}

_CHECK = {
    "en": """Check whether the Claim below is supported by the Context above.
Answer "yes" if the Context says what the Claim says, in the same or in other words: synonyms, paraphrases and a shorter or more general wording all count as support, and the Claim may leave out details of the Context.
Answer "no" if the Claim contradicts the Context, or states something the Context does not contain, such as a different or additional name, number, date, place or fact.
Judge only by the Context, never by your own knowledge.""",
    "zh": """判断下面这条声明能否从上文的上下文中得到支持。
如果上下文表达了声明所说的意思，回答 "yes"：措辞不同、同义词或近义词（例如"负责人"和"主管"）、换一种说法或更笼统的概括都算得到支持，声明也可以省略上下文的部分细节。
如果声明与上下文矛盾，或声明包含上下文没有的内容（例如不同的或额外的名称、数字、日期、地点或事实），回答 "no"。
只依据上下文判断，不要使用你自己的知识。""",
}

_CHECK_ITEM = {
    "en": "Claim: {claim}\n\nIs the claim supported by the Context? Answer yes or no.",
    "zh": "声明：{claim}\n\n这条声明能否从上下文中得到支持？回答 yes 或 no。",
}


def extract_claims(text: str, lang: str, tag: str = "claims") -> JudgeRequest:
    """The claims of `text`, shown alone. Shown the question too (as Ragas does), the default judge took
    claims from it whatever the instructions said (statements of the user's turn, the question restated as a
    claim: 12 of 50 CiteCheck rows), and a supported response was judged on facts it never stated; without
    it, BEGIN dev's faithfulness ROC-AUC went from 0.78 to 0.84 (README, "How well the default judge agrees
    with people"). A pronoun the text leaves unresolved is checked against the contexts as it stands. The
    instructions and their example, which resolves a pronoun from a question, are those that were measured."""
    t = {"en": "Text", "zh": "文本"}[lang]
    return request(lang, _EXTRACT[lang], f"{t}: {copyable(text)}", CLAIMS, tag)


def check_claim(claim: str, sources: Sequence[str], lang: str, tag: str = "verdict",
                retrieved: bool = True) -> JudgeRequest:
    """Is `claim` supported by `sources` (the retrieved contexts, unless `retrieved` is False)?"""
    return request(lang, _CHECK[lang], _CHECK_ITEM[lang].format(claim=claim), YES_NO, tag, sources, retrieved)


def longest_check(text: str, sources: Sequence[str], lang: str) -> JudgeRequest:
    """A claim check as long as `claims_supported_by` may ask about a claim of `text`: the claim is `text`'s
    opening at the longest a claim may be, so it tokenizes like the real ones (long_inputs.py measures it)."""
    claim = (text + " ") * (MAX_CLAIM_CHARS // max(len(text), 1) + 1)
    return check_claim(claim[:MAX_CLAIM_CHARS], sources, lang)


def claims_of(output: JudgeOutput) -> Optional[list[str]]:
    """The claims from an extraction output, without duplicates; None if the call failed."""
    if output.value is None:
        return None
    seen: dict[str, None] = {}
    for claim in output.value["claims"]:
        claim = claim.strip()
        if claim:
            seen.setdefault(claim, None)
    return list(seen)


def supported_share(verdicts: Sequence[Optional[bool]]) -> Optional[float]:
    """Supported claims / claims with a verdict; None when no claim got one."""
    valid = [v for v in verdicts if v is not None]
    return sum(valid) / len(valid) if valid else None


def verdict_lines(claims: Sequence[str], verdicts: Sequence[Optional[bool]]) -> str:
    marks = {True: "supported", False: "not supported", None: "no verdict"}
    return "\n".join(f"- [{marks[v]}] {c}" for c, v in zip(claims, verdicts))


def claims_supported_by(text: str, sources: Sequence[str], lang: str, what: str, tag: str = "claims") -> Plan:
    """Split `text` into claims and check each against `sources`: supported / total, with the claims and
    verdicts as the reason. `what` names the text in reasons ("response", "reference")."""
    (out,) = yield [extract_claims(text, lang, tag)]
    claims = claims_of(out)
    if claims is None:
        return MetricResult(None, f"claim extraction failed: {out.meta.get('error')}")
    if not claims:
        return MetricResult(None, f"the {what} makes no factual claims", {"claims": [], "verdicts": []})
    outputs = yield [check_claim(c, sources, lang, f"verdict[{i}]") for i, c in enumerate(claims)]
    verdicts = [verdict(o) for o in outputs]
    supported = sum(v is True for v in verdicts)
    reason = f"{supported}/{len(claims)} {what} claims supported by the contexts:\n" + verdict_lines(claims, verdicts)
    share = supported_share(verdicts)
    return MetricResult(share, reason, {"claims": claims, "verdicts": verdicts},
                        scores={"argmax": share, "probability": mean_of_valid(p_yes(o) for o in outputs)})
