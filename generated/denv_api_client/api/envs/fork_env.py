from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.envs_create import EnvsCreate
from ...models.error import Error
from ...models.fork import Fork
from ...types import UNSET, Response, Unset


def _get_kwargs(
    env_id: str,
    *,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(idempotency_key, Unset):
        headers["Idempotency-Key"] = idempotency_key

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/envs/{env_id}/fork".format(
            env_id=quote(str(env_id), safe=""),
        ),
    }

    if not isinstance(body, Unset):
        _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | Fork:
    if response.status_code == 201:
        response_201 = Fork.from_dict(response.json())

        return response_201

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Error.from_dict(response.json())

        return response_404

    if response.status_code == 409:
        response_409 = Error.from_dict(response.json())

        return response_409

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Error.from_dict(response.json())

        return response_429

    if response.status_code == 507:
        response_507 = Error.from_dict(response.json())

        return response_507

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Error | Fork]:
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
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Response[Error | Fork]:
    """Snapshot an env once and start `count` children from it.

     One snapshot (as `POST /v1/envs/{env_id}/snapshot`, with its volume
    limit), then `count` children started in parallel, each with its own
    network, volumes and endpoints. Children start from booted spares
    (`start: warm`) when the version is warm-safe and spares are ready,
    else cold.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Fork]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
        body=body,
        idempotency_key=idempotency_key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Error | Fork | None:
    """Snapshot an env once and start `count` children from it.

     One snapshot (as `POST /v1/envs/{env_id}/snapshot`, with its volume
    limit), then `count` children started in parallel, each with its own
    network, volumes and endpoints. Children start from booted spares
    (`start: warm`) when the version is warm-safe and spares are ready,
    else cold.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Fork
    """

    return sync_detailed(
        env_id=env_id,
        client=client,
        body=body,
        idempotency_key=idempotency_key,
    ).parsed


async def asyncio_detailed(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Response[Error | Fork]:
    """Snapshot an env once and start `count` children from it.

     One snapshot (as `POST /v1/envs/{env_id}/snapshot`, with its volume
    limit), then `count` children started in parallel, each with its own
    network, volumes and endpoints. Children start from booted spares
    (`start: warm`) when the version is warm-safe and spares are ready,
    else cold.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Fork]
    """

    kwargs = _get_kwargs(
        env_id=env_id,
        body=body,
        idempotency_key=idempotency_key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    env_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Error | Fork | None:
    """Snapshot an env once and start `count` children from it.

     One snapshot (as `POST /v1/envs/{env_id}/snapshot`, with its volume
    limit), then `count` children started in parallel, each with its own
    network, volumes and endpoints. Children start from booted spares
    (`start: warm`) when the version is warm-safe and spares are ready,
    else cold.

    Args:
        env_id (str): An env's id, `env_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Fork
    """

    return (
        await asyncio_detailed(
            env_id=env_id,
            client=client,
            body=body,
            idempotency_key=idempotency_key,
        )
    ).parsed
