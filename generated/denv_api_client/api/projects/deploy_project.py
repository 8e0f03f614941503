from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.deploy_request import DeployRequest
from ...models.error import Error
from ...models.version import Version
from ...types import UNSET, Response, Unset


def _get_kwargs(
    name: str,
    *,
    body: DeployRequest,
    idempotency_key: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(idempotency_key, Unset):
        headers["Idempotency-Key"] = idempotency_key

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/projects/{name}/deploy".format(
            name=quote(str(name), safe=""),
        ),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | Version:
    if response.status_code == 201:
        response_201 = Version.from_dict(response.json())

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

    if response.status_code == 507:
        response_507 = Error.from_dict(response.json())

        return response_507

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Error | Version]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    name: str,
    *,
    client: AuthenticatedClient | Client,
    body: DeployRequest,
    idempotency_key: str | Unset = UNSET,
) -> Response[Error | Version]:
    """Deploy a compose file as a new version of a project.

     The compose file's `x-denv.agent.service` names the service that
    clients talk to (for OpenEnv, the OpenEnv server); `x-denv.tools`
    (optional) lists the MCP tools it declares, kept as `Version.tools`.
    Every image must already be on the engine.

    Args:
        name (str): Lower-case letters, digits and dashes.
        idempotency_key (str | Unset):
        body (DeployRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Version]
    """

    kwargs = _get_kwargs(
        name=name,
        body=body,
        idempotency_key=idempotency_key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    name: str,
    *,
    client: AuthenticatedClient | Client,
    body: DeployRequest,
    idempotency_key: str | Unset = UNSET,
) -> Error | Version | None:
    """Deploy a compose file as a new version of a project.

     The compose file's `x-denv.agent.service` names the service that
    clients talk to (for OpenEnv, the OpenEnv server); `x-denv.tools`
    (optional) lists the MCP tools it declares, kept as `Version.tools`.
    Every image must already be on the engine.

    Args:
        name (str): Lower-case letters, digits and dashes.
        idempotency_key (str | Unset):
        body (DeployRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Version
    """

    return sync_detailed(
        name=name,
        client=client,
        body=body,
        idempotency_key=idempotency_key,
    ).parsed


async def asyncio_detailed(
    name: str,
    *,
    client: AuthenticatedClient | Client,
    body: DeployRequest,
    idempotency_key: str | Unset = UNSET,
) -> Response[Error | Version]:
    """Deploy a compose file as a new version of a project.

     The compose file's `x-denv.agent.service` names the service that
    clients talk to (for OpenEnv, the OpenEnv server); `x-denv.tools`
    (optional) lists the MCP tools it declares, kept as `Version.tools`.
    Every image must already be on the engine.

    Args:
        name (str): Lower-case letters, digits and dashes.
        idempotency_key (str | Unset):
        body (DeployRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | Version]
    """

    kwargs = _get_kwargs(
        name=name,
        body=body,
        idempotency_key=idempotency_key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    name: str,
    *,
    client: AuthenticatedClient | Client,
    body: DeployRequest,
    idempotency_key: str | Unset = UNSET,
) -> Error | Version | None:
    """Deploy a compose file as a new version of a project.

     The compose file's `x-denv.agent.service` names the service that
    clients talk to (for OpenEnv, the OpenEnv server); `x-denv.tools`
    (optional) lists the MCP tools it declares, kept as `Version.tools`.
    Every image must already be on the engine.

    Args:
        name (str): Lower-case letters, digits and dashes.
        idempotency_key (str | Unset):
        body (DeployRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | Version
    """

    return (
        await asyncio_detailed(
            name=name,
            client=client,
            body=body,
            idempotency_key=idempotency_key,
        )
    ).parsed
