from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.env import Env
from ...models.error import Error
from ...types import Response


def _get_kwargs(
    env_id: str,
) -> dict[str, Any]:
    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/envs/{env_id}/detach".format(
            env_id=quote(str(env_id), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Env | Error:
    if response.status_code == 200:
        response_200 = Env.from_dict(response.json())

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
) -> Response[Env | Error]:
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
) -> Response[Env | Error]:
    """Take an env out of its lease, to keep it past its client.

     The env no longer belongs to the lease that held it: when that lease
    expires or is closed, this env stays, until its `ttl_s` or a delete.
    Its record then has `lease_id: null`. Detaching an env that no lease
    holds changes nothing.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Env | Error]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Env | Error | None:
    """Take an env out of its lease, to keep it past its client.

     The env no longer belongs to the lease that held it: when that lease
    expires or is closed, this env stays, until its `ttl_s` or a delete.
    Its record then has `lease_id: null`. Detaching an env that no lease
    holds changes nothing.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Env | Error
    """

    return sync_detailed(
        env_id=env_id,
        client=client,
    ).parsed


async def asyncio_detailed(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[Env | Error]:
    """Take an env out of its lease, to keep it past its client.

     The env no longer belongs to the lease that held it: when that lease
    expires or is closed, this env stays, until its `ttl_s` or a delete.
    Its record then has `lease_id: null`. Detaching an env that no lease
    holds changes nothing.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Env | Error]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Env | Error | None:
    """Take an env out of its lease, to keep it past its client.

     The env no longer belongs to the lease that held it: when that lease
    expires or is closed, this env stays, until its `ttl_s` or a delete.
    Its record then has `lease_id: null`. Detaching an env that no lease
    holds changes nothing.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Env | Error
    """

    return (
        await asyncio_detailed(
            env_id=env_id,
            client=client,
        )
    ).parsed
