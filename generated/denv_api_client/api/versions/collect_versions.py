from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.gc_result import GcResult
from ...types import Response


def _get_kwargs() -> dict[str, Any]:
    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/gc",
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | GcResult:
    if response.status_code == 200:
        response_200 = GcResult.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    response_default = Error.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Error | GcResult]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
) -> Response[Error | GcResult]:
    """Delete the caller's expired versions now.

     Deletes the versions a sandbox or a fork made (`Version.implicit`)
    that no env and no child version has needed for the server's grace
    period, and the layers only they named, as the server does on its
    own every `--gc-interval` seconds; says what it freed.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | GcResult]
    """

    kwargs = _get_kwargs()

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient | Client,
) -> Error | GcResult | None:
    """Delete the caller's expired versions now.

     Deletes the versions a sandbox or a fork made (`Version.implicit`)
    that no env and no child version has needed for the server's grace
    period, and the layers only they named, as the server does on its
    own every `--gc-interval` seconds; says what it freed.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | GcResult
    """

    return sync_detailed(
        client=client,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
) -> Response[Error | GcResult]:
    """Delete the caller's expired versions now.

     Deletes the versions a sandbox or a fork made (`Version.implicit`)
    that no env and no child version has needed for the server's grace
    period, and the layers only they named, as the server does on its
    own every `--gc-interval` seconds; says what it freed.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | GcResult]
    """

    kwargs = _get_kwargs()

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
) -> Error | GcResult | None:
    """Delete the caller's expired versions now.

     Deletes the versions a sandbox or a fork made (`Version.implicit`)
    that no env and no child version has needed for the server's grace
    period, and the layers only they named, as the server does on its
    own every `--gc-interval` seconds; says what it freed.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | GcResult
    """

    return (
        await asyncio_detailed(
            client=client,
        )
    ).parsed
