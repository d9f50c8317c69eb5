"""The search tool: a bm25s index cached on disk, and the POST /retrieve protocol (client and
server) of Search-R1-style retrieval servers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from areal_agents.errors import ToolError
from areal_agents.net import free_port
from areal_agents.tools import (
    BM25Retriever,
    Document,
    HttpRetriever,
    RetrievalServer,
    RetrieverError,
    SearchTool,
)

DOCS = [
    Document("c1", "Kelmarth", "Kelmarth is a city in Dravonia. It was founded in 1204."),
    Document("c2", "Osk", "Osk is a city in Dravonia. It is the capital of Dravonia."),
    Document("p1", "Orin Valdessa", "Orin Valdessa is a chemist who was born in Kelmarth."),
    Document("k1", "Dravonia", "Dravonia is a country. Its capital is Osk."),
]


def test_bm25_ranks_the_matching_document_first(tmp_path: Path) -> None:
    retriever = BM25Retriever(DOCS, cache_dir=tmp_path)
    hits = retriever.search(["where was Orin Valdessa born", "capital of Dravonia"], topk=2)
    assert hits[0][0].id == "p1"
    assert {d.id for d in hits[1]} <= {"c2", "k1", "c1"} and hits[1]
    assert retriever.search(["zzzz qqqq"], topk=3) == [[]]  # unknown words match nothing
    assert retriever.search(["the of and"], topk=3) == [[]]  # only stop words


def test_index_is_built_once_and_reused_from_disk(tmp_path: Path) -> None:
    first = BM25Retriever(DOCS, cache_dir=tmp_path)
    assert first.index_dir is not None and first.index_dir.exists()
    stamp = (first.index_dir / "params.index.json").stat().st_mtime_ns
    second = BM25Retriever(DOCS, cache_dir=tmp_path)
    assert second.index_dir == first.index_dir
    assert (second.index_dir / "params.index.json").stat().st_mtime_ns == stamp
    assert second.search(["Kelmarth"], 1)[0][0].id == "c1"
    changed = BM25Retriever([*DOCS, Document("x", "New", "A new document.")], cache_dir=tmp_path)
    assert changed.index_dir != first.index_dir  # new documents, new index
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".building")]


def test_search_tool_formats_passages_and_rejects_bad_queries() -> None:
    tool = SearchTool(BM25Retriever(DOCS, cache_dir=None), topk=2)
    out = tool.call({"query": "Orin Valdessa"})
    assert out.startswith("[1] Orin Valdessa\nOrin Valdessa is a chemist")
    assert tool.call({"query": "zzzz"}) == "No results."
    with pytest.raises(ToolError):
        tool.call({"query": "  "})
    with pytest.raises(ToolError):
        tool.call({"query": "x" * 1000})
    assert tool.spec.parameters["required"] == ["query"]


def test_http_retriever_against_the_builtin_server() -> None:
    with RetrievalServer(BM25Retriever(DOCS, cache_dir=None)) as server:
        assert server.host == "127.0.0.1"
        client = HttpRetriever(server.url)
        hits = client.search(["Kelmarth founded", "Osk capital"], topk=1)
        assert [h[0].id for h in hits] == ["c1", "c2"]
        assert hits[0][0].title == "Kelmarth" and "1204" in hits[0][0].text
        tool = SearchTool(client, topk=1)
        assert tool.call({"query": "Orin Valdessa"}).startswith("[1] Orin Valdessa")
        client.close()


def test_server_speaks_the_search_r1_wire_format() -> None:
    import httpx

    with RetrievalServer(BM25Retriever(DOCS, cache_dir=None)) as server:
        body = {"queries": ["Kelmarth"], "topk": 1, "return_scores": True}
        scored = httpx.post(server.url + "/retrieve", json=body).json()
        hit = scored["result"][0][0]
        assert hit["document"]["contents"].startswith('"Kelmarth"\n') and hit["score"] > 0
        bare = httpx.post(server.url + "/retrieve", json={"queries": ["Osk"], "topk": 1}).json()
        assert bare["result"][0][0]["id"] == "c2"
        assert httpx.post(server.url + "/retrieve", json={"topk": 1}).status_code == 422
        assert httpx.post(server.url + "/search", json={}).status_code == 404


def test_client_parses_bare_and_scored_results() -> None:
    body = {
        "result": [
            [{"document": {"id": "1", "contents": '"Title A"\ntext a'}, "score": 3.2}],
            [{"id": "2", "title": "B", "text": "text b"}],
        ]
    }
    docs = HttpRetriever._parse(body, 2)
    assert docs[0][0] == Document("1", "Title A", "text a")
    assert docs[1][0] == Document("2", "B", "text b")
    with pytest.raises(ValueError):
        HttpRetriever._parse({"result": []}, 1)


def test_unreachable_server_is_an_infrastructure_error() -> None:
    port = free_port()  # a loopback port with no listener
    client = HttpRetriever(f"http://127.0.0.1:{port}", timeout_s=2, retries=1)
    with pytest.raises(RetrieverError, match="failed"):
        client.search(["x"], 1)


def test_document_contents_round_trip() -> None:
    doc = Document("9", "Osk", "Osk is a city.")
    assert Document.from_contents("9", doc.contents) == doc
    assert Document.from_contents("9", "no title here") == Document("9", "", "no title here")
    assert json.loads(json.dumps(doc.to_json()))["contents"] == '"Osk"\nOsk is a city.'
