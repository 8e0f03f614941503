from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.env import Env
from ...models.error import Error
from ...models.wait_request import WaitRequest
from ...types import Response


def _get_kwargs(
    env_id: str,
    *,
    body: WaitRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/envs/{env_id}/wait".format(
            env_id=quote(str(env_id), safe=""),
        ),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
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
    body: WaitRequest,
) -> Response[Env | Error]:
    """Wait until an env reaches a status (long-poll).

     Returns the env as soon as it reaches `until`, reaches a terminal
    status (`failed`, `deleted`), or `timeout_s` passes; the caller
    compares the returned `status` with what it waited for.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        body (WaitRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Env | Error]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: WaitRequest,
) -> Env | Error | None:
    """Wait until an env reaches a status (long-poll).

     Returns the env as soon as it reaches `until`, reaches a terminal
    status (`failed`, `deleted`), or `timeout_s` passes; the caller
    compares the returned `status` with what it waited for.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        body (WaitRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Env | Error
    """

    return sync_detailed(
        env_id=env_id,
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: WaitRequest,
) -> Response[Env | Error]:
    """Wait until an env reaches a status (long-poll).

     Returns the env as soon as it reaches `until`, reaches a terminal
    status (`failed`, `deleted`), or `timeout_s` passes; the caller
    compares the returned `status` with what it waited for.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        body (WaitRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Env | Error]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: WaitRequest,
) -> Env | Error | None:
    """Wait until an env reaches a status (long-poll).

     Returns the env as soon as it reaches `until`, reaches a terminal
    status (`failed`, `deleted`), or `timeout_s` passes; the caller
    compares the returned `status` with what it waited for.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        body (WaitRequest):

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
            body=body,
        )
    ).parsed
