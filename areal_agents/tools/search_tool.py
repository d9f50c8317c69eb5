"""The ``search`` tool and its retrievers: a local BM25 index cached on disk, or an HTTP server.

Two backends answer the same :class:`Retriever` protocol (``search(queries, topk)``):

* :class:`BM25Retriever` — a ``bm25s`` index over a document collection, built once and cached
  on disk under a key derived from the documents' content (rebuilding only when they change);
* :class:`HttpRetriever` — a client of the ``POST /retrieve {"queries": [...], "topk": k}``
  protocol of Search-R1-style retrieval servers (dense or sparse, on another machine).

:class:`RetrievalServer` serves any retriever over that same protocol (standard library only),
so a local index can be shared by many rollout workers.

>>> docs = [Document("1", "Kelmarth", "Kelmarth is a city in Dravonia."),
...         Document("2", "Dravonia", "Dravonia is a country. Its capital is Osk.")]
>>> tool = SearchTool(BM25Retriever(docs, cache_dir=None), topk=1)
>>> print(tool.call({"query": "Kelmarth city"}))
[1] Kelmarth
Kelmarth is a city in Dravonia.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from areal_agents.errors import ConfigError, DependencyError, InfrastructureError, ToolError
from areal_agents.files import atomic_directory
from areal_agents.types import ToolSpec

__all__ = [
    "BM25Retriever",
    "Document",
    "HttpRetriever",
    "RetrievalServer",
    "Retriever",
    "RetrieverError",
    "SearchTool",
    "default_cache_dir",
]

logger = logging.getLogger(__name__)


class RetrieverError(InfrastructureError):
    """The retrieval server failed or answered something that is not the protocol."""


@dataclass(frozen=True)
class Document:
    """One retrievable passage."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's ``contents`` field: ``"Title"`` on the first line, then the text."""
        return f'"{self.title}"\n{self.text}' if self.title else self.text

    @classmethod
    def from_contents(cls, doc_id: str, contents: str) -> Document:
        """Parse Search-R1's ``contents`` (a quoted title line, then the text)."""
        first, _, rest = contents.partition("\n")
        if rest and len(first) >= 2 and first.startswith('"') and first.endswith('"'):
            return cls(id=doc_id, title=first[1:-1], text=rest.strip())
        return cls(id=doc_id, title="", text=contents.strip())

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "contents": self.contents}


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns the top documents for each of several queries."""

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        """For each query, up to ``topk`` documents, best first."""
        ...


def _index_complete(directory: Path) -> bool:
    return (directory / "params.index.json").exists()


def default_cache_dir() -> Path:
    """Where indexes are cached: ``$AREAL_CACHE_DIR/search`` or ``~/.cache/areal_agents/search``."""
    root = os.environ.get("AREAL_CACHE_DIR") or Path.home() / ".cache" / "areal_agents"
    return Path(root) / "search"


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise DependencyError.missing("bm25s", "train") from e
    return bm25s


class BM25Retriever:
    """BM25 (``bm25s``) over ``documents``, cached on disk.

    The index directory is ``cache_dir/<sha256 of the documents>``: built once (atomically,
    so concurrent workers are safe), then loaded by every later run. ``cache_dir=None`` keeps
    the index in memory only.
    """

    def __init__(
        self,
        documents: Sequence[Document],
        *,
        cache_dir: str | Path | None = "default",
        stopwords: str = "en",
    ) -> None:
        if not documents:
            raise ConfigError("BM25Retriever needs at least one document")
        self.documents = list(documents)
        self.stopwords = stopwords
        digest = hashlib.sha256()
        for d in self.documents:
            digest.update(json.dumps([d.id, d.title, d.text]).encode())
            digest.update(b"\0")
        self.key = digest.hexdigest()[:24]
        bm25s = _bm25s()
        if cache_dir is None:
            self.index_dir: Path | None = None
            self._index = self._build()
            return
        base = default_cache_dir() if cache_dir == "default" else Path(cache_dir)
        self.index_dir = base / f"bm25-{self.key}"
        if not _index_complete(self.index_dir):
            self._build_on_disk(base)
        self._index = bm25s.BM25.load(str(self.index_dir), show_progress=False)

    def _texts(self) -> list[str]:
        return [f"{d.title}\n{d.text}" for d in self.documents]

    def _build(self) -> Any:
        bm25s = _bm25s()
        tokens = bm25s.tokenize(self._texts(), stopwords=self.stopwords, show_progress=False)
        index = bm25s.BM25()
        index.index(tokens, show_progress=False)
        return index

    def _build_on_disk(self, base: Path) -> None:
        assert self.index_dir is not None
        # another worker may finish first: then its index is kept
        with atomic_directory(self.index_dir, is_complete=_index_complete) as tmp:
            self._build().save(str(tmp), show_progress=False)
        logger.info("built BM25 index of %d documents in %s", len(self.documents), self.index_dir)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        return [[d for d, _ in hits] for hits in self.search_with_scores(queries, topk)]

    def search_with_scores(
        self, queries: Sequence[str], topk: int
    ) -> list[list[tuple[Document, float]]]:
        """Like :meth:`search`, with each document's BM25 score (documents scoring 0 dropped)."""
        bm25s = _bm25s()
        tokens = bm25s.tokenize(
            list(queries), stopwords=self.stopwords, return_ids=False, show_progress=False
        )
        k = max(1, min(topk, len(self.documents)))
        out: list[list[tuple[Document, float]]] = [[] for _ in queries]
        searchable = [i for i, t in enumerate(tokens) if t]
        if not searchable:
            return out
        ids, scores = self._index.retrieve(
            [tokens[i] for i in searchable], k=k, show_progress=False, n_threads=1
        )
        for row, i in enumerate(searchable):
            out[i] = [
                (self.documents[int(d)], float(s))
                for d, s in zip(ids[row], scores[row], strict=True)
                if float(s) > 0.0
            ]
        return out


class HttpRetriever:
    """Client of a Search-R1-style retrieval server: ``POST {url}/retrieve`` with
    ``{"queries": [...], "topk": k, "return_scores": true}``, answered by
    ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (documents may
    also come bare, without the score wrapper). Failures raise :class:`RetrieverError`."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, retries: int = 2) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"retriever url {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        if not self.url.endswith("/retrieve"):
            self.url += "/retrieve"
        self.timeout_s = timeout_s
        self.retries = retries
        import httpx

        self._client = httpx.Client(timeout=timeout_s)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        import httpx

        payload = {"queries": list(queries), "topk": int(topk), "return_scores": True}
        error: Exception | None = None
        for _ in range(self.retries + 1):
            try:
                response = self._client.post(self.url, json=payload)
                response.raise_for_status()
                return self._parse(response.json(), len(queries))
            except (httpx.HTTPError, ValueError) as e:
                error = e
        raise RetrieverError(f"retrieval server {self.url} failed: {error}") from error

    @staticmethod
    def _parse(body: Any, n: int) -> list[list[Document]]:
        result = body.get("result") if isinstance(body, Mapping) else None
        if not isinstance(result, list) or len(result) != n:
            raise ValueError(f"expected {{'result': [...{n} lists]}}, got {str(body)[:200]}")
        out = []
        for hits in result:
            docs = []
            for j, hit in enumerate(hits):
                doc = hit.get("document", hit) if isinstance(hit, Mapping) else None
                if not isinstance(doc, Mapping):
                    raise ValueError(f"bad hit {str(hit)[:200]}")
                doc_id = str(doc.get("id", j))
                if "contents" in doc:
                    docs.append(Document.from_contents(doc_id, str(doc["contents"])))
                else:
                    title = str(doc.get("title", ""))
                    docs.append(Document(doc_id, title, str(doc.get("text", ""))))
            out.append(docs)
        return out

    def close(self) -> None:
        self._client.close()


class SearchTool:
    """The ``search`` tool: a query in, the top documents out as numbered passages."""

    def __init__(
        self,
        retriever: Retriever,
        *,
        topk: int = 3,
        max_query_chars: int = 300,
        name: str = "search",
    ) -> None:
        if topk < 1:
            raise ConfigError(f"topk={topk}: must be at least 1")
        self.retriever = retriever
        self.topk = topk
        self.max_query_chars = max_query_chars
        self._spec = ToolSpec(
            name=name,
            description=(
                "Search the document collection. Returns the most relevant passages for the "
                "query; search again with names you find to follow a chain of facts."
            ),
            parameters={
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look for"}},
                "required": ["query"],
                "additionalProperties": False,
            },
        )

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    def call(self, arguments: Mapping[str, Any]) -> str:
        query = str(arguments["query"]).strip()
        if not query:
            raise ToolError("the query is empty")
        if len(query) > self.max_query_chars:
            raise ToolError(f"the query is longer than {self.max_query_chars} characters")
        docs = self.retriever.search([query], self.topk)[0]
        if not docs:
            return "No results."
        return "\n\n".join(
            f"[{i}] {d.title}\n{d.text}" if d.title else f"[{i}] {d.text}"
            for i, d in enumerate(docs, start=1)
        )


def _results(
    retriever: Retriever, queries: list[str], topk: int, body: Mapping[str, Any]
) -> list[list[dict[str, Any]]]:
    """The ``result`` field of a ``/retrieve`` answer (scored hits when asked and known)."""
    scored = getattr(retriever, "search_with_scores", None)
    if body.get("return_scores") and scored is not None:
        return [
            [{"document": d.to_json(), "score": s} for d, s in hits]
            for hits in scored(queries, topk)
        ]
    return [[d.to_json() for d in docs] for docs in retriever.search(queries, topk)]


class RetrievalServer:
    """Serve a :class:`Retriever` over ``POST /retrieve`` on 127.0.0.1 (a daemon thread).

    >>> docs = [Document("1", "Osk", "Osk is a city.")]
    >>> with RetrievalServer(BM25Retriever(docs, cache_dir=None)) as server:
    ...     HttpRetriever(server.url).search(["Osk"], topk=1)[0][0].title
    'Osk'
    """

    def __init__(self, retriever: Retriever, *, host: str = "127.0.0.1", port: int = 0) -> None:
        served = retriever

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("retrieval server: " + format, *args)

            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/retrieve":
                    self._reply(404, {"error": f"no route {self.path}; use POST /retrieve"})
                    return
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    body = json.loads(self.rfile.read(length) or b"{}")
                    queries = body["queries"]
                    if not isinstance(queries, list) or not all(
                        isinstance(q, str) for q in queries
                    ):
                        raise ValueError("'queries' must be a list of strings")
                    topk = int(body.get("topk") or 3)
                except (ValueError, KeyError, TypeError) as e:
                    self._reply(422, {"error": f"bad request: {e}"})
                    return
                self._reply(200, {"result": _results(served, queries, topk, body)})

            def _reply(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        address = self._server.server_address
        self.host, self.port = str(address[0]), int(address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> RetrievalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
