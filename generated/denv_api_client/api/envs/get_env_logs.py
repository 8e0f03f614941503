from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.env_logs import EnvLogs
from ...models.error import Error
from ...types import UNSET, Response, Unset


def _get_kwargs(
    env_id: str,
    *,
    service: str | Unset = UNSET,
    tail: int | Unset = 100,
) -> dict[str, Any]:
    params: dict[str, Any] = {}

    params["service"] = service

    params["tail"] = tail

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/envs/{env_id}/logs".format(
            env_id=quote(str(env_id), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> EnvLogs | Error:
    if response.status_code == 200:
        response_200 = EnvLogs.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Error.from_dict(response.json())

        return response_404

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[EnvLogs | Error]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    service: str | Unset = UNSET,
    tail: int | Unset = 100,
) -> Response[EnvLogs | Error]:
    """The last log lines of one of an env's services.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        service (str | Unset): A service's name, as in a compose file.
        tail (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EnvLogs | Error]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
        service=service,
        tail=tail,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    service: str | Unset = UNSET,
    tail: int | Unset = 100,
) -> EnvLogs | Error | None:
    """The last log lines of one of an env's services.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        service (str | Unset): A service's name, as in a compose file.
        tail (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EnvLogs | Error
    """

    return sync_detailed(
        env_id=env_id,
        client=client,
        service=service,
        tail=tail,
    ).parsed


async def asyncio_detailed(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    service: str | Unset = UNSET,
    tail: int | Unset = 100,
) -> Response[EnvLogs | Error]:
    """The last log lines of one of an env's services.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        service (str | Unset): A service's name, as in a compose file.
        tail (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EnvLogs | Error]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
        service=service,
        tail=tail,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    service: str | Unset = UNSET,
    tail: int | Unset = 100,
) -> EnvLogs | Error | None:
    """The last log lines of one of an env's services.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        service (str | Unset): A service's name, as in a compose file.
        tail (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EnvLogs | Error
    """

    return (
        await asyncio_detailed(
            env_id=env_id,
            client=client,
            service=service,
            tail=tail,
        )
    ).parsed
