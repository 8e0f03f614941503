from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.version_diff import VersionDiff
from ...types import UNSET, Response


def _get_kwargs(
    version_id: str,
    *,
    base: str,
) -> dict[str, Any]:
    params: dict[str, Any] = {}

    params["base"] = base

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/versions/{version_id}/diff".format(
            version_id=quote(str(version_id), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | VersionDiff:
    if response.status_code == 200:
        response_200 = VersionDiff.from_dict(response.json())

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
) -> Response[Error | VersionDiff]:
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
    base: str,
) -> Response[Error | VersionDiff]:
    """What changed in the volumes from `base` to this version.

     Computed from the two versions' layers on the server, without starting
    an env: only the layers the two stacks do not share are read, so the
    cost follows what changed, not the volumes' size. A file counts as
    modified when its type, size, mode or modification time differ.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        base (str): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | VersionDiff]
    """

    kwargs = _get_kwargs(
        version_id=version_id,
        base=base,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    version_id: str,
    *,
    client: AuthenticatedClient | Client,
    base: str,
) -> Error | VersionDiff | None:
    """What changed in the volumes from `base` to this version.

     Computed from the two versions' layers on the server, without starting
    an env: only the layers the two stacks do not share are read, so the
    cost follows what changed, not the volumes' size. A file counts as
    modified when its type, size, mode or modification time differ.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        base (str): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | VersionDiff
    """

    return sync_detailed(
        version_id=version_id,
        client=client,
        base=base,
    ).parsed


async def asyncio_detailed(
    version_id: str,
    *,
    client: AuthenticatedClient | Client,
    base: str,
) -> Response[Error | VersionDiff]:
    """What changed in the volumes from `base` to this version.

     Computed from the two versions' layers on the server, without starting
    an env: only the layers the two stacks do not share are read, so the
    cost follows what changed, not the volumes' size. A file counts as
    modified when its type, size, mode or modification time differ.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        base (str): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | VersionDiff]
    """

    kwargs = _get_kwargs(
        version_id=version_id,
        base=base,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    version_id: str,
    *,
    client: AuthenticatedClient | Client,
    base: str,
) -> Error | VersionDiff | None:
    """What changed in the volumes from `base` to this version.

     Computed from the two versions' layers on the server, without starting
    an env: only the layers the two stacks do not share are read, so the
    cost follows what changed, not the volumes' size. A file counts as
    modified when its type, size, mode or modification time differ.

    Args:
        version_id (str): A version's id, `ver_` followed by a ULID.
        base (str): A version's id, `ver_` followed by a ULID.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | VersionDiff
    """

    return (
        await asyncio_detailed(
            version_id=version_id,
            client=client,
            base=base,
        )
    ).parsed
