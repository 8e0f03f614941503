from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.env_list import EnvList
from ...models.env_status import EnvStatus
from ...models.error import Error
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    status: EnvStatus | Unset = UNSET,
    include_deleted: bool | Unset = False,
    version_id: str | Unset = UNSET,
) -> dict[str, Any]:
    params: dict[str, Any] = {}

    params["limit"] = limit

    params["cursor"] = cursor

    json_status: str | Unset = UNSET
    if not isinstance(status, Unset):
        json_status = status.value

    params["status"] = json_status

    params["include_deleted"] = include_deleted

    params["version_id"] = version_id

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/envs",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> EnvList | Error:
    if response.status_code == 200:
        response_200 = EnvList.from_dict(response.json())

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
) -> Response[EnvList | Error]:
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
    status: EnvStatus | Unset = UNSET,
    include_deleted: bool | Unset = False,
    version_id: str | Unset = UNSET,
) -> Response[EnvList | Error]:
    """List the caller's envs, newest first.

     Lists the envs that are not deleted. A deleted env keeps its record
    (its lineage and labels), and `include_deleted=true` lists those
    too; `status=deleted` lists only them.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        status (EnvStatus | Unset): Closed for v1 (a new status comes with a new major version).
            `creating` (resources being made), `starting` (containers run, not yet
            healthy), `running` (containers run; no health check was asked for),
            `healthy` (the agent service answers its health path), `failed`
            (see `error`), `deleted`.
        include_deleted (bool | Unset):  Default: False.
        version_id (str | Unset): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EnvList | Error]
    """

    kwargs = _get_kwargs(
        limit=limit,
        cursor=cursor,
        status=status,
        include_deleted=include_deleted,
        version_id=version_id,
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
    status: EnvStatus | Unset = UNSET,
    include_deleted: bool | Unset = False,
    version_id: str | Unset = UNSET,
) -> EnvList | Error | None:
    """List the caller's envs, newest first.

     Lists the envs that are not deleted. A deleted env keeps its record
    (its lineage and labels), and `include_deleted=true` lists those
    too; `status=deleted` lists only them.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        status (EnvStatus | Unset): Closed for v1 (a new status comes with a new major version).
            `creating` (resources being made), `starting` (containers run, not yet
            healthy), `running` (containers run; no health check was asked for),
            `healthy` (the agent service answers its health path), `failed`
            (see `error`), `deleted`.
        include_deleted (bool | Unset):  Default: False.
        version_id (str | Unset): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EnvList | Error
    """

    return sync_detailed(
        client=client,
        limit=limit,
        cursor=cursor,
        status=status,
        include_deleted=include_deleted,
        version_id=version_id,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    status: EnvStatus | Unset = UNSET,
    include_deleted: bool | Unset = False,
    version_id: str | Unset = UNSET,
) -> Response[EnvList | Error]:
    """List the caller's envs, newest first.

     Lists the envs that are not deleted. A deleted env keeps its record
    (its lineage and labels), and `include_deleted=true` lists those
    too; `status=deleted` lists only them.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        status (EnvStatus | Unset): Closed for v1 (a new status comes with a new major version).
            `creating` (resources being made), `starting` (containers run, not yet
            healthy), `running` (containers run; no health check was asked for),
            `healthy` (the agent service answers its health path), `failed`
            (see `error`), `deleted`.
        include_deleted (bool | Unset):  Default: False.
        version_id (str | Unset): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EnvList | Error]
    """

    kwargs = _get_kwargs(
        limit=limit,
        cursor=cursor,
        status=status,
        include_deleted=include_deleted,
        version_id=version_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    cursor: str | Unset = UNSET,
    status: EnvStatus | Unset = UNSET,
    include_deleted: bool | Unset = False,
    version_id: str | Unset = UNSET,
) -> EnvList | Error | None:
    """List the caller's envs, newest first.

     Lists the envs that are not deleted. A deleted env keeps its record
    (its lineage and labels), and `include_deleted=true` lists those
    too; `status=deleted` lists only them.

    Args:
        limit (int | Unset):  Default: 50.
        cursor (str | Unset):
        status (EnvStatus | Unset): Closed for v1 (a new status comes with a new major version).
            `creating` (resources being made), `starting` (containers run, not yet
            healthy), `running` (containers run; no health check was asked for),
            `healthy` (the agent service answers its health path), `failed`
            (see `error`), `deleted`.
        include_deleted (bool | Unset):  Default: False.
        version_id (str | Unset): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EnvList | Error
    """

    return (
        await asyncio_detailed(
            client=client,
            limit=limit,
            cursor=cursor,
            status=status,
            include_deleted=include_deleted,
            version_id=version_id,
        )
    ).parsed
