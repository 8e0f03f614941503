from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.lease import Lease
from ...types import Response


def _get_kwargs(
    lease_id: str,
) -> dict[str, Any]:
    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/leases/{lease_id}".format(
            lease_id=quote(str(lease_id), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | Lease:
    if response.status_code == 200:
        response_200 = Lease.from_dict(response.json())

        return response_200

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
) -> Response[Error | Lease]:
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
) -> Response[Error | Lease]:
    """Get one lease.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Lease]
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
) -> Error | Lease | None:
    """Get one lease.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Lease
    """

    return sync_detailed(
        lease_id=lease_id,
        client=client,
    ).parsed


async def asyncio_detailed(
    lease_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[Error | Lease]:
    """Get one lease.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Lease]
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
) -> Error | Lease | None:
    """Get one lease.

    Args:
        lease_id (str): A lease's id, `lse_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Lease
    """

    return (
        await asyncio_detailed(
            lease_id=lease_id,
            client=client,
        )
    ).parsed
