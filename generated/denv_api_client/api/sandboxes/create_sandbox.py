from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.env import Env
from ...models.env_batch import EnvBatch
from ...models.error import Error
from ...models.sandbox_create import SandboxCreate
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    body: SandboxCreate,
    idempotency_key: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(idempotency_key, Unset):
        headers["Idempotency-Key"] = idempotency_key

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/sandboxes",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Env | EnvBatch | Error:
    if response.status_code == 201:

        def _parse_response_201(data: object) -> Env | EnvBatch:
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                response_201_type_0 = Env.from_dict(data)

                return response_201_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            response_201_type_1 = EnvBatch.from_dict(data)

            return response_201_type_1

        response_201 = _parse_response_201(response.json())

        return response_201

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 409:
        response_409 = Error.from_dict(response.json())

        return response_409

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Error.from_dict(response.json())

        return response_429

    if response.status_code == 503:
        response_503 = Error.from_dict(response.json())

        return response_503

    if response.status_code == 507:
        response_507 = Error.from_dict(response.json())

        return response_507

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Env | EnvBatch | Error]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: SandboxCreate,
    idempotency_key: str | Unset = UNSET,
) -> Response[Env | EnvBatch | Error]:
    """Run one image as a new env (or `count` of them).

     Creates an implicit one-service version from `image` and starts an env
    from it. With `wait: healthy` the call returns once the service
    answers `health_path` with 200, or returns the env as `failed` with its
    last log lines when the container exits or `wait_timeout_s` passes.

    A ready warm spare of the same configuration (kept for an env created
    with `warm` and `warm_fork`) is taken instead of a boot: the env's
    `start` is `warm`. With `count`, `count` envs are created and the
    answer is an `EnvBatch` reporting each env's success or failure on its
    own.

    Args:
        idempotency_key (str | Unset):
        body (SandboxCreate):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Env | EnvBatch | Error]
    """

    kwargs = _get_kwargs(
        body=body,
        idempotency_key=idempotency_key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient | Client,
    body: SandboxCreate,
    idempotency_key: str | Unset = UNSET,
) -> Env | EnvBatch | Error | None:
    """Run one image as a new env (or `count` of them).

     Creates an implicit one-service version from `image` and starts an env
    from it. With `wait: healthy` the call returns once the service
    answers `health_path` with 200, or returns the env as `failed` with its
    last log lines when the container exits or `wait_timeout_s` passes.

    A ready warm spare of the same configuration (kept for an env created
    with `warm` and `warm_fork`) is taken instead of a boot: the env's
    `start` is `warm`. With `count`, `count` envs are created and the
    answer is an `EnvBatch` reporting each env's success or failure on its
    own.

    Args:
        idempotency_key (str | Unset):
        body (SandboxCreate):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Env | EnvBatch | Error
    """

    return sync_detailed(
        client=client,
        body=body,
        idempotency_key=idempotency_key,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: SandboxCreate,
    idempotency_key: str | Unset = UNSET,
) -> Response[Env | EnvBatch | Error]:
    """Run one image as a new env (or `count` of them).

     Creates an implicit one-service version from `image` and starts an env
    from it. With `wait: healthy` the call returns once the service
    answers `health_path` with 200, or returns the env as `failed` with its
    last log lines when the container exits or `wait_timeout_s` passes.

    A ready warm spare of the same configuration (kept for an env created
    with `warm` and `warm_fork`) is taken instead of a boot: the env's
    `start` is `warm`. With `count`, `count` envs are created and the
    answer is an `EnvBatch` reporting each env's success or failure on its
    own.

    Args:
        idempotency_key (str | Unset):
        body (SandboxCreate):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Env | EnvBatch | Error]
    """

    kwargs = _get_kwargs(
        body=body,
        idempotency_key=idempotency_key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    body: SandboxCreate,
    idempotency_key: str | Unset = UNSET,
) -> Env | EnvBatch | Error | None:
    """Run one image as a new env (or `count` of them).

     Creates an implicit one-service version from `image` and starts an env
    from it. With `wait: healthy` the call returns once the service
    answers `health_path` with 200, or returns the env as `failed` with its
    last log lines when the container exits or `wait_timeout_s` passes.

    A ready warm spare of the same configuration (kept for an env created
    with `warm` and `warm_fork`) is taken instead of a boot: the env's
    `start` is `warm`. With `count`, `count` envs are created and the
    answer is an `EnvBatch` reporting each env's success or failure on its
    own.

    Args:
        idempotency_key (str | Unset):
        body (SandboxCreate):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Env | EnvBatch | Error
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
            idempotency_key=idempotency_key,
        )
    ).parsed
