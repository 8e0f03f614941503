from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.lease import Lease
from ...models.lease_create import LeaseCreate
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    body: LeaseCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(idempotency_key, Unset):
        headers["Idempotency-Key"] = idempotency_key

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/leases",
    }

    if not isinstance(body, Unset):
        _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | Lease:
    if response.status_code == 201:
        response_201 = Lease.from_dict(response.json())

        return response_201

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Error.from_dict(response.json())

        return response_429

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Error | Lease]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: LeaseCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Response[Error | Lease]:
    """Open a lease, which holds the envs created with its id.

     A client opens one lease, passes its id as `lease_id` when it creates
    or forks envs, and renews it every few seconds. When no renewal
    arrives for `timeout_s` (the client was killed, paused, or lost its
    network), the lease expires and the server deletes every env it
    holds, with the warm spares they asked for, within seconds; each
    env's `deletion` says why. Closing the lease deletes them at once.
    `ttl_s` still bounds each env. A server that restarts gives open
    leases `timeout_s` from its start to be renewed. An API key may hold
    1024 open leases (the local server's `--max-leases-per-key`; one per
    client): past it 429 `quota_exceeded` naming the flag.

    Args:
        idempotency_key (str | Unset):
        body (LeaseCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Lease]
    """

    kwargs = _get_kwargs(
        body=body,
        idempotency_key=idempotency_key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient | Client,
    body: LeaseCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Error | Lease | None:
    """Open a lease, which holds the envs created with its id.

     A client opens one lease, passes its id as `lease_id` when it creates
    or forks envs, and renews it every few seconds. When no renewal
    arrives for `timeout_s` (the client was killed, paused, or lost its
    network), the lease expires and the server deletes every env it
    holds, with the warm spares they asked for, within seconds; each
    env's `deletion` says why. Closing the lease deletes them at once.
    `ttl_s` still bounds each env. A server that restarts gives open
    leases `timeout_s` from its start to be renewed. An API key may hold
    1024 open leases (the local server's `--max-leases-per-key`; one per
    client): past it 429 `quota_exceeded` naming the flag.

    Args:
        idempotency_key (str | Unset):
        body (LeaseCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Lease
    """

    return sync_detailed(
        client=client,
        body=body,
        idempotency_key=idempotency_key,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: LeaseCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Response[Error | Lease]:
    """Open a lease, which holds the envs created with its id.

     A client opens one lease, passes its id as `lease_id` when it creates
    or forks envs, and renews it every few seconds. When no renewal
    arrives for `timeout_s` (the client was killed, paused, or lost its
    network), the lease expires and the server deletes every env it
    holds, with the warm spares they asked for, within seconds; each
    env's `deletion` says why. Closing the lease deletes them at once.
    `ttl_s` still bounds each env. A server that restarts gives open
    leases `timeout_s` from its start to be renewed. An API key may hold
    1024 open leases (the local server's `--max-leases-per-key`; one per
    client): past it 429 `quota_exceeded` naming the flag.

    Args:
        idempotency_key (str | Unset):
        body (LeaseCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Lease]
    """

    kwargs = _get_kwargs(
        body=body,
        idempotency_key=idempotency_key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    body: LeaseCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Error | Lease | None:
    """Open a lease, which holds the envs created with its id.

     A client opens one lease, passes its id as `lease_id` when it creates
    or forks envs, and renews it every few seconds. When no renewal
    arrives for `timeout_s` (the client was killed, paused, or lost its
    network), the lease expires and the server deletes every env it
    holds, with the warm spares they asked for, within seconds; each
    env's `deletion` says why. Closing the lease deletes them at once.
    `ttl_s` still bounds each env. A server that restarts gives open
    leases `timeout_s` from its start to be renewed. An API key may hold
    1024 open leases (the local server's `--max-leases-per-key`; one per
    client): past it 429 `quota_exceeded` naming the flag.

    Args:
        idempotency_key (str | Unset):
        body (LeaseCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Lease
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
            idempotency_key=idempotency_key,
        )
    ).parsed
