from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.env_batch import EnvBatch
from ...models.envs_create import EnvsCreate
from ...models.error import Error
from ...types import UNSET, Response, Unset


def _get_kwargs(
    version_id: str,
    *,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(idempotency_key, Unset):
        headers["Idempotency-Key"] = idempotency_key

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/versions/{version_id}/envs".format(
            version_id=quote(str(version_id), safe=""),
        ),
    }

    if not isinstance(body, Unset):
        _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> EnvBatch | Error:
    if response.status_code == 201:
        response_201 = EnvBatch.from_dict(response.json())

        return response_201

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

    if response.status_code == 507:
        response_507 = Error.from_dict(response.json())

        return response_507

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[EnvBatch | Error]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    version_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Response[EnvBatch | Error]:
    """Start `count` envs from a stored version.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EnvBatch | Error]
    """

    kwargs = _get_kwargs(
        version_id=version_id,
        body=body,
        idempotency_key=idempotency_key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    version_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> EnvBatch | Error | None:
    """Start `count` envs from a stored version.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EnvBatch | Error
    """

    return sync_detailed(
        version_id=version_id,
        client=client,
        body=body,
        idempotency_key=idempotency_key,
    ).parsed


async def asyncio_detailed(
    version_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> Response[EnvBatch | Error]:
    """Start `count` envs from a stored version.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EnvBatch | Error]
    """

    kwargs = _get_kwargs(
        version_id=version_id,
        body=body,
        idempotency_key=idempotency_key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    version_id: str,
    *,
    client: AuthenticatedClient | Client,
    body: EnvsCreate | Unset = UNSET,
    idempotency_key: str | Unset = UNSET,
) -> EnvBatch | Error | None:
    """Start `count` envs from a stored version.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        idempotency_key (str | Unset):
        body (EnvsCreate | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EnvBatch | Error
    """

    return (
        await asyncio_detailed(
            version_id=version_id,
            client=client,
            body=body,
            idempotency_key=idempotency_key,
        )
    ).parsed
