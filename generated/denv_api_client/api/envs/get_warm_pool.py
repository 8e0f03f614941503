from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.warm_pool import WarmPool
from ...types import Response


def _get_kwargs(
    env_id: str,
) -> dict[str, Any]:
    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/envs/{env_id}/warm".format(
            env_id=quote(str(env_id), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | WarmPool:
    if response.status_code == 200:
        response_200 = WarmPool.from_dict(response.json())

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
) -> Response[Error | WarmPool]:
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
) -> Response[Error | WarmPool]:
    """The warm pool an env asked for (`warm`), as it is now.

     How many booted spares stand ready for this env's forks and how many
    are booting. A client that wants its next `fork(n)` warm polls this
    until `ready` reaches `target` (state `ready`). State `none`: the env
    asked for no spares (or its version is not warm-safe); `filling`:
    spares are booting; `stalled`: boots keep failing (see `error`, which
    says when the pool tries again: it backs off, 15 s doubling up to
    10 minutes, and never gives up for good), or the server has no room
    for another spare. A spare that is still booting (using CPU) when
    its 120 s run out is given more time, up to 8 more minutes.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | WarmPool]
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
) -> Error | WarmPool | None:
    """The warm pool an env asked for (`warm`), as it is now.

     How many booted spares stand ready for this env's forks and how many
    are booting. A client that wants its next `fork(n)` warm polls this
    until `ready` reaches `target` (state `ready`). State `none`: the env
    asked for no spares (or its version is not warm-safe); `filling`:
    spares are booting; `stalled`: boots keep failing (see `error`, which
    says when the pool tries again: it backs off, 15 s doubling up to
    10 minutes, and never gives up for good), or the server has no room
    for another spare. A spare that is still booting (using CPU) when
    its 120 s run out is given more time, up to 8 more minutes.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | WarmPool
    """

    return sync_detailed(
        env_id=env_id,
        client=client,
    ).parsed


async def asyncio_detailed(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[Error | WarmPool]:
    """The warm pool an env asked for (`warm`), as it is now.

     How many booted spares stand ready for this env's forks and how many
    are booting. A client that wants its next `fork(n)` warm polls this
    until `ready` reaches `target` (state `ready`). State `none`: the env
    asked for no spares (or its version is not warm-safe); `filling`:
    spares are booting; `stalled`: boots keep failing (see `error`, which
    says when the pool tries again: it backs off, 15 s doubling up to
    10 minutes, and never gives up for good), or the server has no room
    for another spare. A spare that is still booting (using CPU) when
    its 120 s run out is given more time, up to 8 more minutes.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | WarmPool]
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
) -> Error | WarmPool | None:
    """The warm pool an env asked for (`warm`), as it is now.

     How many booted spares stand ready for this env's forks and how many
    are booting. A client that wants its next `fork(n)` warm polls this
    until `ready` reaches `target` (state `ready`). State `none`: the env
    asked for no spares (or its version is not warm-safe); `filling`:
    spares are booting; `stalled`: boots keep failing (see `error`, which
    says when the pool tries again: it backs off, 15 s doubling up to
    10 minutes, and never gives up for good), or the server has no room
    for another spare. A spare that is still booting (using CPU) when
    its 120 s run out is given more time, up to 8 more minutes.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | WarmPool
    """

    return (
        await asyncio_detailed(
            env_id=env_id,
            client=client,
        )
    ).parsed
