"""Contains all the data models used in inputs/outputs"""

from .deploy_request import DeployRequest
from .egress import Egress
from .egress_allowlist import EgressAllowlist
from .endpoint import Endpoint
from .endpoint_via import EndpointVia
from .env import Env
from .env_batch import EnvBatch
from .env_deletion import EnvDeletion
from .env_deletion_reason import EnvDeletionReason
from .env_error import EnvError
from .env_error_code import EnvErrorCode
from .env_list import EnvList
from .env_logs import EnvLogs
from .env_service import EnvService
from .env_service_status import EnvServiceStatus
from .env_status import EnvStatus
from .env_vars import EnvVars
from .envs_create import EnvsCreate
from .envs_create_kind import EnvsCreateKind
from .error import Error
from .error_code import ErrorCode
from .error_details_type_0 import ErrorDetailsType0
from .file_change import FileChange
from .file_change_change import FileChangeChange
from .fork import Fork
from .gc_result import GcResult
from .health import Health
from .health_status import HealthStatus
from .host_guard import HostGuard
from .host_guard_state import HostGuardState
from .labels import Labels
from .lease import Lease
from .lease_create import LeaseCreate
from .lease_state import LeaseState
from .live_auto import LiveAuto
from .project import Project
from .project_list import ProjectList
from .sandbox_create import SandboxCreate
from .snapshot_request import SnapshotRequest
from .start_mode import StartMode
from .version import Version
from .version_diff import VersionDiff
from .version_list import VersionList
from .version_service import VersionService
from .version_storage_type_0 import VersionStorageType0
from .wait_for import WaitFor
from .wait_request import WaitRequest
from .wait_request_until import WaitRequestUntil
from .warm_pool import WarmPool
from .warm_pool_state import WarmPoolState

__all__ = (
    "DeployRequest",
    "Egress",
    "EgressAllowlist",
    "Endpoint",
    "EndpointVia",
    "Env",
    "EnvBatch",
    "EnvDeletion",
    "EnvDeletionReason",
    "EnvError",
    "EnvErrorCode",
    "EnvList",
    "EnvLogs",
    "EnvsCreate",
    "EnvsCreateKind",
    "EnvService",
    "EnvServiceStatus",
    "EnvStatus",
    "EnvVars",
    "Error",
    "ErrorCode",
    "ErrorDetailsType0",
    "FileChange",
    "FileChangeChange",
    "Fork",
    "GcResult",
    "Health",
    "HealthStatus",
    "HostGuard",
    "HostGuardState",
    "Labels",
    "Lease",
    "LeaseCreate",
    "LeaseState",
    "LiveAuto",
    "Project",
    "ProjectList",
    "SandboxCreate",
    "SnapshotRequest",
    "StartMode",
    "Version",
    "VersionDiff",
    "VersionList",
    "VersionService",
    "VersionStorageType0",
    "WaitFor",
    "WaitRequest",
    "WaitRequestUntil",
    "WarmPool",
    "WarmPoolState",
)
