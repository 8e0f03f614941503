from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.egress import Egress
from ..models.envs_create_kind import EnvsCreateKind
from ..models.live_auto import LiveAuto
from ..models.wait_for import WaitFor
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.egress_allowlist import EgressAllowlist
    from ..models.env_vars import EnvVars
    from ..models.labels import Labels


T = TypeVar("T", bound="EnvsCreate")


@_attrs_define
class EnvsCreate:
    """
    Attributes:
        kind (EnvsCreateKind | Unset): Fork only: `volume` (default) snapshots the parent's volumes and
            starts children from the new version (cold or warm: the server
            process boots again, its memory is not kept); `live` copies the
            parent's running server process into each child, memory and
            OpenEnv sessions included, each child with its own copy-on-write
            `/work` (requires an env created with `live: true`; 409
            `live_unsupported` otherwise, naming the reason). `auto` is live
            where the env allows it, else volume; under `--isolation gvisor`
            (no live forks) `auto` also checkpoints the parent's sandbox
            (memory, processes, open files) and each child resumes from it
            instead of booting (its `start` is `restored`) where the runtime
            can save it (an env of one service; else its children boot). On
            a cluster live children
            run on the parent's node and count against its cap: a `live` fork
            asking for more children than that node has room for is 429
            `rate_limited`; `auto` makes as many live children as fit there
            and starts the rest as a volume fork on other nodes, each with
            `spill` set.
             Default: EnvsCreateKind.VOLUME.
        reseed (bool | Unset): Live fork only: each child draws fresh entropy for the server
            process's global generators (Python's `random`, NumPy's global
            `np.random`), as a newly started server would (default). `false`
            keeps the parent's state of both, so a child draws what the
            parent would have drawn next. Generators the env holds itself
            (`random.Random(seed)`, `np.random.default_rng(seed)`) are copied
            either way.
             Default: True.
        live (bool | LiveAuto | Unset): Create from a version only (a fork's `kind` says how it forks; 422
            there): start each env's agent ready for live forks, as
            `SandboxCreate.live` does: `true` refuses a server that cannot be
            copied (409 `live_unsupported`), `auto` keeps it, serving as
            without `live`. A version of several services runs without it.
             Default: False.
        count (int | Unset): How many envs to start. Default: 1.
        egress (Egress | EgressAllowlist | None | Unset): Overrides the parent's egress.
        env (EnvVars | Unset): Environment variables for the service; names are letters, digits and `_`, not starting
            with a digit.
        labels (Labels | Unset): Free-form labels (at most 32, keys up to 63 and values up to 255 characters).
        ttl_s (int | Unset):  Default: 3600.
        lease_id (None | str | Unset): The lease that holds the new env(s): an open lease of this API key
            (`POST /v1/leases`). When the lease expires or is closed, the
            server deletes every env it holds. Absent or null: the env is
            detached, kept until `ttl_s` or a delete. An expired or closed
            lease is 409 `conflict` (`details.lease_id`, `details.state`); an
            unknown one is 404.
        wait (WaitFor | Unset): When a create returns: `none` at once, `running` once the containers
            run, `healthy` once the agent service answers its health path.
        wait_timeout_s (float | Unset):  Default: 120.0.
        warm (int | Unset): Keep this many booted spares ready for later forks. Default: 0.
    """

    kind: EnvsCreateKind | Unset = EnvsCreateKind.VOLUME
    reseed: bool | Unset = True
    live: bool | LiveAuto | Unset = False
    count: int | Unset = 1
    egress: Egress | EgressAllowlist | None | Unset = UNSET
    env: EnvVars | Unset = UNSET
    labels: Labels | Unset = UNSET
    ttl_s: int | Unset = 3600
    lease_id: None | str | Unset = UNSET
    wait: WaitFor | Unset = UNSET
    wait_timeout_s: float | Unset = 120.0
    warm: int | Unset = 0

    def to_dict(self) -> dict[str, Any]:
        from ..models.egress_allowlist import EgressAllowlist  # noqa: PLC0415

        kind: str | Unset = UNSET
        if not isinstance(self.kind, Unset):
            kind = self.kind.value

        reseed = self.reseed

        live: bool | str | Unset
        if isinstance(self.live, Unset):
            live = UNSET
        elif isinstance(self.live, LiveAuto):
            live = self.live.value
        else:
            live = self.live

        count = self.count

        egress: dict[str, Any] | None | str | Unset
        if isinstance(self.egress, Unset):
            egress = UNSET
        elif isinstance(self.egress, Egress):
            egress = self.egress.value
        elif isinstance(self.egress, EgressAllowlist):
            egress = self.egress.to_dict()
        else:
            egress = self.egress

        env: dict[str, Any] | Unset = UNSET
        if not isinstance(self.env, Unset):
            env = self.env.to_dict()

        labels: dict[str, Any] | Unset = UNSET
        if not isinstance(self.labels, Unset):
            labels = self.labels.to_dict()

        ttl_s = self.ttl_s

        lease_id: None | str | Unset
        if isinstance(self.lease_id, Unset):
            lease_id = UNSET
        else:
            lease_id = self.lease_id

        wait: str | Unset = UNSET
        if not isinstance(self.wait, Unset):
            wait = self.wait.value

        wait_timeout_s = self.wait_timeout_s

        warm = self.warm

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if kind is not UNSET:
            field_dict["kind"] = kind
        if reseed is not UNSET:
            field_dict["reseed"] = reseed
        if live is not UNSET:
            field_dict["live"] = live
        if count is not UNSET:
            field_dict["count"] = count
        if egress is not UNSET:
            field_dict["egress"] = egress
        if env is not UNSET:
            field_dict["env"] = env
        if labels is not UNSET:
            field_dict["labels"] = labels
        if ttl_s is not UNSET:
            field_dict["ttl_s"] = ttl_s
        if lease_id is not UNSET:
            field_dict["lease_id"] = lease_id
        if wait is not UNSET:
            field_dict["wait"] = wait
        if wait_timeout_s is not UNSET:
            field_dict["wait_timeout_s"] = wait_timeout_s
        if warm is not UNSET:
            field_dict["warm"] = warm

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.egress_allowlist import EgressAllowlist  # noqa: PLC0415
        from ..models.env_vars import EnvVars  # noqa: PLC0415
        from ..models.labels import Labels  # noqa: PLC0415

        d = dict(src_dict)
        _kind = d.pop("kind", UNSET)
        kind: EnvsCreateKind | Unset
        if isinstance(_kind, Unset):
            kind = UNSET
        else:
            kind = EnvsCreateKind(_kind)

        reseed = d.pop("reseed", UNSET)

        def _parse_live(data: object) -> bool | LiveAuto | Unset:
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                live_type_1 = LiveAuto(data)

                return live_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(bool | LiveAuto | Unset, data)

        live = _parse_live(d.pop("live", UNSET))

        count = d.pop("count", UNSET)

        def _parse_egress(data: object) -> Egress | EgressAllowlist | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                egress_type_0 = Egress(data)

                return egress_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                egress_type_1 = EgressAllowlist.from_dict(data)

                return egress_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(Egress | EgressAllowlist | None | Unset, data)

        egress = _parse_egress(d.pop("egress", UNSET))

        _env = d.pop("env", UNSET)
        env: EnvVars | Unset
        if isinstance(_env, Unset):
            env = UNSET
        else:
            env = EnvVars.from_dict(_env)

        _labels = d.pop("labels", UNSET)
        labels: Labels | Unset
        if isinstance(_labels, Unset):
            labels = UNSET
        else:
            labels = Labels.from_dict(_labels)

        ttl_s = d.pop("ttl_s", UNSET)

        def _parse_lease_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        lease_id = _parse_lease_id(d.pop("lease_id", UNSET))

        _wait = d.pop("wait", UNSET)
        wait: WaitFor | Unset
        if isinstance(_wait, Unset):
            wait = UNSET
        else:
            wait = WaitFor(_wait)

        wait_timeout_s = d.pop("wait_timeout_s", UNSET)

        warm = d.pop("warm", UNSET)

        envs_create = cls(
            kind=kind,
            reseed=reseed,
            live=live,
            count=count,
            egress=egress,
            env=env,
            labels=labels,
            ttl_s=ttl_s,
            lease_id=lease_id,
            wait=wait,
            wait_timeout_s=wait_timeout_s,
            warm=warm,
        )

        return envs_create
