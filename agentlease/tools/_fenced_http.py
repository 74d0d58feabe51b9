"""The HTTP convention's headers stamped on a leased tool's requests to a fenced downstream by the httpx client
it sends them with, not by a line of the tool (``docs/edge.md``, "Stamped by the client")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import httpx

from agentlease.idempotency.convention import FENCING_RESOURCE_HEADER, FENCING_TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER
from agentlease.lease import _current

__all__ = ["FencedClient", "FencingTransport", "fenced_downstream", "is_fenced", "stamp_httpx"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_CONVENTION = (IDEMPOTENCY_KEY_HEADER, FENCING_TOKEN_HEADER, FENCING_RESOURCE_HEADER)


def _origin_and_path(url: httpx.URL) -> tuple[str, str]:
    port = url.port or _DEFAULT_PORTS.get(url.scheme, 0)
    return f"{url.scheme}://{url.host.lower()}:{port}", url.path.rstrip("/")


def fenced_downstream(base_url: object) -> str:
    """``base_url`` (``"https://refunds.internal/v1"``) as a fenced downstream:
    ``<scheme>://<host>:<port><path>``, the default port written out, no trailing ``/``.

    Raises:
        ValueError: not an absolute ``http://`` or ``https://`` URL, or it has a query or a fragment.
    """
    shown = f"{base_url!r:.120}"
    try:
        url = httpx.URL(base_url) if isinstance(base_url, str | httpx.URL) else None
    except (httpx.InvalidURL, TypeError):
        url = None
    if url is None or url.scheme not in _DEFAULT_PORTS or not url.host or url.query or url.fragment:
        raise ValueError(f"fenced downstream {shown} is not a base URL such as 'https://refunds.internal/v1'")
    origin, path = _origin_and_path(url)
    return origin + path


def is_fenced(url: httpx.URL, downstreams: Iterable[str]) -> bool:
    """Whether ``url`` is under one of ``downstreams`` (:func:`fenced_downstream` forms): the same scheme, host and
    port, and the base URL's path or a path below it (``/v1`` covers ``/v1`` and ``/v1/refunds``, not ``/v10``)."""
    origin, path = _origin_and_path(url)
    target = origin + path  # the form fenced_downstream writes: compared as text, no URL parsed again
    return any(target == downstream or target.startswith(downstream + "/") for downstream in downstreams)


_STAMPED = "agentlease.stamped"
"""A request the lease stamped: the downstreams it was stamped for and the headers (httpx passes a request's
extensions on to the redirects it follows)."""


def _stamp(request: httpx.Request, fenced: Iterable[str] | None) -> None:
    """Put the running lease's headers on ``request`` when it goes to one of ``fenced`` (``None``: the downstreams
    the running tool declared) and carries none of them yet; outside a lease, nothing. A redirect of a stamped
    request (httpx copies its headers) to where they would not be stamped goes without them."""
    stamped = request.extensions.get(_STAMPED)
    if stamped is not None:  # by this layer or another (a FencedClient over a stamping transport), or a redirect
        downstreams, headers = stamped
        if is_fenced(request.url, downstreams):
            request.headers.update(headers)  # a redirect back from elsewhere: stamped again
        else:
            for name in headers:
                request.headers.pop(name, None)
        return
    ctx = _current.get()
    if ctx is None or any(name in request.headers for name in _CONVENTION):
        return
    downstreams = tuple(ctx.fenced if fenced is None else fenced)
    if is_fenced(request.url, downstreams):
        headers = ctx.downstream_headers(ctx.idempotency_key)
        request.headers.update(headers)
        request.extensions[_STAMPED] = (downstreams, headers)


_STAMPING = "__agentlease_stamps__"


def stamp_httpx() -> None:
    """From now on in this process, httpx's own transports (``httpx.AsyncHTTPTransport``, ``httpx.HTTPTransport``:
    every ``httpx.AsyncClient`` and ``httpx.Client`` not built with a transport of its own) stamp the running
    lease's headers on each request to a downstream the running tool declared with ``fenced=``; any other
    request, and every request outside a lease, goes out as it is. Called by the first attempt of a tool that
    declares ``fenced=``; calling it again does nothing (``docs/edge.md``, "Stamped by the client")."""
    if getattr(httpx.AsyncHTTPTransport.handle_async_request, _STAMPING, False):
        return
    send_async = httpx.AsyncHTTPTransport.handle_async_request
    send = httpx.HTTPTransport.handle_request

    async def handle_async_request(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        _stamp(request, None)
        return await send_async(self, request)

    def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        _stamp(request, None)
        return send(self, request)

    for method in (handle_async_request, handle_request):
        setattr(method, _STAMPING, True)
    httpx.AsyncHTTPTransport.handle_async_request = handle_async_request  # type: ignore[method-assign]
    httpx.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign]


class FencingTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """An httpx transport that stamps the running lease's headers on each request to a fenced downstream.

    Inside a leased attempt, every request under one of the ``fenced`` base URLs carries ``Idempotency-Key`` (the
    task's key), ``Fencing-Token`` (the claim generation, signed when the worker has ``AGENTLEASE_FENCING_KEY``)
    and ``Fencing-Resource`` (the idempotency key: one fence per action), as
    :meth:`~agentlease.tools.LeaseContext.downstream_headers` makes them. A request to any other URL, a request
    outside a lease, and a request that already carries one of those headers (the tool's own) go out as they are;
    nothing raises. :class:`FencedClient` is an ``httpx.AsyncClient`` built with one for its ``base_url``.

    Args:
        transport: the transport that sends the requests. Default: httpx's own (``httpx.AsyncHTTPTransport()``
            for an ``AsyncClient``, ``httpx.HTTPTransport()`` for a ``Client``), made on first use.
        fenced: the base URLs of the fenced downstreams (``["https://refunds.internal/v1"]``, see
            :func:`is_fenced`).

    Raises:
        ValueError: a ``fenced`` entry that is not an absolute ``http(s)://`` base URL.
    """

    def __init__(
        self, transport: httpx.AsyncBaseTransport | httpx.BaseTransport | None = None, *, fenced: Sequence[str]
    ) -> None:
        if isinstance(fenced, str) or not isinstance(fenced, Sequence):
            raise ValueError("fenced is a list of base URLs, such as ['https://refunds.internal/v1']")
        self.fenced = tuple(dict.fromkeys(fenced_downstream(url) for url in fenced))
        """The fenced base URLs, each as :func:`fenced_downstream` writes it."""
        self._async = transport if isinstance(transport, httpx.AsyncBaseTransport) else None
        self._sync = transport if isinstance(transport, httpx.BaseTransport) else None
        self._given = transport is not None

    def _stamp(self, request: httpx.Request) -> None:
        _stamp(request, self.fenced)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Stamp ``request`` when it goes to a fenced downstream inside a lease, then send it."""
        if self._async is None:
            if self._given:
                raise TypeError("this FencingTransport wraps a sync transport: build an httpx.Client with it")
            self._async = httpx.AsyncHTTPTransport()
        self._stamp(request)
        return await self._async.handle_async_request(request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Stamp ``request`` when it goes to a fenced downstream inside a lease, then send it (``httpx.Client``)."""
        if self._sync is None:
            if self._given:
                raise TypeError("this FencingTransport wraps an async transport: build an httpx.AsyncClient with it")
            self._sync = httpx.HTTPTransport()
        self._stamp(request)
        return self._sync.handle_request(request)

    async def aclose(self) -> None:
        """Close the wrapped async transport."""
        if self._async is not None:
            await self._async.aclose()

    def close(self) -> None:
        """Close the wrapped sync transport."""
        if self._sync is not None:
            self._sync.close()


_TRANSPORT_ARGUMENTS = ("verify", "cert", "http1", "http2", "limits", "proxy")
"""What ``httpx.AsyncClient`` gives the transport it makes: a :class:`FencedClient` gives them to the one it wraps."""


class FencedClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose requests to its ``base_url`` carry the running lease's fencing headers: a
    leased tool builds it where it built its client (``async with FencedClient(base_url=URL, timeout=60) as
    http``) and sends no header of its own (``docs/edge.md``, "Stamped by the client").

    Args:
        base_url: the fenced downstream's base URL, as for ``httpx.AsyncClient``.
        fenced: the base URLs to fence, when not (only) ``base_url``. Default ``[base_url]``.
        transport: what sends the requests, wrapped in a :class:`FencingTransport`. Default httpx's own, made with
            the ``verify``, ``cert``, ``http1``, ``http2``, ``limits`` and ``proxy`` given (environment proxies,
            ``HTTPS_PROXY`` and the like, are not read: pass ``proxy=``).
        **kwargs: the other arguments of ``httpx.AsyncClient`` (``timeout``, ``headers``, ``auth``...).

    Raises:
        ValueError: no ``base_url`` nor ``fenced``, or one that is not an absolute ``http(s)://`` URL; ``mounts``
            (their requests would not be stamped); ``transport`` with one of the arguments above (give them to it).
    """

    def __init__(
        self,
        *,
        base_url: str | httpx.URL = "",
        fenced: Sequence[str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **kwargs: Any,
    ) -> None:
        if fenced is None:
            if not str(base_url):
                raise ValueError("a FencedClient fences its base_url: give base_url= or fenced=[...]")
            fenced = [str(base_url)]
        if "mounts" in kwargs:
            raise ValueError(
                "a FencedClient takes no mounts= (their requests would go out unstamped): build an httpx.AsyncClient "
                "with mounts of FencingTransport(transport, fenced=[...])"
            )
        given = {name: kwargs.pop(name) for name in _TRANSPORT_ARGUMENTS if name in kwargs}
        if transport is not None and given:
            raise ValueError(f"give {', '.join(given)} to the transport you pass, not to the FencedClient")
        if transport is None:
            transport = httpx.AsyncHTTPTransport(trust_env=kwargs.get("trust_env", True), **given)
        super().__init__(base_url=base_url, transport=FencingTransport(transport, fenced=fenced), **kwargs)
