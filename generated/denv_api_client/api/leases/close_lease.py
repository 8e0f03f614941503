from http import HTTPStatus
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...types import Response


def _get_kwargs(
    lease_id: str,
) -> dict[str, Any]:
    _kwargs: dict[str, Any] = {
        "method": "delete",
        "url": "/v1/leases/{lease_id}".format(
            lease_id=quote(str(lease_id), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Any | Error:
    if response.status_code == 204:
        response_204 = cast(Any, None)
        return response_204

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Error.from_dict(response.json())

        return response_404

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Any | Error]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    lease_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[Any | Error]:
    """Close a lease and delete every env it holds, at once.

     What a client does when it exits cleanly. Its envs are deleted at
    once (their `deletion.reason` is `lease_closed`), their teardown
    running after the answer, so a client with hundreds of envs exits
    without waiting for it; detached envs stay. Idempotent: closing a
    closed or expired lease succeeds.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Any | Error]
    """

    kwargs = _get_kwargs(
        lease_id=lease_id,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    lease_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Any | Error | None:
    """Close a lease and delete every env it holds, at once.

     What a client does when it exits cleanly. Its envs are deleted at
    once (their `deletion.reason` is `lease_closed`), their teardown
    running after the answer, so a client with hundreds of envs exits
    without waiting for it; detached envs stay. Idempotent: closing a
    closed or expired lease succeeds.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Any | Error
    """

    return sync_detailed(
        lease_id=lease_id,
        client=client,
    ).parsed


async def asyncio_detailed(
    lease_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[Any | Error]:
    """Close a lease and delete every env it holds, at once.

     What a client does when it exits cleanly. Its envs are deleted at
    once (their `deletion.reason` is `lease_closed`), their teardown
    running after the answer, so a client with hundreds of envs exits
    without waiting for it; detached envs stay. Idempotent: closing a
    closed or expired lease succeeds.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Any | Error]
    """

    kwargs = _get_kwargs(
        lease_id=lease_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    lease_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Any | Error | None:
    """Close a lease and delete every env it holds, at once.

     What a client does when it exits cleanly. Its envs are deleted at
    once (their `deletion.reason` is `lease_closed`), their teardown
    running after the answer, so a client with hundreds of envs exits
    without waiting for it; detached envs stay. Idempotent: closing a
    closed or expired lease succeeds.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Any | Error
    """

    return (
        await asyncio_detailed(
            lease_id=lease_id,
            client=client,
        )
    ).parsed
