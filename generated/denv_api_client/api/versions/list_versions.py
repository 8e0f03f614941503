from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.version_list import VersionList
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    project: str | Unset = UNSET,
) -> dict[str, Any]:
    params: dict[str, Any] = {}

    params["limit"] = limit

    params["cursor"] = cursor

    params["project"] = project

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/versions",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | VersionList:
    if response.status_code == 200:
        response_200 = VersionList.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Error | VersionList]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    project: str | Unset = UNSET,
) -> Response[Error | VersionList]:
    """List the caller's versions, newest first.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        project (str | Unset): Lower-case letters, digits and dashes.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | VersionList]
    """

    kwargs = _get_kwargs(
        limit=limit,
        cursor=cursor,
        project=project,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    project: str | Unset = UNSET,
) -> Error | VersionList | None:
    """List the caller's versions, newest first.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        project (str | Unset): Lower-case letters, digits and dashes.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | VersionList
    """

    return sync_detailed(
        client=client,
        limit=limit,
        cursor=cursor,
        project=project,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    project: str | Unset = UNSET,
) -> Response[Error | VersionList]:
    """List the caller's versions, newest first.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        project (str | Unset): Lower-case letters, digits and dashes.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | VersionList]
    """

    kwargs = _get_kwargs(
        limit=limit,
        cursor=cursor,
        project=project,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    project: str | Unset = UNSET,
) -> Error | VersionList | None:
    """List the caller's versions, newest first.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        project (str | Unset): Lower-case letters, digits and dashes.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | VersionList
    """

    return (
        await asyncio_detailed(
            client=client,
            limit=limit,
            cursor=cursor,
            project=project,
        )
    ).parsed
